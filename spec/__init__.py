"""The formal lifecycle spec: its schema, loader, static checks and diagram generation.

This package is data and the code that reads and checks it; it imports neither torch nor the
runtime.
"""

from .checks import Finding, run_static_checks
from .load import DEFAULT_SPEC_PATH, SpecError, load_spec, parse_spec
from .schema import SAME, BranchSpec, Level, LifecycleSpec, StateSpec, TransitionSpec

__all__ = [
    "DEFAULT_SPEC_PATH",
    "SAME",
    "BranchSpec",
    "Finding",
    "Level",
    "LifecycleSpec",
    "SpecError",
    "StateSpec",
    "TransitionSpec",
    "load_spec",
    "parse_spec",
    "run_static_checks",
]
