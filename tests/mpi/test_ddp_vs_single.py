"""N-rank hpcddp training against single-process training on the global batch."""

import copy
import os

import pytest
import torch
import torch.nn.functional as F

import hpcddp
from ddp_models import MLP, Checkpointed, Tied, Transposed, global_batch, share
from gpu import skip_or_fail_without_gpu

STEPS = 4
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def _loss(model, x, y, kind):
    out = model(x)
    return F.cross_entropy(out, y) if kind == "tokens" else F.mse_loss(out, y.to(out.dtype))


def _train(world, make_model, kind="dense", dtype=torch.float32, accumulate=1,
           reduce=True, compile=False, reference_scale=1.0, device="cpu", solo_kb=None,
           **ddp_kwargs):
    """Train hpcddp and a single-process reference; return both parameter lists.

    With ``device="cuda"`` hpcddp trains on this rank's GPU; the reference stays on the CPU.
    ``solo_kb`` sets ``HPCDDP_SOLO_BUCKET_KB`` for the wrapper.
    """
    torch.manual_seed(0)
    reference = make_model().to(dtype)
    model = copy.deepcopy(reference).to(world.device if device == "cuda" else "cpu")
    if compile:
        model = torch.compile(model, backend="eager")
    if solo_kb is not None:
        os.environ["HPCDDP_SOLO_BUCKET_KB"] = str(solo_kb)
    try:
        ddp = hpcddp.DistributedDataParallel(model, **ddp_kwargs)
    finally:
        os.environ.pop("HPCDDP_SOLO_BUCKET_KB", None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for step in range(STEPS):
        opt.zero_grad()
        ref_opt.zero_grad()
        for micro in range(accumulate):
            x, y = global_batch(step * accumulate + micro, world.size, kind)
            x = x.to(dtype) if x.is_floating_point() else x
            # Reference: mean loss over the global batch, averaged over micro-batches.
            (_loss(reference, x, y, kind) * reference_scale / accumulate).backward()
            xs, ys = share(x, world.rank), share(y, world.rank)
            xs, ys = xs.to(model_device(ddp)), ys.to(model_device(ddp))
            if not reduce:
                ddp.require_backward_grad_sync = False
                _loss(ddp, xs, ys, kind).div(accumulate).backward()
                continue
            if micro < accumulate - 1:
                with ddp.no_sync():
                    (_loss(ddp, xs, ys, kind) / accumulate).backward()
            else:
                (_loss(ddp, xs, ys, kind) / accumulate).backward()
        opt.step()
        ref_opt.step()
    return ddp, list(ddp.module.parameters()), list(reference.parameters())


def model_device(ddp):
    return next(ddp.module.parameters()).device


def _assert_match(ours, theirs, dtype=torch.float32):
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.detach().float().cpu(), b.detach().float(), **TOL[dtype])


def _assert_far(ours, theirs):
    worst = max((a.detach().float() - b.detach().float()).abs().max().item()
                for a, b in zip(ours, theirs))
    assert worst > 1e-3, f"negative control came within {worst:g} of the reference"


CASES = {
    "mlp": dict(make_model=MLP),
    "tied": dict(make_model=Tied, kind="tokens"),
    "no_sync": dict(make_model=MLP, accumulate=3),
    "bucket_view": dict(make_model=MLP, gradient_as_bucket_view=True),
    "tiny_buckets": dict(make_model=lambda: MLP(width=32, depth=4), bucket_cap_mb=0.001),
    "bf16": dict(make_model=MLP, dtype=torch.bfloat16),
    "compile": dict(make_model=MLP, compile=True),
    "checkpoint": dict(make_model=Checkpointed),
    # Weights of 4 KiB reduced in their own gradients (solo buckets), biases in a bucket.
    "solo": dict(make_model=lambda: MLP(width=32), solo_kb=1),
    "solo_no_sync": dict(make_model=lambda: MLP(width=32), solo_kb=1, accumulate=3),
    "solo_bucket_view": dict(make_model=lambda: MLP(width=32), solo_kb=1,
                             gradient_as_bucket_view=True),
    "solo_static_graph": dict(make_model=lambda: MLP(width=32), solo_kb=1, static_graph=True),
    "solo_find_unused": dict(make_model=lambda: MLP(width=32), solo_kb=1,
                             find_unused_parameters=True),
    "solo_bf16": dict(make_model=lambda: MLP(width=32), solo_kb=1, dtype=torch.bfloat16),
    # A gradient that is not contiguous cannot be reduced where it lies: it is copied.
    "solo_not_contiguous": dict(make_model=Transposed, solo_kb=1),
}


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_single_process_training(world, case, device):
    if device == "cuda":
        skip_or_fail_without_gpu("the CUDA variant of the DDP correctness tests")
    kwargs = dict(CASES[case])
    dtype = kwargs.get("dtype", torch.float32)
    ddp, ours, theirs = _train(world, device=device, **kwargs)
    _assert_match(ours, theirs, dtype)
    solo = [b for b in ddp.reducer.buckets if b.layout.solo]
    if "solo_kb" in kwargs and device == "cpu":
        # The weights had buckets of their own, and (where contiguous) no bucket buffer:
        # they were reduced in the gradients autograd produced.
        large = [p for p in ddp.parameters() if p.numel() * p.element_size() >= 1024]
        assert [id(b.parameters()[0]) for b in solo] == [id(p) for p in large[::-1]]
        made = [b.owned is not None for b in solo]
        assert made == [case == "solo_not_contiguous"] * len(solo), made
    else:
        assert not solo  # host parameters under 1 MiB, or device memory: buckets as torch


@pytest.mark.parametrize("case", ["mlp", "tied", "bucket_view"])
def test_negative_control_without_reduction_is_far(world, case):
    if world.size == 1:
        pytest.skip("one rank trains on the whole batch: nothing to reduce")
    _, ours, theirs = _train(world, reduce=False, **CASES[case])
    _assert_far(ours, theirs)


def test_negative_control_sum_instead_of_average_is_far(world):
    # A reference whose gradient is the sum over ranks, not the average.
    if world.size == 1:
        pytest.skip("with one rank, sum and average coincide")
    _, ours, theirs = _train(world, make_model=MLP, reference_scale=world.size)
    _assert_far(ours, theirs)
