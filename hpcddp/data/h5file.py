"""What is in an HDF5 training file, checked before any rank reads from it.

``inspect_file`` opens the file once, checks every requested key, and describes each
dataset's layout. Its errors name the file, the key and the value, so the loader can
raise the same error on every rank.
"""

import os
import sys
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np

__all__ = ["DatasetInfo", "inspect_file", "open_h5", "DataFileError", "h5py_module"]

# Kinds torch can hold: bool, signed and unsigned integers, floats, complex.
_SUPPORTED_KINDS = "biufc"


class DataFileError(ValueError):
    """An HDF5 file, key or dataset that hpcddp cannot train from."""


class DatasetInfo(NamedTuple):
    key: str
    shape: tuple
    dtype: str
    offset: Optional[int]      # byte offset of contiguous, unfiltered data; else None
    chunks: Optional[tuple]
    filters: int

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def readable_by_offset(self) -> bool:
        """Contiguous, allocated, unfiltered, native byte order: a plain byte range."""
        return self.offset is not None and np.dtype(self.dtype).isnative


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


def open_h5(path, locking: bool = False, **kwargs):
    """Open ``path`` read-only (an ``h5py.File``), with HDF5 file locking off unless asked.

    Parallel file systems fail or hang on HDF5's locks, and a read-only reader needs none.
    """
    return h5py_module().File(path, "r", locking=locking, **kwargs)


def _filters(dset) -> int:
    return dset.id.get_create_plist().get_nfilters()


def _describe(path, f, key) -> DatasetInfo:
    if key not in f:
        available = ", ".join(sorted(k for k in f.keys())) or "none"
        raise DataFileError(f"{path}: no dataset {key!r}; the file has: {available}")
    dset = f[key]
    if not isinstance(dset, h5py_module().Dataset):
        raise DataFileError(f"{path}: {key!r} is a group, not a dataset")
    dtype = dset.dtype
    if dtype.kind not in _SUPPORTED_KINDS or dtype.fields is not None or dtype.subdtype:
        raise DataFileError(f"{path}: dataset {key!r} has dtype {dtype}, which torch cannot "
                            f"hold; store numbers or booleans (e.g. with `hpcddp pack`)")
    if dset.ndim == 0 or dset.shape[0] == 0:
        raise DataFileError(f"{path}: dataset {key!r} is empty (shape {dset.shape}); it needs "
                            f"at least one sample along axis 0")
    offset = dset.id.get_offset() if dset.chunks is None and _filters(dset) == 0 else None
    info = DatasetInfo(key, tuple(dset.shape), dtype.str, offset, dset.chunks, _filters(dset))
    if offset is not None:
        end = offset + dset.size * dtype.itemsize
        size = os.path.getsize(path)
        if end > size:
            raise DataFileError(f"{path}: dataset {key!r} ends at byte {end} but the file has "
                                f"{size} bytes: the file is truncated; copy or pack it again")
    return info


def inspect_file(path, keys: Optional[Sequence[str]] = None,
                 locking: bool = False) -> List[DatasetInfo]:
    """Check ``keys`` of the HDF5 file ``path`` and describe their layouts.

    Args:
        path: the file.
        keys: dataset names; None means every dataset at the top level.

    Raises:
        FileNotFoundError: no such file.
        DataFileError: not readable as HDF5 (truncated or corrupted), a missing key, an
            unsupported dtype, an empty dataset, or keys of different lengths.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        f = open_h5(path, locking)
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
