"""Bucket assignment, a pure function, against hand-computed layouts."""

import pytest

from hpcddp.ddp.buckets import ParamSpec, assign_buckets


def f32(n, device="cpu"):
    return ParamSpec(n, 4, "torch.float32", device)


def test_reverse_order_with_small_first_bucket():
    specs = [f32(100)] * 6  # 400 bytes each
    buckets = assign_buckets(specs, [5, 4, 3, 2, 1, 0], cap_bytes=1200, first_cap_bytes=400)
    assert [b.params for b in buckets] == [(5,), (4, 3, 2), (1, 0)]
    assert [b.offsets for b in buckets] == [(0,), (0, 100, 200), (0, 100)]
    assert [b.numel for b in buckets] == [100, 300, 200]


def test_parameter_larger_than_cap_gets_its_own_bucket():
    specs = [f32(10), f32(10_000), f32(10)]
    buckets = assign_buckets(specs, [2, 1, 0], cap_bytes=100, first_cap_bytes=100)
    assert [b.params for b in buckets] == [(2, 1), (0,)]


def test_dtypes_and_devices_never_share_a_bucket():
    specs = [f32(10), ParamSpec(10, 2, "torch.bfloat16", "cpu"), f32(10, "cuda:0"), f32(10)]
    buckets = assign_buckets(specs, [3, 2, 1, 0], cap_bytes=10**6)
    assert sorted(b.params for b in buckets) == [(1,), (2,), (3, 0)]
    assert all(len({(specs[i].dtype, specs[i].device) for i in b.params}) == 1 for b in buckets)


def test_launch_order_follows_the_last_member():
    # The bf16 bucket closes (by cap) before the float32 one: it must launch first.
    specs = [f32(10), ParamSpec(1000, 2, "torch.bfloat16", "cpu"), f32(10)]
    buckets = assign_buckets(specs, [0, 1, 2], cap_bytes=10**6, first_cap_bytes=1000)
    assert [b.params for b in buckets] == [(1,), (0, 2)]


def test_order_must_name_every_parameter_once():
    with pytest.raises(ValueError, match="every parameter exactly once"):
        assign_buckets([f32(1)] * 3, [0, 0, 1], cap_bytes=10)


def test_large_host_parameters_get_solo_buckets_in_launch_order():
    # A 1024-float weight and a 10-float bias per layer, backward from the last layer.
    specs = [f32(1024), f32(10), f32(1024), f32(10), f32(1024, "cuda:0")]
    buckets = assign_buckets(specs, [4, 3, 2, 1, 0], cap_bytes=10**6, first_cap_bytes=10**6,
                             solo_bytes=4096)
    assert [(b.params, b.solo) for b in buckets] == [
        ((2,), True), ((0,), True),
        # Open buckets close at the end: device memory is bucketed as usual (alone here
        # by dtype and device), and the biases go together.
        ((4,), False), ((3, 1), False)]
    assert [b.offsets for b in buckets if b.solo] == [(0,), (0,)]


def test_solo_bytes_zero_or_above_every_parameter_changes_nothing():
    specs = [f32(1024), f32(10), f32(1024)]
    plain = assign_buckets(specs, [2, 1, 0], cap_bytes=4096, first_cap_bytes=4096)
    assert assign_buckets(specs, [2, 1, 0], 4096, 4096, solo_bytes=0) == plain
    assert assign_buckets(specs, [2, 1, 0], 4096, 4096, solo_bytes=4097) == plain
    assert not any(b.solo for b in plain)
