"""``hpcddp pack``: write NumPy arrays into an HDF5 file laid out for ``ShardedLoader``.

Contiguous by default, so the loader reads rows by byte offset; ``--chunk-rows`` and
``--compression`` give a chunked, compressed layout instead (read through h5py).
``--shards K`` writes K files of consecutive rows, ``OUT-00000.h5`` onwards, which a
``ShardedLoader`` given ``OUT-*.h5`` reads as the one dataset.
"""

import os
import sys
from pathlib import Path
from typing import Dict, Optional

import h5py
import numpy as np

from hpcddp.cli import command_parser
from hpcddp.data.progress import progress as progress_bar

__all__ = ["main", "pack_arrays", "pack_shards", "shard_paths"]

_BLOCK_BYTES = 64 << 20


def _inputs(specs) -> Dict[str, np.ndarray]:
    """``[NAME=]FILE`` specs to arrays: a .npy is one key, a .npz one key per member."""
    arrays = {}
    for spec in specs:
        name, _, file = spec.rpartition("=")
        path = Path(file)
        if not path.exists():
            raise FileNotFoundError(f"{file}: no such file")
        if path.suffix == ".npz":
            with np.load(path) as archive:
                for member in archive.files:
                    arrays[f"{name}{member}" if name else member] = archive[member]
        elif path.suffix == ".npy":
            arrays[name or path.stem] = np.load(path, mmap_mode="r")
        else:
            raise ValueError(f"{file}: give .npy or .npz files (got {path.suffix!r})")
    return arrays


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


def main(argv=None) -> int:
    parser = command_parser("pack", __doc__)
    parser.add_argument("out", help="the HDF5 file to write")
    parser.add_argument("inputs", nargs="+", metavar="[NAME=]FILE",
                        help=".npy (one dataset, named NAME or the file's stem) or .npz "
                             "(one dataset per member, prefixed with NAME)")
    parser.add_argument("--chunk-rows", type=int, help="chunked layout with this many rows")
    parser.add_argument("--compression", choices=["gzip", "lzf"], help="compress (chunked)")
    parser.add_argument("--shards", type=int, default=0,
                        help="write this many files of consecutive rows: OUT-00000.h5 ...")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    options = dict(chunk_rows=args.chunk_rows, compression=args.compression,
                   progress=not args.quiet)
    try:
        arrays = _inputs(args.inputs)
        if args.shards:
            written = pack_shards(args.out, arrays, args.shards, **options)
        else:
            pack_arrays(args.out, arrays, **options)
            written = [args.out]
    except (OSError, ValueError) as error:
        print(f"hpcddp pack: {error}", file=sys.stderr)
        return 2
    for key, array in arrays.items():
        print(f"{args.out}:{key} {array.dtype} {array.shape}")
    if args.shards:
        print(f"{len(written)} files: {written[0]} ... {written[-1]} "
              f"(read them as ShardedLoader(\"{shard_paths(args.out, 0)[1]}\", ...))")
    return 0
