"""The one-writer-at-a-time lock of an output (a quantize/export folder, a batch job's OUT).
Its own module, importing nothing heavy: `corpus` takes it without importing torch."""

from __future__ import annotations

import os
from pathlib import Path


def lock_exclusive(path: Path, busy: Exception, flags: int = os.O_RDONLY) -> int | None:
    """An exclusive flock on `path` (opened with `flags`), taken without waiting, so a second
    writer is refused at once, and dropped by the kernel when the process dies: its descriptor
    to close, None where `fcntl` is missing (Windows: nothing is locked). `busy` is raised when
    another process holds it."""
    try:
        import fcntl
    except ImportError:
        return None
    fd = os.open(path, flags, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise busy from None
    return fd
