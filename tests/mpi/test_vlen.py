"""Variable-length rows (encoded images as ``h5py.vlen_dtype(np.uint8)``, variable-length
strings) through ShardedLoader, against torch's DataLoader + DistributedSampler over
``H5Dataset`` with a collate function that keeps each batch's rows in lists."""

import os
import shutil
import tempfile

import h5py
import numpy as np
import pytest
import torch

from data_reference import reference_batches
from hpcddp.data import DataFileError, ShardedLoader
from hpcddp.data.pack import pack_arrays, pack_shards

N = 61
KEYS = ["image", "name", "label"]
# With h5py built against parallel HDF5 (`make test-phdf5`), one file is read through mpio.
ONE_FILE = "mpio" if h5py.get_config().mpi else "h5py"


def _columns():
    rng = np.random.default_rng(3)
    images = [rng.integers(0, 256, int(rng.integers(0, 40)), dtype=np.uint8).tobytes()
              for _ in range(N)]
    names = [f"sample {i} " + "ü" * (i % 5) for i in range(N)]
    return {"image": images, "name": names, "label": np.arange(N)}


def keep_lists(samples):
    """torch's default collate stacks; rows of different lengths stay a list."""
    images, names, labels = zip(*samples)
    return list(images), list(names), torch.stack(labels)


@pytest.fixture(scope="module")
def vlen_files(world):
    folder = tempfile.mkdtemp(prefix="hpcddp-vlen-") if world.rank == 0 else None
    folder = world.comm.bcast(folder, root=0)
    paths = {k: os.path.join(folder, f"{k}.h5") for k in ("flat", "gzip", "bad")}
    columns = _columns()
    if world.rank == 0:
        pack_arrays(paths["flat"], columns, progress=False)
        pack_arrays(paths["gzip"], columns, chunk_rows=8, compression="gzip", progress=False)
        pack_shards(os.path.join(folder, "shard.h5"), columns, 4, progress=False)
        with h5py.File(paths["bad"], "w") as f:
            f.create_dataset("grid", (N, 2), dtype=h5py.vlen_dtype(np.uint8))
            f["fixed_image"] = np.zeros((N, 3), np.uint8)
    world.comm.Barrier()
    paths["shards"] = sorted(os.path.join(folder, f"shard-{i:05d}.h5") for i in range(4))
    yield paths, columns
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(folder)


def _assert_same(ours, theirs):
    assert len(ours) == len(theirs) > 0
    for (images, names, labels), (r_images, r_names, r_labels) in zip(ours, theirs):
        assert torch.equal(labels, r_labels) and names == r_names
        assert len(images) == len(r_images)
        assert all(a.dtype == torch.uint8 and torch.equal(a, b)
                   for a, b in zip(images, r_images))


@pytest.mark.parametrize("kind", ["flat", "gzip", "shards"])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_variable_length_rows_equal_torch_dataloader(world, vlen_files, kind, prefetch):
    paths, columns = vlen_files
    with ShardedLoader(paths[kind], KEYS, batch_size=5, seed=2, prefetch=prefetch) as loader:
        assert loader.backend == (ONE_FILE if kind != "shards" else "h5py")
        assert [i.type_name for i in loader.infos] == \
            ["variable-length uint8", "variable-length str", "int64"]
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            ours = list(loader)
            _assert_same(ours, reference_batches(world, paths[kind], 5, epoch, keys=KEYS,
                                                 collate_fn=keep_lists, seed=2))
            for images, names, labels in ours:  # and the bytes that were written
                assert [bytes(a.numpy()) for a in images] == \
                    [columns["image"][i] for i in labels]


def test_memmap_refuses_variable_length_rows_and_says_why(world, vlen_files):
    paths, _ = vlen_files
    with pytest.raises(ValueError, match="variable-length"):
        ShardedLoader(paths["flat"], KEYS, batch_size=4, backend="memmap")


def test_variable_length_rows_in_two_dimensions_refused(world, vlen_files):
    paths, _ = vlen_files
    with pytest.raises(DataFileError) as raised:
        ShardedLoader(paths["bad"], ["grid"], batch_size=4)
    assert all(word in str(raised.value) for word in ("'grid'", "(61, 2)", "one dimension"))


def test_files_with_fixed_and_variable_length_rows_refused(world, vlen_files):
    paths, _ = vlen_files
    # The same key, variable-length in one file and fixed rows in the other.
    other = os.path.join(os.path.dirname(paths["bad"]), "fixed.h5")
    if world.rank == 0:
        pack_arrays(other, {"image": np.zeros((3, 4), np.uint8), "name": ["a", "b", "c"],
                            "label": np.arange(3)}, progress=False)
    world.comm.Barrier()
    with pytest.raises(DataFileError) as raised:
        ShardedLoader([paths["flat"], other], KEYS, batch_size=4)
    assert "variable-length uint8" in str(raised.value) and "fixed.h5" in str(raised.value)
