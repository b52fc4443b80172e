"""``stagefate replay``'s run modes, one function each: one run of every policy, a load sweep,
every policy over several IO-jitter seeds, several instances behind a router; and the options,
policies' runs and report (JSON, plot) they share. :mod:`.replay` checks the flags and picks the
mode."""

from __future__ import annotations

import argparse
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..registry import TREES, policy_factories
from ..sim.bound import TraceBound
from ..sim.costs import load_costs
from ..sim.engine_model import EngineOptions
from ..sim.policy import Policy
from ..sim.replay import ReplayMetrics, ReplayOptions
from ..sim.trace import TraceRequest
from ..spec.load import DEFAULT_SPEC_PATH
from ..transition_log import TransitionLog, closing_logs
from .common import console, spec_source
from .model_options import FieldFlag, field_values

if TYPE_CHECKING:
    from ..sim.report_json import RunDescription

DEFAULT_ROUTER = "cache_aware"
"""--instances' router: SGLang's."""


FIELD_FLAGS = {
    flag.dest: flag
    for flag in (
        FieldFlag(
            ReplayOptions,
            "device_tokens",
            "--device-tokens",
            "device KV pool in tokens",
            "device KV pool (default: what the GPU holds)",
        ),
        FieldFlag(
            ReplayOptions,
            "host_tokens",
            "--host-tokens",
            "host bounce buffer in tokens",
            "bounce buffer in tokens",
        ),
        FieldFlag(ReplayOptions, "page_size", "--page-size", "tokens per page"),
        FieldFlag(
            ReplayOptions,
            "prefetch_threshold",
            "--prefetch-threshold",
            "tokens below which a span is not fetched",
        ),
        FieldFlag(
            EngineOptions,
            "prefetch_policy",
            "--prefetch-policy",
            "stop policy",
            "when admission stops waiting for a prefetch (SGLang's default: timeout)",
        ),
        FieldFlag(
            EngineOptions,
            "schedule",
            "--schedule",
            "admission order",
            "admission order: first come first served, or longest prefix match first",
        ),
        FieldFlag(
            EngineOptions, "max_prefill_tokens", "--max-prefill-tokens", "prefill tokens per step"
        ),
        FieldFlag(
            EngineOptions,
            "chunked_prefill_size",
            "--chunked-prefill-size",
            "tokens per prefill chunk",
        ),
        FieldFlag(
            ReplayOptions, "seed", "--seed", "the IO-time jitter's seed", "seeds the IO-time jitter"
        ),
        FieldFlag(
            ReplayOptions,
            "storage",
            "--storage",
            "the L3",
            "L3: memory, file:PATH or mooncake://HOST:PORT[?metrics_port=Q]",
        ),
        FieldFlag(
            ReplayOptions,
            "tp_size",
            "--tp",
            "tensor-parallel ranks",
            "replay the live pipeline as N tensor-parallel ranks in lockstep, each its "
            "own engine over its KV shard; the cost model's tensor_parallel becomes N "
            "(1: one pipeline, the preset's GPUs in the time model only)",
        ),
        FieldFlag(
            ReplayOptions,
            "tree",
            "--tree",
            "the radix tree",
            f"the radix tree the policies run on: {', '.join(TREES)} (SGLang's take a "
            "release, e.g. sglang-rust==0.5.21; without one, the newest installed)",
        ),
    )
}
"""The flags that set a field of the option models, each read from its field."""


def replay_options(args: argparse.Namespace, speed: float) -> ReplayOptions:
    engine = EngineOptions(**field_values(args, FIELD_FLAGS, EngineOptions))
    costs = load_costs(args.model, args.costs)
    if args.tp > 1 and costs.tensor_parallel != args.tp:
        one_gpu = re.sub(r"^\d+x |\s*\(TP \d+\)$", "", costs.gpu)  # "4x H200 SXM (TP 4)"
        gpus = f"{args.tp}x {one_gpu} (TP {args.tp})"
        # validated anew (model_copy checks nothing): the ranks must divide the KV heads
        costs = type(costs).model_validate(
            {**costs.model_dump(), "tensor_parallel": args.tp, "gpu": gpus}
        )
    return ReplayOptions(
        **field_values(args, FIELD_FLAGS, ReplayOptions),
        speed=speed,
        dedup_inflight=not args.no_dedup,
        arrivals=args.arrivals or "open",
        costs=costs,
        engine=engine,
    )


def run_policies(
    trace: list[TraceRequest],
    policies: list[str],
    options: ReplayOptions,
    sglang_env: dict[str, str],
    logs: list[list[TransitionLog]],
    design_logs: dict[str, Path] | None = None,
) -> tuple[dict[str, ReplayMetrics], dict[str, Policy], dict[str, tuple[Path, int]]]:
    """Every policy once: those this interpreter can run here, with progress bars (rank r's
    live run watched by ``logs[r]``), each other SGLang release in its own environment's
    process; ``design_logs[name]``: where that SGLang policy writes its transitions in its
    design's words. The figures of each, the policies run here, and each design log's spec
    and transitions written."""
    from ..registry import target_for
    from ..runner import run_replay, run_replay_logged
    from ..sim.running import replay_policies
    from ..targets.sglang.worker import environment_set

    design_logs = design_logs or {}
    targets = {name: target_for(name, options.tree) for name in policies}
    local = [name for name, target in targets.items() if target is None or target.here]
    opened = {name: TransitionLog.open(path) for name, path in design_logs.items() if name in local}
    with closing_logs(opened.values()), environment_set(sglang_env):
        replays = replay_policies(trace, policy_factories(local), options, console, logs, opened)
    written = {name: (log.spec or DEFAULT_SPEC_PATH, log.seq) for name, log in opened.items()}
    results = {}
    for name, target in targets.items():
        if name in replays:
            results[name] = replays[name].metrics
            continue
        assert target is not None
        console.print(f"replay {name} ×{options.speed:g} in SGLang {target.version}'s process")
        if name in design_logs:
            results[name], spec, transitions = run_replay_logged(
                name, trace, options, design_logs[name], sglang_env
            )
            written[name] = (spec, transitions)
        else:
            results[name] = run_replay(name, trace, options, sglang_env)
    return results, {name: replay.policy for name, replay in replays.items()}, written


def sweep(
    args: argparse.Namespace,
    trace: list[TraceRequest],
    policies: list[str],
    speeds: list[float],
    sglang_env: dict[str, str],
    report: Report,
) -> int:
    """Every policy at every speed: the sweep table and the bound's story."""
    from ..sim.plots import write_sweep_plot
    from ..sim.report_json import sweep_body
    from ..sim.stories import bound_story
    from ..sim.tables import sweep_table

    results = _sweep_runs(args, trace, policies, speeds, sglang_env)
    console.print(sweep_table(results))
    for line in bound_story(results, report.bound):
        console.print(line)
    report.save(sweep_body(results), functools.partial(write_sweep_plot, results))
    return 0


def _sweep_runs(
    args: argparse.Namespace,
    trace: list[TraceRequest],
    policies: list[str],
    speeds: list[float],
    sglang_env: dict[str, str],
) -> dict[float, dict[str, ReplayMetrics]]:
    """Every policy at every speed, each run in a process of a pool (``--jobs``)."""
    from ..runner import pool_size, replay_in_processes
    from ..sim.stories import counted

    runs = {
        (speed, name): (name, replay_options(args, speed)) for speed in speeds for name in policies
    }
    workers = pool_size(args.jobs, len(runs))
    console.print(
        f"{counted(len(runs), 'replay')} ({counted(len(speeds), 'speed')}), "
        f"in up to {counted(workers, 'process')}"
    )
    results = replay_in_processes(trace, runs, args.jobs, sglang_env, Progress(len(runs)))
    return {speed: {name: results[(speed, name)] for name in policies} for speed in speeds}


def behind_the_router(
    args: argparse.Namespace,
    trace: list[TraceRequest],
    policies: list[str],
    options: ReplayOptions,
    report: Report,
    arrival_ms: float,
    sglang_env: dict[str, str],
) -> int:
    """Every policy as ``--instances`` engines behind ``--router``, on the same arrivals."""
    from ..runner import run_instances
    from ..sim.report_json import policies_body
    from ..sim.stories import bound_story, cross_instance_story, story
    from ..sim.tables import instances_table, metrics_table

    results = {}
    router = args.router or DEFAULT_ROUTER
    for name in policies:
        console.print(
            f"replay {name} ×{options.speed:g} on {args.instances} instances behind {router}"
        )
        results[name] = run_instances(name, trace, options, args.instances, router, sglang_env)
    totals = {name: m.total for name, m in results.items()}
    console.print(metrics_table(totals, report.bound))
    for name, metrics in results.items():
        console.print(instances_table(name, metrics))
    lines = story(totals, arrival_ms / 1e3 / args.speed) + cross_instance_story(results)
    for line in lines + bound_story({args.speed: totals}, report.bound):
        console.print(line)
    report.save(policies_body(results))
    return 0


def design_log_path(path: Path, policy: str) -> Path:
    """Where ``--log PATH`` puts an SGLang policy's log: ``live.sglang.jsonl`` beside
    ``live.jsonl`` for ``sglang``, ``live.sglang-0.5.19.jsonl`` for ``sglang==0.5.19``."""
    return path.with_name(f"{path.stem}.{policy.replace('==', '-')}{path.suffix}")


def rank_log_path(path: Path, rank: int, ranks: int) -> Path:
    """Rank ``rank``'s transition log: ``path`` itself for one rank, else ``live.rank1.jsonl``
    for ``live.jsonl``."""
    return path if ranks == 1 else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def over_seeds(
    args: argparse.Namespace,
    trace: list[TraceRequest],
    policies: list[str],
    speeds: list[float],
    seeds: list[int],
    sweeping: bool,
    sglang_env: dict[str, str],
    report: Report,
) -> int:
    """Every policy once per seed (and speed), in processes; figures as median [min–max]."""
    from ..runner import pool_size, replay_over_seeds
    from ..sim.plots import write_spread_sweep_plot
    from ..sim.report_json import spread_body, spread_sweep_body
    from ..sim.stories import bound_story, counted, spread_story
    from ..sim.tables import spread_sweep_table, spread_table

    per_speed = len(policies) * len(seeds)  # one pool a speed
    console.print(
        f"{counted(len(policies), 'policy', 'policies')} × {counted(len(seeds), 'seed')}"
        + (f" × {counted(len(speeds), 'speed')}" if sweeping else "")
        + f", in up to {counted(pool_size(args.jobs, per_speed), 'process')}"
    )
    progress = Progress(per_speed * len(speeds), seeds=True)
    sweep = {
        speed: replay_over_seeds(
            trace, policies, replay_options(args, speed), seeds, args.jobs, sglang_env, progress
        )
        for speed in speeds
    }
    if sweeping:
        console.print(spread_sweep_table(sweep, seeds, report.bound))
        for line in bound_story(sweep, report.bound):
            console.print(line)
        report.save(
            spread_sweep_body(sweep, seeds), functools.partial(write_spread_sweep_plot, sweep)
        )
        return 0
    runs = sweep[speeds[0]]
    console.print(spread_table(runs, seeds, report.bound))
    for line in spread_story(runs, seeds) + bound_story(sweep, report.bound):
        console.print(line)
    report.save(spread_body(runs, seeds))
    return 0


class Progress:
    """One line a finished replay of a pool, as it finishes: a sweep of SGLang's replays over
    seeds runs for an hour, and its table comes only at the end."""

    def __init__(self, total: int, seeds: bool = False) -> None:
        self.total = total
        self.seeds = seeds
        self.done = 0

    def __call__(self, policy: str, options: ReplayOptions, metrics: ReplayMetrics) -> None:
        self.done += 1
        seed = f" seed {options.seed}" if self.seeds else ""
        console.print(
            f"  {self.done} of {self.total}: {policy} ×{options.speed:g}{seed}: "
            f"{metrics.l3_reads:,} L3 reads, {metrics.l3_reads_wasted:,} wasted, hit rate "
            f"{metrics.hit_rate:.3f} ({metrics.wall_seconds:.0f} s)"
        )


class Report:
    """Where ``--json`` and ``--plot`` go, and what the JSON says about the run."""

    def __init__(self, args: argparse.Namespace, bound: TraceBound, run: RunDescription):
        self.json_path = args.json
        self.plot_path = args.plot
        self.bound = bound
        self.run = run

    def save(self, body: dict[str, Any], write_plot: Callable[[Path], None] | None = None) -> None:
        """The JSON (``body`` in :mod:`~stagefate.sim.report_json`'s envelope) and the plot,
        each where asked."""
        from ..sim.report_json import write_report

        if self.json_path:
            write_report(Path(self.json_path), self.run, self.bound, body)
            console.print(f"wrote {self.json_path}")
        if self.plot_path and write_plot is not None:
            write_plot(Path(self.plot_path))
            console.print(f"wrote {self.plot_path}")


def one_run(
    args: argparse.Namespace,
    trace: list[TraceRequest],
    policies: list[str],
    first: ReplayOptions,
    releases: dict[str, str],
    sglang_env: dict[str, str],
    report: Report,
    arrival_ms: float,
) -> int:
    """Every policy once at ``first``'s speed: the table, the story, the logs asked for."""
    from ..sim.plots import write_plot
    from ..sim.report_json import policies_body
    from ..sim.stories import bound_story, in_short, story
    from ..sim.tables import metrics_table, wasted_table

    bound = report.bound
    live_logged = bool(args.log) and "live" in policies
    paths = [
        rank_log_path(Path(args.log), rank, args.tp)
        for rank in range(args.tp if live_logged else 0)
    ]
    logs = [TransitionLog.open(path) for path in paths]
    design_logs = {
        name: design_log_path(Path(args.log), name) for name in (releases if args.log else {})
    }
    with closing_logs(logs):
        results, ran, written = run_policies(
            trace, policies, first, sglang_env, [[log] for log in logs], design_logs
        )
    if logs:
        console.print(
            f"wrote {', '.join(map(str, paths))} ({logs[0].seq:,} transitions"
            + (" each" if len(logs) > 1 else "")
            + f"; `stagefate validate {' '.join(map(str, paths))}`"
            + (": identical logs say the ranks kept lockstep)" if len(logs) > 1 else ")")
        )
    for name, (spec, transitions) in written.items():
        console.print(
            f"wrote {design_logs[name]} ({name}'s {transitions:,} transitions in its design's "
            f"words; `stagefate validate --spec {spec_source(spec)} {design_logs[name]}`)",
            soft_wrap=True,
        )
    heading = f"{len(trace):,} requests of {report.run.source} at {first.speed:g}x"
    for line in in_short(results, bound, heading, releases):
        console.print(line)
    console.print(metrics_table(results, bound))
    if any(m.wasted_by_reason for m in results.values()):
        console.print(wasted_table(results))
    lines = story(results, arrival_ms / 1e3 / args.speed, ran, releases)
    for line in lines + bound_story({args.speed: results}, bound):
        console.print(line)
    report.save(policies_body(results), functools.partial(write_plot, results))
    return 0
