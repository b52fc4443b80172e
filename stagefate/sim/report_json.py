"""``stagefate replay --json``: one self-describing file for every mode of a replay.

Every file has the same envelope, so a figure can be traced back to the run that produced it::

    {"stagefate": "0.1.0",
     "trace": {"source", "requests", "out_of_order"},
     "arguments": {flag: value, …},      # the command line as parsed, defaults included
     "options": {…},                     # the ReplayOptions the first run was built from
     "bound": {"hit_rate", "reusable_tokens", "prompt_tokens"},
     <body>}

and one body, by mode: ``policies`` (``{policy: metrics}``; behind the router each policy's
``{"total", "instances", "cross_instance_read_tokens", "cross_instance_hits"}``; under
``--seeds`` each policy's ``{"seeds": {seed: metrics}, "summary": {figure: {median, min, max}}}``),
or ``speeds`` (``{speed: policies}`` for ``--sweep``). The bound is the trace's, so it sits once
beside the body, never among the policies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ..output_files import write_atomically
from .bound import TraceBound
from .instances import InstancesMetrics
from .replay import ReplayMetrics, ReplayOptions
from .spread import SeedRuns, summary, summary_json
from .trace import TraceRequest, out_of_order


class RunDescription(BaseModel):
    """What a replay's JSON says about the run that produced it."""

    source: str
    """The ``--trace`` path, or the embedded slice's name."""
    requests: int
    out_of_order: int
    """Requests not at their arrival rank in the file (replayed by timestamp all the same)."""
    arguments: dict[str, Any]
    options: ReplayOptions

    @classmethod
    def of(
        cls,
        source: str,
        trace: Sequence[TraceRequest],
        arguments: Mapping[str, Any],
        options: ReplayOptions,
    ) -> RunDescription:
        return cls(
            source=source,
            requests=len(trace),
            out_of_order=out_of_order(trace),
            arguments=dict(arguments),
            options=options,
        )


def stagefate_version() -> str:
    try:
        return version("stagefate")
    except PackageNotFoundError:  # a checkout on sys.path that was never installed
        return "unknown (not installed)"


def write_report(
    path: Path, run: RunDescription, bound: TraceBound, body: Mapping[str, Any]
) -> None:
    """The envelope around ``body`` (one of :func:`policies_body` and friends)."""
    payload = {
        "stagefate": stagefate_version(),
        "trace": {
            "source": run.source,
            "requests": run.requests,
            "out_of_order": run.out_of_order,
        },
        "arguments": run.arguments,
        "options": run.options.model_dump(mode="json"),
        "bound": bound.model_dump(),
        **body,
    }
    write_atomically(path, json.dumps(payload, indent=2) + "\n")


def policies_body(results: Mapping[str, ReplayMetrics | InstancesMetrics]) -> dict[str, Any]:
    """One run of each policy (alone, or behind the router)."""
    return {"policies": {name: metrics.model_dump() for name, metrics in results.items()}}


def sweep_body(sweep: Mapping[float, Mapping[str, ReplayMetrics]]) -> dict[str, Any]:
    return {"speeds": {f"{speed:g}": policies_body(results) for speed, results in sweep.items()}}


def spread_body(runs: SeedRuns, seeds: Sequence[int]) -> dict[str, Any]:
    """Each policy under every seed, with the median and range of each figure."""
    return {
        "policies": {
            name: {
                "seeds": {
                    str(seed): m.model_dump() for seed, m in zip(seeds, policy_runs, strict=True)
                },
                "summary": summary_json(summary(policy_runs)),
            }
            for name, policy_runs in runs.items()
        }
    }


def spread_sweep_body(sweep: Mapping[float, SeedRuns], seeds: Sequence[int]) -> dict[str, Any]:
    return {"speeds": {f"{speed:g}": spread_body(runs, seeds) for speed, runs in sweep.items()}}
