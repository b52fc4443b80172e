"""Running policies over a trace: each replay with its progress bar and the logs asked for."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.progress import Progress

from ..statemachine.record import Instrument
from ..transition_log import TransitionLog
from .live import LivePolicy
from .policy import LogsTransitions, PolicyFactory
from .ranks import RankedReplay, build_replay, replays_of
from .replay import Replay, ReplayOptions
from .trace import TraceRequest


def replay_policies(
    trace: list[TraceRequest],
    policies: Mapping[str, PolicyFactory],
    options: ReplayOptions,
    console: Console | None = None,
    live_instruments: Sequence[Sequence[Instrument]] = (),
    design_logs: Mapping[str, TransitionLog] | None = None,
) -> dict[str, Replay | RankedReplay]:
    """Each policy (``{name: factory}``, :func:`stagefate.registry.policy_factories`) on a
    fresh engine over the same trace and seed (as ``options.tp_size`` ranks where it is more
    than one), with a progress bar each; ``live_instruments[r]`` watch rank ``r``'s live
    pipeline (a transition log, metrics); ``design_logs[name]`` gets that policy's
    transitions in its own design's words."""
    replays: dict[str, Replay | RankedReplay] = {}
    with Progress(console=console, transient=False, disable=console is None) as progress:
        for name, factory in policies.items():
            task = progress.add_task(f"replay {name} ×{options.speed:g}", total=len(trace))
            replays[name] = replay = build_replay(factory, trace, options)
            for rank, instruments in zip(replays_of(replay), live_instruments, strict=False):
                if isinstance(rank.policy, LivePolicy):
                    rank.policy.pipe.instruments.extend(instruments)
            log = (design_logs or {}).get(name)
            if log is not None:
                attach_design_log(replay, name, log)
            replay.run(on_request=functools.partial(progress.advance, task))
    return replays


def attach_design_log(replay: Replay | RankedReplay, name: str, log: TransitionLog) -> None:
    """The ``name`` policy's pipeline writes its transitions to ``log`` in its own design's
    words (``log.spec`` says which)."""
    policy = replays_of(replay)[0].policy
    if not isinstance(policy, LogsTransitions):
        raise ValueError(f"the {name} policy writes no transition log of its own")
    log.spec = policy.log_transitions(log)
