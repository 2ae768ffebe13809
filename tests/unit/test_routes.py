"""How CPU tensors are shown to MPI (``HostRoute``), and the bfloat16 reduction, checked
against torch."""

import numpy as np
import pytest
import torch

from hpcddp.transport import HostRoute
from hpcddp.comm.ops import BFLOAT16, bf16_to_f32, f32_to_bf16, mpi_op


def test_contiguous_cpu_tensor_is_shared_not_copied():
    t = torch.arange(6, dtype=torch.float32)
    [view] = HostRoute().bind(t)
    assert view.finish is None and view.kind is None
    view.buf[0] = 42
    assert t[0] == 42


def test_non_contiguous_tensor_is_staged_and_copied_back():
    t = torch.zeros(4, 3).t()
    [view] = HostRoute().bind(t)
    view.buf[...] = 7
    assert torch.all(t == 0)
    view.finish()
    assert torch.all(t == 7)


def test_bfloat16_travels_as_raw_words():
    t = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    [view] = HostRoute().bind(t)
    assert view.kind == BFLOAT16 and view.buf.dtype == np.uint16
    np.testing.assert_array_equal(bf16_to_f32(view.buf), t.float().numpy())


def test_bf16_rounding_matches_torch():
    values = torch.randn(10000, dtype=torch.float32) * 1000
    values[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    ours = f32_to_bf16(values.numpy())
    expected = values.bfloat16().view(torch.int16).numpy().view(np.uint16)
    finite = ~np.isnan(values.numpy())
    np.testing.assert_array_equal(ours[finite], expected[finite])
    assert np.isnan(bf16_to_f32(ours[:1]))[0]


@pytest.mark.parametrize("name", ["sum", "product", "min", "max"])
def test_bf16_op_equals_torch_float_then_round(name):
    a = torch.randn(257).bfloat16()
    b = torch.randn(257).bfloat16()
    op = mpi_op(name, BFLOAT16)
    inout = b.view(torch.int16).numpy().view(np.uint16).copy()
    op.Reduce_local(a.view(torch.int16).numpy().view(np.uint16), inout)
    expected = {"sum": a.float() + b.float(), "product": a.float() * b.float(),
                "min": torch.minimum(a.float(), b.float()),
                "max": torch.maximum(a.float(), b.float())}[name].bfloat16()
    assert torch.equal(torch.from_numpy(inout.view(np.int16)).view(torch.bfloat16), expected)


def test_unknown_reduction_is_named():
    with pytest.raises(ValueError, match="'median'"):
        mpi_op("median")
