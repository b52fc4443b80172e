"""``blind``'s paced retry and ownership pre-check (SGLang PRs #36227 and #35769), step by step:
after every step the whole of blind's state is asserted (each fetch's state, the pending retry,
the attempts used, what is queued on its IO)."""

from __future__ import annotations

from stagefate import TokenKey
from stagefate.runtime.prefix_tree import Node
from stagefate.sim.blind import BlindPolicy
from stagefate.testing import Pair
from tests.harness import config, make_pair, seq_of

PAGE = 4
INTERVAL = 3
ATTEMPTS = 2


def _blind() -> tuple[BlindPolicy, Pair]:
    """Blind over a pair's consumer; the pair's producer writes L3 (``pair.publish``)."""
    pair = make_pair(config(page_size=PAGE, retry_interval=INTERVAL, retry_max_attempts=ATTEMPTS))
    return BlindPolicy(pair.consumer), pair


def _state(blind: BlindPolicy, rid: str) -> dict[str, object]:
    fetch = blind._fetches.get(rid)
    return {
        "state": None if fetch is None else fetch.state,
        "in_flight": blind.fetch_in_flight(rid),
        "retry_pending": blind.retries.pending(rid),
        "attempts": blind.retries.attempts(rid),
        "queued": len(blind.io.queued()),
    }


def _sweeps_until_due(blind: BlindPolicy, waiting: list[str]) -> int:
    """Sweep (as the replay does each scheduling pass) until a retry falls due; how many."""
    for sweeps in range(1, 4 * INTERVAL):
        if blind.due_retries(waiting):
            return sweeps
    raise AssertionError("no retry fell due")


def _never_make_room(_tokens: int, _keep: Node) -> bool:
    return False


def test_a_miss_is_retried_after_the_interval_even_at_the_queue_head() -> None:
    blind, pair = _blind()
    tokens = seq_of(4, PAGE)
    key = TokenKey.of(tokens)
    blind.issue("r", key, 0)
    assert _state(blind, "r") == dict(
        state="querying", in_flight=True, retry_pending=False, attempts=0, queued=1
    )
    blind.io.complete_all()
    blind.poll()  # L3 has nothing yet: revoked, and the paced retry armed
    assert _state(blind, "r") == dict(
        state=None, in_flight=False, retry_pending=True, attempts=0, queued=0
    )
    assert blind.retries_armed == 1 and blind.ended_unread == {"revoked": 1}
    assert set(blind.ended_unread) <= set(blind.spec.reasons)  # its reasons are its spec's
    # #36227's sweep paces the head like the rest (live's RetryBook lets the head go at once)
    assert _sweeps_until_due(blind, ["r"]) == INTERVAL + 1
    assert _state(blind, "r") == dict(
        state=None, in_flight=False, retry_pending=False, attempts=1, queued=0
    )
    pair.publish(tokens, mark=9)  # the producer's write lands meanwhile
    blind.issue("r", key, 0)  # the engine re-matches and issues again
    blind.io.complete_all()
    blind.poll()  # the existence query finds all four pages: the read launches
    assert _state(blind, "r") == dict(
        state="reading", in_flight=True, retry_pending=False, attempts=1, queued=1
    )
    blind.io.complete_all()
    blind.poll()
    assert _state(blind, "r") == dict(
        state="staged", in_flight=True, retry_pending=False, attempts=1, queued=0
    )
    prefix = blind.pipe.tree.match_prefix(tokens)
    spliced = blind.admit("r", prefix, lambda tokens, keep: True)
    assert spliced.numel() == len(tokens)
    assert _state(blind, "r") == dict(
        state=None, in_flight=False, retry_pending=False, attempts=0, queued=0
    )
    assert blind.books.replay_counters()["l3_reads"] == 1
    assert blind.pipe.host_pool.available() == blind.pipe.host_pool.capacity


def test_the_ownership_pre_check_refuses_a_second_fetch_while_one_is_in_flight() -> None:
    blind, pair = _blind()
    tokens = seq_of(2, PAGE)
    pair.publish(tokens, mark=9)
    key = TokenKey.of(tokens)
    blind.issue("r", key, 0)
    blind.issue("r", key, 0)  # e.g. a retry racing the first fetch: no second bounce
    assert _state(blind, "r") == dict(
        state="querying", in_flight=True, retry_pending=False, attempts=0, queued=1
    )
    blind.io.complete_all()
    blind.poll()
    blind.io.complete_all()
    blind.poll()
    blind.issue("r", key, 0)  # staged and unconsumed: still owned
    assert _state(blind, "r") == dict(
        state="staged", in_flight=True, retry_pending=False, attempts=0, queued=0
    )
    held = blind.pipe.host_pool.capacity - blind.pipe.host_pool.available()
    assert held == len(tokens)
    blind.admit("r", blind.pipe.tree.match_prefix(tokens), _never_make_room)
    assert blind.pipe.host_pool.available() == blind.pipe.host_pool.capacity
    assert blind.books.wasted_by_reason() == {"device_capacity": (1, len(tokens))}


def test_retries_stop_after_max_attempts_and_a_short_span_arms_one() -> None:
    blind, _pair = _blind()
    key = TokenKey.of(seq_of(3, PAGE))
    for attempt in range(ATTEMPTS):
        blind.issue("r", key, 0)
        blind.io.complete_all()
        blind.poll()  # nothing in L3
        assert _state(blind, "r")["retry_pending"] is True
        _sweeps_until_due(blind, ["r"])
        assert blind.retries.attempts("r") == attempt + 1
    blind.issue("r", key, 0)
    blind.io.complete_all()
    blind.poll()
    assert _state(blind, "r") == dict(
        state=None, in_flight=False, retry_pending=False, attempts=ATTEMPTS, queued=0
    )
    assert blind.retries_armed == ATTEMPTS
    # a prompt the device already covers arms the retry at issue, with no IO: its device
    # prefix can be evicted while it waits
    blind.issue("s", key, len(key))
    assert _state(blind, "s") == dict(
        state=None, in_flight=False, retry_pending=True, attempts=0, queued=0
    )
    blind.admit("s", blind.pipe.tree.match_prefix(key), _never_make_room)  # scheduled: moot
    assert _state(blind, "s")["retry_pending"] is False


def test_blind_runs_its_spec_through_the_compiled_machine() -> None:
    blind, _pair = _blind()
    spec = blind.spec
    assert spec.design is not None and spec.design.name.startswith("blind")
    assert (set(spec.guards), set(spec.effects)) == (blind.GUARDS, blind.EFFECTS)
    key = TokenKey.of(seq_of(3, PAGE))
    blind.issue("r", key, 0)
    assert blind.machine.legal_events(_state_name(blind, "r")) == ["hit", "abort"]
    blind.terminate("r")  # admitted without it: the query in flight ends it
    blind.io.complete_all()
    blind.poll()
    assert blind.ended_unread == {"aborted": 1} and not blind.fetch_in_flight("r")


def _state_name(blind: BlindPolicy, rid: str) -> str:
    state = _state(blind, rid)["state"]
    assert isinstance(state, str)
    return state
