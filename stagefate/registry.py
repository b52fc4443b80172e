"""The one place that knows every implementation stagefate can run: its own and the targets'.

Everything below the public face (the pipeline, the replay's engine and policies, the fuzzer)
takes a factory and never imports :mod:`stagefate.targets`; the CLI and the benchmarks resolve
the names a user gives (``--tree``, ``--policy``) here. A test walks the import graph and holds
this rule (tests/test_imports.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .runtime import RadixTree, Storage
from .runtime.prefix_tree import TreeFactory
from .sim.blind import BlindPolicy
from .sim.live import LivePolicy
from .sim.policy import Policy, PolicyFactory, PolicyInputs
from .sim.replay import Replay, ReplayOptions
from .sim.trace import TraceRequest
from .statemachine.pipeline import BufferPipeline

if TYPE_CHECKING:
    from .targets.sglang.environments import Installed

TREES = ("stagefate", "sglang-python", "sglang-rust")
"""Tree names ``--tree`` accepts: stagefate's own, or SGLang's with either tree core. SGLang's
take a release (``sglang-rust==0.5.21``); without one, the newest installed."""
SGLANG_NAMES = ("sglang", "sglang-python", "sglang-rust")
"""The names that are SGLang's, and so may carry a release."""


def split(name: str, choices: Sequence[str], kind: str) -> tuple[str, str | None]:
    """``name`` as ``(base, release)``: the base one of ``choices``, the release (SGLang's
    names only) checked against the releases stagefate drives."""
    from .targets.sglang.releases import split_name

    base = name.partition("==")[0]
    if base not in choices:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(choices)}")
    if base not in SGLANG_NAMES:
        if base != name:
            raise ValueError(f"{kind} {base!r} is stagefate's own and takes no release: {base}")
        return base, None
    return split_name(name, (base,))


def tree_factory(name: str) -> TreeFactory:
    """The tree ``name`` as a factory the pipeline, the replay and the fuzzer take (an SGLang
    tree of the release this interpreter imports)."""
    base, _ = split(name, TREES, "tree")
    if base == "stagefate":
        return RadixTree
    from .targets.sglang.tree import sglang_tree_factory

    return sglang_tree_factory(base.removeprefix("sglang-"))


def _pipeline(inputs: PolicyInputs) -> BufferPipeline:
    return BufferPipeline(
        inputs.config,
        storage=inputs.storage,
        tree_factory=tree_factory(inputs.tree),
        group=inputs.group,
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
    """``{name: factory}`` for ``names`` (``sglang==V``: the release this interpreter
    imports); an unknown name is refused with the choices."""
    return {name: POLICIES[split(name, list(POLICIES), "policy")[0]] for name in names}


def target_for(policy: str | None, tree: str) -> Installed | None:
    """Where a run of ``policy`` (None: stagefate's pipeline) on ``tree`` runs: the SGLang
    release it imports (this interpreter's, or another environment's), or None when it
    imports none. The two names may not ask for different releases: one interpreter holds one
    sglang."""
    from .targets.sglang.environments import resolve

    policy_base, policy_release = (
        ("live", None) if policy is None else split(policy, list(POLICIES), "policy")
    )
    tree_base, tree_release = split(tree, TREES, "tree")
    if policy_release and tree_release and policy_release != tree_release:
        raise ValueError(
            f"--policy {policy} and --tree {tree} name two SGLang releases; one process holds "
            "one sglang: name the same release, or one of them"
        )
    if policy_base not in SGLANG_NAMES and tree_base not in SGLANG_NAMES:
        return None
    return resolve(policy_release or tree_release)


def peer_targets(peer: str) -> list[Installed]:
    """``--peer``: comma-separated SGLang names (``sglang`` the newest installed, ``sglang==V``),
    each resolved to the installed release (refused, naming the install, when it is not)."""
    from .targets.sglang.environments import resolve

    names = [name.strip() for name in peer.split(",") if name.strip()]
    if not names:
        raise ValueError(f"--peer {peer!r}: name sglang or sglang==V (comma-separated)")
    found = [resolve(split(name, ("sglang",), "peer")[1]) for name in names]
    if len({target.version for target in found}) != len(found):
        raise ValueError(f"--peer {peer!r} names one release twice; name each once")
    return found


def make_replay(
    policy: str,
    trace: list[TraceRequest],
    options: ReplayOptions | None = None,
    storage: Storage | None = None,
) -> Replay:
    """A :class:`~stagefate.sim.replay.Replay` of the policy named ``policy``."""
    return Replay(policy_factories([policy])[policy], trace, options, storage)


def policies_for_all(
    storage: str = "memory", releases: Sequence[str] = ()
) -> tuple[list[str], str | None]:
    """What ``--policy all`` runs here (with ``releases``: ``sglang==V`` for each, all of
    them installed), and why SGLang is left out (None when it is not)."""
    from .targets.sglang.environments import installed, resolve
    from .targets.sglang.releases import release

    if releases:
        for version in releases:
            resolve(release(version).version)  # refused, naming the install, if it is not here
        if storage != "memory":
            raise ValueError("SGLang's releases read their own L3, not --storage: drop one")
        return ["live", "blind", *(f"sglang=={version}" for version in releases)], None
    ours = ["live", "blind"]
    if not installed():
        return ours, "no SGLang release is installed here; run `make sglang` to add sglang"
    if storage != "memory":
        return ours, "sglang reads its own L3, not --storage"
    return [*ours, "sglang"], None
