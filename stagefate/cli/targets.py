"""``stagefate targets``: the SGLang releases stagefate can drive, and their environments.

``stagefate targets`` lists every release with buffer mode, what its pipeline is, and where it
is installed; ``stagefate targets install sglang==V`` builds its environment (docs/sglang.md,
"Releases").
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from .common import console


def add_parser(sub: Any) -> None:
    targets = sub.add_parser("targets", help="list the SGLang releases; install one")
    targets.add_argument(
        "action", nargs="?", choices=["list", "install"], default="list", help="default: list"
    )
    targets.add_argument("release", nargs="?", help="install: sglang==V (one of the list)")
    targets.add_argument(
        "--force", action="store_true", help="install: rebuild an environment that is ready"
    )
    targets.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..targets.sglang.environments import (
        InstallFailed,
        environment,
        install,
        install_command,
        installed,
    )
    from ..targets.sglang.releases import NEWEST, RELEASES, split_name

    if args.action == "list":
        if args.release:
            raise ValueError("`stagefate targets` lists them all; drop the release")
        ready = installed()
        table = Table(title="SGLang releases with buffer mode")
        for column in ("release", "API", "built", "buffer mode", "installed"):
            table.add_column(column)
        for version, release in RELEASES.items():
            found = ready.get(version)
            place = (
                "not installed: " + install_command(version)
                if found is None
                else ("this environment" if found.here else str(environment(version)))
            )
            table.add_row(version, release.generation, release.built, release.holds, place)
        console.print(table)
        return 0
    if not args.release:
        raise ValueError(f"`stagefate targets install` takes a release: {install_command(NEWEST)}")
    version = split_name(args.release, ("sglang",))[1] or NEWEST
    existing = installed().get(version)
    if existing is not None and not args.force:
        where = "this environment" if existing.here else str(environment(version))
        console.print(f"SGLang {version} is already ready in {where} (--force rebuilds it)")
        return 0
    try:
        path = install(version, lambda step: console.print(f"sglang=={version}: {step}"))
    except InstallFailed as failed:
        console.print(f"[red]error:[/red] {failed}", soft_wrap=True)
        return 1
    console.print(f"SGLang {version} is ready in {path}")
    return 0
