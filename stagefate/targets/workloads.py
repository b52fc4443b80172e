"""Prompts for the tiny models of the engine targets (vLLM's and SGLang's): multi-turn
conversations, and a Mooncake trace scaled to them.

Pure Python (no engine): the tests and the benchmarks build the prompts here and send them to
an engine's environment as JSON.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ..sim.trace import TraceRequest

BLOCK = 32
"""vLLM's block size for the tiny model (the CPU backend wants a multiple of 32); eight of
SGLang's 4-token pages."""
VOCAB = 1000
SCALE = 16
"""A Mooncake block (512 tokens) becomes one vLLM block (32 tokens): lengths are divided by 16."""
MAX_PROMPT = 60 * BLOCK
"""Prompts are cut to 60 blocks (1,920 tokens), inside the tiny model's 2,048-token context."""


def conversations(count: int, turns: int, seed: int = 0) -> list[list[list[int]]]:
    """``count`` conversations sharing a 4-block system prompt; turn k's prompt is turn k-1's,
    then a stand-in for its answer and a new message (40-199 tokens each: a fixed stand-in
    keeps the prompts the same whatever the model answers)."""
    rng = random.Random(seed)
    system = [rng.randrange(3, VOCAB) for _ in range(4 * BLOCK)]
    chats = []
    for _ in range(count):
        prompt = system + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(40, 200))]
        chat = [prompt]
        for _ in range(turns - 1):
            prompt = prompt + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(40, 200))]
            chat.append(prompt)
        chats.append(chat)
    return chats


def scaled_prompt(request: TraceRequest) -> list[int]:
    """A trace request's prompt for the tiny model: each hash id's block is 32 tokens drawn
    from a generator seeded by the id (so equal ids are equal prefixes), the length divided by
    :data:`SCALE` (rounded up) and cut to :data:`MAX_PROMPT`."""
    tokens: list[int] = []
    for hash_id in request.hash_ids:
        rng = random.Random(hash_id)
        tokens += [rng.randrange(3, VOCAB) for _ in range(BLOCK)]
    length = min(-(-request.input_length // SCALE), MAX_PROMPT)
    return tokens[:length]


def in_batches(prompts: Sequence[list[int]], size: int) -> list[list[list[int]]]:
    """Arrival order in groups of ``size``: each group arrives together (one ``generate``)."""
    return [list(prompts[start : start + size]) for start in range(0, len(prompts), size)]


CONVOY_TAIL = 64
"""Each convoy request's own tokens after the shared prefix."""


def convoy(
    requests: int, prefix_blocks: Sequence[int], seed: int = 7
) -> tuple[list[int], list[list[int]]]:
    """A prompt that puts the shared base in L3, then ``requests`` prompts arriving together,
    each a prefix of that base (of the lengths in ``prefix_blocks``, in turn) and
    :data:`CONVOY_TAIL` tokens of its own: the report of a convoy behind one load (50 requests
    sharing a 10k-token prefix) scaled to the tiny model, whose context allows a base of at
    most 60 blocks. With several lengths, an early request reads a head that later ones need
    more than."""
    rng = random.Random(seed)
    base = [rng.randrange(3, VOCAB) for _ in range(max(prefix_blocks) * BLOCK)]
    warm = base + [rng.randrange(3, VOCAB) for _ in range(CONVOY_TAIL)]
    prompts = [
        base[: prefix_blocks[i % len(prefix_blocks)] * BLOCK]
        + [rng.randrange(3, VOCAB) for _ in range(CONVOY_TAIL)]
        for i in range(requests)
    ]
    return warm, prompts


def documents(count: int, blocks: int, seed: int = 11) -> tuple[list[list[int]], list[list[int]]]:
    """``count`` distinct documents of ``blocks`` blocks: the prompts that put them in L3, and
    the prompts asking about each again (the document, then :data:`CONVOY_TAIL` new tokens)."""
    rng = random.Random(seed)
    bodies = [[rng.randrange(3, VOCAB) for _ in range(blocks * BLOCK)] for _ in range(count)]

    def tail() -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(CONVOY_TAIL)]

    return [body + tail() for body in bodies], [body + tail() for body in bodies]
