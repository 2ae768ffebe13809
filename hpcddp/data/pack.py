"""Write NumPy arrays into an HDF5 file laid out for ``ShardedLoader`` (behind
``hpcddp pack``, ``hpcddp.commands.pack``).

Contiguous by default, so the loader reads rows by byte offset; ``chunk_rows`` and
``compression`` give a chunked, compressed layout instead (read through h5py).
``pack_shards`` writes K files of consecutive rows, ``OUT-00000.h5`` onwards, which a
``ShardedLoader`` given ``OUT-*.h5`` reads as the one dataset.
"""

import os
from typing import Dict, Optional

import h5py
import numpy as np

from hpcddp.data.progress import progress as progress_bar

__all__ = ["pack_arrays", "pack_shards", "shard_paths"]

_BLOCK_BYTES = 64 << 20


def _variable_length(key, rows) -> np.ndarray:
    """A sequence of ``str``, ``bytes`` or 1-D arrays as an object array of rows."""
    column = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        column[i] = np.frombuffer(row, np.uint8) if isinstance(row, (bytes, bytearray)) \
            else row if isinstance(row, str) else np.asarray(row).ravel()
    kinds = {type(row) for row in column} if len(column) else {str}
    if len(kinds) != 1:
        raise ValueError(f"{key}: mixes str with arrays or bytes; give one kind of row")
    if kinds != {str} and len({row.dtype for row in column}) != 1:
        raise ValueError(f"{key}: rows of different dtypes "
                         f"{sorted({str(row.dtype) for row in column})}; give one dtype")
    return column


def _h5_dtype(column: np.ndarray):
    if column.dtype != object:
        return column.dtype
    if isinstance(column[0], str):
        return h5py.string_dtype()
    return h5py.vlen_dtype(column[0].dtype)


def _nbytes(column: np.ndarray) -> int:
    if column.dtype != object:
        return column.nbytes
    return sum(len(r.encode()) if isinstance(r, str) else r.nbytes for r in column)


def pack_arrays(out, arrays: Dict[str, np.ndarray], chunk_rows: Optional[int] = None,
                compression: Optional[str] = None, progress: bool = True) -> None:
    """Write ``arrays`` (equal length along axis 0) to the HDF5 file ``out``, atomically.

    Args:
        arrays: arrays by key; a list of ``bytes`` (encoded images, say) or of 1-D arrays
            becomes a variable-length dataset (``h5py.vlen_dtype``), a list of ``str``
            one of variable-length strings.
        chunk_rows: rows per chunk; None writes contiguous datasets.
        compression: an h5py filter ("gzip", "lzf"); implies chunking.
    """
    arrays = {k: a if isinstance(a, np.ndarray) and a.dtype != object
              else _variable_length(k, a) for k, a in arrays.items()}
    lengths = {k: len(a) for k, a in arrays.items()}
    if not arrays or len(set(lengths.values())) != 1 or 0 in lengths.values():
        raise ValueError(f"need one or more non-empty arrays of equal length; got {lengths}")
    row_bytes = {k: max(1, _nbytes(a[:16]) // len(a[:16])) if a.dtype == object
                 else max(1, a[:1].nbytes) for k, a in arrays.items()}
    if compression and not chunk_rows:
        chunk_rows = max(1, (1 << 20) // next(iter(row_bytes.values())))
    total = sum(_nbytes(a) for a in arrays.values())
    tmp = f"{out}.tmp{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f, progress_bar(total=total, unit="B", unit_scale=True,
                                                    desc=f"pack {out}",
                                                    disable=not progress) as bar:
            for key, array in arrays.items():
                chunks = (min(chunk_rows, len(array)),) + array.shape[1:] if chunk_rows else None
                dset = f.create_dataset(key, shape=array.shape, dtype=_h5_dtype(array),
                                        chunks=chunks, compression=compression)
                rows = max(1, _BLOCK_BYTES // row_bytes[key])
                for start in range(0, len(array), rows):
                    block = np.ascontiguousarray(array[start:start + rows])
                    dset[start:start + len(block)] = block
                    bar.update(_nbytes(block))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def shard_paths(out, shards: int):
    """The file names ``pack_shards`` writes: ``train.h5`` gives ``train-00000.h5``...,
    and the glob that reads them back, ``train-*.h5``."""
    root, ext = os.path.splitext(os.fspath(out))
    ext = ext or ".h5"
    return [f"{root}-{i:05d}{ext}" for i in range(shards)], f"{root}-*{ext}"


def pack_shards(out, arrays: Dict[str, np.ndarray], shards: int, **kwargs):
    """Write ``arrays`` as ``shards`` files of consecutive rows (sizes differ by at most
    one row), each as ``pack_arrays`` writes it; return their paths."""
    length = len(next(iter(arrays.values()))) if arrays else 0
    if not 1 <= shards <= max(1, length):
        raise ValueError(f"--shards {shards}: give between 1 and the number of rows "
                         f"({length})")
    bounds = np.linspace(0, length, shards + 1).round().astype(int)
    paths, _ = shard_paths(out, shards)
    for path, start, stop in zip(paths, bounds[:-1], bounds[1:]):
        pack_arrays(path, {k: a[start:stop] for k, a in arrays.items()}, **kwargs)
    return paths
