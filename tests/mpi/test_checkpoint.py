"""Checkpoints under MPI: round trip, verification, mismatches, prefixes, world sizes."""

import copy
import json
import os
import warnings

import pytest
import torch
from mpi4py import MPI
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import hpcddp
import hpcddp.checkpoint as checkpoint
from ddp_models import MLP, global_batch, share


def _trained(world, steps=2, device="cpu"):
    torch.manual_seed(0)
    model = hpcddp.DistributedDataParallel(MLP().to(device))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        x, y = (t.to(device) for t in global_batch(step, world.size))
        opt.zero_grad()
        nn.functional.mse_loss(model(share(x, world.rank)), share(y, world.rank)).backward()
        opt.step()
    return model, opt


def test_nothing_to_resume(world, folder):
    model = hpcddp.DistributedDataParallel(MLP())
    assert checkpoint.load(folder, model) is None
    assert checkpoint.load(folder + "-never-made", model) is None


def test_a_directory_that_cannot_take_a_checkpoint_is_refused_on_every_rank(world, folder):
    """Found at load, before training, not at the first save an epoch later."""
    model, opt = _trained(world)
    checkpoint.save(folder, model, opt, step=1)
    blocker = os.path.join(os.path.dirname(folder), "a-file")  # no directory can go under it
    if world.rank == 0:
        with open(blocker, "w") as f:
            f.write("not a directory")
    world.comm.Barrier()
    fresh = hpcddp.DistributedDataParallel(MLP())
    with pytest.raises(OSError, match=r"checkpoint directory .*a-file/ckpt cannot be written "
                                      r".*check_writable=False"):
        checkpoint.load(os.path.join(blocker, "ckpt"), fresh)
    # Without the check there is nothing there to resume, and no error.
    assert checkpoint.load(os.path.join(blocker, "ckpt"), fresh, check_writable=False) is None
    # The check leaves nothing behind where it succeeds, and what was saved still loads.
    assert checkpoint.load(folder, fresh).step == 1
    assert not [name for name in os.listdir(folder) if name.startswith(".hpcddp-write-test")]


def test_round_trip_restores_model_optimizer_rng_and_extra(world, folder, device):
    model, opt = _trained(world, device=device)
    path = checkpoint.save(folder, model, opt, step=7, epoch=2, extra={"best": 0.5})
    assert world.comm.allgather(path) == [path] * world.size
    expected = (torch.rand(3), torch.rand(3, device=device))
    fresh = hpcddp.DistributedDataParallel(MLP().to(device))
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=1e-2)
    torch.manual_seed(12345)
    resumed = checkpoint.load(folder, fresh, fresh_opt)
    assert (resumed.step, resumed.epoch, resumed.extra) == (7, 2, {"best": 0.5})
    assert all(a.device == device and torch.equal(a, b)
               for a, b in zip(fresh.parameters(), model.parameters()))
    assert str(fresh_opt.state_dict()) == str(opt.state_dict())
    # The generators continue where they were at the save, on the CPU and the GPU.
    assert all(torch.equal(a, b) for a, b in zip((torch.rand(3), torch.rand(3, device=device)),
                                                  expected))
    # The file is plain tensors and values: torch's weights_only loader takes it.
    state = torch.load(os.path.join(path, "state.pt"), weights_only=True)
    assert list(state["model"]) == list(model.module.state_dict())
    assert len(state["rng"]) == world.size


def test_extra_that_load_would_refuse_is_refused_at_save(world, folder):
    import numpy as np
    model, opt = _trained(world)
    good = checkpoint.save(folder, model, opt, step=1, extra={"a": torch.arange(3)})
    with pytest.raises(ValueError, match="would save but never load.*torch.from_numpy"):
        checkpoint.save(folder, model, opt, step=2, extra={"a": np.arange(3)})
    # Nothing was published: the previous checkpoint is still the one load finds.
    fresh = hpcddp.DistributedDataParallel(MLP())
    resumed = checkpoint.load(folder, fresh)
    assert resumed.path == good and torch.equal(resumed.extra["a"], torch.arange(3))


def test_keep_last_keeps_the_newest(world, folder):
    model, _ = _trained(world, steps=0)
    for step in range(1, 5):
        checkpoint.save(folder, model, step=step, keep_last=2)
    names = sorted(n for n in os.listdir(folder) if n.startswith("step-"))
    assert names == ["step-000000003", "step-000000004"]


def _damage(path, damage):
    """Damage the checkpoint at ``path`` (rank 0 only) in the way ``damage`` names."""
    state, manifest = os.path.join(path, "state.pt"), os.path.join(path, "manifest.json")
    if damage == "truncate":
        os.truncate(state, os.path.getsize(state) // 2)
    elif damage == "flip":
        with open(state, "r+b") as f:
            f.seek(os.path.getsize(state) // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0x01]))
    elif damage == "empty_state":
        os.truncate(state, 0)
    elif damage == "empty_state_and_size":  # the manifest agrees that it is empty
        os.truncate(state, 0)
        with open(manifest) as f:
            saved = json.load(f)
        saved["files"]["state.pt"]["size"] = 0
        with open(manifest, "w") as f:
            json.dump(saved, f)
    elif damage == "manifest_list":
        with open(manifest, "w") as f:
            json.dump([1, 2], f)
    elif damage == "manifest_garbage":
        with open(manifest, "wb") as f:
            f.write(b"\x00\xff{")
    elif damage == "state_is_a_directory":
        os.remove(state)
        os.mkdir(state)
    elif damage == "latest_garbage":  # the newest checkpoint is whole; latest is not
        with open(os.path.join(os.path.dirname(path), "latest"), "wb") as f:
            f.write(b"\xff\xfe\x00garbage")


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty_state", "empty_state_and_size",
                                    "manifest_list", "manifest_garbage",
                                    "state_is_a_directory"])
def test_corrupt_newest_is_skipped_for_the_previous(world, folder, damage):
    model, _ = _trained(world, steps=0)
    checkpoint.save(folder, model, step=1)
    newest = checkpoint.save(folder, model, step=2)
    if world.rank == 0:
        _damage(newest, damage)
    world.comm.Barrier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = checkpoint.load(folder, model)
    assert resumed.step == 1
    if world.rank == 0:
        assert any(f"skipping {newest}" in str(w.message) for w in caught)


def test_garbage_in_latest_is_ignored_with_a_warning(world, folder):
    model, _ = _trained(world, steps=0)
    checkpoint.save(folder, model, step=1)
    newest = checkpoint.save(folder, model, step=2)
    if world.rank == 0:
        _damage(newest, "latest_garbage")
    world.comm.Barrier()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = checkpoint.load(folder, model)
    assert resumed.step == 2  # the newest step, found without latest
    if world.rank == 0:
        assert any("not a checkpoint name" in str(w.message) for w in caught)


def test_every_checkpoint_damaged_is_an_error_unless_allowed(world, folder):
    model, _ = _trained(world, steps=0)
    paths = [checkpoint.save(folder, model, step=s) for s in (1, 2)]
    if world.rank == 0:
        _damage(paths[0], "flip")
        _damage(paths[1], "manifest_list")
    world.comm.Barrier()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(checkpoint.DamagedCheckpointsError,
                           match=r"every checkpoint under .* is damaged.*step-000000002: "
                                 r"ValueError: manifest.json holds a list.*step-000000001: "
                                 r"state.pt does not match its xxh3_128 digest.*"
                                 r"allow_damaged=True"):
            checkpoint.load(folder, model)
        assert checkpoint.load(folder, model, allow_damaged=True) is None
    # Nothing was lost: both damaged checkpoints are still there to repair.
    assert all(os.path.isdir(p) for p in paths)


def test_mismatching_model_is_named_on_every_rank(world, folder):
    model, _ = _trained(world, steps=0)
    checkpoint.save(folder, model, step=1)
    other = hpcddp.DistributedDataParallel(MLP(width=17))
    with pytest.raises(ValueError, match=r"'body.0.weight' has shape \[16, 8\] in the "
                                         r"checkpoint and \[17, 8\] in the model"):
        checkpoint.load(folder, other)


def test_torch_ddp_bare_module_and_hpcddp_load_each_other(world, folder, gloo):
    torch.manual_seed(1)
    bare = MLP()
    theirs = TorchDDP(copy.deepcopy(bare), process_group=gloo)
    checkpoint.save(folder, theirs, step=1)
    ours = hpcddp.DistributedDataParallel(MLP())
    checkpoint.load(folder, ours)
    assert all(torch.equal(a, b) for a, b in zip(ours.module.parameters(), bare.parameters()))
    # A raw torch DDP state dict (``module.`` keys) into a bare module, and back.
    target = MLP()
    checkpoint.load_model_state(target, theirs.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), bare.parameters()))
    again = hpcddp.DistributedDataParallel(MLP())
    checkpoint.load_model_state(again, bare.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(again.module.parameters(), bare.parameters()))


def test_bucket_order_comes_back(world, folder):
    model = hpcddp.DistributedDataParallel(MLP(), bucket_cap_mb=0.0005)
    count = len(model.reducer.params)
    order = [i for pair in zip(range(count // 2), range(count // 2, count)) for i in pair]
    model.reducer.rebuild(order)  # stands for an order observed in training
    checkpoint.save(folder, model, step=2)
    fresh = hpcddp.DistributedDataParallel(MLP(), bucket_cap_mb=0.0005)
    assert fresh.reducer.bucket_order() != order
    checkpoint.load(folder, fresh)
    assert fresh.reducer.bucket_order() == order
    assert [b.params for b in fresh.reducer.layouts] == [b.params for b in model.reducer.layouts]


def test_resume_on_a_different_world_size_reseeds_and_says_so(world, folder):
    if world.size == 1:
        pytest.skip("needs two ranks")
    model, opt = _trained(world)
    checkpoint.save(folder, model, opt, step=3)
    sub = world.comm.Split(0 if world.rank == 0 else MPI.UNDEFINED)
    if world.rank == 0:
        alone = MLP()
        with pytest.warns(UserWarning, match=r"seeded from \(step=3, rank\)") as caught:
            resumed = checkpoint.load(folder, alone, comm=sub)
        # Pointing at the caller's line, not at hpcddp's own.
        assert [w.filename for w in caught] == [__file__]
        assert resumed.step == 3
        assert all(torch.equal(a, b) for a, b in zip(alone.parameters(), model.parameters()))
        sub.Free()
    world.comm.Barrier()
