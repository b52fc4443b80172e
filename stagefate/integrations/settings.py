"""What every integration's settings do alike: refuse an unknown key or a bad value at startup,
naming the key (as the deployment spelled it) and what is known, before anything is built."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

Settings = TypeVar("Settings", bound=BaseModel)


def checked(model: type[Settings], given: dict[str, Any], where: str, prefix: str = "") -> Settings:
    """``model(**given)``, or a ValueError that starts with ``where`` and names each unknown key
    with the known ones, or each bad value; ``prefix`` is how the deployment spells a key
    (``stagefate.`` in vLLM's extra config)."""
    unknown = sorted(set(given) - set(model.model_fields))
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {', '.join(prefix + key for key in unknown)}; known: "
            f"{', '.join(prefix + key for key in model.model_fields)}"
        )
    try:
        return model(**given)
    except ValidationError as error:
        problems = "; ".join(
            f"{prefix}{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()
        )
        raise ValueError(f"{where}: {problems}") from None
