"""Reading ``lifecycle.yaml`` into a :class:`LifecycleSpec`, with errors that say how to fix."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .schema import LifecycleSpec

DEFAULT_SPEC_PATH = Path(__file__).with_name("lifecycle.yaml")


class SpecError(ValueError):
    """The spec file is malformed; the message names the file, the field path and the fix."""


def _field_path(location: tuple[int | str, ...]) -> str:
    path = ""
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "<top level>"


def parse_spec(document: Any, source: str = "<memory>") -> LifecycleSpec:
    """Validate an already-parsed YAML document."""
    if not isinstance(document, dict):
        raise SpecError(
            f"{source}: the top level must be a mapping of sections (states, events, …)"
        )
    try:
        return LifecycleSpec.model_validate(document)
    except ValidationError as exc:
        lines = [f"{source}: the lifecycle spec is malformed:"]
        for error in exc.errors():
            message = error["msg"].removeprefix("Value error, ")
            lines.append(f"  at {_field_path(tuple(error['loc']))}: {message}")
        lines.append("Fix the fields above; spec/schema.py documents every field.")
        raise SpecError("\n".join(lines)) from None


def load_spec(path: Path | str | None = None) -> LifecycleSpec:
    """Load and validate a spec file (the packaged ``lifecycle.yaml`` by default)."""
    if path is None:
        return _default_spec()
    return _load(Path(path))


@lru_cache(maxsize=1)
def _default_spec() -> LifecycleSpec:
    return _load(DEFAULT_SPEC_PATH)


def _load(path: Path) -> LifecycleSpec:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(
            f"{path}: cannot read the spec ({exc.strerror}); pass an existing file"
        ) from None
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no objects
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: not valid YAML: {exc}") from None
    return parse_spec(document, str(path))


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the
    last: a spec with two ``initial:`` keys would silently start elsewhere)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice in this mapping (line "
                    f"{key_node.start_mark.line + 1}); keep one",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
