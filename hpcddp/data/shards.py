"""Many HDF5 files read as one dataset: the concatenation of their rows, in the order given.

Training sets come as tens to thousands of shards. ``resolve_paths`` turns a path, a glob
or a list into the ordered list of files; ``inspect_files`` checks that every file holds
the same keys with the same dtypes and row shapes; ``ShardedReader`` reads rows of the
concatenation through one reader per file, at most ``max_open`` of them open at once, so
that a thousand shards never exhaust file descriptors. Global row ``i`` is row
``i - starts[f]`` of file ``f``, exactly as in ``torch.utils.data.ConcatDataset``.
"""

import glob
import os
from collections import OrderedDict
from typing import List, NamedTuple, Optional, Sequence

import numpy as np

from hpcddp.data.h5file import DataFileError, DatasetInfo, inspect_file

__all__ = ["Shards", "ShardedReader", "inspect_files", "resolve_paths"]


def resolve_paths(source) -> List[str]:
    """The files of ``source``: a path, a glob pattern (sorted matches) or a sequence of
    either, in order.

    Raises:
        FileNotFoundError: a pattern that matches no file.
        ValueError: no files at all, or a file named twice.
    """
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    paths: List[str] = []
    for item in items:
        item = os.fspath(item)
        if glob.has_magic(item):
            matches = sorted(glob.glob(item))
            if not matches:
                raise FileNotFoundError(f"{item}: no file matches this pattern")
            paths.extend(matches)
        else:
            paths.append(item)
    if not paths:
        raise ValueError("no HDF5 files given: pass a path, a glob such as "
                         "'train-*.h5', or a list of paths")
    seen = set()
    for path in paths:
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(f"{path} is named twice among the files; each sample would be "
                             f"read twice per epoch. Name each file once")
        seen.add(real)
    return paths


class Shards(NamedTuple):
    """What the loader needs to know of its files."""

    paths: List[str]
    infos: List[List[DatasetInfo]]  # per file, per key
    starts: np.ndarray              # global index of each file's first row, and the total

    @property
    def length(self) -> int:
        return int(self.starts[-1])

    def combined(self) -> List[DatasetInfo]:
        """One description per key for the whole concatenation (the first file's layout,
        the total length)."""
        return [info._replace(shape=(self.length,) + info.shape[1:]) for info in self.infos[0]]


def inspect_files(paths: Sequence[str], keys=None, locking: bool = False,
                  swmr: bool = False) -> Shards:
    """``inspect_file`` on each file, and check that they agree with the first.

    Raises:
        DataFileError: as ``inspect_file``, or a file whose keys, dtypes or row shapes
            differ from the first file's (both named).
    """
    first = inspect_file(paths[0], keys, locking, swmr)
    keys = [info.key for info in first]
    infos = [first]
    for path in paths[1:]:
        mine = inspect_file(path, keys, locking, swmr)
        for a, b in zip(first, mine):
            if (a.dtype, a.vlen, a.shape[1:]) != (b.dtype, b.vlen, b.shape[1:]):
                raise DataFileError(
                    f"{path}: dataset {a.key!r} has dtype {b.type_name} and rows of "
                    f"shape {b.shape[1:]}, but {paths[0]} has {a.type_name} and "
                    f"{a.shape[1:]}; every file must hold the same keys with the same "
                    f"dtypes and row shapes")
        infos.append(mine)
    starts = np.zeros(len(paths) + 1, dtype=np.int64)
    np.cumsum([file_infos[0].shape[0] for file_infos in infos], out=starts[1:])
    return Shards(list(paths), infos, starts)


class ShardedReader:
    """Rows of the concatenation of many files, through one reader per file.

    Args:
        reader_class: the backend's reader (``readers.MemmapReader`` or ``H5pyReader``).
        shards: the files (``inspect_files``).
        max_open: files kept open at once; the least recently read is closed first.
        **kwargs: passed to each reader.
    """

    def __init__(self, reader_class, shards: Shards, max_open: int, **kwargs):
        if int(max_open) < 1:
            raise ValueError(f"max_open_files={max_open} must be >= 1")
        self.name = reader_class.name
        self._class, self._kwargs = reader_class, kwargs
        self.shards, self.max_open = shards, int(max_open)
        self._open: "OrderedDict[int, object]" = OrderedDict()
        self.opened = 0  # files opened so far, for inspection

    def _reader(self, index: int):
        reader = self._open.get(index)
        if reader is not None:
            self._open.move_to_end(index)
            return reader
        while len(self._open) >= self.max_open:
            _, oldest = self._open.popitem(last=False)
            oldest.close()
        reader = self._class(self.shards.paths[index], self.shards.infos[index],
                             **self._kwargs)
        self._open[index] = reader
        self.opened += 1
        return reader

    def read(self, indices: np.ndarray, out: Optional[List[np.ndarray]] = None
             ) -> List[np.ndarray]:
        """Rows ``indices`` (global) of every key, into ``out`` when given."""
        starts = self.shards.starts
        files = np.searchsorted(starts, indices, side="right") - 1
        if len(indices) and files[0] == files[-1] and np.all(files == files[0]):
            # One file (unshuffled reading, or a shuffle that keeps to chunks).
            return self._reader(int(files[0])).read(indices - starts[files[0]], out)
        if out is None:
            out = [np.empty((len(indices),) + info.shape[1:], np.dtype(info.dtype))
                   for info in self.shards.infos[0]]
        by_file = np.argsort(files, kind="stable")
        bounds = np.flatnonzero(np.diff(files[by_file])) + 1
        for positions in np.split(by_file, bounds):
            index = int(files[positions[0]])
            parts = self._reader(index).read(indices[positions] - starts[index])
            for whole, part in zip(out, parts):
                whole[positions] = part
        return out

    def close(self) -> None:
        while self._open:
            _, reader = self._open.popitem(last=False)
            reader.close()

