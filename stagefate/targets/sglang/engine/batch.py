"""What one ``generate`` command sends: :class:`Batch`, the same on both sides of the driver."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Batch:
    """Prompts sent together to the engine, with what shapes their arrival and end.

    ``rids`` name the requests (SGLang draws its own where absent); ``abort_after_s`` has the
    tokenizer manager abort a request that many seconds after the batch starts;
    ``start_after[i]`` holds prompt ``i`` back until prompt ``start_after[i]``'s answer is in
    (SGLang's tokenizer refuses a rid still in flight, so a retry under the same id waits so);
    ``salts`` are SGLang's ``cache_salt`` per prompt (a tenant's namespace); a request not
    answered within ``timeout_s`` is aborted and reported ``timed_out``; ``stream`` asks for
    the answer in chunks, so its time to the first token is measured."""

    prompts: list[list[int]]
    max_new_tokens: int = 8
    rids: list[str] | None = None
    abort_after_s: dict[str, float] | None = None
    start_after: list[int | None] | None = None
    salts: list[str | None] | None = None
    timeout_s: float | None = None
    stream: bool = False

    def __post_init__(self) -> None:
        for name in ("rids", "start_after", "salts"):
            given = getattr(self, name)
            if given is not None and len(given) != len(self.prompts):
                raise ValueError(
                    f"{name} has {len(given)} entries for {len(self.prompts)} prompts: give one "
                    "per prompt"
                )
        if self.timeout_s is not None and (self.rids is None or None in self.rids):
            raise ValueError("timeout_s aborts a late request by its id: give every prompt a rid")
        unknown = set(self.abort_after_s or ()) - set(self.rids or ())
        if unknown:
            raise ValueError(f"abort_after_s names {sorted(unknown)}, which no prompt's rid is")

    def as_json(self) -> dict[str, Any]:
        return asdict(self)
