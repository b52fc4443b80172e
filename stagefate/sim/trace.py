"""Mooncake-format traces: loading, validation and deterministic token synthesis.

One JSON object a line: ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``
(one id per 512-token block; equal ids at equal positions mean a reusable prefix). Token ids are
synthesized from the block ids, so two requests share exactly the prefix blocks they share in
the trace: token ``j`` of block ``h`` is ``h * 512 + j``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

BLOCK_TOKENS = 512
DEFAULT_TRACE = "mooncake_synthetic_slice.jsonl"
"""The embedded slice: the last 1,000 requests of Mooncake's synthetic trace (data/NOTICE.md)."""


class TraceError(ValueError):
    """A trace file is missing or malformed; the message names the file, line and field."""


@dataclass(frozen=True)
class TraceRequest:
    index: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def tokens(self) -> torch.Tensor:
        """The prompt's synthesized token ids (int64), ``input_length`` of them."""
        ids = torch.tensor(self.hash_ids, dtype=torch.int64)
        block = torch.arange(BLOCK_TOKENS, dtype=torch.int64)
        tokens = (ids[:, None] * BLOCK_TOKENS + block[None, :]).reshape(-1)
        return tokens[: self.input_length]


def default_trace_path() -> Path:
    return Path(str(resources.files("stagefate.sim") / "data" / DEFAULT_TRACE))


def load_trace(path: Path | str | None = None, limit: int | None = None) -> list[TraceRequest]:
    """Read a trace (the embedded slice by default), sorted by timestamp, at most ``limit``."""
    if limit is not None and limit < 1:
        raise TraceError(f"--limit must be at least 1, got {limit}")
    trace_path = default_trace_path() if path is None else Path(path)
    if trace_path.is_dir():
        raise TraceError(f"trace {trace_path} is a folder; pass --trace PATH to a .jsonl file")
    if trace_path.exists() and not trace_path.is_file():
        raise TraceError(
            f"trace {trace_path} is not a regular file (a pipe or a device: it is read more "
            "than once); save it to a .jsonl file and pass that"
        )
    if not trace_path.is_file():
        raise TraceError(f"trace {trace_path} does not exist; pass --trace PATH to a .jsonl file")
    try:
        requests = _read(trace_path, limit)
    except UnicodeDecodeError as error:
        raise TraceError(
            f"trace {trace_path}: not a text file ({error.reason}); pass a Mooncake-format "
            ".jsonl trace"
        ) from None
    if not requests:
        raise TraceError(f"trace {trace_path} holds no requests")
    arrivals = sorted(requests, key=lambda request: (request.timestamp_ms, request.index))
    return arrivals if limit is None else arrivals[:limit]


def _read(trace_path: Path, limit: int | None) -> list[TraceRequest]:
    """The trace's requests in file order (up to ``limit`` when the file is in time order)."""
    requests: list[TraceRequest] = []
    in_order = True
    with trace_path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            request = _parse(trace_path, number, line, len(requests))
            in_order = in_order and (
                not requests or requests[-1].timestamp_ms <= request.timestamp_ms
            )
            requests.append(request)
            if limit is not None and in_order and len(requests) >= limit:
                break  # (out of order, the earliest arrivals may lie further on: read it all)
    return requests


def out_of_order(trace: Sequence[TraceRequest]) -> int:
    """How many of ``trace``'s requests (in arrival order) are not at their arrival rank in the
    file: none for a file in time order (under ``--limit``, its first lines)."""
    return sum(request.index != rank for rank, request in enumerate(trace))


MAX_TOKENS = 1 << 24
"""The longest prompt or output a trace line may give (16 M tokens, past every model's context)."""
MAX_TIMESTAMP_MS = 1e12
"""The latest arrival a trace line may give: about 32 years of ms (past it, a timestamp is a
unit mistake, and the engine's clock would lose its sub-ms steps)."""
MAX_HASH_ID = 1 << 53
"""The largest hash id: JSON's exact integers (a block's token ids, ``id * 512 + j``, stay far
inside int64)."""


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _parse(path: Path, number: int, line: str, index: int) -> TraceRequest:
    where = f"{path}:{number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not JSON ({error.msg}); one JSON object a line") from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for field in ("timestamp", "input_length", "output_length", "hash_ids"):
        if field not in row:
            raise TraceError(f"{where}: missing field {field!r} (Mooncake format)")
    timestamp, length, output = row["timestamp"], row["input_length"], row["output_length"]
    hash_ids = row["hash_ids"]
    # (JSON's true is an int to Python, and its NaN and Infinity are floats: both refused)
    if not _number(timestamp) or not 0 <= timestamp <= MAX_TIMESTAMP_MS:
        raise TraceError(
            f"{where}: timestamp must be a finite number of ms from 0 to {MAX_TIMESTAMP_MS:.0e} "
            f"(a year is 3e10), got {timestamp!r}"
        )
    for field, value, least in (("input_length", length, 1), ("output_length", output, 0)):
        if not _whole(value) or not least <= value <= MAX_TOKENS:
            raise TraceError(
                f"{where}: {field} must be an int from {least} to {MAX_TOKENS:,} (no model's "
                f"context is longer), got {value!r}"
            )
    if not isinstance(hash_ids, list) or not all(
        _whole(h) and 0 <= h <= MAX_HASH_ID for h in hash_ids
    ):
        raise TraceError(
            f"{where}: hash_ids must be a list of ints from 0 to 2**53 (JSON's exact integers; "
            "a block's tokens are numbered from its id)"
        )
    blocks = -(-length // BLOCK_TOKENS)
    if len(hash_ids) != blocks:
        raise TraceError(
            f"{where}: {len(hash_ids)} hash_ids for input_length={length}; expected {blocks} "
            f"(one per {BLOCK_TOKENS}-token block)"
        )
    return TraceRequest(index, float(timestamp), length, output, tuple(hash_ids))
