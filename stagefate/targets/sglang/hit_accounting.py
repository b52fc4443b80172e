"""SGLang's own storage-hit metrics held to what the fuzz world saw loaded.

From 0.5.20 on a release accounts for every token an L3 existence query found, per request: it
exports the hit (``log_storage_prefetch_hit_tokens``) and resolves each of its tokens once,
either loaded onto the device (at the load back's ack; not exported) or unfulfilled with a
reason (``log_storage_prefetch_unfulfilled_tokens``: ``device_covered``, ``host_capacity``,
``deadline``, ``below_threshold``, …). Two cases are left out on purpose
(``discard_storage_prefetch_accounting``, "cases intentionally excluded from metrics"): an
aborted request, and a retracted request at its admission (the scheduler's
``_account_prefill_cache_admission`` with ``retracted_stain``). So at quiescence

    exported hit tokens - exported unfulfilled tokens
        == tokens the world's admissions loaded + tokens left out

The world counts the loads itself, from each admission's result (:class:`WorldLoads`); what a
left-out request still had unresolved is read from SGLang's book at the moment the world aborts
or re-admits it. A token dropped without a reason, counted twice, or fulfilled beyond what was
loaded breaks the equality. 0.5.19 keeps no such books, and the check is not made there.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

REMAINING_BOOK = "_storage_prefetch_hit_remaining_by_reqid"
"""SGLang's per-request book of hit tokens not yet resolved (0.5.20 on)."""


def keeps_hit_metrics(cache: Any) -> bool:
    """Whether the release accounts for storage hits per request (0.5.20 on)."""
    return hasattr(cache, REMAINING_BOOK)


@dataclass
class WorldLoads:
    """What the world saw, in the terms of SGLang's metrics."""

    loaded: int = 0
    """Tokens admissions loaded onto the device for requests whose hits the metrics keep."""
    left_out: int = 0
    """Hit tokens still unresolved when SGLang left their request out of the metrics."""

    def leave_out(self, cache: Any, handle: Any) -> None:
        """SGLang is about to leave ``handle`` out of its metrics: what it had not resolved of
        the request's hit will never be exported."""
        book = getattr(cache, REMAINING_BOOK, None)
        if book is not None:
            self.left_out += int(book.get(handle, 0))


@dataclass
class HitMetrics:
    """Stands in for SGLang's storage metrics collector: keeps the hit and unfulfilled tokens
    it exports (every other metric call is ignored)."""

    hit: int = 0
    unfulfilled: Counter[str] = field(default_factory=Counter)
    """Tokens by SGLang's reason."""

    def log_storage_prefetch_hit_tokens(self, tokens: int) -> None:
        self.hit += int(tokens)

    def log_storage_prefetch_unfulfilled_tokens(self, tokens: int, reason: str) -> None:
        self.unfulfilled[reason] += int(tokens)

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None

    @classmethod
    def on(cls, cache: Any) -> HitMetrics:
        """SGLang's storage metrics turned on in ``cache``, exported into a new stand-in."""
        metrics = cls()
        cache.enable_storage_metrics = True
        cache.storage_metrics_collector = metrics
        return metrics

    def problem(self, world: WorldLoads) -> str | None:
        """Why the exported figures disagree with ``world`` at quiescence (None: they agree)."""
        resolved = self.hit - sum(self.unfulfilled.values())
        if resolved == world.loaded + world.left_out:
            return None
        reasons = ", ".join(
            f"{reason} {tokens}" for reason, tokens in sorted(self.unfulfilled.items())
        )
        return (
            f"SGLang exported {self.hit} storage-hit tokens and {sum(self.unfulfilled.values())} "
            f"unfulfilled ({reasons or 'none'}), so {resolved} fulfilled; the world's admissions "
            f"loaded {world.loaded} and aborts and retractions left {world.left_out} out of the "
            f"metrics: {resolved - world.loaded - world.left_out:+d} tokens unaccounted for"
        )
