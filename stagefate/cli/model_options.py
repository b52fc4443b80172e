"""Command-line flags made from the option models' fields.

A flag that sets a field of :class:`~stagefate.sim.replay.ReplayOptions` or
:class:`~stagefate.sim.engine_model.EngineOptions` takes its default, its choices (a
``Literal``), its bound (``ge``/``gt``) and, unless a command words it better, its help from the
field: the parser cannot drift from the model it fills (a docs default of 8 once outlived a
model's 12). The same table reads the parsed flags back into the model (:func:`field_values`).
"""

from __future__ import annotations

import argparse
import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel

from .common import number


@dataclass(frozen=True)
class FieldFlag:
    """A flag for ``model``'s ``field``: ``meaning`` names the value in a refusal."""

    model: type[BaseModel]
    field: str
    flag: str
    meaning: str
    help: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")


def add_field_flag(parser: argparse.ArgumentParser, spec: FieldFlag) -> argparse.Action:
    info = spec.model.model_fields[spec.field]
    default = info.default
    options: dict[str, Any] = {"dest": spec.dest, "default": default}
    kind = _value_type(info.annotation)
    if kind is bool:
        raise TypeError(f"{spec.flag}: a bool field takes an action flag, written by hand")
    if get_origin(kind) is Literal:
        options["choices"] = list(get_args(kind))
    elif kind in (int, float):
        low, strict = _bound(info.metadata)
        options["type"] = number(kind, low, spec.meaning, strict)
    text = spec.help or info.description or spec.meaning
    options["help"] = text if default is None else f"{text} (default {default})"
    return parser.add_argument(spec.flag, **options)


def field_values(
    args: argparse.Namespace, flags: Mapping[str, FieldFlag], model: type[BaseModel]
) -> dict[str, Any]:
    """``{field: parsed value}`` of the flags that set ``model``'s fields."""
    return {spec.field: getattr(args, spec.dest) for spec in flags.values() if spec.model is model}


def _value_type(annotation: Any) -> Any:
    """``int | None`` -> ``int``: a flag left out keeps the model's None."""
    if get_origin(annotation) in (Union, types.UnionType):
        present = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(present) == 1:
            return present[0]
    return annotation


def _bound(metadata: list[Any]) -> tuple[float, bool]:
    """The field's lower bound and whether it is strict (``gt``); none: any finite value."""
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            return float(item.ge), False  # type: ignore[arg-type]
        if isinstance(item, annotated_types.Gt):
            return float(item.gt), True  # type: ignore[arg-type]
    return float("-inf"), False
