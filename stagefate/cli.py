"""The ``stagefate`` command line: replay, check, diagram, bench."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from rich.console import Console
from rich.table import Table

from .bench.report import Section
from .registry import TREES, policy_factories
from .sim.costs import DEFAULT_PRESET, PRESETS, load_costs
from .sim.replay import DEFAULT_SPEED, ReplayOptions
from .spec import load_spec, run_static_checks
from .spec.diagram import spec_digest, stale_diagrams, write_diagrams
from .spec.load import DEFAULT_SPEC_PATH, SpecError
from .spec.modelcheck import Bounds
from .spec.schema import LifecycleSpec
from .transition_log import TransitionLog

console = Console(highlight=False)
Payload = TypeVar("Payload")


def _cmd_check(args: argparse.Namespace) -> int:
    from .statemachine.bindings import implemented_names

    spec_path = Path(args.spec) if args.spec else DEFAULT_SPEC_PATH
    spec = load_spec(spec_path)
    bound = implemented_names()
    findings = run_static_checks(spec, *bound)
    for finding in findings:
        console.print(f"[red]FAIL[/red] {finding}")
    if findings:
        console.print(f"{len(findings)} static finding(s) in {spec_path}")
        return 1
    console.print(
        f"static checks passed: {len(spec.states)} states, {len(spec.rows())} (state, event) rows, "
        f"{len(spec.guards)} guards, {len(spec.effects)} effects, all implemented"
    )
    return 0 if args.static else _model_check(spec, args)


def _report_unreached(edges: Sequence[tuple[str, str, str]]) -> None:
    for state, event, guard in edges:
        console.print(f"finding: edge never reached: {state} --{event} [{guard}]-->", markup=False)


def _model_check(spec: LifecycleSpec, args: argparse.Namespace) -> int:
    from .spec.modelcheck import NOT_MODELLED_GUARDS, Bounds, ModelChecker

    bounds = Bounds(
        pages=args.pages,
        requests=args.requests,
        host_pages=args.host_pages,
        device_pages=args.device_pages,
        cap_pages=args.cap_pages,
        threshold_pages=args.threshold_pages,
        issues_per_request=args.issues,
        max_states=args.max_states,
    )
    started = time.perf_counter()
    checker = ModelChecker(spec, bounds)
    result = checker.run()
    seconds = time.perf_counter() - started
    console.print(
        f"model check: {result.states:,} states explored in {seconds:.1f} s "
        f"({bounds.pages} pages, {bounds.requests} requests, host {bounds.host_pages}, device "
        f"{bounds.device_pages}, cap {bounds.cap_pages}, threshold {bounds.threshold_pages}, "
        f"{bounds.issues_per_request} issues each)"
    )
    if result.violation is not None:
        console.print(f"[red]VIOLATION[/red] {result.violation}", markup=True)
        console.print("shortest counterexample:")
        for number, step in enumerate(result.counterexample or [], start=1):
            console.print(f"  {number}. {step}", markup=False)
        return 1
    modelled = [
        e for e in ModelChecker(spec, bounds).all_edges() if e[2] not in NOT_MODELLED_GUARDS
    ]
    console.print(
        f"invariants hold in every state; {len(modelled) - len(result.unreached_edges)} of "
        f"{len(modelled)} modelled edges reached (not modelled: {sorted(NOT_MODELLED_GUARDS)})"
    )
    _report_unreached(result.unreached_edges)
    for state in result.unreached_states:
        console.print(f"finding: state never reached: {state}", markup=False)
    if result.truncated:
        console.print(f"finding: stopped at --max-states {bounds.max_states:,}; raise it")
    return 1 if result.unreached_edges or result.unreached_states or result.truncated else 0


def _cmd_diagram(args: argparse.Namespace) -> int:
    spec_path = Path(args.spec) if args.spec else DEFAULT_SPEC_PATH
    spec = load_spec(spec_path)
    digest = spec_digest(spec_path)
    out = Path(args.out)
    if args.check:
        problems = stale_diagrams(spec, out, digest)
        for problem in problems:
            console.print(f"[red]STALE[/red] {problem}; run `stagefate diagram` and commit docs/")
        return 1 if problems else 0
    for path in write_diagrams(spec, out, digest):
        console.print(f"wrote {path}")
    return 0


def _bench_runners(
    trace: str | None = None, device: str = "auto", peer: str | None = None
) -> dict[str, Callable[[], list[Section]]]:
    from .bench import copy, dispatch, lifecycle, replay, storage, tree

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return {
        "dispatch": lambda: [dispatch.run()],
        # today's shapes, then the §9.1 workload (side by side with a peer when asked)
        "tree": lambda: [tree.run(), tree.run_side_by_side(peer)],
        "copy": lambda: [copy.run(device)],
        "lifecycle": lambda: (
            [lifecycle.run(device)] + ([lifecycle.run_side_by_side(peer)] if peer else [])
        ),
        "replay": lambda: [replay.run(trace)],
        "storage": lambda: [storage.run()],
    }


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench.report import write_section

    if args.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch sees no GPU here; use --device cpu or auto")
    runners = _bench_runners(args.trace, args.device, args.peer)
    names = list(runners) if args.which == "all" else [args.which]
    for name in names:
        console.print(f"running bench {name} …")
        for section in runners[name]():
            command = "stagefate bench " + " ".join(shlex.quote(a) for a in args.argv)
            write_section(section, command.strip(), Path(args.report))
            console.print(section.body)
    console.print(f"results written to {args.report}")
    return 0


def _replay_options(args: argparse.Namespace, speed: float) -> ReplayOptions:
    from .sim.engine import EngineOptions

    engine = EngineOptions(
        schedule=args.schedule,
        prefetch_policy=args.prefetch_policy,
        max_prefill_tokens=args.max_prefill_tokens,
        chunked_prefill_size=args.chunked_prefill_size,
    )
    return ReplayOptions(
        page_size=args.page_size,
        device_tokens=args.device_tokens,
        host_tokens=args.host_tokens,
        speed=speed,
        seed=args.seed,
        dedup_inflight=not args.no_dedup,
        storage=args.storage,
        tree=args.tree,
        costs=load_costs(args.model, args.costs),
        engine=engine,
    )


def _parse_speeds(text: str) -> list[float]:
    try:
        speeds = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--sweep takes speeds like 0.5,1,2,4; got {text!r}") from None
    if not speeds or any(speed <= 0 for speed in speeds):
        raise ValueError(f"--sweep takes positive speeds like 0.5,1,2,4; got {text!r}")
    return sorted(set(speeds))


def _policies(choice: str, storage: str) -> list[str]:
    """``--policy``: one, or all: ``sglang`` too where SGLang is installed (else a hint)."""
    if choice != "all":
        return [choice]
    from .registry import policies_for_all

    policies, left_out = policies_for_all(storage)
    if left_out is not None:
        console.print(f"--policy all: live and blind only ({left_out})")
    return policies


def _cmd_replay(args: argparse.Namespace) -> int:
    from .sim.report import (
        metrics_table,
        replay_policies,
        story,
        sweep_table,
        wasted_table,
        write_json,
        write_plot,
        write_sweep_json,
        write_sweep_plot,
    )
    from .sim.trace import load_trace

    if args.speed <= 0:
        raise ValueError(f"--speed must be positive (2 = arrivals twice as fast), got {args.speed}")
    speeds = _parse_speeds(args.sweep) if args.sweep else None
    trace = load_trace(args.trace, args.limit)
    policies = _policies(args.policy, args.storage)
    if "sglang" in policies:  # its per-request warnings are its operational log; figures here
        logging.getLogger("sglang").setLevel(logging.ERROR)
    source = args.trace or "the embedded Mooncake slice"
    first = _replay_options(args, speeds[0] if speeds else args.speed)
    costs = first.costs
    console.print(
        f"replaying {len(trace):,} requests of {source} on {costs.model}, {costs.gpu} "
        f"({first.device_tokens or costs.device_kv_tokens():,} device KV tokens), "
        f"prefetch policy {first.engine.prefetch_policy}, {first.engine.schedule}"
    )
    arrival_ms = trace[-1].timestamp_ms - trace[0].timestamp_ms
    if args.log and (speeds or "live" not in policies):
        raise ValueError(
            "--log records the live pipeline's transitions in one run: use it without --sweep, "
            "with --policy live or all"
        )
    if speeds:
        sweep = {}
        for speed in speeds:
            replays = replay_policies(
                trace, policy_factories(policies), _replay_options(args, speed), console
            )
            sweep[speed] = {name: replay.metrics for name, replay in replays.items()}
        console.print(sweep_table(sweep))
        _save(args, sweep, write_sweep_json, write_sweep_plot)
        return 0
    log = TransitionLog.open(args.log) if args.log else None
    try:
        replays = replay_policies(
            trace, policy_factories(policies), first, console, [log] if log else []
        )
    finally:
        if log is not None:
            log.close()
            console.print(f"wrote {args.log} ({log.seq:,} transitions; `stagefate validate` it)")
    results = {name: replay.metrics for name, replay in replays.items()}
    console.print(metrics_table(results))
    if any(m.wasted_by_reason for m in results.values()):
        console.print(wasted_table(results))
    for line in story(replays, arrival_ms / 1e3 / args.speed):
        console.print(line, markup=False)
    _save(args, results, write_json, write_plot)
    return 0


def _save(
    args: argparse.Namespace,
    payload: Payload,
    write_json: Callable[[Payload, Path], None],
    write_plot: Callable[[Payload, Path], None],
) -> None:
    """``--json`` and ``--plot``, when given."""
    for path, write in ((args.json, write_json), (args.plot, write_plot)):
        if path:
            write(payload, Path(path))
            console.print(f"wrote {path}")


def _cmd_validate(args: argparse.Namespace) -> int:
    from .transition_log import validate_log

    spec = load_spec(Path(args.spec) if args.spec else DEFAULT_SPEC_PATH)
    path = Path(args.log)
    if not path.is_file():
        raise ValueError(f"transition log {path} does not exist; write one with --log FILE")
    with path.open(encoding="utf-8") as lines:
        summary = validate_log(lines, spec)
    if summary.violation is not None:
        console.print(f"[red]INVALID[/red] {path}:{summary.violation}", soft_wrap=True)
        return 1
    ended = ", ".join(f"{reason} {n:,}" for reason, n in summary.ended.most_common()) or "none"
    live = ", ".join(f"{state} {n:,}" for state, n in summary.live.most_common()) or "none"
    console.print(
        f"{path}: {summary.lines:,} transitions of {summary.records:,} records follow the spec; "
        f"{len(summary.edges)} of {len(spec.edges())} edges taken; ended: {ended}; "
        f"still live: {live}",
        markup=False,
        soft_wrap=True,
    )
    return 0


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from .fuzz.campaign import DATABASE, edge_table, run_campaign
    from .fuzz.machine import PAGE, configured
    from .registry import tree_factory

    if args.steps is None and args.budget is None:
        args.steps = 20_000
    if args.target == "sglang":
        return _fuzz_sglang(args, DATABASE)
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
    _report_unreached(result.unreached)
    if args.log:
        console.print(f"wrote {args.log}: the transition log of the last program run")
    if result.failure is not None:
        console.print(
            f"[red]VIOLATION[/red] {type(result.failure).__name__}: {result.failure}\n"
            f"The minimal failing program is printed above; the example is saved in {DATABASE}, "
            "so the next run replays it first."
        )
        return 1
    return 0


def _fuzz_sglang(args: argparse.Namespace, database: Path) -> int:
    from .targets.sglang import require

    if args.log:
        raise ValueError(
            "--log writes stagefate's transition log; SGLang's pipeline has none (the report "
            "counts its decisions instead): drop --log with --target sglang"
        )
    require()
    from .targets.sglang.machine import run_target_campaign

    core = "rust" if args.tree == "sglang-rust" else "python"
    result = run_target_campaign(console, args.steps, args.budget, args.seed, core, args.profile)
    table = Table(title="SGLang's decisions reached")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for name, count in result.outcomes.items():
        table.add_row(name, f"{count:,}" if count else "[red]0[/red]")
    console.print(table)
    console.print(
        f"{result.states:,} states checked in {result.programs:,} programs over SGLang 0.5.23's "
        f"BufferModePipeline ({core} tree core), {result.seconds:.0f} s, seed {args.seed}"
    )
    if result.failure is not None:
        console.print(
            f"[red]VIOLATION[/red] {type(result.failure).__name__}: {result.failure}\n"
            f"The minimal failing program is printed above; the example is saved in {database}."
        )
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stagefate", description="Staged KV-cache prefetch lifecycle: spec, checks, jobs."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    replay = sub.add_parser(
        "replay", help="replay a Mooncake trace through the pipeline: live tree vs blind gamble"
    )
    replay.add_argument("--trace", help="Mooncake-format .jsonl (default: the embedded slice)")
    replay.add_argument("--limit", type=int, help="replay only the first N requests")
    replay.add_argument(
        "--policy",
        choices=["live", "blind", "sglang", "all"],
        default="all",
        help="all: live, blind, and sglang where SGLang 0.5.23 is installed (make sglang)",
    )
    replay.add_argument(
        "--speed",
        type=float,
        default=DEFAULT_SPEED,
        help=f"arrival speed (timestamps divided by it; default {DEFAULT_SPEED}: one H200 "
        "carries about a third of the trace's rate, docs/replay.md)",
    )
    replay.add_argument("--sweep", help="run every policy at each speed, e.g. 0.5,1,2,4")
    replay.add_argument("--model", choices=sorted(PRESETS), default=DEFAULT_PRESET)
    replay.add_argument("--costs", help="YAML/JSON file of cost-model fields to override")
    replay.add_argument(
        "--device-tokens", type=int, help="device KV pool (default: what the GPU holds)"
    )
    replay.add_argument("--host-tokens", type=int, default=256 * 1024, help="bounce buffer")
    replay.add_argument("--page-size", type=int, default=64)
    replay.add_argument(
        "--prefetch-policy",
        choices=["timeout", "best_effort", "wait_complete"],
        default="timeout",
        help="when admission stops waiting for a prefetch (SGLang's default: timeout)",
    )
    replay.add_argument("--schedule", choices=["fcfs", "lpm"], default="fcfs")
    replay.add_argument("--max-prefill-tokens", type=int, default=16384)
    replay.add_argument("--chunked-prefill-size", type=int, default=8192)
    replay.add_argument("--seed", type=int, default=0, help="seeds the IO-time jitter")
    replay.add_argument(
        "--storage",
        default="memory",
        help="L3: memory (default), file:PATH or mooncake://HOST:PORT[?metrics_port=Q]",
    )
    replay.add_argument(
        "--no-dedup", action="store_true", help="live: read spans a sibling is already reading"
    )
    replay.add_argument("--json", help="write {policy: metrics} to this file")
    replay.add_argument("--log", help="write the live run's transition log (JSON lines) here")
    replay.add_argument(
        "--tree",
        choices=TREES,
        default="stagefate",
        help="the radix tree both policies run on (sglang-*: SGLang 0.5.23's, `make sglang`)",
    )
    replay.add_argument("--plot", help="write a PNG comparing the policies (needs matplotlib)")
    replay.set_defaults(func=_cmd_replay)

    fuzz = sub.add_parser("fuzz", help="stateful fuzz campaign over the real pipeline")
    fuzz.add_argument("--steps", type=int, help="states to check (default 20,000)")
    fuzz.add_argument("--budget", type=float, help="seconds to run instead of a step count")
    fuzz.add_argument("--seed", type=int, default=0)
    fuzz.add_argument("--faults", action=argparse.BooleanOptionalAction, default=True)
    fuzz.add_argument("--profile", default="fuzz", choices=["ci", "dev", "fuzz", "repro"])
    fuzz.add_argument(
        "--log", help="write each program's transition log here (the failing one's on a failure)"
    )
    fuzz.add_argument(
        "--tree",
        choices=TREES,
        default="stagefate",
        help="the radix tree under test (sglang-*: SGLang 0.5.23's, after `make sglang`)",
    )
    fuzz.add_argument(
        "--target",
        choices=["stagefate", "sglang"],
        default="stagefate",
        help="the pipeline under test: stagefate's, or SGLang 0.5.23's BufferModePipeline "
        "(its tree core from --tree sglang-python|sglang-rust; python by default)",
    )
    fuzz.set_defaults(func=_cmd_fuzz)

    check = sub.add_parser(
        "check", help="static checks of the lifecycle spec, then the exhaustive model checker"
    )
    check.add_argument("--spec", help="spec file (default: the shipped lifecycle.yaml)")
    check.add_argument("--static", action="store_true", help="static checks only")
    defaults = Bounds()
    for flag, default, meaning in (
        ("--pages", defaults.pages, "pages of the abstract token line"),
        ("--requests", defaults.requests, "requests (request i wants pages - i)"),
        ("--host-pages", defaults.host_pages, "bounce capacity"),
        ("--device-pages", defaults.device_pages, "device pool capacity"),
        ("--cap-pages", defaults.cap_pages, "anchor-pin cap"),
        ("--threshold-pages", defaults.threshold_pages, "prefetch threshold"),
        ("--issues", defaults.issues_per_request, "prefetches per request (re-issues)"),
        ("--max-states", defaults.max_states, "stop (and report) beyond this many states"),
    ):
        check.add_argument(flag, type=int, default=default, help=f"model check: {meaning}")
    check.set_defaults(func=_cmd_check)

    validate = sub.add_parser(
        "validate", help="check a transition log (JSON lines) against the lifecycle spec"
    )
    validate.add_argument("log", help="the log: one transition a line (stagefate replay --log)")
    validate.add_argument("--spec", help="spec file (default: the shipped lifecycle.yaml)")
    validate.set_defaults(func=_cmd_validate)

    diagram = sub.add_parser("diagram", help="regenerate docs/lifecycle.md and .svg from the spec")
    diagram.add_argument("--spec", help="spec file (default: the shipped lifecycle.yaml)")
    diagram.add_argument("--out", default="docs", help="output folder (default: docs)")
    diagram.add_argument("--check", action="store_true", help="exit 1 if docs/ is out of step")
    diagram.set_defaults(func=_cmd_diagram)

    bench = sub.add_parser("bench", help="run benchmarks, write docs/benchmarks.md")
    bench.add_argument("which", nargs="?", default="all", choices=["all", *_bench_runners()])
    bench.add_argument("--report", default="docs/benchmarks.md", help="report file")
    bench.add_argument("--trace", help="trace for the replay bench (default: the embedded slice)")
    bench.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="where copy and lifecycle run (auto: cuda when a GPU is visible)",
    )
    bench.add_argument(
        "--peer",
        choices=["sglang"],
        help="tree: also run SGLang 0.5.23's trees on the §9.1 workload; lifecycle: also its "
        "BufferModePipeline, alternated prefetch by prefetch (`make sglang`)",
    )
    bench.set_defaults(func=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit status (0 success, 1 a check failed, 2 bad usage)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(args_list)
    args.argv = args_list[1:]
    try:
        result: int = args.func(args)
    except (SpecError, ValueError, RuntimeError, OSError) as exc:
        console.print(f"[red]error:[/red] {exc}", soft_wrap=True)  # paths stay on one line
        return 2
    return result


if __name__ == "__main__":
    sys.exit(main())
