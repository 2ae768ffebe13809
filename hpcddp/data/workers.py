"""Per-sample transforms for ``ShardedLoader``, in worker processes that never touch MPI.

A training rank is an MPI process: forking it is unsafe (InfiniBand MPIs pin memory that
a forked child shares), and a worker that initialized MPI would try to join the job. So
workers are fresh interpreters, started with ``spawn`` (or from a ``forkserver``) with
``MPI4PY_RC_INITIALIZE=false`` and ``HPCDDP_LOADER_WORKER=1`` in their environment:
importing ``mpi4py.MPI`` there (a transform's module, h5py built against parallel HDF5,
the training script re-imported by ``spawn``) does not initialize MPI, and
``hpcddp.init()`` refuses to run there and says why.

Random augmentations are reproducible: before a sample is transformed, Python's
``random``, NumPy's global generator and torch's are seeded from
``np.random.SeedSequence([seed, epoch, index])`` (``index`` is the sample's global
index), and before a batch transform from ``[seed, epoch, first, 1]`` (``first``: the
batch's first sample). A sample's augmentation therefore depends on neither the worker, the
number of workers nor the world size, and a resumed epoch repeats it exactly.
"""

import os
import queue
import random
import threading
import traceback
from typing import Callable, Dict, NamedTuple, Optional, Sequence

import numpy as np
import torch

from hpcddp.data.dataset import as_sample
from hpcddp.env.config import LOADER_WORKER_VARIABLE as WORKER_VARIABLE

__all__ = ["Transforms", "WorkerPool", "sample_seed", "transform_batch"]
_CONTEXTS = ("spawn", "forkserver")
_POLL_S = 0.1


class Transforms(NamedTuple):
    """What a worker does to each batch of raw rows."""

    transform: Optional[Callable]        # one sample (a tuple) -> anything collate takes
    batch_transform: Optional[Callable]  # the collated batch -> the batch handed out
    collate: Callable                    # a list of samples -> a batch


def sample_seed(seed: int, epoch: int, index: int, batch: bool = False) -> int:
    """The 32-bit seed of sample ``index`` in ``epoch`` (``np.random.SeedSequence``), or
    of the batch that ``index`` begins."""
    entropy = [seed, epoch, index] + ([1] if batch else [])
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def _seed_everything(value: int) -> None:
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


def transform_batch(transforms: Transforms, columns: Sequence[np.ndarray],
                    indices: np.ndarray, seed: int, epoch: int):
    """Rows ``columns`` (one array per key) of samples ``indices``, transformed.

    Each sample is the tuple ``H5Dataset`` gives (tensors; ``str`` for variable-length
    strings); with no ``transform`` the samples are collated as they are. The
    generators' states are put back afterwards: run in the training process
    (``num_workers=0``), the seeding must not steer its dropout or shuffles.
    """
    saved = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
    try:
        return _transform_batch(transforms, columns, indices, seed, epoch)
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.random.set_rng_state(saved[2])


def _transform_batch(transforms, columns, indices, seed, epoch):
    samples = []
    for row, index in enumerate(indices):
        sample = tuple(as_sample(column[row]) for column in columns)
        if transforms.transform is not None:
            _seed_everything(sample_seed(seed, epoch, int(index)))
            sample = transforms.transform(sample)
        samples.append(sample)
    batch = transforms.collate(samples)
    if transforms.batch_transform is not None:
        _seed_everything(sample_seed(seed, epoch, int(indices[0]), batch=True))
        batch = transforms.batch_transform(batch)
    return batch


def _worker(transforms: Transforms, tasks, results, threads: int) -> None:
    torch.set_num_threads(threads)
    while True:
        task = tasks.get()
        if task is None:
            return
        number, columns, indices, seed, epoch = task
        try:
            results.put((number, True, transform_batch(transforms, columns, indices, seed,
                                                       epoch)))
        except BaseException as error:  # the traceback goes back as text, raised there
            results.put((number, False, f"{type(error).__name__}: {error}\n"
                                        f"{traceback.format_exc()}"))


_environment_lock = threading.Lock()


class WorkerPool:
    """``num_workers`` processes that transform batches; results come back in order.

    Args:
        transforms: what to do (its callables must be picklable: module-level functions
            or objects, as for ``DataLoader`` workers).
        num_workers: processes, started now and kept until ``close()``.
        context: ``"spawn"`` (default) or ``"forkserver"``; ``"fork"`` is refused.
        threads: torch threads per worker.
    """

    def __init__(self, transforms: Transforms, num_workers: int, context: str = "spawn",
                 threads: int = 1):
        if context not in _CONTEXTS:
            raise ValueError(f"worker_context={context!r}: a training rank is an MPI process "
                             f"and must not be forked; use 'spawn' or 'forkserver'")
        ctx = torch.multiprocessing.get_context(context)
        self._tasks, self._results = ctx.Queue(), ctx.Queue()
        self._processes = [ctx.Process(target=_worker, name=f"hpcddp-loader-worker-{i}",
                                       args=(transforms, self._tasks, self._results, threads),
                                       daemon=True) for i in range(num_workers)]
        # A started process inherits os.environ as it is at that moment.
        with _environment_lock:
            saved = {k: os.environ.get(k) for k in ("MPI4PY_RC_INITIALIZE", WORKER_VARIABLE)}
            os.environ.update({"MPI4PY_RC_INITIALIZE": "false", WORKER_VARIABLE: "1"})
            try:
                for process in self._processes:
                    process.start()
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
        self._submitted = 0
        self._next = 0
        self._done: Dict[int, object] = {}

    def submit(self, columns, indices, seed: int, epoch: int) -> None:
        """Queue one batch of raw rows."""
        self._tasks.put((self._submitted, columns, indices, seed, epoch))
        self._submitted += 1

    @property
    def pending(self) -> int:
        return self._submitted - self._next

    def next_result(self):
        """The oldest submitted batch, transformed; a worker's error is raised here."""
        while self._next not in self._done:
            try:
                number, ok, value = self._results.get(timeout=_POLL_S)
            except queue.Empty:
                dead = [p for p in self._processes if p.exitcode is not None]
                if dead:
                    raise RuntimeError(
                        f"hpcddp: loader worker {dead[0].name} (pid {dead[0].pid}) died with "
                        f"exit code {dead[0].exitcode} while transforming a batch (killed "
                        f"for memory, or a crash in native code such as a decoder)") from None
                continue
            if number < self._next:
                continue  # a batch of an iteration left early
            if not ok:
                raise RuntimeError(f"hpcddp: a loader worker's transform failed: {value}")
            self._done[number] = value
        self._next += 1
        return self._done.pop(self._next - 1)

    def forget(self) -> None:
        """Drop the batches still being transformed (an iteration left early): their
        results are discarded as they arrive."""
        self._next = self._submitted
        self._done.clear()

    def close(self) -> None:
        for _ in self._processes:
            self._tasks.put(None)
        for process in self._processes:
            process.join(timeout=5)
            if process.exitcode is None:
                process.terminate()
                process.join()
        self._tasks.close()
        self._results.close()
