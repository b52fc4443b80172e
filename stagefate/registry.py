"""The one place that knows every implementation stagefate can run: its own and the targets'.

Everything below the public face (the pipeline, the replay's engine and policies, the fuzzer)
takes a factory and never imports :mod:`stagefate.targets`; the CLI and the benchmarks resolve
the names a user gives (``--tree``, ``--policy``) here. A test walks the import graph and holds
this rule (tests/test_imports.py).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from .runtime import RadixTree, Storage
from .runtime.prefix_tree import TreeFactory
from .sim.blind import BlindPolicy
from .sim.live import LivePolicy
from .sim.policy import Policy, PolicyFactory, PolicyInputs
from .sim.replay import Replay, ReplayMetrics, ReplayOptions
from .sim.trace import TraceRequest
from .statemachine.pipeline import BufferPipeline
from .targets import TargetUnavailable

TREES = ("stagefate", "sglang-python", "sglang-rust")
"""Tree names ``--tree`` accepts: stagefate's own, or SGLang's with either tree core."""


def tree_factory(name: str) -> TreeFactory:
    """The tree ``name`` as a factory the pipeline, the replay and the fuzzer take."""
    if name == "stagefate":
        return RadixTree
    if name in ("sglang-python", "sglang-rust"):
        from .targets.sglang.tree import sglang_tree_factory

        return sglang_tree_factory(name.removeprefix("sglang-"))
    raise ValueError(f"unknown tree {name!r}; choose one of {', '.join(TREES)}")


def _pipeline(inputs: PolicyInputs) -> BufferPipeline:
    return BufferPipeline(
        inputs.config, storage=inputs.storage, tree_factory=tree_factory(inputs.tree)
    )


def _sglang(inputs: PolicyInputs) -> Policy:
    from .targets.sglang.policy import SGLangPolicy  # imports SGLang: only when asked for

    return SGLangPolicy(inputs)


POLICIES: dict[str, PolicyFactory] = {
    "live": lambda inputs: LivePolicy(_pipeline(inputs)),
    "blind": lambda inputs: BlindPolicy(_pipeline(inputs)),
    "sglang": _sglang,
}
"""Every policy a replay can compare, by the name ``--policy`` takes."""


def policy_factories(names: Sequence[str]) -> dict[str, PolicyFactory]:
    """``{name: factory}`` for ``names``; an unknown name is refused with the choices."""
    unknown = [name for name in names if name not in POLICIES]
    if unknown:
        raise ValueError(f"unknown policy {unknown[0]!r}; choose one of {sorted(POLICIES)}")
    return {name: POLICIES[name] for name in names}


def make_replay(
    policy: str,
    trace: list[TraceRequest],
    options: ReplayOptions | None = None,
    storage: Storage | None = None,
) -> Replay:
    """A :class:`~stagefate.sim.replay.Replay` of the policy named ``policy``."""
    return Replay(policy_factories([policy])[policy], trace, options, storage)


def policies_for_all(storage: str = "memory") -> tuple[list[str], str | None]:
    """What ``--policy all`` runs here, and why ``sglang`` is left out (None when it is not)."""
    from .targets.sglang import require

    try:
        require()
    except TargetUnavailable as missing:
        return ["live", "blind"], f"{missing} to add sglang"
    if storage != "memory":
        return ["live", "blind"], "sglang reads its own L3, not --storage"
    return ["live", "blind", "sglang"], None


def _replay_one(policy: str, trace: list[TraceRequest], options: ReplayOptions) -> dict[str, Any]:
    """One replay in a worker process (module level, so a process pool can pickle it)."""
    return make_replay(policy, trace, options).run().model_dump()


def replay_over_seeds(
    trace: list[TraceRequest],
    policies: Sequence[str],
    options: ReplayOptions,
    seeds: Sequence[int],
    jobs: int | None = None,
) -> dict[str, list[ReplayMetrics]]:
    """Each policy replayed once per IO-jitter seed, in ``jobs`` processes (default: the
    cores); ``{policy: [metrics of each seed, in seed order]}``."""
    policy_factories(policies)  # an unknown name is refused before any process starts
    tasks = [(name, seed) for name in policies for seed in seeds]
    workers = max(1, min(jobs or os.cpu_count() or 1, len(tasks)))
    # spawn, not fork: a child forked after torch ran a parallel op can hang in OpenMP
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=spawn) as pool:
        futures = {
            (name, seed): pool.submit(
                _replay_one, name, trace, options.model_copy(update={"seed": seed})
            )
            for name, seed in tasks
        }
        return {
            name: [ReplayMetrics.model_validate(futures[(name, seed)].result()) for seed in seeds]
            for name in policies
        }
