"""``H5Dataset``: one sample of an HDF5 file as a tuple of tensors, safe in DataLoader workers.

A variable-length row is a 1-D tensor of its own length, and a variable-length string a
``str``; torch's default collate cannot stack those, so a ``DataLoader`` over them needs
a ``collate_fn`` that keeps lists.
"""

import os
from typing import Optional, Sequence

import numpy as np
import torch

from hpcddp.data.h5file import inspect_file, open_h5

__all__ = ["H5Dataset", "as_batch", "as_tensor"]


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor owning ``array``'s data, converted to native byte order if needed."""
    if not array.dtype.isnative:
        array = array.astype(array.dtype.newbyteorder("="))
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def as_sample(value):
    """One row as a sample: a tensor, or a ``str`` for a variable-length string."""
    return value if isinstance(value, str) else as_tensor(np.asarray(value))


def as_batch(array: np.ndarray):
    """Rows as a batch: one tensor for fixed-size rows; for variable-length rows (an
    object array) a list with one tensor (or ``str``) per row."""
    if array.dtype != object:
        return as_tensor(array)
    return [as_sample(row) for row in array]


class H5Dataset(torch.utils.data.Dataset):
    """A map-style dataset over the datasets ``keys`` of the HDF5 file ``path``.

    The file is opened lazily in each process and never pickled: an h5py handle shared
    across forked DataLoader workers gives corrupt reads (pytorch/pytorch#11929).

    Args:
        path: the HDF5 file.
        keys: dataset names, all of the same length; None means every top-level dataset.
        locking: keep HDF5 file locking on (off by default for read-only use).
        swmr: the file is still being appended to by a SWMR writer; its length is the rows
            flushed when the dataset was made.

    Example::

        ds = H5Dataset("train.h5", ["images", "labels"])
        image, label = ds[0]
    """

    def __init__(self, path, keys: Optional[Sequence[str]] = None, locking: bool = False,
                 swmr: bool = False):
        self.path = os.fspath(path)
        self.infos = inspect_file(self.path, keys, locking, swmr)
        self.keys = [info.key for info in self.infos]
        self.locking, self.swmr = locking, swmr
        self._length = self.infos[0].shape[0]
        self._file, self._pid = None, None
        self._text = [info.vlen == "str" for info in self.infos]

    def __len__(self):
        return self._length

    def _datasets(self):
        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = open_h5(self.path, self.locking, self.swmr), \
                os.getpid()
        return [self._file[key] for key in self.keys]

    def __getitem__(self, index):
        if not -self._length <= index < self._length:
            raise IndexError(f"index {index} out of range for {self._length} samples")
        return tuple(as_sample(d.asstr()[index] if text else d[index])
                     for d, text in zip(self._datasets(), self._text))

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_file"], state["_pid"] = None, None
        return state
