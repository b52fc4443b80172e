"""One Python environment per SGLang release: install, list, find.

One interpreter can import only one sglang, so each release stagefate drives lives in a virtual
environment of its own under :func:`targets_dir` (``$STAGEFATE_TARGETS``, default
``~/.cache/stagefate/targets``), and runs there in a worker process (:mod:`.worker`). The release
this interpreter imports (``make sglang`` puts the newest in ``.venv``) runs in-process.

An install builds ``sglang-V.partial`` and renames it to ``sglang-V`` only once the worker has
run one prefetch through the release's pipeline there, so an interrupted install leaves nothing that
:func:`installed` lists as ready. What goes in, in order (docs/sglang.md, "Releases"):

1. ``torch==2.13.0``, the CPU build (the wheels pin a CUDA build of a newer torch);
2. the release's wheel with ``--no-deps`` (its dependencies pull CUDA and GPU-only packages);
3. what its tree and pipeline import (the names of stagefate's ``sglang-deps`` extra, plus
   :data:`_IMPORTED`), each at the release's own pin where its wheel pins one, else at
   stagefate's; :data:`_NO_DEPS` without their dependencies;
4. what stagefate itself needs to run there (its own dependencies, but pygraphviz, which only
   draws diagrams). stagefate's code is not installed: the worker runs the caller's, through
   ``PYTHONPATH``, so both sides always run the same stagefate;
5. what SGLang's engine imports beyond that (stagefate's ``sglang-engine`` extra, at the
   wheel's pins). Once the environment is ready, ``stagefate targets install`` checks that the
   engine serves from L3 there (:mod:`.engine.serving`): its outcome is recorded, not
   required, since a release whose engine cannot start here still drives its tree and
   pipeline.
"""

from __future__ import annotations

import difflib
import functools
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from .. import TargetUnavailable
from .releases import NEWEST, RELEASES, release

TORCH = "torch==2.13.0"
_IMPORTED = ("tokenizers", "xxhash", "zstandard", "setproctitle", "einops", "uvicorn", "fastapi")
"""Imported by 0.5.19's modules beyond the ``sglang-deps`` extra (the extra is 0.5.23's set):
the last four by ``scheduler.py``, whose retry sweep the 0.5.19 driver calls."""
_NO_DEPS = ("xgrammar", "openai-harmony")
"""Imported through ``server_args.py`` by 0.5.19; their own dependencies pull triton and CUDA."""
_NOT_FOR_WORKERS = {"pygraphviz"}
READY = "stagefate-ready.json"


def targets_dir() -> Path:
    return Path(os.environ.get("STAGEFATE_TARGETS") or Path.home() / ".cache/stagefate/targets")


def install_command(version: str) -> str:
    return f"stagefate targets install sglang=={version}"


@dataclass(frozen=True)
class Installed:
    """A release stagefate can drive here, and the interpreter that imports it."""

    version: str
    python: Path
    here: bool
    """It is this interpreter's own sglang: it runs in-process."""


def here_version() -> str | None:
    """The sglang this interpreter imports (None: none)."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def environment(version: str) -> Path:
    return targets_dir() / f"sglang-{version}"


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def installed() -> dict[str, Installed]:
    """Every release ready to run here, oldest first."""
    found = {}
    here = here_version()
    for version in RELEASES:
        if version == here:
            found[version] = Installed(version, Path(sys.executable), True)
        elif _ready(environment(version)):
            found[version] = Installed(version, _python(environment(version)), False)
    return found


def resolve(version: str | None) -> Installed:
    """The release ``version`` (None: the newest installed), or :class:`TargetUnavailable`
    naming the command that installs it."""
    ready = installed()
    if version is None:
        if not ready:
            raise TargetUnavailable(
                f"no SGLang release is installed here; run `make sglang` (the newest, into this "
                f"environment) or `{install_command(NEWEST)}`"
            )
        return ready[next(reversed(ready))]
    release(version)
    if version not in ready:
        raise TargetUnavailable(
            f"SGLang {version} is not installed here; run `{install_command(version)}`"
        )
    return ready[version]


def worker_environment(python: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a worker of the interpreter ``python`` runs in: this stagefate on its
    path and nothing of this interpreter's site-packages (the release's own must win); torch's
    extension builds (SGLang JIT-compiles its page hash) in the release's environment, so two
    releases never share one build directory."""
    package_root = Path(__file__).resolve().parents[3]
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = str(package_root)
    env["TORCH_EXTENSIONS_DIR"] = str(python.parent.parent / "torch_extensions")
    env.update(extra or {})
    return env


def _pins(python: Path) -> dict[str, Requirement]:
    """The requirements the installed sglang wheel declares that apply here, by name."""
    script = "import importlib.metadata as m, json; print(json.dumps(m.requires('sglang') or []))"
    output = subprocess.run(
        [str(python), "-c", script], check=True, capture_output=True, text=True
    ).stdout
    pins = {}
    for line in json.loads(output):
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            pins[_canonical(requirement.name)] = requirement
    return pins


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-")


def _own_requirements(extra: str | None) -> list[Requirement]:
    """stagefate's declared requirements: its dependencies (None) or one extra's."""
    requirements = []
    for line in importlib.metadata.requires("stagefate") or []:
        requirement = Requirement(line)
        marker = requirement.marker
        in_extra = marker is not None and marker.evaluate({"extra": extra or "-"})
        if (extra is None and marker is None) or (extra is not None and in_extra):
            requirements.append(requirement)
    return requirements


def worker_requirements() -> list[str]:
    """What stagefate needs in a release's environment: its dependencies and the ``tools``
    extra (a worker runs the fuzzer's strategies), torch and Graphviz aside. Written without
    the extra's marker: pip evaluates ``extra == "tools"`` false outside an extra's install and
    would skip them."""
    return [
        f"{r.name}{r.specifier}"
        for r in _own_requirements(None) + _own_requirements("tools")
        if _canonical(r.name) not in _NOT_FOR_WORKERS and _canonical(r.name) != "torch"
    ]


def _ready(path: Path) -> bool:
    """The environment at ``path`` was built whole, with what stagefate needs there today (one
    built before a requirement changed is rebuilt by the next install)."""
    try:
        ready = json.loads((path / READY).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(ready, dict)
        and ready.get("stagefate") == worker_requirements()
        and ready.get("engine") == engine_requirements()
    )


def engine_requirements() -> list[str]:
    """What SGLang's engine imports beyond the pipeline (the ``sglang-engine`` extra)."""
    return sorted(f"{r.name}{r.specifier}" for r in _own_requirements("sglang-engine"))


def _pinned(
    names: list[str], own: dict[str, Requirement], wheel: dict[str, Requirement]
) -> list[str]:
    """Each name at the wheel's pin where it pins one (``==``), else at stagefate's spec."""
    specs = []
    for name in names:
        key = _canonical(name)
        theirs = wheel.get(key)
        if theirs is not None and any(spec.operator == "==" for spec in theirs.specifier):
            specs.append(f"{name}{theirs.specifier}")
        elif key in own:
            specs.append(f"{name}{own[key].specifier}")
        else:
            specs.append(name)
    return specs


class InstallFailed(RuntimeError):
    """A step of an install failed; the message names it. Nothing was left installed."""


def install(version: str, say: Callable[[str], None]) -> Path:
    """Build the environment of ``version`` (see the module's docstring); returns its path."""
    release(version)
    return build_whole(environment(version), lambda partial: _build(version, partial, say))


def build_whole(final: Path, build: Callable[[Path], None]) -> Path:
    """Build an environment in ``FINAL.partial`` and rename it ``final`` only once ``build``
    returned: an interrupted or failed build leaves nothing behind (any target's install)."""
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        build(partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # nothing half-installed stays behind
        raise
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return final


def _build(version: str, partial: Path, say: Callable[[str], None]) -> None:
    python = _python(partial)
    pip = [str(python), "-m", "pip", "install", "-q"]

    def step(what: str, command: list[str], env: dict[str, str] | None = None) -> None:
        say(what)
        done = subprocess.run(command, check=False, env=env)
        if done.returncode != 0:
            raise InstallFailed(
                f"installing sglang=={version} failed at: {what} (exit status "
                f"{done.returncode}, its output is above); nothing was left installed"
            )

    step(f"venv {partial}", [sys.executable, "-m", "venv", str(partial)])
    step(f"{TORCH} (CPU)", [*pip, TORCH])
    step(f"sglang=={version} without its dependencies", [*pip, "--no-deps", f"sglang=={version}"])
    wheel = _pins(python)
    extra = {_canonical(r.name): r for r in _own_requirements("sglang-deps")}
    imported = [r.name for r in extra.values()] + list(_IMPORTED)
    step("what its tree and pipeline import", [*pip, *_pinned(imported, extra, wheel)])
    step("their import-only packages", [*pip, "--no-deps", *_pinned(list(_NO_DEPS), {}, wheel)])
    own = worker_requirements()
    step("what stagefate needs there", [*pip, *own])
    engine = {_canonical(r.name): r for r in _own_requirements("sglang-engine")}
    step("what its engine imports", [*pip, *_pinned(list(engine), engine, wheel)])
    step(
        "one prefetch through its pipeline, in the worker",
        [str(python), "-m", "stagefate.targets.sglang.worker", "--check", version],
        env=worker_environment(python),
    )
    ready = {"version": version, "torch": TORCH, "stagefate": own, "engine": engine_requirements()}
    (partial / READY).write_text(json.dumps(ready) + "\n")


_KNOB = re.compile(rb"SGLANG_[A-Z0-9_]+")


def source_roots(target: Installed) -> list[Path]:
    """The folders of the release's ``sglang`` package (read as files: a release of another
    environment is not importable here)."""
    if target.here:
        spec = importlib.util.find_spec("sglang")
        return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    env = target.python.parent.parent
    return list(env.glob("lib/python*/site-packages/sglang"))


@functools.cache
def release_knobs(target: Installed) -> frozenset[str]:
    """Every ``SGLANG_…`` name the release's own sources spell: the knobs it can read."""
    names: set[str] = set()
    for root in source_roots(target):
        for source in root.rglob("*.py"):
            names.update(match.decode() for match in _KNOB.findall(source.read_bytes()))
    return frozenset(names)


def check_knobs(knobs: Iterable[str], targets: Iterable[Installed]) -> None:
    """Refuse a ``--sglang-env`` knob a release never reads (it would be echoed as applied and
    change nothing), naming the nearest it does read."""
    for target in targets:
        known = release_knobs(target)
        for knob in knobs:
            if knob not in known:
                near = difflib.get_close_matches(knob, sorted(known), n=1)
                hint = f"; did you mean {near[0]}?" if near else ""
                raise ValueError(
                    f"--sglang-env {knob}: SGLang {target.version} reads no such knob (none of "
                    f"its sources names it){hint}"
                )
