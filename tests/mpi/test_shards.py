"""ShardedLoader over many HDF5 files, against torch's DataLoader + DistributedSampler over
``ConcatDataset`` of one ``H5Dataset`` per file."""

import os
import shutil
import tempfile

import h5py
import numpy as np
import pytest
import torch

from data_reference import reference_batches
from hpcddp.data import DataFileError, ShardedLoader
from hpcddp.data.pack import pack_arrays

LENGTHS = [7, 13, 20, 1, 9]  # 50 rows: not a multiple of 3, and a one-row shard
MANY = 100


def _arrays(start, count):
    rows = np.arange(start, start + count)
    return {"x": np.stack([rows * 1.0, -rows * 1.0, rows * 0.5], 1).astype(np.float32),
            "y": rows}


@pytest.fixture(scope="module")
def shards(world):
    """Real shard files on disk, written by rank 0."""
    folder = tempfile.mkdtemp(prefix="hpcddp-shards-") if world.rank == 0 else None
    folder = world.comm.bcast(folder, root=0)
    paths = {"flat": [], "gzip": [], "many": []}
    start = 0
    for i, count in enumerate(LENGTHS):
        for kind in ("flat", "gzip"):
            path = os.path.join(folder, f"{kind}-{i:03d}.h5")
            if world.rank == 0:
                pack_arrays(path, _arrays(start, count), progress=False,
                            **({"chunk_rows": 4, "compression": "gzip"} if kind == "gzip" else {}))
            paths[kind].append(path)
        start += count
    for i in range(MANY):
        path = os.path.join(folder, f"many-{i:03d}.h5")
        if world.rank == 0:
            pack_arrays(path, _arrays(2 * i, 2), progress=False)
        paths["many"].append(path)
    paths["vds"] = os.path.join(folder, "virtual.h5")
    paths["other_dtype"] = os.path.join(folder, "other-dtype.h5")
    if world.rank == 0:
        layout = {"x": h5py.VirtualLayout((sum(LENGTHS), 3), np.float32),
                  "y": h5py.VirtualLayout((sum(LENGTHS),), np.int64)}
        start = 0
        for path, count in zip(paths["flat"], LENGTHS):
            layout["x"][start:start + count] = h5py.VirtualSource(path, "x", (count, 3))
            layout["y"][start:start + count] = h5py.VirtualSource(path, "y", (count,))
            start += count
        with h5py.File(paths["vds"], "w") as f:
            for key, lay in layout.items():
                f.create_virtual_dataset(key, lay)
        pack_arrays(paths["other_dtype"], {"x": np.zeros((3, 3)), "y": np.arange(3)},
                    progress=False)
    world.comm.Barrier()
    yield folder, paths
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(folder)


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for (x, y), (rx, ry) in zip(ours, theirs):
        assert torch.equal(x, rx) and torch.equal(y, ry)


@pytest.mark.parametrize("kind, backend", [("flat", "memmap"), ("gzip", "h5py")])
@pytest.mark.parametrize("given", ["list", "glob"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_many_files_equal_torch_concat_dataset(world, shards, kind, backend, given, prefetch):
    folder, paths = shards
    source = paths[kind] if given == "list" else os.path.join(folder, f"{kind}-*.h5")
    # Two files open at most: the shuffle sends every read to several files in turn.
    with ShardedLoader(source, ["x", "y"], batch_size=4, seed=5, prefetch=prefetch,
                       max_open_files=2) as loader:
        assert loader.backend == backend and loader.length == sum(LENGTHS)
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            _assert_same(list(loader), reference_batches(world, paths[kind], 4, epoch, seed=5))
        assert loader._reader.opened > 2  # files were closed and opened again


@pytest.mark.parametrize("shuffle", [True, False])
def test_resume_mid_epoch_over_many_files(world, shards, shuffle):
    _, paths = shards
    loader = ShardedLoader(paths["flat"], ["x", "y"], batch_size=3, shuffle=shuffle, seed=2)
    loader.set_epoch(1)
    it = iter(loader)
    first = [next(it) for _ in range(2)]
    state = loader.state_dict()
    loader.close()
    with ShardedLoader(paths["flat"], ["x", "y"], batch_size=3, shuffle=shuffle,
                       seed=2) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
    _assert_same(first + rest, reference_batches(world, paths["flat"], 3, 1, shuffle=shuffle, seed=2))


def _open_descriptors():
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd (Linux)")
@pytest.mark.parametrize("backend", ["memmap", "h5py"])
def test_a_hundred_shards_keep_descriptors_bounded(world, shards, backend):
    _, paths = shards
    before = _open_descriptors()
    most = before
    with ShardedLoader(paths["many"], ["x", "y"], batch_size=8, seed=1, prefetch=0,
                       backend=backend, max_open_files=4) as loader:
        ours = []
        for batch in loader:
            most = max(most, _open_descriptors())
            ours.append(batch)
        assert loader._reader.opened > 50
    _assert_same(ours, reference_batches(world, paths["many"], 8, 0, seed=1))
    # Four files open at a time; h5py may hold a second descriptor per file.
    assert most - before <= 8, f"{most - before} descriptors opened at once"
    assert _open_descriptors() == before


def test_virtual_dataset_reads_like_its_sources(world, shards):
    _, paths = shards
    # The reference first: HDF5 keeps the sources a virtual dataset opened for a while,
    # with the virtual file's locking flags, and refuses to open them again with others.
    theirs = reference_batches(world, paths["flat"], 4, 3, seed=7)
    with ShardedLoader(paths["vds"], ["x", "y"], batch_size=4, seed=7) as loader:
        # No byte offset, and parallel HDF5 cannot read virtual datasets: h5py.
        assert loader.backend == "h5py"
        loader.set_epoch(3)
        _assert_same(list(loader), theirs)


@pytest.mark.parametrize("case, error, words", [
    ("other_dtype", DataFileError, ["other-dtype.h5", "flat-000.h5", "same keys"]),
    ("no_match", FileNotFoundError, ["nothing-*.h5", "no file matches"]),
    ("twice", ValueError, ["named twice"]),
    ("mpio", ValueError, ["backend='mpio'", "5 files", "backend='auto'"]),
    ("mpio_virtual", ValueError, ["backend='mpio'", "virtual datasets", "'h5py'"]),
])
def test_bad_file_lists_raise_the_same_error_on_every_rank(world, shards, case, error, words):
    folder, paths = shards
    source, backend = {
        "other_dtype": (paths["flat"] + [paths["other_dtype"]], "auto"),
        "no_match": (os.path.join(folder, "nothing-*.h5"), "auto"),
        "twice": (paths["flat"] + paths["flat"][:1], "auto"),
        "mpio": (paths["flat"], "mpio"),
        "mpio_virtual": (paths["vds"], "mpio"),
    }[case]
    with pytest.raises(error) as raised:
        ShardedLoader(source, ["x", "y"], batch_size=4, backend=backend)
    for word in words:
        assert word in str(raised.value)


def _file_changes(loader, starts):
    files = np.searchsorted(starts, loader.indices(), side="right") - 1
    return int(np.count_nonzero(np.diff(files)))


def test_chunk_shuffle_over_many_files_keeps_reads_to_few_files(world, shards):
    """Shuffled by whole files, then within windows of files: each rank's sequence goes
    through the files one window at a time, and the epoch is still every sample once."""
    _, paths = shards
    starts = np.cumsum([0] + LENGTHS)
    local = ShardedLoader(paths["flat"], ["y"], batch_size=4, exact=True, seed=3,
                          chunk_shuffle=True, chunk_window=1)
    plain = ShardedLoader(paths["flat"], ["y"], batch_size=4, exact=True, seed=3)
    mine = torch.cat([y for (y,) in local]).tolist()
    everyone = world.comm.allgather(mine)
    assert sorted(i for part in everyone for i in part) == list(range(sum(LENGTHS)))
    assert _file_changes(local, starts) <= len(LENGTHS) - 1
    assert _file_changes(plain, starts) > 2 * len(LENGTHS)  # the test can tell them apart
    local.close()
    plain.close()
