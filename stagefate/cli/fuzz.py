"""``stagefate fuzz``: a stateful fuzz campaign over stagefate's pipeline or SGLang's."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from ..registry import TREES, split
from .common import (
    OnOrOffOnce,
    add_sglang_env,
    console,
    count,
    flagged,
    output_file,
    parse_sglang_env,
    positive,
    positive_int,
    report_unreached,
)

if TYPE_CHECKING:
    from ..targets.sglang.waste import Comparison

SET_ASIDE = ["sanity_check", "namespaces", "id_reuse", "unusable_fetch"]
"""``--set-aside`` choices: two switches of the world, then each finding's ``set_aside`` name
(``targets/sglang/findings.py``; a test holds them equal)."""


def add_parser(sub: Any) -> None:
    fuzz = sub.add_parser("fuzz", help="stateful fuzz campaign over the real pipeline")
    fuzz.add_argument(
        "--steps",
        type=positive_int("states to check"),
        help="states to check (default 20,000); programs run whole, so up to one program's "
        "steps more",
    )
    fuzz.add_argument(
        "--budget",
        type=positive("seconds to run"),
        help="seconds to run instead of a step count",
    )
    fuzz.add_argument(
        "--seed", type=count("the campaign's seed"), default=0, help="seeds Hypothesis (default 0)"
    )
    fuzz.add_argument("--faults", action=OnOrOffOnce, default=True)
    fuzz.add_argument("--profile", default="fuzz", choices=["ci", "dev", "fuzz", "repro"])
    fuzz.add_argument(
        "--log",
        type=output_file("the transition log"),
        help="write each program's transition log here (the failing one's on a failure)",
    )
    fuzz.add_argument(
        "--tree",
        default="stagefate",
        help=f"the radix tree under test: {', '.join(TREES)} (SGLang's take a release, e.g. "
        "sglang-rust==0.5.21; without one, the newest installed)",
    )
    fuzz.add_argument(
        "--target",
        default="stagefate",
        help="the pipeline under test: stagefate, or sglang / sglang==V: that release's "
        "BufferModePipeline (`stagefate targets`; its tree core from --tree "
        "sglang-python|sglang-rust, python by default)",
    )
    fuzz.add_argument(
        "--set-aside",
        action="append",
        default=[],
        choices=SET_ASIDE,
        help="--target sglang (repeatable), to look past a release's known finding "
        "(docs/sglang-findings.md): sanity_check: do not call SGLang's own sanity_check "
        "(0.5.19, 0.5.20); namespaces: issue and publish every request in the root namespace "
        "(0.5.19's L3 keys ignore it); id_reuse: run with the fix proposed for an earlier "
        "attempt's query or parked hit taken for a later attempt's under the same id (an "
        "aborted id reused, a retracted request re-issued; 0.5.19 to 0.5.23); unusable_fetch: "
        "with the fix proposed for a fetch that lands nothing usable leaving its trimmed head "
        "out of SGLang's hit metrics (0.5.22, 0.5.23); every other invariant still runs",
    )
    fuzz.add_argument(
        "--tp",
        type=positive_int("tensor-parallel ranks"),
        default=1,
        help="fuzz N tensor-parallel ranks in lockstep under per-rank faults "
        "(docs/tensor-parallel.md); 1 (default): one pipeline",
    )
    fuzz.add_argument(
        "--processes",
        action="store_true",
        help="--tp: each rank in a process of its own, agreeing over torch.distributed (gloo "
        "on 127.0.0.1) instead of threads in this one",
    )
    fuzz.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--target sglang (repeatable): pin one setting every program draws (prefetch_policy, "
        "retry_interval, retry_max_attempts, anchor_lock, anchor_cap, host_tokens, "
        "prefetch_threshold, swa_window; docs/sglang.md), e.g. --config prefetch_policy=timeout",
    )
    fuzz.add_argument(
        "--compare",
        metavar="KEY=VALUE",
        help="--target sglang: replay each program on a twin deployed with KEY=VALUE instead of "
        "its drawn value (or release=V: on that SGLang release, after the campaign), and report "
        "the programs in which either wastes more (tokens read from L3 and never spliced; "
        "docs/sglang.md), e.g. --compare anchor_lock=off",
    )
    fuzz.add_argument(
        "--waste-fails",
        choices=("drawn", "twin"),
        help="--compare: a program in which this side wastes more than the other fails, and "
        "is shrunk to a minimal one (a performance finding)",
    )
    add_sglang_env(fuzz, "--target sglang")
    fuzz.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..fuzz.campaign import DATABASE, edge_table, run_campaign
    from ..fuzz.fuzzer import configured
    from ..fuzz.world import PAGE
    from ..registry import target_for, tree_factory

    if args.steps is None and args.budget is None:
        args.steps = 20_000
    if args.tp > 1:
        return _fuzz_ranks(args, DATABASE)
    if args.processes:
        raise ValueError("--processes runs tensor-parallel ranks: give it with --tp 2 or more")
    target = split(args.target, ("stagefate", "sglang"), "target")[0]
    if target == "sglang":
        return _fuzz_sglang(args, DATABASE)
    if args.sglang_env or args.set_aside or args.config or args.compare or args.waste_fails:
        raise ValueError(
            "--sglang-env, --set-aside, --config, --compare and --waste-fails apply to SGLang's "
            "pipeline: use them with --target sglang"
        )
    from ..targets.sglang.worker import command_in

    found = target_for(None, args.tree)  # an SGLang tree of another release runs there
    if found is not None and not found.here:
        return command_in(found, ["fuzz", *args.argv], {})
    machine = configured(
        faults=args.faults,
        tree_factory=tree_factory(args.tree),
        # SGLang's trees are built with the FULL component only: no sliding-window variant.
        windows=(None, 2 * PAGE) if args.tree == "stagefate" else (None,),
        log_path=args.log,
    )
    result = run_campaign(console, machine, args.steps, args.budget, args.seed, args.profile)
    console.print(edge_table())
    console.print(
        f"{result.states:,} states checked in {result.examples:,} programs, "
        f"{result.seconds:.0f} s, "
        f"tree {args.tree}, seed {args.seed}, "
        f"PYTHONHASHSEED {os.environ.get('PYTHONHASHSEED', 'random')}, "
        f"faults {'on' if args.faults else 'off'}"
    )
    report_unreached(result.unreached)
    if args.log:
        console.print(f"wrote {args.log}: the transition log of the last program run")
    if result.failure is not None:
        return _violation(result.failure, DATABASE)
    return 0


def _violation(failure: BaseException, database: Path) -> int:
    """Print each minimal failing program of ``failure``, then the violation; exit status 1."""
    from ..fuzz.campaign import failing_programs

    programs = failing_programs(failure)
    for program in programs:
        console.print(program, soft_wrap=True, markup=False, highlight=False)
    where = (
        "The minimal failing program is printed above"
        if programs
        else "Hypothesis attached no program (`--profile repro` replays the example)"
    )
    flagged(
        "VIOLATION",
        f"{type(failure).__name__}: {failure}\n{where}; the example is saved in {database}, so "
        "the next run replays it first.",
    )
    return 1


def _fuzz_ranks(args: argparse.Namespace, database: Path) -> int:
    """``--tp N``: N ranks of stagefate's pipeline, agreeing through a LocalGroup."""
    from ..fuzz.campaign import run_batches
    from ..fuzz.rank_fuzzer import TALLY, configured

    if args.target != "stagefate" or args.tree != "stagefate" or args.log or args.sglang_env:
        raise ValueError(
            "--tp fuzzes stagefate's own pipeline on its own tree: drop --target, --tree, "
            "--log and --sglang-env"
        )
    if args.processes:
        return _fuzz_rank_processes(args)
    TALLY.states = 0
    programs, seconds, failure = run_batches(
        console,
        configured(args.tp),
        lambda: TALLY.states,
        args.steps,
        args.budget,
        args.seed,
        args.profile,
    )
    console.print(
        f"{TALLY.states:,} states checked in {programs:,} programs over {args.tp} ranks in "
        f"lockstep (threads), {seconds:.0f} s, seed {args.seed}; {_RANK_FAULTS}"
    )
    if failure is not None:
        return _violation(failure, database)
    return 0


_RANK_FAULTS = (
    "per-rank faults: pages missing from one rank's L3, one rank's reads short, failed or "
    "late, one rank's bounce fuller"
)


def _fuzz_rank_processes(args: argparse.Namespace) -> int:
    import tempfile

    from ..fuzz.rank_fuzzer import run_in_processes

    with tempfile.TemporaryDirectory(prefix="stagefate-tp-l3-") as l3:
        ranks = run_in_processes(args.tp, args.steps, args.budget, args.seed, Path(l3))
    states, programs, seconds, _failure = ranks[0]
    console.print(
        f"{states:,} states checked in {programs:,} programs over {args.tp} ranks in lockstep, "
        f"one process each over gloo, {seconds:.0f} s, seed {args.seed}; {_RANK_FAULTS}"
    )
    failed = [(rank, failure) for rank, (*_, failure) in enumerate(ranks) if failure]
    if failed:
        for rank, failure in failed:
            flagged("VIOLATION", f"rank {rank}: {failure}")
        console.print(
            "Each rank printed its failing program above (the same program on every rank)."
        )
        return 1
    return 0


def _compared(text: str | None, pins: dict[str, Any]) -> tuple[str, Any] | None:
    """``--compare KEY=VALUE``: the field the twin changes and its value there, or
    ``release=V``: the release the twin runs."""
    from ..targets.sglang.environments import resolve
    from ..targets.sglang.fuzz_config import parse_pins
    from ..targets.sglang.waste import RELEASE

    if text is None:
        return None
    key, equals, version = text.partition("=")
    if key.strip() == RELEASE and equals:
        resolve(version.strip())  # installed, or refused naming the install command
        return RELEASE, version.strip()
    ((key, value),) = parse_pins([text], flag="--compare").items()
    if key in pins and pins[key] == value:
        raise ValueError(
            f"--compare {text}: --config pins {key} to the same value, so the twin would be the "
            "same deployment; compare another value or drop the pin"
        )
    return key, value


def _report_waste(waste: Comparison) -> None:
    """What ``--compare`` found: how often each side wasted more, and each side's worst program
    (a performance finding, not a violation)."""
    from ..targets.sglang.fuzzer import SEQUENCES
    from ..targets.sglang.waste import program_text

    twin = f"the twin ({waste.key}={waste.value!r})"
    console.print(
        f"waste (tokens read from L3 and never spliced) against {twin}: {waste.programs:,} "
        f"programs compared ({waste.skipped_calls:,} calls the twin could not take skipped); "
        f"the drawn deployment wasted more in {waste.more['drawn']:,}, the twin in "
        f"{waste.more['twin']:,}",
        soft_wrap=True,
    )
    for side, worst in waste.worst.items():
        if worst is None:
            continue
        tokens, config, calls = worst
        wasteful = twin if side == "twin" else "the drawn deployment"
        flagged(
            "PERFORMANCE",
            f"{wasteful} wasted {tokens} tokens more, drawn {config}, in this program:",
        )
        console.print(program_text(calls, SEQUENCES), soft_wrap=True, markup=False, highlight=False)


def without_flag(argv: list[str], flag: str) -> list[str]:
    """``argv`` less every ``flag VALUE`` and ``flag=VALUE`` (a command re-run elsewhere with
    that flag set anew: given twice, it would be refused)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == flag:
            skip = True
        elif not arg.startswith(f"{flag}="):
            kept.append(arg)
    return kept


def _fuzz_sglang(args: argparse.Namespace, database: Path) -> int:
    """The campaign in the process of the release ``--target`` names (this one, or its own
    environment's: the same command runs there, the release named)."""
    from ..registry import target_for
    from ..targets.sglang.environments import check_knobs
    from ..targets.sglang.worker import command_in, environment_set

    if args.tree == "stagefate":
        args.tree = "sglang-python"  # SGLang's pipeline runs on its own tree
    sglang_env = parse_sglang_env(args.sglang_env)
    found = target_for(args.target, args.tree)
    assert found is not None
    check_knobs(sglang_env, [found])
    if not found.here:
        pinned = [*without_flag(args.argv, "--target"), "--target", f"sglang=={found.version}"]
        return command_in(found, ["fuzz", *pinned], {**sglang_env})
    from ..fuzz.world import NAMESPACES
    from ..targets.sglang.findings import proposed_fixes, set_aside
    from ..targets.sglang.fuzz_config import parse_pins
    from ..targets.sglang.fuzzer import run_target_campaign
    from ..targets.sglang.twins import compare_with_release
    from ..targets.sglang.waste import RELEASE

    pins = parse_pins(args.config)
    compare = _compared(args.compare, pins)
    if args.waste_fails and compare is None:
        raise ValueError("--waste-fails needs --compare KEY=VALUE: the twin to compare with")
    if compare is not None and compare[0] == RELEASE:
        if compare[1] == found.version:
            raise ValueError(
                f"--compare release={compare[1]}: the campaign runs {found.version} already; "
                "name another release"
            )
        if args.waste_fails:
            raise ValueError(
                "--waste-fails fails a program while it runs, but --compare release=V replays "
                "the programs after the campaign: compare a setting (KEY=VALUE) to shrink one"
            )
    fixed = set_aside(args.set_aside)

    core = split(args.tree, TREES, "tree")[0].removeprefix("sglang-")
    with environment_set(sglang_env):
        result = run_target_campaign(
            console,
            args.steps,
            args.budget,
            args.seed,
            core,
            args.profile,
            sanity_check="sanity_check" not in args.set_aside,
            namespaced="namespaces" not in args.set_aside,
            log_path=args.log,
            pins=pins,
            fixes=proposed_fixes(fixed),
            compare=compare,
            waste_fails=args.waste_fails,
        )
        if result.waste is not None and compare is not None and compare[0] == RELEASE:
            namespaces = NAMESPACES if "namespaces" not in args.set_aside else (None,)
            compare_with_release(result.waste, str(compare[1]), namespaces, core, fixed)
    table = Table(title="SGLang's decisions reached")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for name, seen in result.outcomes.items():
        table.add_row(name, Text(f"{seen:,}", style="" if seen else "red"))
    console.print(table)
    if result.waste is not None:
        _report_waste(result.waste)
    if result.failure is None:
        from ..targets.sglang.design_log import load_design

        for design, taken in result.design_edges.items():
            edges = load_design(design).edges()
            missing = sorted(set(edges) - set(taken))
            console.print(
                f"every program's run followed SGLang's own design ({design.name}): its "
                f"decisions took {len(taken)} of the design's {len(edges)} edges"
                + (f"; not taken: {missing}" if missing else ""),
                soft_wrap=True,
            )
    console.print(
        f"{result.states:,} states checked in {result.programs:,} programs over SGLang "
        f"{found.version}'s BufferModePipeline ({core} tree core), {result.seconds:.0f} s, "
        f"seed {args.seed}"
        + "".join(f", {key}={value}" for key, value in sglang_env.items())
        + (f", set aside: {', '.join(sorted(set(args.set_aside)))}" if args.set_aside else "")
    )
    if result.failure is not None:
        return _violation(result.failure, database)
    return 0
