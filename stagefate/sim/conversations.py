"""Conversations inferred from a trace's hash chains, so that a turn waits for the one before it.

A Mooncake trace's arrivals are open-loop: each request comes at its timestamp whatever the
engine did. Replayed faster than the engine serves them, turn n+1 of a conversation arrives
before turn n has finished, so the prefix it should find was never written and every design
misses it. A conversation is visible in the hash chains: the next turn's prompt is the previous
turn's prompt with the answer and a new message after it. In the Mooncake format a block's id
hashes the block's tokens, so a prompt whose last 512-token block is **partial** has that
block re-hashed once the conversation grows: the next turn extends the earlier prompt *less its
partial last block*, never the whole prompt. A prompt that ends on a whole block is extended
whole.

* A request's **kept prefix** is its blocks less a partial last block (all of them when the last
  block is whole); a request with one partial block keeps nothing and is nobody's turn before.
* A request follows an earlier one when its leading blocks are that request's kept prefix, its
  prompt is longer, and (a whole kept prompt) it has more blocks: it extended the prompt.
* Of the earlier requests it may follow, the one with the **longest** kept prefix is its turn
  before. Several earlier requests may keep that prefix: turns of one conversation that grew
  within a partial block (the latest is the turn before), or requests of different
  conversations (two that opened alike, or a shared system block and a short first message),
  where the hash ids cannot say which: a shared prefix, and the request is no turn.
* A prompt that several later requests take as their turn before is a **shared prefix** too (a
  system prompt, a few-shot header, a document asked about twice): none of them waits on it. A
  conversation is a chain, so a turn has one next turn.

Under ``--arrivals causal`` a turn arrives at its trace time or when its predecessor finished
plus the trace's gap between the two (at the replay's speed), whichever is later.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from .trace import BLOCK_TOKENS, TraceRequest


@dataclass(frozen=True)
class Turns:
    predecessor: dict[int, int] = field(default_factory=dict)
    """Request index → the index of the turn it follows."""
    less_partial_block: frozenset[int] = frozenset()
    """The turns that extend their predecessor less its partial last block (the others extend
    a prompt that ends on a whole block)."""
    shared_prefixes: int = 0
    """Prompts several later requests extend, or kept prefixes several requests share: not
    turns."""

    @property
    def conversations(self) -> int:
        """Chains of two or more turns."""
        return len(set(self.predecessor.values()) - set(self.predecessor))

    @property
    def whole_prompt(self) -> int:
        """Turns that extend their predecessor's whole prompt."""
        return len(self.predecessor) - len(self.less_partial_block)

    @property
    def default_arrivals(self) -> Literal["open", "causal"]:
        """What a replay honours unless told: the turns where the trace has any (a turn that
        arrives before the one it follows finds nothing to reuse), the trace's times else."""
        return "causal" if self.predecessor else "open"


def infer_turns(trace: list[TraceRequest]) -> Turns:
    """Each turn's predecessor in ``trace`` (by arrival), as the module's rules say."""
    kept_by: dict[int, list[int]] = {}  # chained id of a kept prefix -> the requests keeping it
    by_index = {request.index: request for request in trace}
    extends: dict[int, int] = {}
    ambiguous: set[int] = set()  # kept prefixes a later request matched but several requests keep
    for request in sorted(trace, key=lambda r: (r.timestamp_ms, r.index)):
        chain = _prefix_chain(request.hash_ids)
        for blocks in range(len(chain), 0, -1):  # the longest kept prefix first
            earlier = [
                index
                for index in kept_by.get(chain[blocks - 1], ())
                if _extends(request, by_index[index])
            ]
            if earlier:
                latest = _one_conversation(earlier, extends)
                if latest is None:
                    ambiguous.add(chain[blocks - 1])
                else:
                    extends[request.index] = latest
                break
        kept = _kept_blocks(request)
        if kept:
            kept_by.setdefault(chain[kept - 1], []).append(request.index)
    followers = Counter(extends.values())
    predecessor = {turn: before for turn, before in extends.items() if followers[before] == 1}
    return Turns(
        predecessor=predecessor,
        less_partial_block=frozenset(
            turn for turn, before in predecessor.items() if _partial(by_index[before])
        ),
        shared_prefixes=sum(1 for count in followers.values() if count > 1) + len(ambiguous),
    )


def _one_conversation(candidates: list[int], extends: dict[int, int]) -> int | None:
    """The latest of ``candidates`` (in arrival order) when the others are turns before it in
    its own conversation (a turn that grew within its partial block keeps the same prefix as
    the turn before); None when they are not one conversation's."""
    latest, before = candidates[-1], set()
    walk = extends.get(latest)
    while walk is not None:
        before.add(walk)
        walk = extends.get(walk)
    return latest if before.issuperset(candidates[:-1]) else None


def _partial(request: TraceRequest) -> bool:
    """Whether ``request``'s last block holds fewer than 512 tokens."""
    return request.input_length % BLOCK_TOKENS != 0


def _kept_blocks(request: TraceRequest) -> int:
    """How many leading blocks a later turn keeps of ``request``'s prompt."""
    return len(request.hash_ids) - _partial(request)


def _extends(later: TraceRequest, earlier: TraceRequest) -> bool:
    """Whether ``later`` (whose leading blocks are ``earlier``'s kept prefix) grew ``earlier``'s
    prompt: longer, and past its last block when that block was whole (an equal prompt is a
    repeat, not a turn)."""
    grew_blocks = _partial(earlier) or len(later.hash_ids) > len(earlier.hash_ids)
    return later.input_length > earlier.input_length and grew_blocks


def _prefix_chain(hash_ids: tuple[int, ...]) -> list[int]:
    """One id per leading run of blocks: equal ids, equal block prefixes."""
    chain, running = [], 0
    for block in hash_ids:
        running = hash((running, block))
        chain.append(running)
    return chain
