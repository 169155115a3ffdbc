"""Files Receipt creates on disk, private from their first byte.

``RECEIPT_HOME`` holds the embedded database, the broker folders and the dev token: it is created
0700, and the database and the dev-token file 0600 through ``os.open`` with that mode, so there is
no moment when another user of the machine could open them (a ``chmod`` after ``write`` leaves
one). An existing folder or file is left as its owner set it, except the dev token, which is
rewritten 0600 every time.
"""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) with the folder itself 0700; no-op if it exists."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            return path  # created meanwhile by another process: its creator chose the mode
        path.chmod(PRIVATE_DIR_MODE)  # mkdir's mode is masked by the umask; this is exact
    return path


def create_private_file(path: Path) -> None:
    """Create an empty ``path`` as 0600 unless it exists (SQLite then opens the empty file)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, which is 0600 before its first byte is written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE)  # an older file may have been wider
        os.write(fd, text.encode())
    finally:
        os.close(fd)
