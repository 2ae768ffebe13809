"""What is in an HDF5 training file, checked before any rank reads from it.

``inspect_file`` opens the file once, checks every requested key, and describes each
dataset's layout. Its errors name the file, the key and the value, so the loader can
raise the same error on every rank.
"""

import errno
import fcntl
import os
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np

__all__ = ["DatasetInfo", "inspect_file", "open_h5", "DataFileError", "h5py_module"]

# Kinds torch can hold: bool, signed and unsigned integers, floats, complex.
_SUPPORTED_KINDS = "biufc"

# The superblock (HDF5 File Format Specification, "Superblock") starts with this
# signature at byte 0, 512, 1024, 2048, ... (after a user block). Its file consistency
# flags are set while a writer has the file open: bit 0 write access, bit 2 SWMR write.
_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_WRITE_ACCESS, _SWMR_WRITE = 0x01, 0x04


class DataFileError(ValueError):
    """An HDF5 file, key or dataset that hpcddp cannot train from."""


class DatasetInfo(NamedTuple):
    key: str
    shape: tuple
    dtype: str
    offset: Optional[int]      # byte offset of contiguous, unfiltered data; else None
    chunks: Optional[tuple]
    filters: int
    virtual: bool = False      # an HDF5 virtual dataset (rows mapped from other files)
    vlen: Optional[str] = None  # variable-length rows: "str", or the elements' dtype
    sample_bytes: int = 0      # variable-length rows: mean bytes of the first rows

    @property
    def row_bytes(self) -> int:
        if self.vlen:
            return self.sample_bytes
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def type_name(self) -> str:
        """The rows' type in words: ``float32``, ``variable-length uint8``."""
        if self.vlen:
            return "variable-length " + (self.vlen if self.vlen == "str"
                                         else str(np.dtype(self.vlen)))
        return str(np.dtype(self.dtype))

    @property
    def readable_by_offset(self) -> bool:
        """Contiguous, allocated, unfiltered, native byte order: a plain byte range."""
        return self.offset is not None and not self.vlen and np.dtype(self.dtype).isnative


def _in_dataloader_worker() -> bool:
    utils = sys.modules.get("torch.utils.data")
    return utils is not None and utils.get_worker_info() is not None


def h5py_module():
    """Import h5py; in a DataLoader worker, without letting it initialize MPI.

    h5py built against parallel HDF5 imports ``mpi4py.MPI``, whose import calls
    ``MPI_Init``. A worker process inherits the launcher's variables, so it would try to
    join the job as a rank and die. A worker never needs MPI: there ``mpi4py`` is told
    not to initialize (or finalize) it before h5py is imported.
    """
    if "h5py" not in sys.modules and "mpi4py.MPI" not in sys.modules \
            and _in_dataloader_worker():
        import mpi4py
        mpi4py.rc.initialize = mpi4py.rc.finalize = False
    import h5py
    return h5py


def open_h5(path, locking: bool = False, swmr: bool = False, **kwargs):
    """Open ``path`` read-only (an ``h5py.File``), with HDF5 file locking off unless asked.

    Parallel file systems fail or hang on HDF5's locks, and a read-only reader needs none.
    ``swmr=True`` reads a file that a single writer is still appending to in SWMR mode.
    """
    if swmr:
        kwargs["swmr"] = True
    return h5py_module().File(path, "r", locking=locking, **kwargs)


def _consistency_flags(path) -> Optional[int]:
    """The superblock's file consistency flags, or None where there is no superblock."""
    with open(path, "rb") as f:
        size, where = os.fstat(f.fileno()).st_size, 0
        while where + 24 <= size:
            f.seek(where)
            head = f.read(24)
            if head[:8] == _SIGNATURE:
                version = head[8]
                # Versions 0 and 1 keep 4 bytes of flags at byte 20; 2 and 3 one byte at 11.
                return int.from_bytes(head[20:24], "little") if version < 2 else head[11]
            where = 512 if where == 0 else where * 2
    return None


def _writer_holds_lock(path) -> bool:
    """Whether a process holds HDF5's exclusive lock on ``path`` (a writer, with locking on).

    HDF5 locks with ``flock``: a writer takes it exclusively, a reader shared. Where the
    file system has no ``flock`` (some parallel ones), nothing can be learned this way.
    """
    with open(path, "rb") as f:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as error:
            return error.errno in (errno.EWOULDBLOCK, errno.EAGAIN)
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    return False


def _check_not_being_written(path, flags: int, swmr: bool) -> None:
    """Refuse a file another process has open for writing (``flags``: its superblock's):
    what it has not written yet would be read as zeros, or as whatever the disk held.

    A file written in SWMR mode is readable while it grows with ``swmr=True``: the rows
    the writer has flushed are then read, and nothing else.
    """
    if flags & _SWMR_WRITE:
        if swmr:
            return
        raise DataFileError(
            f"{path} is being written in SWMR mode by another process; to train on the rows "
            f"it has flushed so far, pass swmr=True (H5Dataset, ShardedLoader), or wait until "
            f"the writer closes the file")
    if flags & _WRITE_ACCESS or _writer_holds_lock(path):
        raise DataFileError(
            f"{path} is open for writing by another process (its superblock says so, or the "
            f"writer holds HDF5's lock): rows it has not written yet would be read as zeros. "
            f"Wait until the writer closes it, or have it write in SWMR mode and pass "
            f"swmr=True. If no process has it open (a writer that crashed left the mark), "
            f"clear it with `h5clear -s {path}`")


def _filters(dset) -> int:
    return dset.id.get_create_plist().get_nfilters()


def _vlen_kind(path, key, dset) -> Optional[str]:
    """``"str"`` for variable-length strings, the element dtype for variable-length
    arrays of numbers, None for fixed-size rows; refuse other variable-length data."""
    h5py = h5py_module()
    base = h5py.check_vlen_dtype(dset.dtype)
    if base is None:
        return None
    if base in (str, bytes):
        kind = "str"
    elif np.dtype(base).kind in _SUPPORTED_KINDS and np.dtype(base).fields is None:
        kind = np.dtype(base).str
    else:
        raise DataFileError(f"{path}: dataset {key!r} holds variable-length rows of {base}, "
                            f"which torch cannot hold; store variable-length arrays of "
                            f"numbers (h5py.vlen_dtype(np.uint8)) or strings")
    if dset.ndim != 1:
        raise DataFileError(f"{path}: dataset {key!r} holds variable-length rows in shape "
                            f"{dset.shape}; give such data one dimension, one row per sample")
    return kind


def _describe(path, f, key) -> DatasetInfo:
    if key not in f:
        available = ", ".join(sorted(k for k in f.keys())) or "none"
        raise DataFileError(f"{path}: no dataset {key!r}; the file has: {available}")
    dset = f[key]
    if not isinstance(dset, h5py_module().Dataset):
        raise DataFileError(f"{path}: {key!r} is a group, not a dataset")
    dtype = dset.dtype
    vlen = _vlen_kind(path, key, dset)
    if vlen is None and (dtype.kind not in _SUPPORTED_KINDS or dtype.fields is not None
                         or dtype.subdtype):
        raise DataFileError(f"{path}: dataset {key!r} has dtype {dtype}, which torch cannot "
                            f"hold; store numbers or booleans (e.g. with `hpcddp pack`), "
                            f"variable-length arrays of them, or variable-length strings")
    if dset.ndim == 0:
        raise DataFileError(f"{path}: dataset {key!r} is a scalar (shape ()); a training "
                            f"dataset needs one row per sample along axis 0")
    if dset.shape[0] == 0:
        raise DataFileError(f"{path}: dataset {key!r} is empty (shape {dset.shape}); it needs "
                            f"at least one sample along axis 0")
    if vlen:
        # The rows live in HDF5's heap, not at an offset: h5py reads them, many per call.
        # Their size, for how many batches one call reads, is that of the first rows.
        first = dset[:min(64, dset.shape[0])]
        size = sum(len(row.encode()) if isinstance(row, str) else np.asarray(row).nbytes
                   for row in first)
        return DatasetInfo(key, tuple(dset.shape), dtype.str, None, dset.chunks,
                           _filters(dset), dset.is_virtual, vlen,
                           max(1, -(-size // len(first))))
    offset = dset.id.get_offset() if dset.chunks is None and _filters(dset) == 0 else None
    info = DatasetInfo(key, tuple(dset.shape), dtype.str, offset, dset.chunks, _filters(dset),
                       dset.is_virtual)
    if offset is not None:
        end = offset + dset.size * dtype.itemsize
        size = os.path.getsize(path)
        if end > size:
            raise DataFileError(f"{path}: dataset {key!r} ends at byte {end} but the file has "
                                f"{size} bytes: the file is truncated; copy or pack it again")
    return info


def _check_is_hdf5(path) -> int:
    """Refuse what is not an HDF5 file; return its superblock's consistency flags."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    if os.path.isdir(path):
        raise DataFileError(f"{path} is a directory; pass the HDF5 file itself")
    flags = _consistency_flags(path)
    if flags is None:
        raise DataFileError(f"{path} is not an HDF5 file (no HDF5 signature in it); convert "
                            f"the data with `hpcddp pack` or h5py")
    return flags


def inspect_file(path, keys: Optional[Sequence[str]] = None, locking: bool = False,
                 swmr: bool = False) -> List[DatasetInfo]:
    """Check ``keys`` of the HDF5 file ``path`` and describe their layouts.

    Args:
        path: the file.
        keys: dataset names; None means every dataset at the top level.
        locking: keep HDF5 file locking on.
        swmr: the file may be growing under a SWMR writer; describe the rows there now.

    Raises:
        FileNotFoundError: no such file.
        DataFileError: a directory, not HDF5, open for writing elsewhere, truncated or
            corrupted, a missing key, an unsupported dtype, a scalar or empty dataset, or
            keys of different lengths.
    """
    path = os.fspath(path)
    _check_not_being_written(path, _check_is_hdf5(path), swmr)
    try:
        f = open_h5(path, locking, swmr)
    except OSError as error:
        raise DataFileError(f"{path}: cannot be read as HDF5 ({error}); the file may be "
                            f"truncated or corrupted") from None
    with f:
        if keys is None:
            keys = sorted(k for k, v in f.items() if isinstance(v, h5py_module().Dataset))
        if isinstance(keys, str):
            keys = [keys]
        if not keys:
            raise DataFileError(f"{path}: no datasets to read")
        infos = [_describe(path, f, key) for key in keys]
    lengths: Dict[str, int] = {info.key: info.shape[0] for info in infos}
    if len(set(lengths.values())) > 1:
        said = ", ".join(f"{k}: {n}" for k, n in lengths.items())
        raise DataFileError(f"{path}: keys have different lengths ({said}); every key needs "
                            f"one row per sample")
    return infos
