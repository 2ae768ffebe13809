"""``hpcddp pack``: write NumPy arrays into an HDF5 file laid out for ``ShardedLoader``.

Contiguous by default, so the loader reads rows by byte offset; ``--chunk-rows`` and
``--compression`` give a chunked, compressed layout instead (read through h5py).
``--shards K`` writes K files of consecutive rows, ``OUT-00000.h5`` onwards, which a
``ShardedLoader`` given ``OUT-*.h5`` reads as the one dataset.
"""

import sys
from pathlib import Path
from typing import Dict

import numpy as np

from hpcddp.commands.parser import command_parser
from hpcddp.data.pack import pack_arrays, pack_shards, shard_paths

__all__ = ["main"]


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
