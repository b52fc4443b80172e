"""``--speed auto``: the arrival speed at which the engine is busy a target share of the time,
and, where every design still serves every reusable page there, the load at which they part.

A replay says something only under load: too light, and every design serves every reusable
page in time (the bound of :mod:`.bound` is met by all); too heavy, and the queue grows without
end. Which speed is which depends on the trace (its arrival rate, its prompt lengths) and on the
cost model, so it is searched rather than guessed: the live policy replays a prefix of the trace
at candidate speeds, and the speed whose ``busy_fraction`` (the share of simulated time the
engine ran a step) is nearest the target is kept. Busy time rises with the arrival speed (a
faster trace leaves the engine fewer idle gaps) and, below saturation, about in proportion: each
candidate is the last one scaled by target / busy, kept inside the bracket the candidates so
far have drawn (else the bracket is halved in log space).

A busy engine is not yet a load that says something: on a trace whose turns come back slowly
(a multi-turn one), every design may still reach the trace's bound at 90 % busy. From the busy
load the parting search goes up by half each time until one design (live or blind: blind,
deciding nothing, misses first) falls below 0.99 of the bound, and the replay runs there.
"""

from __future__ import annotations

import math
import time

from pydantic import BaseModel, ConfigDict

from .policy import PolicyFactory
from .replay import Replay, ReplayOptions
from .trace import TraceRequest

SEARCH_PREFIX = 1000
"""Requests of the trace the search replays at each candidate speed (the embedded slice is
1,000: a shorter prefix of it is its heavy start, busier than the whole at any speed)."""
START_SPEED = 0.3
"""The first candidate: the embedded slice's documented speed."""
SPEED_LIMITS = (1 / 1024, 1024.0)
"""The slowest and fastest speeds tried."""
TOLERANCE = 0.02
"""A candidate this close to the target utilization ends the search."""
MAX_EVALUATIONS = 8


class LoadSearch(BaseModel):
    """What ``--speed auto`` found, and what it cost."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    speed: float
    busy_fraction: float
    """The prefix's busy fraction at ``speed``."""
    utilization: float
    """The target."""
    evaluations: int
    requests: int
    """Requests of the trace each evaluation replayed."""
    seconds: float
    reached: bool
    """False when even the fastest speed tried left the engine idle more than the target."""


def find_speed(
    policy: PolicyFactory,
    trace: list[TraceRequest],
    options: ReplayOptions,
    utilization: float,
) -> LoadSearch:
    """The speed at which ``policy`` keeps the engine busy ``utilization`` of the time, over
    the first :data:`SEARCH_PREFIX` requests of ``trace``."""
    if not 0 < utilization <= 1:
        raise ValueError(
            f"--utilization {utilization:g} must lie in (0, 1]: the share of time the engine "
            "is busy, e.g. 0.9"
        )
    if not trace:
        raise ValueError("--speed auto needs a trace with requests; this one holds none")
    started = time.perf_counter()
    prefix = trace[:SEARCH_PREFIX]
    tried: dict[float, float] = {}
    slowest, fastest = SPEED_LIMITS
    low, high = slowest, fastest  # busy below the target at low, at or above it at high
    speed = START_SPEED
    while len(tried) < MAX_EVALUATIONS:
        run = Replay(policy, prefix, options.model_copy(update={"speed": speed})).run()
        busy = tried[speed] = run.engine.busy_fraction
        if abs(busy - utilization) <= TOLERANCE:
            break
        if busy < utilization:
            low = max(low, speed)
        else:
            high = min(high, speed)
        # busy time grows about as the speed below saturation: scale to the target, unless
        # that leaves the bracket (near saturation), then halve it in log space
        proposal = speed * utilization / max(busy, 1e-6)
        if not low < proposal < high:
            proposal = math.sqrt(low * high)
        if high / low <= 1.01 or proposal in tried:
            break
        speed = proposal
    best = min(tried, key=lambda candidate: abs(tried[candidate] - utilization))
    return LoadSearch(
        speed=best,
        busy_fraction=tried[best],
        utilization=utilization,
        evaluations=len(tried),
        requests=len(prefix),
        seconds=round(time.perf_counter() - started, 1),
        reached=max(tried.values()) >= utilization - TOLERANCE,
    )


PARTING_STEP = 1.5
"""How much faster each candidate of the parting search is than the last."""
PARTING_EVALUATIONS = 6
"""Candidates the parting search tries at most (up to 1.5**5 ≈ 7.6x the busy load)."""
PARTED_SHARE = 0.99
"""A design below this share of the trace's bound has missed reusable pages: the designs part."""


class PartingSearch(BaseModel):
    """Where the designs part: the lowest load tried at which one of them misses the bound."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    speed: float
    """The parting load (the last candidate when none parted)."""
    shares: dict[str, float]
    """Each design's hit rate over the bound's at ``speed``."""
    busy_shares: dict[str, float]
    """The same at the busy load the search started from."""
    evaluations: int
    seconds: float
    parted: bool
    """False when every design stayed at the bound up to the fastest load tried."""


def find_parting_speed(
    policies: dict[str, PolicyFactory],
    trace: list[TraceRequest],
    options: ReplayOptions,
    busy_speed: float,
) -> PartingSearch:
    """From ``busy_speed`` up by :data:`PARTING_STEP`, the first load at which one of
    ``policies`` falls below :data:`PARTED_SHARE` of the bound over the first
    :data:`SEARCH_PREFIX` requests of ``trace``: where a replay has something to show."""
    from .bound import hit_rate_bound

    started = time.perf_counter()
    prefix = trace[:SEARCH_PREFIX]
    bound = hit_rate_bound(prefix, options.page_size).hit_rate
    if not bound:  # nothing is reusable: no load makes a design miss what is not there
        return PartingSearch(
            speed=busy_speed, shares={}, busy_shares={}, evaluations=0, seconds=0.0, parted=False
        )
    tried: list[dict[str, float]] = []  # each load's shares, from the busy one up
    speed = busy_speed
    while True:
        at = options.model_copy(update={"speed": speed})
        tried.append(
            {
                name: round(Replay(factory, prefix, at).run().hit_rate / bound, 4)
                for name, factory in policies.items()
            }
        )
        parted = min(tried[-1].values()) < PARTED_SHARE
        if parted or len(tried) == PARTING_EVALUATIONS:
            break
        speed *= PARTING_STEP
    return PartingSearch(
        speed=speed,
        shares=tried[-1],
        busy_shares=tried[0],
        evaluations=len(tried),
        seconds=round(time.perf_counter() - started, 1),
        parted=parted,
    )
