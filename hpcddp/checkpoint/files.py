"""Publishing files so that a crash at any instant leaves the old or the new version.

A checkpoint is written into a temporary directory beside its final place, every file is
fsynced, then the directory, then it is renamed into place and the parent directory is
fsynced. The digest of each file is computed while it is written, not in a second pass.
The writer holds an exclusive ``flock`` on its temporary directory, so that a reader can
tell a save in progress (an evaluation job loading beside a training job) from one whose
writer was killed.
"""

import contextlib
import errno
import fcntl
import hashlib
import io
import os
import shutil
from typing import Callable, Dict

import xxhash

__all__ = ["DIGEST", "DIGESTS", "HashingWriter", "digest_of", "fsync_dir", "publish_dir",
           "replace_file", "writer_alive"]


# New checkpoints are checked with XXH3-128: a corruption check needs no cryptographic
# strength, and it runs an order of magnitude faster than SHA-256
# (docs/benchmarks.md#checkpoint-save-and-load). Checkpoints written with SHA-256 still
# verify.
DIGESTS = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
DIGEST = "xxh3_128"


def digest_of(algorithm: str, data) -> str:
    """The hex digest of ``data`` (any buffer) with ``algorithm``, a key of ``DIGESTS``."""
    return DIGESTS[algorithm](data).hexdigest()


class HashingWriter(io.RawIOBase):
    """A write-only file that hashes (XXH3-128) and counts what passes through it.

    The hash is computed while writing, not in a second pass over the file, at a small
    fraction of the cost of the write itself.
    """

    def __init__(self, path):
        super().__init__()
        self._file = open(path, "wb")
        self._hash = DIGESTS[DIGEST]()
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
        self._hash.update(view)
        self.size += view.nbytes
        return view.nbytes

    def hexdigest(self) -> str:
        """The digest of everything written."""
        return self._hash.hexdigest()

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
    fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _lock(fd)
        written = write_files(tmp)
        os.fsync(fd)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(fd)  # releases the lock, once the directory is in place or gone
    fsync_dir(parent)
    return written


def _lock(fd) -> None:
    # A file system without flock: stale temporaries are then removed at save only.
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def writer_alive(tmp):
    """Whether the save writing the temporary directory ``tmp`` is still running: True,
    False (its writer died, the directory is stale), or None where ``flock`` cannot tell."""
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return True  # published or removed meanwhile: nothing to clean
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as error:
        return True if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN) else None
    finally:
        os.close(fd)  # and with it any lock taken here


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

