"""Paced retries: at most one pending retry per request, counted in scheduling passes."""

from __future__ import annotations

from collections.abc import Callable, Sequence


class RetryBook:
    """Who may re-issue a prefetch, and when.

    A retry armed at poll ``n`` is due at poll ``n + interval``; the head of the waiting queue is
    due at once (pacing protects storage from requests deep in the queue; the head is about to
    be admitted, and waiting would delay it). After ``max_attempts`` retries a request is not
    armed again. ``head_due_at_once=False`` paces the head like the rest, as SGLang's sweep
    (PR #36227) does.
    """

    def __init__(self, interval: int, max_attempts: int, head_due_at_once: bool = True) -> None:
        self.interval = interval
        self.max_attempts = max_attempts
        self.head_due_at_once = head_due_at_once
        self._armed_at: dict[str, int] = {}
        self._attempts: dict[str, int] = {}

    def arm(self, request_id: str, now: int) -> bool:
        """Arm a retry; False when its attempts are used up (nothing is armed)."""
        if self._attempts.get(request_id, 0) >= self.max_attempts:
            return False
        self._armed_at.setdefault(request_id, now)
        return True

    def pending(self, request_id: str) -> bool:
        """Whether ``request_id`` has a retry armed."""
        return request_id in self._armed_at

    def pending_count(self) -> int:
        """How many requests have a retry armed."""
        return len(self._armed_at)

    def attempts(self, request_id: str) -> int:
        """How many retries ``request_id`` has made."""
        return self._attempts.get(request_id, 0)

    def make_due(self, request_id: str, now: int) -> None:
        """Make a pending retry due at once (used when what it waited for has ended)."""
        if request_id in self._armed_at:
            self._armed_at[request_id] = now - self.interval

    def due(
        self, waiting: Sequence[str], now: int, held: Callable[[str], bool] = lambda _: False
    ) -> list[str]:
        """Pending retries that are due among ``waiting`` (queue order); each counts an attempt.
        A ``held`` request is never due (it waits for an event that makes it due itself)."""
        out = []
        for position, request_id in enumerate(waiting):
            armed_at = self._armed_at.get(request_id)
            if armed_at is None or held(request_id):
                continue
            if (position == 0 and self.head_due_at_once) or now - armed_at >= self.interval:
                del self._armed_at[request_id]
                self._attempts[request_id] = self._attempts.get(request_id, 0) + 1
                out.append(request_id)
        return out

    def disarm(self, request_id: str) -> None:
        """Drop a pending retry (the request issued again by itself)."""
        self._armed_at.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        """Forget the request entirely (it finished or was aborted)."""
        self._armed_at.pop(request_id, None)
        self._attempts.pop(request_id, None)
