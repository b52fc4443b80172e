"""The test suite needs no environment of the Makefile's: a fuzz run under two hash seeds and
two separate interpreters draws the same programs and reaches the same edges."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROGRAM = """
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test
from stagefate.fuzz.fuzzer import PipelineFuzzer
from stagefate.fuzz.tally import TALLY
from stagefate.fuzz.profiles import register_profiles

register_profiles()
short = settings(settings.get_profile("ci"), max_examples=20, stateful_step_count=40)
run_state_machine_as_test(PipelineFuzzer, settings=short)
print(TALLY.states, sorted(TALLY.edges.items()))
"""


@pytest.mark.slow
def test_a_fuzz_run_is_the_same_under_any_hash_seed() -> None:
    runs = []
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _PROGRAM], env=env, capture_output=True, text=True, check=True
        )
        runs.append(done.stdout)
    assert runs[0] == runs[1] and runs[0].split()[0] != "0"
