"""The one place that knows every implementation stagefate can run: its own and the targets'.

Everything below the public face (the pipeline, the replay's engine and policies, the fuzzer)
takes a factory and never imports :mod:`stagefate.targets`; the CLI and the benchmarks resolve
the names a user gives (``--tree``, ``--policy``) here. A test walks the import graph and holds
this rule (tests/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from .runtime import RadixTree, Storage
from .runtime.prefix_tree import TreeFactory
from .sim.blind import BlindPolicy
from .sim.live import LivePolicy
from .sim.policy import Policy, PolicyFactory, PolicyInputs
from .sim.replay import Replay, ReplayOptions
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
