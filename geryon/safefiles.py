"""Files geryon writes, often as root, in directories others may write to: never through a name
someone else can predict or plant a symlink at.

`replace_file(path, text)` writes a fresh temporary file next to `path` with `mkstemp` (a random name,
created with O_CREAT|O_EXCL, so a planted file or symlink is never opened) and renames it over
`path`: readers see the old file or the new one, never half of it, and a symlink at `path` itself is
replaced, not followed; `replace_bytes(path, data, durable=True)` also fsyncs the file and its folder.
`create_exclusive(path, text)` creates `path` only if nothing (not even a dangling symlink) is there,
with O_EXCL|O_NOFOLLOW.
"""

import os
import tempfile


def replace_file(path, text: str, mode: int = 0o644) -> None:
    """Atomically replace `path` with a file holding `text` (created with `mode`)."""
    replace_bytes(path, text.encode(), mode)


def replace_bytes(path, data: bytes, mode: int = 0o644, durable: bool = False) -> None:
    """Atomically replace `path` with a file holding `data` (created with `mode`). With `durable` the
    file is fsync'd before the rename and its folder after it, so the new file survives a power cut."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    if durable:
        folder = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def create_exclusive(path, text: str, mode: int = 0o644) -> bool:
    """Create `path` holding `text`; False if anything already exists there (a symlink included)."""
    try:
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return True
