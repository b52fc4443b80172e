"""Files a run writes: never half-written under their final name, never by two runs at once.

An output is written to a temporary file beside its final path and renamed into place when
the run finished writing it, so a reader (or the next run) sees the old file or the whole new
one, never a torn one; a run stopped by an error or Ctrl-C removes its temporary file and
leaves the final path as it was. While a run writes an output it holds a lock on that path
(``flock`` on a hidden lock file beside it, released by the kernel if the process dies): a
second run asked to write the same path is refused at once, naming the path, instead of both
running for minutes and one silently winning.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, ClassVar


def _umask() -> int:
    """The process's umask (reading it means setting it: done once, at import, before any
    thread of the run could create a file meanwhile)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


class OutputBusy(ValueError):
    """Another run is writing the same output path."""


class OutputLock:
    """An exclusive, non-blocking lock on one output path for the life of a run (re-entrant
    within the process: a run that holds it may write the path under it)."""

    _held: ClassVar[dict[Path, list[int]]] = {}
    """Lock file -> [descriptor, holds] of the locks this process holds."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(f".{self.path.name}.lock").resolve()
        self._holding = False

    def acquire(self) -> OutputLock:
        held = self._held.get(self._lock_path)
        if held is not None:
            held[1] += 1
            self._holding = True
            return self
        while True:
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise OutputBusy(
                    f"{self.path}: another run is writing it now (it holds {self._lock_path}); "
                    "wait for that run to finish, or name another output"
                ) from None
            if self._still_linked(fd):
                break
            os.close(fd)  # its holder unlinked it as we opened it: lock the new one
        self._held[self._lock_path] = [fd, 1]
        self._holding = True
        return self

    def _still_linked(self, fd: int) -> bool:
        try:
            return os.stat(self._lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            return False

    def release(self) -> None:
        if not self._holding:
            return
        self._holding = False
        held = self._held[self._lock_path]
        held[1] -= 1
        if held[1]:
            return
        del self._held[self._lock_path]
        with contextlib.suppress(FileNotFoundError):
            self._lock_path.unlink()  # unlinked while held: a waiting run gets a fresh one
        os.close(held[0])


class AtomicFile:
    """A file written beside ``path`` and renamed onto it by :meth:`commit` (or removed by
    :meth:`abandon`); ``lock``: hold an :class:`OutputLock` on ``path`` meanwhile; ``mode``:
    the file's permissions once in place (None: what the umask gives any new file)."""

    def __init__(
        self, path: Path | str, binary: bool = False, lock: bool = True, mode: int | None = None
    ) -> None:
        self.path = Path(path)
        self.mode = 0o666 & ~_UMASK if mode is None else mode
        self._lock = OutputLock(self.path).acquire() if lock else None
        try:
            fd, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        except BaseException:
            self._release()
            raise
        self.temporary = Path(temporary)
        self.handle: IO[Any] = os.fdopen(
            fd, "wb" if binary else "w", encoding=None if binary else "utf-8"
        )

    def commit(self) -> None:
        """The whole file is written: it takes the final name, with its :attr:`mode`."""
        try:
            self.handle.close()
            self.temporary.chmod(self.mode)  # mkstemp makes it 0600
            os.replace(self.temporary, self.path)
        except BaseException:
            self.temporary.unlink(missing_ok=True)  # (a full disk, say): nothing left over
            raise
        finally:
            self._release()

    def abandon(self) -> None:
        """The run stopped before finishing it: nothing is left, the final path untouched."""
        try:
            self.handle.close()
        finally:
            self.temporary.unlink(missing_ok=True)
            self._release()

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


@contextlib.contextmanager
def atomic_output(
    path: Path | str, binary: bool = False, lock: bool = True, mode: int | None = None
) -> Iterator[IO[Any]]:
    """A handle whose content becomes ``path`` if the block ends normally, and nothing if it
    raises (KeyboardInterrupt included); ``lock`` and ``mode`` as :class:`AtomicFile`'s."""
    output = AtomicFile(path, binary, lock, mode)
    try:
        yield output.handle
    except BaseException:
        output.abandon()
        raise
    output.commit()


def write_atomically(path: Path | str, data: str | bytes) -> None:
    """``path`` holds ``data`` whole, or is left as it was."""
    with atomic_output(path, isinstance(data, bytes)) as handle:
        handle.write(data)


@contextlib.contextmanager
def held_outputs(paths: Sequence[str | None]) -> Iterator[None]:
    """Hold the lock of each output path given (None: not asked for) for the whole run, so a
    second run asked for one of them is refused before its work, not overwritten after it.
    The lock is released before each is written (:func:`write_atomically` takes it anew)."""
    locks = []
    try:
        for path in paths:
            if path is not None:
                locks.append(OutputLock(path).acquire())
        yield
    finally:
        for lock in locks:
            lock.release()


def distinct_outputs(named: Sequence[tuple[str, str | None]]) -> None:
    """Refuse one path given to two outputs (``[(flag, path), …]``; None: not asked for): the
    later would overwrite the earlier."""
    seen: dict[Path, str] = {}
    for flag, given in named:
        if given is None:
            continue
        resolved = Path(given).resolve()
        if resolved in seen:
            raise ValueError(
                f"{seen[resolved]} and {flag} both name {given}: the one written last would "
                "replace the other; give each output a file of its own"
            )
        seen[resolved] = flag
