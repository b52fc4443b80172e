"""Multi-turn conversation traces in the Mooncake format, synthesized (``stagefate trace synth``).

The shipped synthetic trace has few conversations; a real multi-turn trace is what the causal
arrivals and the turn rule (:mod:`.conversations`) are for. This writes one of that shape from a
seed, with the format's hashing done the way the format does it, so the turn rule meets what a
real trace gives it:

* **Conversations** start as a Poisson process (``start_rate`` per second). Each opens with a
  **shared system prompt** (``system_tokens``, the same tokens in every conversation) and a
  first user message; each next turn's prompt is the previous turn's prompt, its answer
  (``output_length`` tokens) and a new message. Turns per conversation: 1 plus a geometric count
  with mean ``mean_extra_turns``, at most ``max_turns``.
* A next turn arrives a **think time** after the previous one (exponential, mean
  ``mean_think_s``): the trace's gap between two turns, which causal arrivals keep.
* Lengths are log-normal around their medians (first message, new message, answer); a
  conversation ends before a prompt longer than ``context_tokens``.
* **Hash ids** are the format's: a prompt's 512-token blocks, each id standing for the block's
  tokens *and everything before it* (the chained prefix), numbered in order of first
  appearance. Equal ids, equal prefixes; a partial last block hashes its partial tokens, so it
  is re-hashed once the conversation grows past it (which is why a follow-up extends the earlier
  prompt less its partial last block).

Tokens are never materialized: a prompt is a list of segments (the system prompt, a message, an
answer), and a block's content is the part of each segment it covers.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from .trace import BLOCK_TOKENS, MAX_TOKENS, TraceRequest


class SynthOptions(BaseModel):
    """What ``stagefate trace synth`` draws from (every default a documented guess at a chat
    service's shape, dense enough that the designs part under load; docs/replay.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    conversations: int = Field(500, ge=1, le=1_000_000)
    seed: int = 0
    start_rate: float = Field(1.0, gt=0, description="conversations starting per second")
    system_tokens: int = Field(512, ge=0, le=MAX_TOKENS)
    first_message_tokens: int = Field(6_000, ge=1, le=MAX_TOKENS, description="median")
    message_tokens: int = Field(800, ge=1, le=MAX_TOKENS, description="median")
    answer_tokens: int = Field(350, ge=1, le=MAX_TOKENS, description="median")
    mean_extra_turns: float = Field(1.5, ge=0, description="turns after the first, on average")
    max_turns: int = Field(8, ge=1)
    mean_think_s: float = Field(90.0, gt=0, description="a user's gap between two turns")
    context_tokens: int = Field(65_536, ge=BLOCK_TOKENS, le=MAX_TOKENS)
    """A conversation ends once its next prompt would pass this."""


@dataclass(frozen=True)
class SynthRequest:
    """One synthesized request, with what the trace file cannot say: whose turn it follows."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    conversation: int
    turn: int
    """0 for a conversation's first request."""

    def row(self) -> dict[str, object]:
        """The Mooncake-format line."""
        return {
            "timestamp": round(self.timestamp_ms, 3),
            "input_length": self.input_length,
            "output_length": self.output_length,
            "hash_ids": list(self.hash_ids),
        }


Segment = tuple[tuple[int, int, str], int]
"""``((conversation, turn, kind), length)``: a run of tokens; the system prompt's is
``((-1, 0, "system"), n)``, the same in every conversation."""


@dataclass
class _BlockIds:
    """The format's remapped ids: a chained block key → its id, in order of first appearance."""

    ids: dict[tuple[object, ...], int] = field(default_factory=dict)

    def of(self, segments: list[Segment], length: int) -> tuple[int, ...]:
        out: list[int] = []
        previous: int | None = None
        pieces = list(_pieces(segments))
        for start in range(0, length, BLOCK_TOKENS):
            end = min(start + BLOCK_TOKENS, length)
            content = tuple(
                (name, lo - at, hi - at)
                for name, at, lo, hi in (
                    (name, at, max(start, at), min(end, at + size)) for name, at, size in pieces
                )
                if lo < hi
            )
            key = (previous, content)
            previous = self.ids.setdefault(key, len(self.ids))
            out.append(previous)
        return tuple(out)


def _pieces(segments: list[Segment]) -> Iterator[tuple[tuple[int, int, str], int, int]]:
    """``(name, where it starts in the prompt, length)`` for each segment."""
    at = 0
    for name, size in segments:
        yield name, at, size
        at += size


def _lognormal(rng: random.Random, median: int, sigma: float = 0.8) -> int:
    return max(1, round(median * math.exp(rng.gauss(0.0, sigma))))


def synthesize(options: SynthOptions) -> list[SynthRequest]:
    """The trace ``options`` describes, in arrival order (the same for the same options)."""
    rng = random.Random(options.seed)
    ids = _BlockIds()
    requests: list[SynthRequest] = []
    started_s = 0.0
    system: list[Segment] = (
        [((-1, 0, "system"), options.system_tokens)] if options.system_tokens else []
    )
    for conversation in range(options.conversations):
        started_s += rng.expovariate(options.start_rate)
        extra = 0
        while extra + 1 < options.max_turns and rng.random() < _continue(options):
            extra += 1
        prompt = [
            *system,
            ((conversation, 0, "message"), _lognormal(rng, options.first_message_tokens)),
        ]
        at_s = started_s
        for turn in range(extra + 1):
            length = sum(size for _, size in prompt)
            if length > options.context_tokens:
                break
            answer = _lognormal(rng, options.answer_tokens)
            requests.append(
                SynthRequest(
                    at_s * 1000, length, answer, ids.of(prompt, length), conversation, turn
                )
            )
            at_s += rng.expovariate(1 / options.mean_think_s)
            prompt = [
                *prompt,
                ((conversation, turn, "answer"), answer),
                ((conversation, turn + 1, "message"), _lognormal(rng, options.message_tokens)),
            ]
    requests.sort(key=lambda request: request.timestamp_ms)
    return requests


def _continue(options: SynthOptions) -> float:
    """The chance of one more turn: a geometric count of extra turns with the asked mean."""
    return options.mean_extra_turns / (1 + options.mean_extra_turns)


def as_read(requests: list[SynthRequest]) -> list[TraceRequest]:
    """``requests`` as the trace file reads back (indices in arrival order): what the turn rule
    and the replay see of them."""
    return [
        TraceRequest(index, r.timestamp_ms, r.input_length, r.output_length, r.hash_ids)
        for index, r in enumerate(requests)
    ]


def write_jsonl(requests: list[SynthRequest]) -> str:
    """The trace file's text: one Mooncake-format line a request."""
    return "".join(json.dumps(request.row()) + "\n" for request in requests)
