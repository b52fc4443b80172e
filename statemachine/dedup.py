"""In-flight dedup's book: which live record owns which page keys, and who waits on whom.

A record owns the page keys of what it reads from the moment the read is launched until it
leaves the spec's ``owning`` group (a short read owns only what it brought). A request whose
whole span one live sibling owns is declined (``declined_inflight``) and waits on that sibling;
when the sibling's ownership shrinks, whatever the reason, its waiters' retries fall due at once.
The pipeline's guards only ask (:meth:`sibling_owning`); its effects and exit hooks write.
"""

from __future__ import annotations

from collections.abc import Sequence


class DedupBook:
    def __init__(self) -> None:
        self._owners: dict[bytes, dict[str, None]] = {}
        """page key -> the records owning it, in the order they took it"""
        self._waiters: dict[str, list[str]] = {}
        """owning record -> the requests waiting on it"""

    def sibling_owning(self, request_id: str, digests: Sequence[bytes]) -> str | None:
        """The one live record other than ``request_id`` that owns every key of ``digests``."""
        if not digests:
            return None
        owners = self._owners
        for sibling in owners.get(digests[0], ()):
            if sibling != request_id and all(sibling in owners.get(d, ()) for d in digests):
                return sibling
        return None

    def own(self, request_id: str, digests: Sequence[bytes]) -> None:
        owners = self._owners
        for digest in digests:
            owners.setdefault(digest, {})[request_id] = None

    def wait(self, waiter: str, sibling: str) -> None:
        self._waiters.setdefault(sibling, []).append(waiter)

    def disown(self, request_id: str, digests: Sequence[bytes]) -> list[str]:
        """``request_id`` gives up ``digests``; returns its waiters (no longer waiting)."""
        owners_of = self._owners
        for digest in digests:
            owners = owners_of.get(digest)
            if owners is not None:
                owners.pop(request_id, None)
                if not owners:
                    del owners_of[digest]
        return self._waiters.pop(request_id, [])

    def is_waiting(self, request_id: str) -> bool:
        return any(request_id in waiters for waiters in self._waiters.values())

    def waited_on(self) -> list[str]:
        """The records some request waits on (each must be live and owning)."""
        return list(self._waiters)
