"""Every per-request structure of a target, found by walking its objects rather than listed.

A leak of per-request state is a structure keyed by a request that outlives the request: a dict
of a handle, a set of rids, a queued operation naming one. :func:`per_request_books` walks every
object reachable from the roots (:mod:`.object_walk`) and reports each dict, set, list, deque or
queue that holds an entry for one of the requests: as a key or member, or an item whose ``rid``,
``request_id``, ``req_id`` or ``request`` names one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from .object_walk import entries, walk

_NAMING_ATTRIBUTES = ("rid", "request_id", "req_id", "request")
"""Attributes through which an item (an operation, a pending load) names its request."""


def per_request_books(
    roots: Mapping[str, object], requests: Collection[object], package: str = "sglang"
) -> dict[str, int]:
    """``{path: entries}`` of every structure reachable from ``roots`` (by name) that holds an
    entry for one of ``requests`` (rids and handles alike)."""
    found: dict[str, int] = {}
    for path, obj in walk(roots, package):
        held = entries_for(obj, requests)
        if held:
            found[path] = held
    return found


def entries_for(obj: object, requests: Collection[object]) -> int:
    """How many entries of ``obj`` (a book, or 0 for anything else) name one of ``requests``:
    :func:`per_request_books`' test of one object, for a caller already walking."""
    book = entries(obj)
    if book is None:
        return 0
    return sum(_names_request(entry, requests) for entry in book)


def _names_request(entry: object, requests: Collection[object]) -> bool:
    if _member(entry, requests):
        return True
    return any(_member(getattr(entry, name, None), requests) for name in _NAMING_ATTRIBUTES)


def _member(value: object, requests: Collection[object]) -> bool:
    try:
        return value is not None and value in requests
    except TypeError:  # unhashable
        return False
