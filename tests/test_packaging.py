"""The bare wheel, as an engine installs it (no extra): a prefetch runs, and none of the tools
(the command line's rich, the fuzzers' hypothesis, the oracle's transitions, the diagrams'
pygraphviz) is installed or needed; the command says how to get them."""

from __future__ import annotations

import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from stagefate.extras import DRAWING_TOOLS, TOOLS

REPO = Path(__file__).parents[1]
RUNTIME = """
import importlib.util, sys
from stagefate import BufferPipeline, PipelineConfig
pipe = BufferPipeline(PipelineConfig(device="cpu", io="manual"))
state = pipe.prefetch_from_storage("r0", list(range(64)), 0)
pipe.release_aborted_request("r0")
pipe.io.complete_all()  # the existence query lands on a request already let go
pipe.poll()
tools = [name for name in {tools!r} if importlib.util.find_spec(name) is not None]
print(state, pipe.is_idle(), tools)
"""


@pytest.mark.slow
def test_the_bare_wheel_runs_a_prefetch_without_the_tools(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO), "-w", str(wheels)]
    subprocess.run(build, check=True)
    (wheel,) = wheels.glob("stagefate-*.whl")
    env = tmp_path / "bare"
    venv.create(env, with_pip=True)
    python = env / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # the local CPU wheel (fast here)
    subprocess.run([*pip, str(wheel)], check=True)
    done = subprocess.run(
        [str(python), "-c", RUNTIME.format(tools=TOOLS + DRAWING_TOOLS)],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository: the installed wheel, not the source tree
    )
    assert done.stdout.split("\n")[-2] == "no_anchor True []"
    command = subprocess.run(
        [str(env / "bin" / "stagefate"), "replay"], capture_output=True, text=True, cwd=tmp_path
    )
    assert command.returncode == 2
    assert "pip install 'stagefate[tools]'" in command.stderr


def test_the_tools_the_command_asks_for_are_the_tools_extra() -> None:
    # the extra's one line (tomllib is Python 3.11's; the project runs on 3.10)
    (line,) = re.findall(r"^tools = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.M)
    names = [re.split(r"[<>=!~]", quoted.strip(' "'))[0] for quoted in line.split(",")]
    assert sorted(names) == sorted(TOOLS + DRAWING_TOOLS)
