"""Fixtures for the MPI tests (run under ``mpiexec ... pytest -p hpcddp.testing``)."""

import os
import shutil
import tempfile

import pytest
import torch
import torch.distributed as dist

import hpcddp
from hpcddp.checkpoint import store
from gloo_group import make_gloo_group
from gpu import skip_or_fail_without_gpu


@pytest.fixture(scope="module")
def world():
    return hpcddp.init()


@pytest.fixture
def folder(world):
    """A checkpoint directory (not yet made) in a temporary folder every rank shares."""
    path = tempfile.mkdtemp(prefix="hpcddp-ckpt-") if world.rank == 0 else None
    path = world.comm.bcast(path, root=0)
    yield os.path.join(path, "ckpt")
    world.comm.Barrier()
    if world.rank == 0:
        # keep_last deletes old checkpoints in a background thread; let it finish first.
        store.finish_removal()
        shutil.rmtree(path)


@pytest.fixture(params=["cpu", "cuda"])
def device(request, world):
    """Each test that takes it runs on the CPU, and on this rank's GPU where there is one."""
    if request.param == "cuda":
        skip_or_fail_without_gpu("the CUDA variant of this test")
        return world.device
    return torch.device("cpu")


@pytest.fixture(scope="module")
def gloo(world):
    """torch's gloo process group, built beside hpcddp's default group: the reference."""
    group, backend, store = make_gloo_group(world)
    yield group
    dist.distributed_c10d._world.pg_group_ranks.pop(group, None)
    del group, backend, store
