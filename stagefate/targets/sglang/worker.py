"""A call run in another SGLang release's environment: the worker process.

The caller (:func:`call_in`) starts the release's interpreter with this stagefate on its path
(:func:`~.environments.worker_environment`) and writes ``(function, args, kwargs)`` to its stdin
as a pickle; the worker calls it and writes back ``("ok", result)`` or ``("error", traceback)``.
Both sides run the same stagefate code on the same Python, so pickle's references to module-level
functions and stagefate's own classes resolve on both. Whatever SGLang prints goes to stderr;
stdout carries the answer alone.

``--check V`` runs one prefetch through release V's pipeline with the CPU stand-ins
(:func:`one_prefetch`; the last step of an install: an environment is ready only once this
passed).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

from .environments import Installed, worker_environment
from .logs import route_sglang_logs

Result = TypeVar("Result")


class WorkerFailed(RuntimeError):
    """The call raised in the release's process; the message carries its traceback."""


def call_in(
    target: Installed,
    function: Callable[..., Result],
    *args: Any,
    sglang_env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Result:
    """``function(*args, **kwargs)`` in ``target``'s interpreter (in this process when it is
    this interpreter's own release), with ``sglang_env`` set in its environment."""
    if target.here:
        with environment_set(sglang_env or {}):
            return function(*args, **kwargs)
    done = subprocess.run(
        [str(target.python), "-m", __name__],
        input=pickle.dumps((function, args, kwargs)),
        stdout=subprocess.PIPE,
        env=worker_environment(target.python, dict(sglang_env or {})),
        check=False,
    )
    if done.returncode != 0 or not done.stdout:
        raise WorkerFailed(
            f"the SGLang {target.version} worker exited with status {done.returncode} before "
            "answering (its stderr is above)"
        )
    status, value = pickle.loads(done.stdout)
    if status != "ok":
        raise WorkerFailed(f"in SGLang {target.version}'s process:\n{value}")
    return value  # type: ignore[no-any-return]


def command_in(target: Installed, argv: list[str], sglang_env: Mapping[str, str]) -> int:
    """``stagefate ARGV`` run by ``target``'s interpreter, its output on this terminal; its
    exit status."""
    # Past ``stagefate``'s entry check: a release's environment has every tool the command
    # line needs but pygraphviz, which no command run there draws with (environments).
    done = subprocess.run(
        [
            str(target.python),
            "-c",
            "import sys; from stagefate.cli import main; sys.exit(main())",
            *argv,
        ],
        env=worker_environment(target.python, dict(sglang_env)),
        check=False,
    )
    return done.returncode


@contextmanager
def environment_set(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, restored on exit (SGLang reads its knobs there at
    call time)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_native_hash() -> None:
    """Build (or load) SGLang's JIT-compiled page-hash extension in this process. The build
    takes a file lock; two processes building it at once can fail one L3 query ("HiCache
    storage query failed", seen when seeds' replays started together), so callers build it
    once before their processes fan out."""
    from . import require

    require()
    from sglang.srt.mem_cache.cpp_utils.native_hash import _load_native_hash_module

    _load_native_hash_module()


def one_prefetch(swa_window: int | None = None) -> tuple[str, int, bool, int]:
    """One prefetch through this interpreter's release, as the scheduler makes it: issue,
    query, commit, read, ack, admission (``swa_window``: of a hybrid model). ``(driver, tokens
    loaded, whether the loaded slots hold the producer's KV, in every pool, device slots neither
    free nor in the tree, in every pool)``."""
    from .generations import stepped_sglang

    driver = stepped_sglang(page_size=4, swa_window=swa_window)
    try:
        tokens = list(range(1, 33))
        driver.produce(tokens, None)
        driver.publish(tokens[:8], None)
        driver.issue("r0", tokens, None)
        driver.run_existence_queries()
        driver.tick()
        driver.run_reads()
        driver.tick()
        loaded = driver.admit("r0")
        driver.settle()
        held = driver.device_marks(tokens, None)[1]
        books = [driver.device_books(), driver.swa_books()]
        leaked = sum(size - free - cached for free, cached, size in filter(None, books))
        return type(driver).__name__, loaded, held, leaked
    finally:
        driver.close()


def one_expired_wait() -> tuple[bool, bool]:
    """A prefetch whose wait the caller's clock ends (``timeout`` policy) before its L3 query
    ran, through the release's own deadline path: ``(SGLang ended it, it is still in flight)``.
    """
    from .generations import stepped_sglang

    driver = stepped_sglang(page_size=4, prefetch_policy="timeout")
    try:
        tokens = list(range(1, 33))
        driver.produce(tokens, None)
        request = driver.issue("r0", tokens, None)
        ended = driver.expire_wait("r0")
        in_flight = request.handle in driver.consumer.cache.ongoing_prefetch
        driver.settle()
        return ended, in_flight
    finally:
        driver.close()


def one_logged_program(log_path: str) -> str:
    """A scripted program through this interpreter's release with its design log on
    (:mod:`.design_log`), written to ``log_path``: a whole fill, an abort while querying, a hold
    let go by an abort, an abort while reading, a hit too short. The design's spec (a path)."""
    from ...transition_log import TransitionLog, closing_logs
    from .design_log import design_path, watch_design
    from .fuzz_config import PAGE, FuzzConfig
    from .fuzzer import SEQUENCES, fuzz_world

    driver = fuzz_world(FuzzConfig(), namespaces=(None,))
    try:
        log = TransitionLog.open(log_path)
        with closing_logs([log]):
            watch_design(driver, log)
            driver.issue("fill", SEQUENCES[0], None)
            driver.settle(3)
            assert driver.admit("fill") > 0, "the scripted fill loaded nothing"
            driver.settle(3)
            driver.issue("querying", SEQUENCES[1], None)
            driver.abort("querying")
            driver.issue("held", SEQUENCES[2], None)
            driver.settle(3)
            driver.abort("held")
            driver.issue("reading", SEQUENCES[1], None)
            driver.run_existence_queries()
            driver.tick()
            driver.abort("reading")
            driver.evict(10_000)
            driver.publish(SEQUENCES[1][:PAGE], None)
            driver.issue("short", SEQUENCES[1], None, stale=True)
            driver.settle(3)
        return str(design_path(driver.consumer.cache.buffer_pipeline))
    finally:
        driver.close()


def _check(version: str) -> None:
    """An install's last step: the release's own prefetch, end to end, and one whose wait the
    caller's clock ends, in its environment."""
    from . import require

    require(version)
    driver, loaded, held, leaked = one_prefetch()
    if loaded != 24 or not held or leaked:
        raise SystemExit(
            f"SGLang {version} ({driver}): one prefetch loaded {loaded} of 24 tokens, bytes "
            f"{'right' if held else 'wrong'}, {leaked} device slots leaked"
        )
    ended, in_flight = one_expired_wait()
    if not ended or in_flight:
        raise SystemExit(
            f"SGLang {version} ({driver}): an expired prefetch wait did not end it "
            f"(ended {ended}, still in flight {in_flight})"
        )
    print(f"SGLang {version}: one prefetch through {driver}, 24 tokens spliced", file=sys.stderr)


def _serve() -> None:
    answer = sys.stdout.buffer
    sys.stdout = sys.stderr  # whatever the call prints is not the answer
    function, args, kwargs = pickle.load(sys.stdin.buffer)
    route_sglang_logs()  # (from the replay's environment, when it named a file)
    try:
        reply: tuple[str, Any] = ("ok", function(*args, **kwargs))
    except BaseException:
        reply = ("error", traceback.format_exc())
    answer.write(pickle.dumps(reply))
    answer.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--check"]:
        _check(sys.argv[2])
    else:
        _serve()
