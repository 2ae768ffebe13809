"""How a checkpoint's bytes reach the ranks (once per node, mapped within it) and how
they are checked (XXH3-128, and SHA-256 for checkpoints written before it). Each rank's
result is compared with ``torch.load`` of the file itself."""

import hashlib
import json
import os
import warnings

import pytest
import torch

import hpcddp
import hpcddp.checkpoint as checkpoint
from ddp_models import MLP
from hpcddp.checkpoint import delivery, store


def _saved(world, folder, step, seed):
    torch.manual_seed(seed)
    model = hpcddp.DistributedDataParallel(MLP())
    return checkpoint.save(folder, model, step=step), model


def _as_if_sha256(world, path):
    """Rewrite the manifest of ``path`` as a checkpoint from before XXH3 would have it."""
    if world.rank == 0:
        manifest = os.path.join(path, store.MANIFEST)
        with open(manifest) as f:
            saved = json.load(f)
        entry = saved["files"][store.STATE]
        del entry["xxh3_128"]
        with open(os.path.join(path, store.STATE), "rb") as f:
            entry["sha256"] = hashlib.sha256(f.read()).hexdigest()
        with open(manifest, "w") as f:
            json.dump(saved, f)
    world.comm.Barrier()


def test_new_checkpoints_name_xxh3_and_sha256_ones_still_verify(world, folder):
    first, _ = _saved(world, folder, 1, seed=1)
    if world.rank == 0:
        with open(os.path.join(first, store.MANIFEST)) as f:
            assert set(json.load(f)["files"][store.STATE]) == {"size", "xxh3_128"}
    _as_if_sha256(world, first)
    second, _ = _saved(world, folder, 2, seed=2)
    _as_if_sha256(world, second)
    if world.rank == 0:  # one flipped bit in the newest
        with open(os.path.join(second, store.STATE), "r+b") as f:
            f.seek(1000)
            byte = f.read(1)
            f.seek(1000)
            f.write(bytes([byte[0] ^ 0x10]))
    world.comm.Barrier()
    fresh = hpcddp.DistributedDataParallel(MLP())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert checkpoint.load(folder, fresh).step == 1
    if world.rank == 0:
        assert any("does not match its sha256 digest" in str(w.message) for w in caught)
    reference = torch.load(os.path.join(first, store.STATE), weights_only=True)["model"]
    for key, value in fresh.module.state_dict().items():
        assert torch.equal(value, reference[key]), key


def _delivered(world, path, node):
    opened = store.Opened(path) if world.rank == 0 else None
    size = world.comm.bcast(opened.size if opened else None, root=0)
    got = delivery.deliver(world.comm, opened, os.path.join(path, store.STATE), size, node)
    state = got.load("cpu")
    world.comm.Barrier()  # every rank has mapped what it maps before any copy goes
    assert world.comm.bcast(opened.verified() if opened else None, root=0)
    got.close()
    if opened:
        opened.close()
    return state


def _same_as_the_file(state, path):
    reference = torch.load(os.path.join(path, store.STATE), weights_only=True)
    assert state["step"] == reference["step"]
    for key, value in reference["model"].items():
        assert torch.equal(state["model"][key], value), key


@pytest.mark.parametrize("nodes", [1, 2])
def test_every_rank_gets_the_bytes_of_the_file(world, folder, nodes):
    # nodes=2 groups the ranks as if every other one sat on another node: those receive
    # the broadcast into memory of their own and share it with the ranks grouped with them.
    path, _ = _saved(world, folder, 3, seed=3)
    node = world.comm.Split(world.rank % nodes, key=world.rank)
    try:
        _same_as_the_file(_delivered(world, path, node), path)
    finally:
        node.Free()


def test_ranks_that_cannot_open_the_nodes_copy_are_sent_their_own(world, folder,
                                                                   monkeypatch):
    # /proc/<pid>/fd of another process is closed to this one (hidepid, another user):
    # the OS's refusal is played here, since this machine allows it.
    path, _ = _saved(world, folder, 4, seed=4)
    monkeypatch.setattr(delivery, "_opened_by_peer", lambda pid, fd: None)
    _same_as_the_file(_delivered(world, path, None), path)
    fresh = hpcddp.DistributedDataParallel(MLP())
    assert checkpoint.load(folder, fresh).step == 4
