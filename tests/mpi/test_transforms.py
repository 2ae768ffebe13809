"""Per-sample and batch transforms in ShardedLoader's worker processes, against torch's
DataLoader + DistributedSampler over H5Dataset with the same transforms, each sample's
generators seeded from np.random.SeedSequence([seed, epoch, index]) and each batch's
from [seed, epoch, first index, 1], as documented."""

import os
import random
import shutil
import tempfile

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from hpcddp.data import H5Dataset, ShardedLoader
from hpcddp.data.pack import pack_arrays
from worker_transforms import crop_and_flip, fail_on_seven, scale_batch, with_process

N = 47
KEYS = ["image", "name", "label"]


def _seed(*entropy):
    value = int(np.random.SeedSequence(entropy).generate_state(1)[0])
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


class Transformed(Dataset):
    """The reference: H5Dataset's sample, transformed after the documented seeding."""

    def __init__(self, path, seed, transform):
        self.inner, self.seed, self.transform, self.epoch = H5Dataset(path, KEYS), seed, \
            transform, 0

    def __len__(self):
        return len(self.inner)

    def __getitem__(self, index):
        _seed(self.seed, self.epoch, index)
        return self.transform(self.inner[index])


def reference(world, path, batch_size, epoch, seed, transform=crop_and_flip,
              batch_transform=None, first_index=None):
    dataset = Transformed(path, seed, transform)
    dataset.epoch = epoch
    sampler = TorchSampler(dataset, world.size, world.rank, seed=seed)
    sampler.set_epoch(epoch)
    order = list(sampler)
    batches = []
    for start in range(0, len(order), batch_size):
        ids = order[start:start + batch_size]
        batch = torch.utils.data.default_collate([dataset[i] for i in ids])
        if batch_transform is not None:
            _seed(seed, epoch, ids[0], 1)
            batch = batch_transform(batch)
        batches.append(batch)
    # The same as torch's DataLoader over that sampler, without a batch transform.
    if batch_transform is None:
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
        assert all(_equal(a, b) for a, b in zip(batches, loader))
    return batches


def _equal(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def encoded(world):
    folder = tempfile.mkdtemp(prefix="hpcddp-transform-") if world.rank == 0 else None
    folder = world.comm.bcast(folder, root=0)
    path = os.path.join(folder, "encoded.h5")
    if world.rank == 0:
        rng = np.random.default_rng(5)
        pack_arrays(path, {
            "image": [rng.integers(0, 256, int(rng.integers(1, 30)), np.uint8).tobytes()
                      for _ in range(N)],
            "name": [f"n{i}" * (i % 3) for i in range(N)],
            "label": np.arange(N)}, progress=False)
    world.comm.Barrier()
    yield path
    world.comm.Barrier()
    if world.rank == 0:
        shutil.rmtree(folder)


@pytest.mark.parametrize("workers", [0, 2])
def test_random_transforms_equal_dataloader_and_do_not_depend_on_workers(world, encoded,
                                                                         workers):
    references = [reference(world, encoded, 4, epoch, 8, batch_transform=scale_batch)
                  for epoch in (0, 1)]
    torch.manual_seed(11)
    before = torch.random.get_rng_state(), random.getstate(), np.random.get_state()[1]
    with ShardedLoader(encoded, KEYS, batch_size=4, seed=8, transform=crop_and_flip,
                       batch_transform=scale_batch, num_workers=workers) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            ours = list(loader)
            theirs = references[epoch]
            assert len(ours) == len(theirs) == len(loader)
            assert all(_equal(a, b) for a, b in zip(ours, theirs))
        assert ours[0][0].dtype == torch.float32  # the batch transform ran
    # The training process's generators are as they were, transforms run here or not.
    assert torch.equal(torch.random.get_rng_state(), before[0])
    assert random.getstate() == before[1] and np.array_equal(np.random.get_state()[1], before[2])


def test_workers_never_initialize_mpi_and_are_other_processes(world, encoded):
    with ShardedLoader(encoded, KEYS, batch_size=5, transform=with_process,
                       num_workers=2) as loader:
        batches = list(loader)
    labels = torch.cat([b[0] for b in batches])
    assert sorted(labels.tolist()) == sorted(
        list(TorchSampler(range(N), world.size, world.rank, seed=0)))
    assert not any(b[1].any() for b in batches), "a worker initialized MPI"
    pids = {int(p) for b in batches for p in b[2]}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


def test_resume_mid_epoch_repeats_the_same_augmentations(world, encoded):
    first = ShardedLoader(encoded, KEYS, batch_size=3, seed=2, transform=crop_and_flip,
                          num_workers=2)
    first.set_epoch(3)
    iterator = iter(first)
    head = [next(iterator) for _ in range(2)]  # workers are further ahead meanwhile
    state = first.state_dict()
    first.close()
    with ShardedLoader(encoded, KEYS, batch_size=3, seed=2, transform=crop_and_flip,
                       num_workers=1) as again:
        again.load_state_dict(state)
        rest = list(again)
    theirs = reference(world, encoded, 3, 3, 2)
    assert len(head) + len(rest) == len(theirs)
    assert all(_equal(a, b) for a, b in zip(head + rest, theirs))


def test_a_failing_transform_names_the_error_and_the_job_goes_on(world, encoded):
    with ShardedLoader(encoded, KEYS, batch_size=4, shuffle=False, transform=fail_on_seven,
                       num_workers=1, exact=True) as loader:
        mine = {int(i) for i in range(world.rank, N, world.size)}
        if 7 in mine:
            with pytest.raises(RuntimeError, match="sample 7 is damaged"):
                list(loader)
        else:
            assert sum(len(b) for b in loader) == len(mine)
    world.comm.Barrier()


def test_bad_worker_settings_are_refused(world, encoded):
    with pytest.raises(ValueError, match="must not be forked"):
        ShardedLoader(encoded, KEYS, batch_size=4, transform=crop_and_flip, num_workers=1,
                      worker_context="fork").__iter__().__next__()
    with pytest.raises(ValueError, match="give transform="):
        ShardedLoader(encoded, KEYS, batch_size=4, num_workers=2)
