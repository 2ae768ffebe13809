"""Reading rows of HDF5 datasets: three backends behind one ``read(indices)``.

- ``memmap``: contiguous, unfiltered, native-order data is a plain byte range of the
  file; the offset comes from h5py and rows are copied straight out of the page cache.
  A memory-map copy reads faster than MPI-IO ``Read_at_all``, and a 4 KiB row costs no
  h5py call (docs/benchmarks.md#shardedloader).
- ``h5py``: chunked or compressed data; one h5py call per batch, with sorted unique
  indices (h5py's fancy indexing needs increasing order), then put back in batch order.
- ``mpio``: h5py built against parallel HDF5; the file is opened with ``driver='mpio'``
  on a communicator and read collectively when every rank reads the same number of
  batches.
"""

import mmap
import os
from typing import List, Optional, Sequence

import numpy as np

from hpcddp.comm import lifetime, serial
from hpcddp.data.h5file import DataFileError, DatasetInfo, h5py_module, open_h5

__all__ = ["BACKENDS", "H5pyReader", "MemmapReader", "MPIOReader", "choose_backend"]


def _runs(sorted_unique: np.ndarray):
    """Split sorted unique indices into (start, stop) runs of consecutive rows."""
    if len(sorted_unique) == 0:
        return []
    breaks = np.flatnonzero(np.diff(sorted_unique) != 1) + 1
    starts = np.concatenate([[0], breaks])
    stops = np.concatenate([breaks, [len(sorted_unique)]])
    return [(int(sorted_unique[a]), int(sorted_unique[b - 1]) + 1) for a, b in zip(starts, stops)]


def _constant_step(indices: np.ndarray) -> int:
    """The common positive step of ``indices``, or 0 if there is none."""
    if len(indices) < 2:
        return 1 if len(indices) else 0
    step = int(indices[1] - indices[0])
    if step > 0 and indices[-1] - indices[0] == step * (len(indices) - 1) and \
            np.all(np.diff(indices) == step):
        return step
    return 0


class MemmapReader:
    """Rows by byte offset through one read-only memory map of the file.

    The map holds the only file descriptor (one per file, which matters for many shards),
    and every dataset is an array over it at its offset.
    """

    name = "memmap"

    def __init__(self, path, infos: Sequence[DatasetInfo], **_):
        self.path = os.fspath(path)
        with open(self.path, "rb") as file:
            self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        self.maps = [np.ndarray(i.shape, np.dtype(i.dtype), buffer=self._map, offset=i.offset)
                     for i in infos]
        self._ends = [(i.offset + i.shape[0] * i.row_bytes, i.key) for i in infos]

    def _check_size(self) -> None:
        """Refuse to read a file that has shrunk: touching a mapped page past its end would
        kill the process with SIGBUS, naming neither the rank nor the file."""
        size = self._map.size()  # the mapped file's size now
        for end, key in self._ends:
            if end > size:
                raise DataFileError(
                    f"{self.path} shrank to {size} bytes while being read (dataset {key!r} "
                    f"needs {end}): another process truncated or rewrote it in place. Write "
                    f"a new file beside it and rename it into place instead")

    def read(self, indices: np.ndarray, out: Optional[List[np.ndarray]] = None
             ) -> List[np.ndarray]:
        """Copy rows ``indices`` of every dataset, into ``out`` when given."""
        self._check_size()
        out = out or [np.empty((len(indices),) + m.shape[1:], m.dtype) for m in self.maps]
        step = _constant_step(indices)
        for m, o in zip(self.maps, out):
            if step:
                # Unshuffled batches are ranges (or, dealt round-robin, strided ranges).
                np.copyto(o, m[int(indices[0]):int(indices[-1]) + 1:step])
            else:
                np.take(m, indices, axis=0, out=o)
        return out

    def close(self):
        self.maps = []
        try:
            self._map.close()
        except BufferError:
            pass  # a view of it is still alive somewhere; the map goes with the last one


class H5pyReader:
    """Rows through h5py, one call per key and batch, in sorted order."""

    name = "h5py"

    def __init__(self, path, infos: Sequence[DatasetInfo], locking=False, swmr=False, **_):
        self.path = os.fspath(path)
        self.file = self._open(path, locking, swmr)
        self.dsets = [self.file[i.key] for i in infos]
        self._text = [i.vlen == "str" for i in infos]  # read as str, not bytes

    def _open(self, path, locking, swmr):
        return open_h5(path, locking, swmr)

    def _select(self, dset, unique):
        runs = _runs(unique)
        if len(runs) == 1:
            return dset[runs[0][0]:runs[0][1]]
        return dset[unique]

    def read(self, indices: np.ndarray, out=None) -> List[np.ndarray]:
        """Rows ``indices`` of every key, one h5py call each; variable-length rows come
        as an object array of arrays (or of str), still one call for the batch."""
        unique, inverse = np.unique(indices, return_inverse=True)
        return [self._select_or_explain(d, unique, text)[inverse]
                for d, text in zip(self.dsets, self._text)]

    def _select_or_explain(self, dset, unique, text=False):
        try:
            rows = self._select(dset, unique)
            if text:  # h5py gives variable-length strings as bytes
                rows = np.array([r.decode() if isinstance(r, bytes) else r for r in rows],
                                dtype=object)
            return rows
        except OSError as error:
            # HDF5 says only "filter returned failure during read" for a damaged chunk.
            raise DataFileError(
                f"{self.path}: dataset {dset.name.lstrip('/')!r} cannot be read at rows "
                f"{int(unique[0])}..{int(unique[-1])} ({error}); the file is damaged there "
                f"(a corrupt compressed chunk, or a truncated copy): copy or pack it "
                f"again") from None

    def close(self):
        # Datasets first: with the mpio driver HDF5 will not close a file whose objects
        # are still open.
        self.dsets = []
        self.file.close()


class MPIOReader(H5pyReader):
    """Rows through parallel HDF5 (``driver='mpio'``), collective when ranks agree.

    It owns ``comm`` (a duplicate made for it) and frees it on ``close()``. Closing an
    mpio file is collective: left to the garbage collector, ranks would close at
    different moments and hang, so the file stays open until ``close()``, or until
    ``hpcddp.comm.lifetime`` closes it before MPI is finalized.

    HDF5 calls MPI inside every operation on an mpio file, so each (open, read, close)
    is made by hpcddp's MPI thread (``hpcddp.comm.serial``), from whichever thread asks.
    """

    name = "mpio"

    def __init__(self, path, infos, comm=None, collective=True, locking=False, **_):
        self.comm, self.collective = comm, collective
        serial.call(super().__init__, path, infos, locking=locking)
        lifetime.register(self, keep_alive=True)

    def read(self, indices: np.ndarray, out=None) -> List[np.ndarray]:
        return serial.call(super().read, indices, out)

    def close(self):
        """Close the file and free the communicator. Collective: every rank must call it."""
        lifetime.unregister(self)
        if self.comm is not None:
            serial.call(super().close)
            lifetime.free_comm(self.comm)
            self.comm = None

    def _open(self, path, locking, swmr):
        if not h5py_module().get_config().mpi:
            raise RuntimeError("backend='mpio' needs h5py built with MPI (h5py.get_config().mpi "
                               "is False); see `make test-phdf5` in docs/tests.md for a build")
        return open_h5(path, locking, driver="mpio", comm=self.comm)

    def _select(self, dset, unique):
        if not self.collective:
            return super()._select(dset, unique)
        with dset.collective:
            return super()._select(dset, unique)


BACKENDS = {cls.name: cls for cls in (MemmapReader, H5pyReader, MPIOReader)}


def choose_backend(infos: Sequence[DatasetInfo], requested: str = "auto",
                   swmr: bool = False, files: int = 1) -> str:
    """Pick the backend for ``infos`` (of every file, when ``files`` > 1); refuse a
    requested one that cannot read them."""
    if requested not in ("auto", *BACKENDS):
        raise ValueError(f"backend={requested!r}; use 'auto', " +
                         ", ".join(repr(b) for b in BACKENDS))
    if requested == "mpio" and files > 1:
        # Collective opens and reads need every rank in every file, while a shuffle
        # sends each rank to different files.
        raise ValueError(f"backend='mpio' reads one file collectively and cannot read "
                         f"{files} files as one; use backend='auto' (memmap or h5py, each "
                         f"rank reading its own rows)")
    virtual = [i.key for i in infos if i.virtual]
    if requested == "mpio" and virtual:
        raise ValueError(f"backend='mpio' cannot read {virtual}: parallel HDF5 does not "
                         f"read virtual datasets; use backend='auto' or 'h5py'")
    if swmr:
        # Only HDF5 itself follows a SWMR writer's metadata; parallel HDF5 has no SWMR.
        if requested not in ("auto", "h5py"):
            raise ValueError(f"backend={requested!r} cannot read a file in SWMR mode; use "
                             f"backend='auto' or 'h5py' with swmr=True")
        return "h5py"
    by_offset = all(i.readable_by_offset for i in infos)
    if requested == "memmap" and not by_offset:
        bad = [i.key for i in infos if not i.readable_by_offset]
        raise ValueError(f"backend='memmap' needs contiguous, unfiltered, native-order data; "
                         f"{bad} are chunked, compressed, byte-swapped or variable-length. "
                         f"Use backend='auto' or repack with `hpcddp pack` (contiguous by "
                         f"default; variable-length rows are read through h5py)")
    if requested != "auto":
        return requested
    if by_offset:
        return "memmap"
    parallel = files == 1 and not virtual and h5py_module().get_config().mpi
    return "mpio" if parallel else "h5py"
