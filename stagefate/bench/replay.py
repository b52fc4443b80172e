"""``stagefate bench replay``: the replay's wall time and outcome for live, live without dedup,
blind and (where ``make sglang`` installed it) SGLang's own pipeline, in one run, on the embedded
slice or (``--trace``) another trace (a section of its own), each over three IO-jitter seeds.

Targets (docs/design.md §8.1, issue "Replay on a continuous-batching engine"): ``make demo``
(live and blind on the embedded slice) under 30 s on 2 cores; the full synthetic trace with both
policies under 2 minutes.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..registry import policies_for_all
from ..runner import replay_over_seeds
from ..sim.conversations import Turns, infer_turns
from ..sim.replay import ReplayOptions
from ..sim.spread import summary
from ..sim.tables import spread_rows
from ..sim.trace import TraceRequest, load_trace
from .report import Section, table

SEEDS = (0, 1, 2)
"""The IO-jitter seeds every figure is taken over (median [min–max])."""


def bench_options(trace: list[TraceRequest]) -> tuple[ReplayOptions, Turns]:
    """The replay's defaults, arrivals as ``stagefate replay`` chooses them: the bench measures
    the run a user gets."""
    turns = infer_turns(trace)
    return ReplayOptions(arrivals=turns.default_arrivals), turns


def run(trace_path: str | None = None) -> Section:
    trace = load_trace(trace_path)
    options, turns = bench_options(trace)
    policies, _left_out = policies_for_all()
    started = time.perf_counter()
    runs = replay_over_seeds(trace, policies, options, SEEDS)
    plain = replay_over_seeds(
        trace, ["live"], options.model_copy(update={"dedup_inflight": False}), SEEDS
    )
    seconds = time.perf_counter() - started
    results = {
        "live": runs["live"],
        "live, no dedup": plain["live"],
        **{name: runs[name] for name in policies if name != "live"},
    }
    body = table(["metric", *results], spread_rows(results))
    spreads = {name: summary(policy_runs) for name, policy_runs in results.items()}
    live, blind = spreads["live"], spreads["blind"]
    costs = options.costs
    body += (
        f"\n\nTrace: {trace_path or 'the embedded slice'} ({len(trace):,} requests), default "
        f"options: {costs.model} on {costs.gpu} ({costs.device_kv_tokens():,} device KV "
        f"tokens), speed {options.speed:g}, page {options.page_size}, "
        f"{options.host_tokens // 1024} Ki host tokens, prefetch policy "
        f"{options.engine.prefetch_policy}, arrivals {options.arrivals}"
        + (
            f" ({len(turns.predecessor):,} turns, each held until the turn before has finished,"
            " as `stagefate replay` does by default)"
            if options.arrivals == "causal"
            else ""
        )
        + f"; every figure is the median [min–max] over the "
        f"IO-jitter seeds {', '.join(map(str, SEEDS))}, each policy and seed a replay of its "
        f"own in a process pool ({seconds:.0f} s of wall time for all of them). A live replay "
        f"took {live['wall_seconds'].show()} s, a blind one {blind['wall_seconds'].show()} s. "
        f"Live wasted {live['l3_reads_wasted'].show()} of {live['l3_reads'].show()} L3 reads, "
        f"blind {blind['l3_reads_wasted'].show()} of {blind['l3_reads'].show()}; hit rate "
        f"{live['hit_rate'].show(rate=True)} against {blind['hit_rate'].show(rate=True)}. "
    )
    sglang = spreads.get("sglang")
    if sglang is not None:
        body += (
            f"SGLang 0.5.23's own pipeline (`--policy sglang`) took "
            f"{sglang['wall_seconds'].show()} s a replay and wasted "
            f"{sglang['l3_reads_wasted'].show()} of {sglang['l3_reads'].show()}, hit rate "
            f"{sglang['hit_rate'].show(rate=True)}. "
        )
    body += "docs/replay.md explains where each wasted read comes from."
    if trace_path is None:
        return Section("replay", "Trace replay: the embedded slice", body)
    stem = Path(trace_path).stem
    return Section(f"replay-{stem}", f"Trace replay: {stem}", body)
