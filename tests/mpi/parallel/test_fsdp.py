"""FSDP2 (``fully_shard``) on the hpcddp backend against single-process training on the
global batch, and its state dicts through torch.distributed.checkpoint, resumed at
another world size."""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from mpi4py import MPI
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_state_dict, set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from parallel_models import (
    assert_states_close, batches, full_state, loss_fn, make_net, shard_of, states_differ,
    train_single)

FP32 = dict(rtol=1e-5, atol=1e-6)


def _shard(model, mesh, reshard=True, mp=None):
    kw = dict(mesh=mesh, reshard_after_forward=reshard)
    if mp is not None:
        kw["mp_policy"] = mp
    for block in model.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    return model


def _train(model, data, opt, rank, size, dtype=torch.float32):
    for x, y in data:
        opt.zero_grad()
        loss_fn(model(shard_of(x, rank, size).to(dtype)).float(), shard_of(y, rank, size)).backward()
        opt.step()


def _adam(params):
    return torch.optim.Adam(params, lr=1e-2)


@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_matches_single_process(world, reshard):
    data = batches()
    ref = train_single(make_net(), data, _adam)
    mesh = init_device_mesh("cpu", (world.size,))
    model = _shard(make_net(), mesh, reshard)
    # Each rank holds a shard only: the whole weight is not on any one rank.
    assert model.inp.weight.to_local().shape[0] < model.inp.weight.shape[0]
    opt = _adam(model.parameters())
    _train(model, data, opt, world.rank, world.size)
    ours = full_state(model)
    assert_states_close(ours, dict(ref.named_parameters()), **FP32)
    assert states_differ(ours, full_state(make_net())), "training changed nothing"


def test_fsdp2_matches_single_process_on_device(world, device):
    """The same on this rank's GPU (where there is one): FSDP2's all-gathers and
    reduce-scatters on device tensors, run on its own streams, against single-process
    training on the same device."""
    data = [(x.to(device), y.to(device)) for x, y in batches()]
    ref = train_single(make_net().to(device), data, _adam)
    mesh = init_device_mesh(device.type, (world.size,))
    model = _shard(make_net().to(device), mesh)
    assert model.inp.weight.to_local().device.type == device.type
    _train(model, data, _adam(model.parameters()), world.rank, world.size)
    ours = full_state(model)
    assert_states_close(ours, dict(ref.named_parameters()), **FP32)
    assert states_differ(ours, full_state(make_net().to(device))), "training changed nothing"


def test_fsdp2_without_reduction_differs(world):
    """Negative control: the same per-rank training without FSDP's reduction is far
    from the reference, so the match above needs the backend's collectives."""
    data = batches()
    ref = train_single(make_net(), data, _adam)
    model = make_net()
    _train(model, data, _adam(model.parameters()), world.rank, world.size)
    assert states_differ(full_state(model), full_state(ref))


def test_fsdp2_bf16_mixed_precision(world):
    data = batches()
    ref = train_single(make_net(), data, _adam, param_dtype=torch.bfloat16)
    ref32 = train_single(make_net(), data, _adam)
    mesh = init_device_mesh("cpu", (world.size,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = _shard(make_net(), mesh, True, mp)
    _train(model, data, _adam(model.parameters()), world.rank, world.size, torch.bfloat16)
    ours = full_state(model)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # bf16 sums over a rank's part of the batch round differently than over the whole.
    assert_states_close(ours, dict(ref.named_parameters()), rtol=2e-2, atol=2e-2)
    assert states_differ(ours, full_state(ref32), atol=1e-6), "bf16 was not applied"



def test_fsdp2_dcp_resume_at_another_world_size(world, folder):
    """Saved by all ranks, sharded N ways; loaded by N-1 ranks (N=2: one), sharded
    N-1 ways, then trained on: equal to uninterrupted single-process training."""
    data = batches(steps=4)
    ref = train_single(make_net(), data, _adam)
    mesh = init_device_mesh("cpu", (world.size,))
    model = _shard(make_net(), mesh)
    opt = _adam(model.parameters())
    _train(model, data[:2], opt, world.rank, world.size)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=folder)
    dist.barrier()

    smaller = list(range(world.size - 1)) if world.size > 1 else [0]
    group = dist.new_group(smaller)
    if world.rank in smaller:
        sub = dist.device_mesh.DeviceMesh.from_group(group, "cpu")
        resumed = _shard(make_net(seed=99), sub)
        opt2 = _adam(resumed.parameters())
        msd2, osd2 = get_state_dict(resumed, opt2)
        state = {"model": msd2, "optim": osd2}
        dcp.load(state, checkpoint_id=folder, process_group=group)
        set_state_dict(resumed, opt2, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        rank, size = smaller.index(world.rank), len(smaller)
        _train(resumed, data[2:], opt2, rank, size)
        assert_states_close(full_state(resumed), dict(ref.named_parameters()), **FP32)
    dist.barrier()
    dist.destroy_process_group(group)


def test_fsdp2_full_state_dict_on_rank0(world):
    """A full (unsharded) state dict, as a user saves one for inference: the trained
    weights, the same keys as the plain module's."""
    data = batches()
    ref = train_single(make_net(), data, _adam)
    model = _shard(make_net(), init_device_mesh("cpu", (world.size,)))
    _train(model, data, _adam(model.parameters()), world.rank, world.size)
    full, _ = get_state_dict(model, [], options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))
    if world.rank == 0:
        assert full.keys() == ref.state_dict().keys()
        assert_states_close({k: full[k] for k, _ in ref.named_parameters()},
                            dict(ref.named_parameters()), **FP32)
    else:
        assert full == {}
    assert MPI.COMM_WORLD.allreduce(1) == world.size


def test_fsdp1_on_cpu_matches_single_process(world):
    """FSDP1 (``FullyShardedDataParallel``), each block wrapped, on CPU."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from parallel_models import Block

    data = batches()
    ref = train_single(make_net(), data, _adam)
    model = FSDP(make_net(), device_id=torch.device("cpu"), use_orig_params=True,
                 auto_wrap_policy=ModuleWrapPolicy({Block}))
    _train(model, data, _adam(model.parameters()), world.rank, world.size)
    with FSDP.summon_full_params(model):
        ours = {name.replace("_fsdp_wrapped_module.", ""): p.detach().clone()
                for name, p in model.named_parameters()}
    assert_states_close(ours, dict(ref.named_parameters()), **FP32)
