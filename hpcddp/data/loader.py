"""``ShardedLoader``: this rank's batches of HDF5 files, read ahead in the background.

Each rank's sample sequence is ``hpcddp.DistributedSampler``'s, cut into batches of
``batch_size`` with the last partial batch kept, so the batches equal those of
``DataLoader(H5Dataset, batch_size, sampler=DistributedSampler(...))``, only read a
batch at a time instead of a sample at a time.
"""

import logging
import math
from collections import deque
from typing import Optional, Sequence

import numpy as np
import torch

import hpcddp.runtime  # noqa: F401 - first: MPI starts there, as hpcddp starts it
from hpcddp import timeline
from hpcddp.comm.lifetime import Closable
from hpcddp.comm.outcome import decide_on_root
from hpcddp.comm.thread_level import helper_threads_allowed
from hpcddp.data.dataset import H5Dataset, as_batch
from hpcddp.data.pool import BufferPool
from hpcddp.data.prefetch import Prefetcher
from hpcddp.data.readers import BACKENDS, choose_backend
from hpcddp.data.sampler import chunked_order, global_order, per_rank_count, rank_indices
from hpcddp.data.shards import ShardedReader, inspect_files, resolve_paths
from hpcddp.data.workers import Transforms, WorkerPool, transform_batch
from hpcddp.env.notices import warn_user
from hpcddp.transport.pinned import pinned_array

__all__ = ["ShardedLoader"]

log = logging.getLogger("hpcddp.data")
_STATE_VERSION = 1
# Batches smaller than this are read several at a time, in one copy (or one h5py call)
# per dataset: at 64 rows of 4 KiB, a read per batch spends more time in per-call work
# (index checks, the pool, the prefetch queue) than in copying
# (docs/benchmarks.md#shardedloader).
_READ_BYTES = 4 << 20


class ShardedLoader(Closable):
    """Iterate this rank's batches of HDF5 files: a global shuffle, read in parallel.

    Args:
        path_or_dataset: an HDF5 path, a glob of them (``"train-*.h5"``, sorted), a list
            of paths, or an ``H5Dataset`` (its path and keys are used). Many files are
            one dataset, their rows concatenated in order, as
            ``torch.utils.data.ConcatDataset`` of one ``H5Dataset`` per file; an HDF5
            virtual dataset is read as any other dataset.
        keys: dataset names; None means every top-level dataset (or the dataset's keys).
        batch_size: samples per batch; the last partial batch is kept.
        shuffle: as for ``hpcddp.DistributedSampler``.
        seed: as for ``hpcddp.DistributedSampler``.
        drop_last: as for ``hpcddp.DistributedSampler``.
        exact: as for ``hpcddp.DistributedSampler``.
        device: where batches go; on CUDA they are read into pinned buffers that are
            reused, and copied with ``non_blocking=True`` on the current stream.
        prefetch: batches read ahead by a background thread; 0 reads in the caller.
            Batches under 4 MiB are read several at a time (as many as fit in 4 MiB, one
            copy or h5py call per dataset), so the thread may be further ahead.
        backend: ``"auto"``, ``"memmap"``, ``"h5py"`` or ``"mpio"``; ``self.backend``
            says which one reads.
        chunk_shuffle: for chunked or compressed files: shuffle whole chunks, then
            samples within a few chunks (not torch's order; every rank still agrees).
            With many files the blocks are the files: file order is shuffled, then
            samples within ``chunk_window`` files, so each read touches few of them.
        chunk_window: chunks (or files) mixed together by ``chunk_shuffle``.
        locking: keep HDF5 file locking on.
        swmr: read a file that a SWMR writer is still appending to: the rows it had
            flushed when the loader was built, through h5py. A file open for writing
            without SWMR is refused, since the rows not yet written would read as zeros.
        max_open_files: files kept open at once when there are many; the least
            recently read is closed first.
        transform: applied to each sample (the tuple ``H5Dataset`` gives) before the
            batch is collated; for decoding, random crops and flips.
        batch_transform: applied to each collated batch.
        collate_fn: a list of (transformed) samples to a batch; torch's
            ``default_collate`` by default. Used only with a transform.
        num_workers: processes that run the transforms (``hpcddp.data.workers``: spawned,
            never forked, never touching MPI); 0 runs them in the calling thread. Random
            augmentations are seeded per sample from ``(seed, epoch, index)``, so they do
            not depend on the workers, and a resumed epoch repeats them exactly.
        worker_context: ``"spawn"`` or ``"forkserver"``.
        comm: an mpi4py communicator; the hpcddp world's by default.

    ``close()`` (or ``with ShardedLoader(...) as loader``) closes the file and frees the
    communicator the ``mpio`` backend duplicates; collective then.

    Example::

        loader = ShardedLoader("train.h5", ["x", "y"], batch_size=64, device=world.device)
        for epoch in range(start_epoch, epochs):
            loader.set_epoch(epoch)
            for x, y in loader:
                ...
        state = loader.state_dict()   # resumes with exactly the next batch

    .. warning:: Construction is collective over ``comm``.
    """

    def __init__(self, path_or_dataset, keys: Optional[Sequence[str]] = None,
                 batch_size: int = 1, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, exact: bool = False, device=None, prefetch: int = 2,
                 backend: str = "auto", chunk_shuffle: bool = False, chunk_window: int = 8,
                 locking: bool = False, swmr: bool = False, max_open_files: int = 64,
                 transform=None, batch_transform=None, collate_fn=None, num_workers: int = 0,
                 worker_context: str = "spawn", comm=None):
        self._on_world = comm is None  # follows the world as a recovery shrinks it
        if comm is None:
            from hpcddp.runtime import get_world
            comm = get_world().comm
        if isinstance(path_or_dataset, H5Dataset):
            keys = path_or_dataset.keys if keys is None else keys
            swmr = swmr or path_or_dataset.swmr
            path_or_dataset = path_or_dataset.path
        if int(batch_size) < 1 or int(prefetch) < 0:
            raise ValueError(f"batch_size={batch_size} must be >= 1 and prefetch={prefetch} "
                             f">= 0")
        self.paths = resolve_paths(path_or_dataset)
        self.path = self.paths[0] if len(self.paths) == 1 else \
            f"{self.paths[0]} and {len(self.paths) - 1} more files"
        self.comm = comm
        self.num_replicas, self.rank = comm.size, comm.rank
        self.batch_size, self.prefetch = int(batch_size), int(prefetch)
        self.shuffle, self.seed, self.drop_last, self.exact = shuffle, seed, drop_last, exact
        self.chunk_shuffle, self.chunk_window = chunk_shuffle, chunk_window
        self.device = None if device is None else torch.device(device)
        # Rank 0 inspects the files; every rank gets the result or raises the same error.
        shards = decide_on_root(comm, inspect_files, self.paths, keys, locking, swmr)
        self.infos = shards.combined()
        self.keys = [info.key for info in self.infos]
        self.length = shards.length
        self._file_starts = shards.starts if len(self.paths) > 1 else None
        self.backend = choose_backend([i for f in shards.infos for i in f], backend, swmr,
                                      files=len(self.paths))
        if self.backend == "mpio" and self.prefetch and not helper_threads_allowed(
                "the loader's prefetch thread (it reads through MPI-IO)",
                "batches are read in the calling thread (prefetch=0)"):
            self.prefetch = 0
        if len(self.paths) > 1:
            self._reader = ShardedReader(BACKENDS[self.backend], shards, max_open_files,
                                         locking=locking, swmr=swmr)
        else:
            # Collective MPI-IO needs every rank to issue the same reads. Reads in the
            # caller's thread keep step with it; a prefetch thread would not: an epoch
            # left early (a break after max_steps) finds each rank's thread at another
            # read, and a rank whose thread had begun one more would wait for it forever.
            same_count = not exact or self.length % self.num_replicas == 0
            self._reader = BACKENDS[self.backend](
                self.paths[0], self.infos, locking=locking, swmr=swmr,
                comm=comm.Dup() if self.backend == "mpio" else None,
                collective=same_count and not self.prefetch)
        if comm.rank == 0:
            log.info("ShardedLoader: %s keys=%s samples=%d backend=%s", self.path,
                     self.keys, self.length, self.backend)
        self._to_gpu = self.device is not None and self.device.type == "cuda"
        self._batches_per_read = max(1, _READ_BYTES // (
            self.batch_size * sum(i.row_bytes for i in self.infos)))
        self._pool = BufferPool(limit=self.prefetch + 4,
                                allocate=pinned_array if self._to_gpu else np.empty)
        self._in_flight = deque()  # (event, host batch) until the batch's copy completes
        self.epoch = 0
        self._position = 0      # samples of this rank's sequence already handed out
        self._remap_from = None  # a global position saved under another world size
        self._finished = False   # the last iteration ran to the end of the epoch
        self._prefetcher = None  # the read-ahead of the iteration under way
        self._transforms = None
        if transform is not None or batch_transform is not None:
            self._transforms = Transforms(transform, batch_transform,
                                          collate_fn or torch.utils.data.default_collate)
        elif int(num_workers):
            raise ValueError(f"num_workers={num_workers} runs transforms; give transform= "
                             f"or batch_transform= (reading needs no workers: it is batched "
                             f"and prefetched by the loader itself)")
        if int(num_workers) < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        self.num_workers, self.worker_context = int(num_workers), worker_context
        self._workers = None  # started on the first iteration, kept until close()
        self._opened()

    # -- order and position -----------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` (its permutation comes from ``seed + epoch``)."""
        if epoch != self.epoch:
            self.epoch, self._position, self._remap_from = epoch, 0, None
            self._finished = False

    def _order(self) -> np.ndarray:
        if self.chunk_shuffle and self.shuffle:
            chunk = self.infos[0].chunks[0] if self.infos[0].chunks else 1024
            # Many files: a file is a block, so a window of blocks is a few files.
            bounds = None if self._file_starts is None else self._file_starts.tolist()
            return chunked_order(self.length, chunk, self.seed, self.epoch, self.chunk_window,
                                 bounds)
        return global_order(self.length, self.shuffle, self.seed, self.epoch)

    def indices(self) -> np.ndarray:
        """This rank's sample sequence for the current epoch."""
        order = self._order()
        if self._remap_from is not None:
            order = order[min(self._remap_from, len(order)):]
        return rank_indices(order, self.num_replicas, self.rank, self.drop_last, self.exact)

    def __len__(self) -> int:
        if self.exact:
            count = len(range(self.rank, self.length, self.num_replicas))
        else:
            count = per_rank_count(self.length, self.num_replicas, self.drop_last)
        return math.ceil(count / self.batch_size)

    def _dealt(self, replicas: int) -> int:
        """How many samples of the global order an epoch on ``replicas`` ranks hands out."""
        if self.exact:
            return self.length
        return min(self.length, per_rank_count(self.length, replicas, self.drop_last) * replicas)

    def state_dict(self) -> dict:
        """The position, in global sample space: resuming continues with the next batch."""
        return {"version": _STATE_VERSION, "epoch": self.epoch, "seed": self.seed,
                "shuffle": self.shuffle, "length": self.length,
                "num_replicas": self.num_replicas, "batch_size": self.batch_size,
                "global_position": self._position * self.num_replicas + (self._remap_from or 0)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state``; on another world size, from the same global position."""
        if state.get("length") != self.length:
            raise ValueError(f"loader state is for {state.get('length')} samples but "
                             f"{self.path} has {self.length}; resume with the same data")
        self.epoch, self.seed = state["epoch"], state["seed"]
        position = state["global_position"]
        self._finished = False
        if state["num_replicas"] == self.num_replicas:
            self._position, self._remap_from = position // self.num_replicas, None
        elif position >= self._dealt(state["num_replicas"]):  # that epoch was over
            self._position, self._remap_from = 0, self.length
        else:
            warn_user(f"ShardedLoader: resuming epoch {self.epoch} on {self.num_replicas} ranks "
                      f"where it was saved on {state['num_replicas']}: its remaining "
                      f"{self.length - position} of {self.length} samples are dealt out anew "
                      f"among {self.num_replicas} ranks, each still seen once", rank=self.rank)
            self._position, self._remap_from = 0, position

    # -- iteration ---------------------------------------------------------------------

    def _reads(self):
        """This epoch's remaining samples, in reads of ``_batches_per_read`` whole batches."""
        if self._finished:
            # An epoch iterated to its end here and iterated again starts over, as a
            # DataLoader does. A position loaded at the end of an epoch yields nothing.
            self._position, self._remap_from, self._finished = 0, None, False
        indices = self.indices()
        span = self.batch_size * self._batches_per_read
        return [indices[i:i + span] for i in range(self._position, len(indices), span)]

    def _load(self, rows) -> tuple:
        if self._transforms:
            return rows, self._reader.read(rows)  # raw rows, for the transforms
        out = None
        if self.backend == "memmap":
            out = [self._pool.get((len(rows),) + i.shape[1:], i.dtype) for i in self.infos]
        arrays = self._reader.read(rows, out)
        if self._to_gpu and out is None:
            # Variable-length rows (object arrays) are copied to the GPU row by row.
            arrays = [a if a.dtype == object else self._pinned_copy(a) for a in arrays]
        return tuple(as_batch(a) for a in arrays)

    def _pinned_copy(self, array: np.ndarray) -> np.ndarray:
        pinned = self._pool.get(array.shape, array.dtype.newbyteorder("="))
        np.copyto(pinned, array)
        return pinned

    def _deliver(self, tensors, count):
        self._position += count  # before the caller has it: a state taken now skips it
        if self.device is None or self.device.type == "cpu":
            return tensors
        moved = self._moved(tensors)
        if self._to_gpu and not self._transforms:
            # The copy reads the pinned buffer after this returns; the pool may hand the
            # buffer to the reader again only once the copy's event has completed.
            while self._in_flight and self._in_flight[0][0].query():
                self._in_flight.popleft()
            copied = torch.cuda.Event()
            copied.record(torch.cuda.current_stream(self.device))
            self._in_flight.append((copied, tensors))
        return moved

    def _moved(self, batch):
        if isinstance(batch, (list, tuple)):  # variable-length rows; transformed batches
            return type(batch)(self._moved(item) for item in batch)
        if isinstance(batch, dict):
            return {key: self._moved(item) for key, item in batch.items()}
        if not isinstance(batch, torch.Tensor):
            return batch
        if self._transforms and self._to_gpu and not batch.is_pinned():
            # torch's pinned allocator reuses a block only after its copies completed.
            batch = batch.pin_memory()
        return batch.to(self.device, non_blocking=True)

    def _cut(self, loaded):
        """Reads cut into batches (views of the read): (batch, samples)."""
        for tensors in loaded:
            for start in range(0, len(tensors[0]), self.batch_size):
                batch = tuple(t[start:start + self.batch_size] for t in tensors)
                yield batch, len(batch[0])

    def _transformed(self, loaded):
        """Raw reads cut into batches and transformed, in order: (batch, samples)."""
        if self.num_workers and self._workers is None:
            self._workers = WorkerPool(self._transforms, self.num_workers,
                                       self.worker_context)
        pool, counts = self._workers, deque()
        try:
            for rows, arrays in loaded:
                for start in range(0, len(rows), self.batch_size):
                    ids = rows[start:start + self.batch_size]
                    columns = [a[start:start + self.batch_size] for a in arrays]
                    if pool is None:
                        yield transform_batch(self._transforms, columns, ids, self.seed,
                                              self.epoch), len(ids)
                        continue
                    pool.submit(columns, ids, self.seed, self.epoch)
                    counts.append(len(ids))
                    while pool.pending >= 2 * self.num_workers:
                        yield pool.next_result(), counts.popleft()
            while counts:
                yield pool.next_result(), counts.popleft()
        finally:
            if pool is not None:
                pool.forget()

    def __iter__(self):
        self._check_open()
        reads = self._reads()
        prefetcher = None
        if self.prefetch:
            # At least ``prefetch`` batches ahead, in whole reads.
            depth = -(-self.prefetch // self._batches_per_read)
            prefetcher = self._prefetcher = Prefetcher(self._load, reads, depth)
        loaded = prefetcher if prefetcher else map(self._load, reads)
        try:
            # Untransformed, each batch is a view of the read: the read's buffer returns to
            # the pool once the caller has let go of every batch cut from it.
            batches = iter(self._transformed(loaded) if self._transforms else self._cut(loaded))
            while True:
                with timeline.span("loader wait", timeline.LOADER):  # what training waits
                    item = next(batches, None)
                    if item is None:
                        break
                    delivered = self._deliver(*item)
                yield delivered
        finally:
            if prefetcher:
                prefetcher.stop()
                if self._prefetcher is prefetcher:
                    self._prefetcher = None
        self._finished = True

    _what = "ShardedLoader"

    def _rejoin(self, world) -> None:
        """Deal the samples over ``world``, the survivors after ``hpcddp.elastic`` shrank
        the job: the state the recovery restores next was saved at the old size, so the
        rest of its epoch is dealt out anew among them, each sample still seen once
        (``load_state_dict``)."""
        if not self._on_world or self.backend == "mpio":
            raise RuntimeError(
                "hpcddp.elastic: a ShardedLoader on a communicator of its own (comm=) or "
                "reading through MPI-IO (backend='mpio') cannot follow the job as it "
                "shrinks; leave comm unset and choose backend='h5py' or 'memmap', or make "
                "the loader inside the function `run` calls")
        self.comm = world.comm
        self.num_replicas, self.rank = world.size, world.rank
        self._finished = False
        self._opened()

    def _abandon(self) -> None:
        if self._prefetcher is not None:  # the iteration under way is over
            self._prefetcher.stop()
            self._prefetcher = None

    def _release(self) -> None:
        # An iteration left unfinished still has its thread reading: stop it first.
        if self._prefetcher is not None:
            self._prefetcher.stop()
            self._prefetcher = None
        if self._workers is not None:
            self._workers.close()
            self._workers = None
        self._reader.close()
