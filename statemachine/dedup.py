"""In-flight dedup's book: which live record owns which page keys, and who waits on whom.

A record owns the page keys of what it reads from the moment the read is launched until it
leaves the spec's ``owning`` group (a short read owns only what it brought). A request whose
span's head (its first page key) a live sibling owns is declined (``declined_inflight``) and
waits on that sibling; when the sibling's ownership shrinks, whatever the reason, its waiters'
retries fall due at once. Page keys chain from the root, so the sibling brings the same head;
once it is spliced the waiter's re-issue matches it on the device and reads only the rest, so
requests that share a head and differ after it read the head once. The pipeline's guards only
ask (:meth:`sibling_owning_head`); its effects and exit hooks write.
"""

from __future__ import annotations

from collections.abc import Sequence


class DedupBook:
    """In-flight dedup's book (this module's docstring): owners of page keys, and waiters."""

    def __init__(self) -> None:
        self._owners: dict[bytes, dict[str, None]] = {}
        """page key -> the records owning it, in the order they took it"""
        self._waiters: dict[str, list[str]] = {}
        """owning record -> the requests waiting on it"""
        self._waiting_on: dict[str, str] = {}
        """waiting request -> the record it waits on"""

    def sibling_owning_head(self, request_id: str, digests: Sequence[bytes]) -> str | None:
        """The earliest live record other than ``request_id`` that owns ``digests[0]``."""
        if not digests:
            return None
        return next((s for s in self._owners.get(digests[0], ()) if s != request_id), None)

    def own(self, request_id: str, digests: Sequence[bytes]) -> None:
        """``request_id`` owns ``digests`` (its read is launched)."""
        owners = self._owners
        for digest in digests:
            owners.setdefault(digest, {})[request_id] = None

    def wait(self, waiter: str, sibling: str) -> None:
        """``waiter`` waits on ``sibling`` (declined while the sibling reads its head)."""
        self.stop_waiting(waiter)  # (re-issued while still waiting: it waits on one sibling)
        self._waiters.setdefault(sibling, []).append(waiter)
        self._waiting_on[waiter] = sibling

    def disown(self, request_id: str, digests: Sequence[bytes]) -> list[str]:
        """``request_id`` gives up ``digests``; returns its waiters (no longer waiting)."""
        owners_of = self._owners
        for digest in digests:
            owners = owners_of.get(digest)
            if owners is not None:
                owners.pop(request_id, None)
                if not owners:
                    del owners_of[digest]
        waiters = self._waiters.pop(request_id, [])
        for waiter in waiters:
            self._waiting_on.pop(waiter, None)
        return waiters

    def stop_waiting(self, request_id: str) -> None:
        """``request_id`` waits no more (it was aborted): a later request under its id is new."""
        sibling = self._waiting_on.pop(request_id, None)
        if sibling is not None:
            waiters = self._waiters[sibling]
            waiters.remove(request_id)
            if not waiters:
                del self._waiters[sibling]

    def is_waiting(self, request_id: str) -> bool:
        """Whether ``request_id`` waits on a sibling."""
        return request_id in self._waiting_on

    def is_empty(self) -> bool:
        """No key owned and nobody waiting (as at quiescence)."""
        return not (self._owners or self._waiters or self._waiting_on)

    def sibling_of(self, waiter: str) -> str | None:
        """The record ``waiter`` waits on (it must be live and owning), or None."""
        return self._waiting_on.get(waiter)
