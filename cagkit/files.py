"""Writing files the way every part of cagkit does: atomically, and readable as the user's umask allows.

safetensors writes its files owner-only (mode 0600, whatever the umask), so a store, a translator or a converted
model written by one user could not be read by another who shares the folder. These helpers give such files the
mode any other new file gets (0666 less the umask: 0644 under the usual 022).
"""

from __future__ import annotations

import os
from pathlib import Path

_PROC_STATUS = "/proc/self/status"


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


def save_safetensors(tensors: dict, path: Path, metadata: dict | None = None) -> Path:
    """Write `tensors` to `path` atomically (a temporary file beside it, flushed to disk, then renamed), with the
    default file mode. A crash leaves either the old file or the new one, never half of one."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.chmod(tmp, default_file_mode())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
