"""Every object of a target reachable from a few roots, found by walking rather than listed.

Which books a release keeps changes from release to release (0.5.23 alone adds a wait book and
a retry book), so a check that lists structures by hand checks the release it was written for.
The fuzzer's quiescence and slot-ownership checks instead walk the object graph from the cache:
through the attributes of every object whose class is the target's (its package's modules), and
through the items of every container met on the way (dicts' values, lists, tuples, sets, deques,
queues). Named tuples count as objects: SGLang keeps a prefetch's record as one.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

MAX_DEPTH = 7
"""Hops from a root: a hybrid's SWA staging slots in an operation queued for its ack are seven
(``cache.cache_controller.ack_prefetch_queue[…].operation.pool_transfers[…].host_indices``)."""
CONTAINERS = (dict, list, tuple, set, frozenset, deque, queue.Queue)
_SCALARS = (int, float, str, bytes, bool, type(None))
"""Leaves no check looks at (a book's keys are read from the book): not walked."""
_KINDS: dict[tuple[type, str], str] = {}
"""Each type's kind for a package (the fuzzer walks after every step: classify a type once)."""


def walk(
    roots: Mapping[str, object],
    package: str = "sglang",
    max_depth: int = MAX_DEPTH,
    skip: Iterable[object] = (),
) -> Iterator[tuple[str, object]]:
    """``(path, object)`` of every object reachable from ``roots`` (by name), each once: a
    root's or target object's attributes are ``path.name``, a container's items ``path[…]``.
    The objects in ``skip`` are neither yielded nor walked through."""
    seen = {id(obj) for obj in skip}
    stack = [(name, root, 0) for name, root in roots.items()]
    while stack:
        path, obj, depth = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield path, obj
        if depth == max_depth:
            continue
        kind = "target" if depth == 0 else _KINDS.get((type(obj), package))
        if kind is None:
            kind = _KINDS[type(obj), package] = _kind(obj, package)
        for name, child in _children(obj, kind):
            if not isinstance(child, _SCALARS):
                stack.append((f"{path}.{name}" if name else f"{path}[…]", child, depth + 1))


def entries(value: object) -> list[object] | None:
    """A book's keys or members (a dict, set, list, deque or queue); None for anything else,
    records (tuples) included."""
    if isinstance(value, dict):
        return list(value)
    if isinstance(value, (set, frozenset, list, deque)):
        return list(value)
    if isinstance(value, queue.Queue):
        return list(value.queue)
    return None


def is_targets(value: object, package: str) -> bool:
    module = type(value).__module__
    return module == package or module.startswith(package + ".")


def _kind(obj: object, package: str) -> str:
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return "record"  # a named tuple
    if isinstance(obj, dict):
        return "dict"
    if isinstance(obj, queue.Queue):
        return "queue"
    if isinstance(obj, CONTAINERS):
        return "container"
    return "target" if is_targets(obj, package) else "leaf"


def _children(obj: Any, kind: str) -> Iterable[tuple[str | None, object]]:
    """``(attribute name, child)``; the name is None for a container's item."""
    if kind == "record":
        return [(name, getattr(obj, name)) for name in obj._fields]
    if kind == "dict":
        return [(None, value) for value in list(obj.values())]
    if kind == "queue":
        return [(None, item) for item in list(obj.queue)]
    if kind == "container":
        return [(None, item) for item in list(obj)]
    return _attributes(obj) if kind == "target" else ()


def _attributes(obj: object) -> list[tuple[str | None, object]]:
    fields = getattr(obj, "__dict__", None)
    found: list[tuple[str | None, object]] = (
        list(fields.items()) if isinstance(fields, dict) else []
    )
    for name in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, name):
            found.append((name, getattr(obj, name)))
    return found
