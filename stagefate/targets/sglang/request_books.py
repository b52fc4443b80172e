"""Every per-request structure of a target, found by walking its objects rather than listed.

A leak of per-request state is a structure keyed by a request that outlives the request: a dict
of a handle, a set of rids, a queued operation naming one. Which structures a release has
changes from release to release (0.5.23 alone adds a wait book and a retry book), so a list
written by hand would check the structures of the release it was written for. Instead,
:func:`per_request_books` walks every object reachable from the roots through attributes whose
class is the target's (its package's modules), and reports each dict, set, list, deque or queue
that holds an entry for one of the requests: as a key or member, or an item whose ``rid``,
``request_id``, ``req_id`` or ``request`` names one.
"""

from __future__ import annotations

import queue
from collections import deque
from collections.abc import Collection, Iterable, Mapping

_NAMING_ATTRIBUTES = ("rid", "request_id", "req_id", "request")
"""Attributes through which an item (an operation, a pending load) names its request."""
MAX_DEPTH = 6
"""Attribute hops from a root: the cache's controller's book's entries are four."""


def per_request_books(
    roots: Mapping[str, object], requests: Collection[object], package: str = "sglang"
) -> dict[str, int]:
    """``{path: entries}`` of every structure reachable from ``roots`` (by name) that holds an
    entry for one of ``requests`` (rids and handles alike)."""
    found: dict[str, int] = {}
    seen: set[int] = set()
    stack = [(name, root, 0) for name, root in roots.items()]
    while stack:
        path, obj, depth = stack.pop()
        if id(obj) in seen or depth > MAX_DEPTH:
            continue
        seen.add(id(obj))
        for name, value in _attributes(obj):
            where = f"{path}.{name}"
            entries = _entries(value)
            if entries is not None:
                held = sum(_names_request(entry, requests) for entry in entries)
                if held:
                    found[where] = held
                stack.extend(
                    (f"{where}[…]", item, depth + 1)
                    for item in _values(value)
                    if _is_targets(item, package)
                )
            elif _is_targets(value, package):
                stack.append((where, value, depth + 1))
    return found


def _attributes(obj: object) -> Iterable[tuple[str, object]]:
    fields = getattr(obj, "__dict__", None)
    if isinstance(fields, dict):
        yield from list(fields.items())
    for name in getattr(type(obj), "__slots__", ()):
        if hasattr(obj, name):
            yield name, getattr(obj, name)


def _entries(value: object) -> list[object] | None:
    """A container's keys or members; None for anything else."""
    if isinstance(value, dict):
        return list(value)
    if isinstance(value, (set, list, deque)):
        return list(value)
    if isinstance(value, queue.Queue):
        return list(value.queue)
    return None


def _values(value: object) -> list[object]:
    if isinstance(value, dict):
        return list(value.values())
    return _entries(value) or []


def _names_request(entry: object, requests: Collection[object]) -> bool:
    if _member(entry, requests):
        return True
    return any(_member(getattr(entry, name, None), requests) for name in _NAMING_ATTRIBUTES)


def _member(value: object, requests: Collection[object]) -> bool:
    try:
        return value is not None and value in requests
    except TypeError:  # unhashable
        return False


def _is_targets(value: object, package: str) -> bool:
    module = type(value).__module__
    return module == package or module.startswith(package + ".")
