"""hpcddp's sampler against torch's DistributedSampler, index for index."""

import pytest
from torch.utils.data.distributed import DistributedSampler as TorchSampler

from hpcddp.data.sampler import DistributedSampler, chunked_order


@pytest.mark.parametrize("n", [1, 2, 7, 103, 128])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("shuffle, drop_last", [(True, False), (False, False), (True, True)])
def test_same_indices_as_torch(n, size, shuffle, drop_last):
    if drop_last and n < size:
        return  # torch itself yields nothing per rank here
    for epoch in (0, 3):
        for rank in range(size):
            kwargs = dict(num_replicas=size, rank=rank, shuffle=shuffle, seed=11,
                          drop_last=drop_last)
            ours, theirs = DistributedSampler(range(n), **kwargs), TorchSampler(range(n), **kwargs)
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


@pytest.mark.parametrize("n, size", [(103, 2), (103, 3), (2, 3), (0, 2)])
def test_exact_mode_reads_every_sample_once(n, size):
    shares = [list(DistributedSampler(range(n), size, r, seed=5, exact=True)) for r in range(size)]
    assert sorted(i for share in shares for i in share) == list(range(n))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert [len(DistributedSampler(range(n), size, r, exact=True)) for r in range(size)] == \
        [len(s) for s in shares]


def test_epochs_differ_and_runs_repeat():
    a = DistributedSampler(range(50), 2, 0, seed=1)
    first = list(a)
    a.set_epoch(1)
    assert list(a) != first
    a.set_epoch(0)
    assert list(a) == first == list(DistributedSampler(range(50), 2, 0, seed=1))


def test_bad_rank_is_named():
    with pytest.raises(ValueError, match="rank=3"):
        DistributedSampler(range(5), num_replicas=2, rank=3)


def test_chunked_order_is_a_permutation_that_keeps_chunks_together():
    order = chunked_order(1000, chunk=64, seed=0, epoch=0, window=2)
    assert sorted(order.tolist()) == list(range(1000))
    # Any window of 128 consecutive entries touches at most 2 chunks... plus edges.
    assert len({i // 64 for i in order[:100]}) <= 2
    assert not (order == chunked_order(1000, 64, 0, 1, 2)).all()
