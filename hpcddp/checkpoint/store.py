"""Checkpoints on disk: naming, the manifest, verification, retention (rank 0's side).

A checkpoint is a directory ``step-<step>`` holding ``state.pt`` and ``manifest.json``;
``latest`` names the newest published one.
"""

import contextlib
import json
import mmap
import os
import re
import shutil
import threading
from typing import Iterator, List

import torch

from hpcddp.checkpoint.files import (DIGEST, DIGESTS, HashingWriter, digest_of, publish_dir,
                                     replace_file, writer_alive)
from hpcddp.env.notices import warn_user
from hpcddp.version import __version__

__all__ = ["FORMAT", "Opened", "candidates", "check_writable", "open_candidates",
           "remove_old", "write_checkpoint"]

FORMAT = 1
STATE, MANIFEST, LATEST = "state.pt", "manifest.json", "latest"
_NAME = re.compile(r"^step-(\d+)$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:09d}"


def check_writable(root) -> None:
    """Create ``root`` if need be and write, fsync and remove a small file in it, as a
    checkpoint will, so a directory that cannot take one is found before training.

    Raises:
        OSError: naming the directory, the reason and the ways out.
    """
    probe = os.path.join(root, f".hpcddp-write-test-{os.getpid()}")
    try:
        os.makedirs(root, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"hpcddp")
            os.fsync(f.fileno())
        os.remove(probe)
    except OSError as error:
        raise OSError(error.errno, f"checkpoint directory {root} cannot be written "
                      f"({error.strerror}: {error.filename}), so training would fail at "
                      f"its first save. Choose a writable directory or fix its "
                      f"permissions; to resume from a read-only copy, pass "
                      f"check_writable=False to load()", str(root)) from None


def write_checkpoint(root, step: int, state: dict, world_size: int) -> str:
    """Publish ``state`` as the checkpoint of ``step`` under ``root``; return its path.

    Raises:
        OSError: the disk refused (full, a size limit, a permission); it names the
            checkpoint, the space left, and says that the previous one is intact.
    """
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, checkpoint_name(step))
    try:
        _write_and_publish(root, final, step, state, world_size)
    except OSError as error:
        if error.filename is not None:
            raise
        # A failed write() or fsync() names no file: the user learns only "No space left".
        free = shutil.disk_usage(root).free
        raise OSError(error.errno, f"{error.strerror} while writing checkpoint {final} "
                      f"({free / 2**20:.1f} MiB free there); nothing of it was published and "
                      f"the previous checkpoint is intact", final) from None
    return final


_crc32 = {"saves": 0, "before": True}
_crc32_lock = threading.Lock()


@contextlib.contextmanager
def without_zip_crc32():
    """torch.save without the CRC32 of every zip record, restored afterwards.

    The manifest holds an XXH3-128 of every byte of the file, checked at every load;
    torch's CRC32 of the same bytes is a second, slower checksum of them, a large part of
    a save's time (docs/benchmarks.md#checkpoint-save-and-load). Files written
    without it load in torch.load as any other.

    The option is process-wide: a ``torch.save`` in another thread while a checkpoint is
    written also skips it. Saves that overlap (threads) count themselves in and out, so
    the last one out restores what was set before the first came in.
    """
    get = getattr(torch.serialization, "get_crc32_options", None)
    put = getattr(torch.serialization, "set_crc32_options", None)
    if get is None or put is None:  # an older torch: nothing to turn off
        yield
        return
    with _crc32_lock:
        if _crc32["saves"] == 0:
            _crc32["before"] = get()
            put(False)
        _crc32["saves"] += 1
    try:
        yield
    finally:
        with _crc32_lock:
            _crc32["saves"] -= 1
            if _crc32["saves"] == 0:
                put(_crc32["before"])


def _write_and_publish(root, final, step, state, world_size) -> None:
    if os.path.exists(final):
        shutil.rmtree(final)  # a re-save of the same step replaces it

    def write(tmp):
        writer = HashingWriter(os.path.join(tmp, STATE))
        try:
            with without_zip_crc32():
                torch.save(state, writer)
            writer.sync_and_close()
        except BaseException as error:
            writer.abandon()
            if writer.error is not None and writer.error is not error:
                raise writer.error from None
            raise
        manifest = {"format": FORMAT, "step": step, "world_size": world_size,
                    "hpcddp": __version__, "torch": str(torch.__version__),
                    "files": {STATE: {"size": writer.size,
                                      DIGEST: writer.hexdigest()}}}
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        return manifest

    publish_dir(final, write)
    replace_file(os.path.join(root, LATEST), checkpoint_name(step) + "\n")


def candidates(root) -> List[str]:
    """Checkpoint directories under ``root``, newest first (``latest`` leads)."""
    if not os.path.isdir(root):
        return []
    names = sorted((n for n in os.listdir(root) if _NAME.match(n)),
                   key=lambda n: int(_NAME.match(n).group(1)), reverse=True)
    latest = _read_latest(root)
    if latest in names:
        names.remove(latest)
        names.insert(0, latest)
    return [os.path.join(root, n) for n in names]


def _read_latest(root):
    """The checkpoint ``latest`` names, or None (missing, or damaged: warned)."""
    path = os.path.join(root, LATEST)
    try:
        with open(path, "rb") as f:
            raw = f.read(256)
    except FileNotFoundError:
        return None
    except OSError as error:
        warn_user(f"hpcddp.checkpoint: ignoring {path}: {error}")
        return None
    name = raw.decode("ascii", errors="replace").strip()
    if not _NAME.match(name):
        warn_user(f"hpcddp.checkpoint: ignoring {path}: it holds {raw[:40]!r}, not a "
                  f"checkpoint name; checkpoints are taken newest step first")
        return None
    return name


def _check_manifest(manifest) -> dict:
    """``manifest``'s entry for the state file; ValueError saying what is wrong."""
    if not isinstance(manifest, dict):
        raise ValueError(f"{MANIFEST} holds a {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"format {manifest.get('format')!r}, expected {FORMAT}")
    entry = manifest.get("files", {}).get(STATE) if isinstance(manifest.get("files"), dict) \
        else None
    if not isinstance(entry, dict) or not isinstance(entry.get("size"), int) or \
            not any(isinstance(entry.get(name), str) for name in DIGESTS):
        raise ValueError(f"{MANIFEST} has no size and digest ({', '.join(DIGESTS)}) for "
                         f"{STATE}")
    return entry


class Opened:
    """A checkpoint's state file, open and mapped, its digest checked in a background
    thread while the bytes are broadcast and deserialized (the hashes release the GIL).

    ``fd`` stays open until ``close()``: ranks on the same node map the file through it.
    """

    def __init__(self, path):
        with open(os.path.join(path, MANIFEST), "rb") as f:
            manifest = json.loads(f.read())
        expected = _check_manifest(manifest)
        self.algorithm = next(name for name in DIGESTS if isinstance(expected.get(name), str))
        self.expected = expected[self.algorithm]
        self.fd = os.open(os.path.join(path, STATE), os.O_RDONLY)
        try:
            size = os.fstat(self.fd).st_size
            if size != expected["size"]:
                raise ValueError(f"{STATE} has {size} bytes, the manifest says "
                                 f"{expected['size']}")
            if size == 0:
                raise ValueError(f"{STATE} is empty")
            self.map = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ)
        except BaseException:
            os.close(self.fd)
            raise
        self.path, self.manifest, self.size = path, manifest, size
        self._digest = None
        self._thread = threading.Thread(target=self._hash, name="hpcddp-verify", daemon=True)
        self._thread.start()

    def _hash(self):
        self._digest = digest_of(self.algorithm, self.map)

    def verified(self) -> bool:
        """Wait for the hash; True if it matches the manifest."""
        self._thread.join()
        return self._digest == self.expected

    def close(self):
        self._thread.join()
        self.map.close()
        os.close(self.fd)


def open_candidates(root, skipped: List[str]) -> Iterator[Opened]:
    """Checkpoints under ``root``, newest first, that open and have the right size.

    Those that do not are skipped with a warning naming them, and listed in ``skipped``
    (``"<path>: <reason>"``). Any damage skips: whatever a damaged file raises.
    """
    for path in candidates(root):
        try:
            yield Opened(path)
        except Exception as error:  # noqa: BLE001 - any damage means: use an older one
            skip(path, f"{type(error).__name__}: {error}", skipped)


def skip(path: str, reason: str, skipped: List[str]) -> None:
    """Warn that the checkpoint at ``path`` is passed over, and note it in ``skipped``."""
    skipped.append(f"{path}: {reason}")
    warn_user(f"hpcddp.checkpoint: skipping {path}: {reason}; trying an older one")


_REMOVING = ".removing-"
_removal: List[threading.Thread] = []  # the one removal in flight in this process, if any


def remove_old(root, keep_last: int, keep: str) -> None:
    """Delete all but the newest ``keep_last`` checkpoints; never ``keep``.

    Each one is renamed out of the way at once (``.removing-step-N``: no load sees it
    from then on) and its files are deleted by a background thread, off the save's
    critical path, where unlinking large files is a good part of a save. The next save
    or load waits for it first (``finish_removal``), so a full disk gets its space back
    before anything new is written. A crash mid-delete leaves ``.removing-*``, which the
    next save removes.
    """
    finish_removal()
    names = sorted((n for n in os.listdir(root) if _NAME.match(n)),
                   key=lambda n: int(_NAME.match(n).group(1)), reverse=True)
    doomed = []
    for name in names[keep_last:]:
        path = os.path.join(root, name)
        if os.path.abspath(path) != os.path.abspath(keep):
            target = os.path.join(root, f"{_REMOVING}{name}-{os.getpid()}")
            try:
                os.rename(path, target)
            except OSError:
                target = path  # deleted in place, as before
            doomed.append(target)
    if doomed:
        thread = threading.Thread(target=_delete, args=(doomed,),
                                  name="hpcddp-checkpoint-removal")
        thread.start()  # not a daemon: the interpreter finishes it before it exits
        _removal.append(thread)


def _delete(paths: List[str]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def finish_removal() -> None:
    """Wait for this process's removal of old checkpoints, if one is running."""
    while _removal:
        _removal.pop().join()


def remove_stale_temporaries(root, saving: bool = True) -> None:
    """Remove what writers that died mid-save left behind (never a published checkpoint).

    A save killed outright (SIGKILL, a lost node) leaves its temporary directory, which
    may hold gigabytes. A job removes those when it loads (``saving=False``: only those
    whose writer provably died, since another job may be saving here) and before it saves
    (also those it cannot tell about: two jobs saving into one directory is unsupported).
    """
    try:
        names = os.listdir(root)
    except OSError:
        return  # no directory yet, or unreadable: the load or save says so itself
    finish_removal()
    for name in names:
        path = os.path.join(root, name)
        if saving and name.startswith(_REMOVING):  # a removal a crash interrupted
            shutil.rmtree(path, ignore_errors=True)
        elif name.startswith(".tmp-step-"):
            alive = writer_alive(path)
            if alive is False or (saving and alive is None):
                shutil.rmtree(path, ignore_errors=True)
        elif saving and name.startswith(LATEST + ".tmp-"):
            with contextlib.suppress(OSError):
                os.remove(path)
