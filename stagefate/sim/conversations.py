"""Conversations inferred from a trace's hash chains, so that a turn waits for the one before it.

A Mooncake trace's arrivals are open-loop: each request comes at its timestamp whatever the
engine did. Replayed faster than the engine serves them, turn n+1 of a conversation arrives
before turn n has finished, so the prefix it should find was never written and every design
misses it. A conversation is visible in the hash chains: the next turn's prompt is the previous
turn's prompt with the answer and a new message after it, so its leading blocks are the earlier
request's **whole** prompt.

* A request's predecessor is the latest earlier request whose whole prompt (every block id) is
  the longest such prefix of its own: the most recent turn it extends.
* A prompt that several later requests take as that predecessor is a **shared prefix** (a
  system prompt, a few-shot header, a document asked about twice), not a turn: none of them
  waits on it. A conversation is a chain, so a turn has one next turn.

Under ``--arrivals causal`` a turn arrives at its trace time or when its predecessor finished
plus the trace's gap between the two (at the replay's speed), whichever is later.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .trace import TraceRequest


@dataclass(frozen=True)
class Turns:
    predecessor: dict[int, int] = field(default_factory=dict)
    """Request index → the index of the turn it follows."""
    shared_prefixes: int = 0
    """Prompts extended by more than one later request (not turns)."""

    @property
    def conversations(self) -> int:
        """Chains of two or more turns."""
        return len(set(self.predecessor.values()) - set(self.predecessor))


def infer_turns(trace: list[TraceRequest]) -> Turns:
    """Each turn's predecessor in ``trace`` (by arrival), as the module's rules say."""
    whole: dict[int, int] = {}  # chained id of a whole prompt -> the latest request with it
    extends: dict[int, int] = {}
    for request in sorted(trace, key=lambda r: (r.timestamp_ms, r.index)):
        chain = _prefix_chain(request.hash_ids)
        for prefix in reversed(chain[:-1]):  # the longest earlier whole prompt first
            if prefix in whole:
                extends[request.index] = whole[prefix]
                break
        whole[chain[-1]] = request.index
    followers = Counter(extends.values())
    return Turns(
        predecessor={turn: before for turn, before in extends.items() if followers[before] == 1},
        shared_prefixes=sum(1 for count in followers.values() if count > 1),
    )


def _prefix_chain(hash_ids: tuple[int, ...]) -> list[int]:
    """One id per leading run of blocks: equal ids, equal block prefixes."""
    chain, running = [], 0
    for block in hash_ids:
        running = hash((running, block))
        chain.append(running)
    return chain
