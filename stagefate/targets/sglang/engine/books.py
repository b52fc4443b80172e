"""stagefate's look at SGLang's books, from inside the scheduler's process.

The engine's scheduler runs in a process of its own; what it holds (the tree, the pools, the
buffer-mode pipeline's per-request structures) can only be read there. :func:`attach` gives
SGLang's ``Scheduler`` one method, ``stagefate_books``, which the driver calls over SGLang's own
``collective_rpc`` (the scheduler runs it between batches, on its own thread, as it does every
RPC). It writes a JSON report to the path it is given (an RPC answers only "success"):

* ``fully_idle``: the scheduler's own ``is_fully_idle()``;
* ``sglang_checks``: SGLang's own idle checks, run now rather than waited for: the pools'
  token invariant (``invariant_checker._check_all_pools``), the request-row pool
  (``_check_req_pool``; raises under ``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE``, which the
  engine target sets) and the leak warnings SGLang counted so far;
* ``pipeline``: buffer mode's ``is_idle()`` and every non-empty dict, list, set or deque the
  pipeline holds (its per-request books among them), by name and size; where stagefate's
  lifecycle is the pipeline, its live records, pinned tokens, bounce and counters too;
* ``host``: the bounce buffer's free slots against its size, and the slots queued for release
  (``host_mem_release_queue``: SGLang frees them at its next pass, and an idle scheduler runs
  none, so they stay queued until the next request arrives), and every ``host_indices`` tensor
  reachable from the cache (who holds the rest);
* ``per_request``: every structure reachable from the tree cache that still names one of the
  given request ids (:func:`..request_books.per_request_books`' test, in the same walk);
* ``probe``: :mod:`.probe`'s counters (the pipeline's time on the scheduler's thread, L3 reads).
"""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from ..object_walk import walk
from ..request_books import entries_for
from . import probe

_BOOKS = (dict, list, set, deque)


def _pipeline(cache: Any) -> dict[str, Any] | None:
    pipeline = getattr(cache, "buffer_pipeline", None)
    if pipeline is None:
        return None
    held = {
        name: len(value)
        for name, value in vars(pipeline).items()
        if isinstance(value, _BOOKS) and value
    }
    books: dict[str, Any] = {"idle": bool(pipeline.is_idle()), "held": held}
    life = getattr(pipeline, "_life", None)
    if life is not None:  # stagefate's lifecycle is the pipeline (integrations.sglang)
        bounce = life.host_pool
        books["lifecycle"] = {
            "live": {rid: record.state for rid, record in life.live_records.items()},
            "pinned_tokens": life.pinned_tokens,
            "bounce": {"available": bounce.available(), "size": bounce.capacity},
            "stats": life.stats.model_dump(),
        }
    return books


def _host(cache: Any, holders: dict[str, int]) -> dict[str, Any] | None:
    controller = getattr(cache, "cache_controller", None)
    host = getattr(controller, "mem_pool_host", None)
    if host is None:
        return None
    queued = getattr(controller, "host_mem_release_queue", None)
    releasing = sum(len(slots) for slots in getattr(queued, "queue", ()))
    return {
        "available": int(host.available_size()),
        "size": int(host.size),
        "queued_for_release": int(releasing),
        "held_by": holders,
    }


def _walked(cache: Any, rids: set[str]) -> tuple[dict[str, int], dict[str, int]]:
    """One walk from the cache (the host pool itself not walked): every structure that names
    one of ``rids`` (:func:`..request_books.entries_for`), and every ``host_indices`` tensor
    (SGLang's name for a bounce allocation in every release) with its slots: who holds the
    bounce now. Both by path."""
    named: dict[str, int] = {}
    holders: dict[str, int] = {}
    pool = getattr(getattr(cache, "cache_controller", None), "mem_pool_host", None)
    for path, obj in walk({"tree_cache": cache}, skip=() if pool is None else (pool,)):
        held = entries_for(obj, rids)
        if held:
            named[path] = held
        if path.endswith(".host_indices") and hasattr(obj, "numel"):
            holders[path] = int(obj.numel())
    return named, holders


def _sglang_checks(scheduler: Any) -> dict[str, Any]:
    checker = scheduler.invariant_checker
    leaked, messages = checker._check_all_pools(scheduler.pool_stats_observer.get_pool_stats())
    problems = [str(message) for message in messages if leaked and message]
    try:
        checker._check_req_pool()
    except ValueError as leak:  # strict mode: SGLang raises rather than warns
        problems.append(str(leak))
    warnings = {
        name: int(getattr(checker, name, 0))
        for name in ("count_memory_leak_warnings", "count_req_pool_leak_warnings")
    }
    return {"problems": problems, "warnings": warnings}


def report(scheduler: Any, rids: list[str]) -> dict[str, Any]:
    """What :func:`stagefate_books` writes (see the module's docstring)."""
    cache = scheduler.tree_cache
    named, holders = _walked(cache, set(rids))
    return {
        "fully_idle": bool(scheduler.is_fully_idle()),
        "sglang_checks": _sglang_checks(scheduler),
        "pipeline": _pipeline(cache),
        "host": _host(cache, holders),
        "per_request": named,
        "probe": probe.report(scheduler),
    }


def stagefate_books(self: Any, path: str, rids: list[str] | None = None) -> None:
    """The RPC: write :func:`report` of this scheduler to ``path``."""
    text = json.dumps(report(self, list(rids or [])), sort_keys=True)
    Path(path).write_text(text + "\n", encoding="utf-8")


def attach() -> None:
    """Give SGLang's ``Scheduler`` the method (in the process that imported its module)."""
    from sglang.srt.managers.scheduler import Scheduler

    Scheduler.stagefate_books = stagefate_books
