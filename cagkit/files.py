"""Writing files the way every part of cagkit does: atomically, durably, and readable as the user's umask allows.

`atomic_write` is the one way: a temporary beside the target, flushed to disk, renamed over it, and the rename
flushed too, so neither a crash nor a power cut leaves half a file (`write_atomic`, `write_json_atomic` and
`save_safetensors` are its common cases). safetensors writes its files owner-only (mode 0600, whatever the umask),
so a store, a translator or a converted model written by one user could not be read by another who shares the
folder: what `atomic_write` publishes gets the mode any other new file gets (0666 less the umask: 0644 under the
usual 022).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_PROC_STATUS = "/proc/self/status"
TEMPORARY_SUFFIX = ".tmp"
_temporaries = itertools.count()  # numbers a process's temporaries apart, also across threads


def _current_umask() -> int:
    """The process's umask. Linux reports it in /proc/self/status; elsewhere it can only be read by setting it,
    which for a moment leaves it at 0 for every thread of the process, so that is the fallback."""
    try:
        with open(_PROC_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The mode a newly created file gets under the current umask."""
    return 0o666 & ~_current_umask()


@contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` for the caller to write in full, a file or a directory; when the block ends
    without an error it becomes `path` durably: its files get the default mode and are flushed to disk, it is
    renamed over `path`, and the rename itself is flushed (the directory's fsync). A crash at any moment leaves
    the old `path` or the new one, never part of either; on an error the temporary is removed.

    Temporary names are `<name>.<pid>.<n>.tmp` (`is_temporary`), so a folder's owner can tell them from its files.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{next(_temporaries)}{TEMPORARY_SUFFIX}")
    try:
        yield tmp
        mode = default_file_mode()
        for file in [tmp] if tmp.is_file() else [f for f in tmp.rglob("*") if f.is_file()]:
            os.chmod(file, mode)
            _fsync(file)
        if tmp.is_dir():
            _fsync(tmp)
            if path.is_dir():  # a directory cannot be renamed over one that has files
                shutil.rmtree(path)
        os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, data: bytes | str) -> Path:
    """Write `data` (text as UTF-8) to `path` with `atomic_write`."""
    with atomic_write(path) as tmp:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    return Path(path)


def write_json_atomic(path: str | Path, value, indent: int | None = 2) -> Path:
    """Write `value` as JSON (and a final newline) to `path` with `atomic_write`."""
    return write_atomic(path, json.dumps(value, indent=indent) + "\n")


def save_safetensors(tensors: dict, path: str | Path, metadata: dict | None = None) -> Path:
    """Write `tensors` to a safetensors file at `path` with `atomic_write`."""
    from safetensors.torch import save_file

    with atomic_write(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return Path(path)


def is_temporary(file: Path) -> bool:
    """Whether `file` is one of `atomic_write`'s temporaries (left behind only by a crash)."""
    return file.name.endswith(TEMPORARY_SUFFIX)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
