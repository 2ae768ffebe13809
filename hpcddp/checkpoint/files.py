"""Publishing files so that a crash at any instant leaves the old or the new version.

A checkpoint is written into a temporary directory beside its final place, every file is
fsynced, then the directory, then it is renamed into place and the parent directory is
fsynced. The SHA-256 of each file is computed while it is written, not in a second pass.
"""

import hashlib
import io
import os
import shutil
from typing import Callable, Dict

__all__ = ["HashingWriter", "fsync_dir", "publish_dir", "replace_file", "sha256_of_bytes"]


class HashingWriter(io.RawIOBase):
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, path):
        super().__init__()
        self._file = open(path, "wb")
        self.sha256 = hashlib.sha256()
        self.size = 0
        # torch's zip writer turns a failed write into a RuntimeError without the errno;
        # the original error is kept here so the caller can raise it (ENOSPC, EFBIG).
        self.error = None

    def writable(self):
        return True

    def write(self, data):
        view = memoryview(data).cast("B")
        try:
            self._file.write(view)
        except OSError as error:
            self.error = error
            raise
        self.sha256.update(view)
        self.size += view.nbytes
        return view.nbytes

    def abandon(self):
        """Close without syncing, after a failure."""
        try:
            self._file.close()
        except OSError:
            pass

    def sync_and_close(self):
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        super().close()


def fsync_dir(path) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_dir(final, write_files: Callable[[str], Dict[str, dict]]) -> Dict[str, dict]:
    """Create directory ``final`` atomically.

    ``write_files(tmp)`` writes (and fsyncs) the files into the temporary directory
    ``tmp`` and returns what it wrote. On any error the temporary directory is removed
    and ``final`` does not exist.
    """
    parent, name = os.path.split(os.path.abspath(final))
    tmp = os.path.join(parent, f".tmp-{name}-{os.getpid()}")
    os.makedirs(tmp)
    try:
        written = write_files(tmp)
        fsync_dir(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(parent)
    return written


def replace_file(path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file, fsync, rename, fsync dir)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def sha256_of_bytes(data) -> str:
    return hashlib.sha256(data).hexdigest()
