"""Runs replays by policy name: here, in the process of the SGLang release a policy needs, or in
a pool of processes (seeds, sweeps). :mod:`.registry` says what each name is; this module only
runs them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, TypeVar

from .registry import policy_factories, target_for
from .sim.instances import InstancesMetrics, InstancesReplay
from .sim.ranks import build_replay
from .sim.replay import ReplayMetrics, ReplayOptions
from .sim.trace import TraceRequest
from .transition_log import TransitionLog, closing_logs

RunKey = TypeVar("RunKey")
ReplayDone = Callable[[str, ReplayOptions, ReplayMetrics], None]
"""Told of each finished run of a pool: its policy, its options, its metrics."""


def run_replay(
    policy: str,
    trace: list[TraceRequest],
    options: ReplayOptions,
    sglang_env: Mapping[str, str] | None = None,
) -> ReplayMetrics:
    """One replay of ``policy``, in the process of the SGLang release it needs (this one when
    it needs none or this interpreter's), with ``sglang_env`` set there."""
    from .targets.sglang.worker import call_in

    target = target_for(policy, options.tree)
    if target is None:  # no SGLang in it: nothing reads sglang_env
        return build_replay(policy_factories([policy])[policy], trace, options).run()
    dumped = call_in(target, _replay_one, policy, trace, options, sglang_env=sglang_env)
    return ReplayMetrics.model_validate(dumped)


def run_replay_logged(
    policy: str,
    trace: list[TraceRequest],
    options: ReplayOptions,
    log_path: Path,
    sglang_env: Mapping[str, str] | None = None,
) -> tuple[ReplayMetrics, Path, int]:
    """:func:`run_replay` with the policy's pipeline writing its transitions, in its own
    design's words, to ``log_path``: the figures, the design's spec and the transitions
    written."""
    from .targets.sglang.worker import call_in

    target = target_for(policy, options.tree)
    if target is None:
        raise ValueError(f"the {policy} policy writes no transition log of its own")
    dumped, spec, transitions = call_in(
        target, _replay_logged, policy, trace, options, str(log_path), sglang_env=sglang_env
    )
    return ReplayMetrics.model_validate(dumped), Path(spec), transitions


def _replay_logged(
    policy: str, trace: list[TraceRequest], options: ReplayOptions, log_path: str
) -> tuple[dict[str, Any], str, int]:
    """One replay writing its design log, here (module level: a release's worker calls it)."""
    from .sim.running import attach_design_log

    replay = build_replay(policy_factories([policy])[policy], trace, options)
    log = TransitionLog.open(log_path)
    with closing_logs([log]):
        attach_design_log(replay, policy, log)
        metrics = replay.run()
    return metrics.model_dump(), str(log.spec), log.seq


def run_instances(
    policy: str,
    trace: list[TraceRequest],
    options: ReplayOptions,
    instances: int,
    router: str,
    sglang_env: Mapping[str, str] | None = None,
) -> InstancesMetrics:
    """``instances`` engines of ``policy`` behind ``router`` over one L3, in the process of the
    SGLang release it needs (as :func:`run_replay`)."""
    from .targets.sglang.worker import call_in

    target = target_for(policy, options.tree)
    if target is None:
        return _instances_one(policy, trace, options, instances, router)
    dumped = call_in(
        target, _instances_dumped, policy, trace, options, instances, router, sglang_env=sglang_env
    )
    return InstancesMetrics.model_validate(dumped)


def _instances_one(
    policy: str, trace: list[TraceRequest], options: ReplayOptions, instances: int, router: str
) -> InstancesMetrics:
    factory = policy_factories([policy])[policy]
    return InstancesReplay(factory, trace, options, instances, router).run()


def _instances_dumped(
    policy: str, trace: list[TraceRequest], options: ReplayOptions, instances: int, router: str
) -> dict[str, Any]:
    """:func:`_instances_one` as plain data (module level: a release's worker calls it)."""
    return _instances_one(policy, trace, options, instances, router).model_dump()


def _replay_one(policy: str, trace: list[TraceRequest], options: ReplayOptions) -> dict[str, Any]:
    """One replay, here (module level, so a process pool or a release's worker can call it)."""
    return build_replay(policy_factories([policy])[policy], trace, options).run().model_dump()


def pool_size(jobs: int | None, runs: int) -> int:
    """Processes for ``runs`` replays: ``jobs``, by default the cores, never more than runs."""
    return max(1, min(jobs or os.cpu_count() or 1, runs))


def _pool_worker() -> None:
    """A pool worker's torch runs one intra-op thread: the processes are the parallelism (two
    workers of two threads each on two cores take 3x as long as one thread each). Ctrl-C is
    the parent's to handle (it stops the pool): a worker ignores it, so an interrupt prints
    one line, not a traceback a worker."""
    import torch

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)


def _replay_task(
    policy: str,
    trace: list[TraceRequest],
    options: ReplayOptions,
    sglang_env: Mapping[str, str] | None,
) -> dict[str, Any]:
    """One replay of a process pool, in the process its release needs."""
    from .targets.sglang.logs import route_sglang_logs

    route_sglang_logs()
    return run_replay(policy, trace, options, sglang_env).model_dump()


def replay_over_seeds(
    trace: list[TraceRequest],
    policies: Sequence[str],
    options: ReplayOptions,
    seeds: Sequence[int],
    jobs: int | None = None,
    sglang_env: Mapping[str, str] | None = None,
    on_done: ReplayDone | None = None,
) -> dict[str, list[ReplayMetrics]]:
    """Each policy replayed once per IO-jitter seed, in ``jobs`` processes (default: the
    cores); ``{policy: [metrics of each seed, in seed order]}``. ``on_done`` as for
    :func:`replay_in_processes`."""
    runs = {
        (name, seed): (name, options.model_copy(update={"seed": seed}))
        for name in policies
        for seed in seeds
    }
    results = replay_in_processes(trace, runs, jobs, sglang_env, on_done)
    return {name: [results[(name, seed)] for seed in seeds] for name in policies}


def replay_in_processes(
    trace: list[TraceRequest],
    runs: Mapping[RunKey, tuple[str, ReplayOptions]],
    jobs: int | None = None,
    sglang_env: Mapping[str, str] | None = None,
    on_done: ReplayDone | None = None,
) -> dict[RunKey, ReplayMetrics]:
    """Every run (``{key: (policy, options)}``) replayed in ``jobs`` processes (default: the
    cores), each in the environment its SGLang release needs; the metrics by key.

    ``on_done(policy, options, metrics)`` is called in this process as each run finishes, in
    the order they finish: a sweep of SGLang replays runs for an hour, and its caller can say
    how far it got."""
    from .targets.sglang.worker import build_native_hash, call_in

    targets = {  # an unknown or uninstalled one is refused before any process starts
        target.version: target
        for target in (target_for(name, options.tree) for name, options in runs.values())
        if target is not None
    }
    for target in targets.values():  # before the processes fan out (build_native_hash says why)
        call_in(target, build_native_hash)
    workers = pool_size(jobs, len(runs))
    # spawn, not fork: a child forked after torch ran a parallel op can hang in OpenMP
    spawn = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(workers, spawn, initializer=_pool_worker)
    try:
        futures = {
            pool.submit(_replay_task, name, trace, options, sglang_env): key
            for key, (name, options) in runs.items()
        }
        results = {}
        for future in as_completed(futures):
            key = futures[future]
            results[key] = ReplayMetrics.model_validate(future.result())
            if on_done is not None:
                on_done(*runs[key], results[key])
    except BaseException:  # Ctrl-C or a failed run: stop the workers now, not after the rest
        # (no public call ends a ProcessPoolExecutor's workers before Python 3.14's
        # terminate_workers; they ignore SIGINT, so without it the shutdown waits their runs)
        workers_running: dict[int, Any] = getattr(pool, "_processes", None) or {}
        for process in list(workers_running.values()):
            process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    return {key: results[key] for key in runs}
