"""Files and directories only their owner can use, whatever the umask (docs/security.md).

``os.open``/``mkdir`` with an explicit mode, then ``fchmod``/``chmod``: a umask can only take
bits away, and the second call puts the mode back exactly. Stdlib only: the plan, the engine
and the envelope all use it.
"""

from __future__ import annotations

import contextlib
import errno
import os

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def open_private(path: str, flags: int) -> int:
    """Open (creating) a file only its owner can read: 0600 whatever the umask."""
    fd = os.open(path, flags, PRIVATE_FILE)
    with contextlib.suppress(OSError):  # a file system without modes (vfat): nothing to do
        os.fchmod(fd, PRIVATE_FILE)
    return fd


def make_private_dir(path: os.PathLike[str] | str) -> None:
    """``mkdir -p`` where the directories it creates are 0700 (an existing one is left as it
    is: it is the operator's)."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, PRIVATE_DIR)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue
        os.chmod(directory, PRIVATE_DIR)


def error_text(exc: OSError) -> str:
    """``ENOSPC: No space left on device``: the errno's name and its text."""
    name = errno.errorcode.get(exc.errno or 0, "") if exc.errno else ""
    text = exc.strerror or str(exc)
    return f"{name}: {text}" if name else text
