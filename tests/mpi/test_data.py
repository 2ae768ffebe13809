"""ShardedLoader on real HDF5 files, against torch's DataLoader + DistributedSampler."""

import importlib
import os
import shutil
import tempfile
import threading

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from data_reference import reference_batches
from gpu import skip_or_fail_without_gpu
from hpcddp.data import DataFileError, ShardedLoader
from hpcddp.data.pack import pack_arrays

N = 103  # divisible by neither 2 nor 3


@pytest.fixture(scope="module")
def files(world):
    """Real files on disk, written by rank 0: contiguous, chunked+gzip, big-endian."""
    folder = tempfile.mkdtemp(prefix="hpcddp-data-") if world.rank == 0 else None
    folder = world.comm.bcast(folder, root=0)
    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((N, 5)).astype(np.float32), "y": np.arange(N)}
    paths = {k: os.path.join(folder, f"{k}.h5") for k in ("flat", "gzip", "swapped", "bad")}
    if world.rank == 0:
        pack_arrays(paths["flat"], arrays, progress=False)
        pack_arrays(paths["gzip"], arrays, chunk_rows=16, compression="gzip", progress=False)
        with h5py.File(paths["swapped"], "w") as f:
            f["x"] = arrays["x"].astype(">f4")
            f["y"] = arrays["y"]
        with h5py.File(paths["bad"], "w") as f:
            f["x"] = arrays["x"]
            f["short"] = np.arange(N - 1)
            f["text"] = np.array([b"a"] * N, dtype="S1")
            f["empty"] = np.zeros((0, 3))
        truncated = os.path.join(folder, "truncated.h5")
        shutil.copy(paths["flat"], truncated)
        os.truncate(truncated, os.path.getsize(truncated) - 100)
    paths["truncated"] = os.path.join(folder, "truncated.h5")
    world.comm.Barrier()
    yield paths, arrays
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(folder)


# With h5py built against parallel HDF5 (`make test-phdf5`), h5py's place is mpio's.
H5PY = "mpio" if h5py.get_config().mpi else "h5py"


@pytest.mark.parametrize("kind, backend", [("flat", "memmap"), ("gzip", H5PY),
                                           ("swapped", H5PY)])
@pytest.mark.parametrize("shuffle, drop_last", [(True, False), (False, False), (True, True)])
def test_batches_equal_torch_dataloader_with_distributed_sampler(world, files, kind, backend,
                                                                 shuffle, drop_last):
    paths, _ = files
    loader = ShardedLoader(paths[kind], ["x", "y"], batch_size=8, shuffle=shuffle, seed=3,
                           drop_last=drop_last)
    assert loader.backend == backend
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        ours = list(loader)
        theirs = reference_batches(world, paths[kind], 8, epoch, shuffle=shuffle, seed=3,
                                    drop_last=drop_last)
        assert len(ours) == len(theirs) == len(loader)
        for (x, y), (rx, ry) in zip(ours, theirs):
            assert torch.equal(x, rx) and torch.equal(y, ry)
    loader.close()


@pytest.mark.parametrize("kind", ["flat", "gzip", "swapped"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_small_batches_read_together_stay_intact(world, files, monkeypatch, kind, prefetch):
    """Batches that share one read's buffer: a batch the caller keeps is never overwritten,
    and a buffer whose batches were all let go is filled again."""
    paths, _ = files
    row_bytes = 5 * 4 + 8  # x: 5 float32, y: int64
    monkeypatch.setattr(importlib.import_module("hpcddp.data.loader"), "_READ_BYTES",
                        3 * 4 * row_bytes)
    loader = ShardedLoader(paths[kind], ["x", "y"], batch_size=4, seed=6, prefetch=prefetch)
    assert loader._batches_per_read == 3
    theirs = reference_batches(world, paths[kind], 4, 0, shuffle=True, seed=6)
    kept = []
    for i, (x, y) in enumerate(loader):
        assert torch.equal(x, theirs[i][0]) and torch.equal(y, theirs[i][1])
        if i % 5 == 0:
            kept.append((i, x, y))
    assert i + 1 == len(theirs) == len(loader)
    for i, x, y in kept:  # later reads went through the pool meanwhile
        assert torch.equal(x, theirs[i][0]) and torch.equal(y, theirs[i][1])
    if loader.backend == "memmap":  # the only reader that fills the pool's buffers
        del kept, x, y
        allocated = loader._pool.allocated
        assert allocated > 0
        assert sum(1 for _ in loader) == len(theirs)
        assert loader._pool.allocated == allocated  # nothing kept: every buffer came back
    loader.close()


@pytest.mark.parametrize("kind", ["flat", "gzip"])
def test_an_epoch_left_early_and_closed_stops_every_read(world, files, monkeypatch, kind):
    """Ranks leave the epoch at different batches and close the loader while the
    iterator is still alive: no rank waits for a read another rank's thread never starts
    (mpio's prefetch thread reads independently) and no thread is left reading."""
    paths, _ = files
    monkeypatch.setattr(importlib.import_module("hpcddp.data.loader"), "_READ_BYTES", 1)
    loader = ShardedLoader(paths[kind], ["x", "y"], batch_size=4, seed=4, prefetch=2)
    assert loader._batches_per_read == 1
    theirs = reference_batches(world, paths[kind], 4, 0, shuffle=True, seed=4)
    iterator = iter(loader)
    for i in range(1 + 2 * world.rank % len(theirs)):  # 8 ranks have 3 batches each
        x, y = next(iterator)
        assert torch.equal(x, theirs[i][0]) and torch.equal(y, theirs[i][1])
    loader.close()
    assert not [t for t in threading.enumerate() if t.name == "hpcddp-prefetch"]
    del iterator


def test_each_backend_returns_the_written_arrays(world, files):
    paths, arrays = files
    for kind in ("flat", "gzip", "swapped"):
        loader = ShardedLoader(paths[kind], ["x", "y"], batch_size=10, shuffle=False, exact=True)
        mine = [b for b in loader]
        xs = torch.cat([x for x, _ in mine]) if mine else torch.empty(0, 5)
        ys = torch.cat([y for _, y in mine]) if mine else torch.empty(0, dtype=torch.long)
        assert torch.equal(ys, torch.arange(world.rank, N, world.size))
        np.testing.assert_array_equal(xs.numpy(), arrays["x"][world.rank::world.size])
        loader.close()


def test_exact_mode_reads_every_sample_once_per_epoch(world, files):
    paths, _ = files
    loader = ShardedLoader(paths["flat"], ["y"], batch_size=7, exact=True, seed=9)
    seen_epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        mine = torch.cat([y for (y,) in loader]).tolist()
        everyone = world.comm.allgather(mine)
        assert sorted(i for part in everyone for i in part) == list(range(N))
        assert max(map(len, everyone)) - min(map(len, everyone)) <= 1
        seen_epochs.append(everyone)
    assert seen_epochs[0] != seen_epochs[1]


def test_chunk_shuffle_is_a_permutation_and_differs_from_plain(world, files):
    paths, _ = files
    loader = ShardedLoader(paths["gzip"], ["y"], batch_size=8, exact=True, chunk_shuffle=True,
                           chunk_window=2)
    mine = torch.cat([y for (y,) in loader]).tolist()
    everyone = world.comm.allgather(mine)
    assert sorted(i for part in everyone for i in part) == list(range(N))
    plain = ShardedLoader(paths["gzip"], ["y"], batch_size=8, exact=True)
    assert not np.array_equal(loader.indices(), plain.indices())


def test_state_dict_mid_epoch_in_the_same_job(world, files):
    paths, _ = files
    loader = ShardedLoader(paths["flat"], ["y"], batch_size=5, seed=1, prefetch=3)
    loader.set_epoch(2)
    everything = [y for (y,) in loader]
    iterator = iter(loader)
    head = [next(iterator)[0] for _ in range(min(4, len(everything) - 1))]  # mid-epoch
    state = loader.state_dict()
    iterator.close()
    again = ShardedLoader(paths["flat"], ["y"], batch_size=5, seed=1)
    again.load_state_dict(state)
    rest = [y for (y,) in again]
    assert all(torch.equal(a, b) for a, b in zip(head + rest, everything))
    assert len(head) + len(rest) == len(everything)


@pytest.mark.parametrize("kind, keys, error, words", [
    ("missing", ["x"], FileNotFoundError, ["missing.h5", "no such file"]),
    ("bad", ["nope"], DataFileError, ["'nope'", "the file has"]),
    ("bad", ["x", "short"], DataFileError, ["different lengths", "short: 102"]),
    ("bad", ["text"], DataFileError, ["'text'", "dtype |S1"]),
    ("bad", ["empty"], DataFileError, ["'empty'", "empty"]),
    ("truncated", ["x", "y"], DataFileError, ["truncated"]),
])
def test_bad_input_raises_the_same_error_on_every_rank(world, files, kind, keys, error, words):
    paths, _ = files
    path = paths.get(kind, os.path.join(os.path.dirname(paths["flat"]), "missing.h5"))
    with pytest.raises(error) as info:
        ShardedLoader(path, keys, batch_size=4)
    for word in words:
        assert word in str(info.value)
    assert world.comm.allreduce(1) == world.size  # every rank got here: nobody waits


@pytest.mark.parametrize("backend", ["h5py", "mpio"])
def test_forced_backend_reads_contiguous_files_too(world, files, backend):
    if backend == "mpio" and not h5py.get_config().mpi:
        pytest.skip("h5py is built without MPI; `make test-phdf5` runs this with it")
    paths, arrays = files
    loader = ShardedLoader(paths["flat"], ["x"], batch_size=9, seed=2, backend=backend)
    assert loader.backend == backend
    reference = [x for x, _ in reference_batches(world, paths["flat"], 9, 0, seed=2)]
    ours = [x for (x,) in loader]
    assert len(ours) == len(reference) and all(map(torch.equal, ours, reference))


def test_mpio_without_parallel_h5py_says_how_to_get_it(world, files):
    if h5py.get_config().mpi:
        pytest.skip("this h5py has MPI")
    with pytest.raises(RuntimeError, match="h5py built with MPI"):
        ShardedLoader(files[0]["flat"], ["x"], batch_size=4, backend="mpio")


def test_memmap_backend_refused_for_compressed_data(world, files):
    paths, _ = files
    with pytest.raises(ValueError, match="backend='memmap' needs contiguous"):
        ShardedLoader(paths["gzip"], ["x"], batch_size=4, backend="memmap")


@pytest.mark.parametrize("kind", ["flat", "gzip", "swapped"])
def test_gpu_batches_equal_torch_dataloader_while_the_gpu_lags(world, files, kind):
    """Pinned buffers are reused only after their copy has run: the GPU is kept busy
    before every copy, so a buffer handed back to the reader too early is overwritten
    by a later batch before the copy reads it."""
    skip_or_fail_without_gpu("pinned batches copied to the GPU")
    paths, _ = files
    loader = ShardedLoader(paths[kind], ["x", "y"], batch_size=4, shuffle=True, seed=5,
                           device=world.device, prefetch=3)
    ours = []
    for x, y in loader:
        assert x.is_cuda and y.is_cuda
        ours.append((x, y))
        torch.cuda._sleep(2_000_000)  # about a millisecond of GPU time ahead of each copy
    theirs = reference_batches(world, paths[kind], 4, 0, shuffle=True, seed=5)
    assert len(ours) == len(theirs)
    for (x, y), (rx, ry) in zip(ours, theirs):
        torch.testing.assert_close(x.cpu(), rx, rtol=0, atol=0)
        torch.testing.assert_close(y.cpu(), ry, rtol=0, atol=0)


def test_position_at_the_end_of_an_epoch_resumes_to_nothing(world, files):
    paths, _ = files
    loader = ShardedLoader(paths["flat"], ["y"], batch_size=8)
    assert len(list(loader)) == len(loader)
    assert len(list(loader)) == len(loader)  # iterated again here: starts over
    again = ShardedLoader(paths["flat"], ["y"], batch_size=8)
    again.load_state_dict(loader.state_dict())
    assert list(again) == []  # the epoch was done: the next one comes with set_epoch
    again.set_epoch(1)
    assert len(list(again)) == len(loader)


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@pytest.mark.parametrize("kind", ["flat", "gzip"])
def test_dataloader_workers_started_safely_never_initialize_mpi(world, files, context, kind):
    # Forking an MPI process is unsafe (InfiniBand MPIs), so workers are spawned or come
    # from a fork server: fresh interpreters that unpickle the dataset. They inherit the
    # launcher's variables, so a worker that initialized MPI would try to join the job.
    from worker_probe import ProbedDataset

    paths, _ = files
    dataset = ProbedDataset(paths[kind], ["x", "y"])
    sampler = TorchSampler(dataset, world.size, world.rank, shuffle=True, seed=5)
    here = list(DataLoader(dataset, batch_size=8, sampler=sampler))
    workers = list(DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2,
                              multiprocessing_context=context))
    assert len(here) == len(workers) == len(sampler) // 8 + (len(sampler) % 8 > 0)
    for (x, y, _), (wx, wy, worker_mpi) in zip(here, workers):
        assert torch.equal(x, wx) and torch.equal(y, wy)
        assert not worker_mpi.any(), f"a {context} worker initialized MPI"
    assert all(flag.all() for *_, flag in here), "the probe must see MPI in the rank itself"


def test_thousands_of_loaders_created_and_closed(world, files):
    # With the mpio backend each loader duplicates a communicator and opens the file
    # collectively; both are released by close(), or MPI runs out of contexts.
    from hpcddp.comm import lifetime
    paths, _ = files
    before = lifetime.open_count()
    for _ in range(3000 if H5PY == "mpio" else 300):
        with ShardedLoader(paths["gzip"], ["x", "y"], batch_size=64, prefetch=0) as loader:
            pass
    assert loader.closed and lifetime.open_count() == before
    with pytest.raises(RuntimeError, match="already closed"):
        next(iter(loader))
    with ShardedLoader(paths["gzip"], ["x", "y"], batch_size=8, seed=1) as loader:
        theirs = reference_batches(world, paths["gzip"], 8, 0, seed=1)
        assert all(torch.equal(x, rx) and torch.equal(y, ry)
                   for (x, y), (rx, ry) in zip(loader, theirs))
