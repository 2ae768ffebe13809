"""Batch buffers: reused only once released, never while a batch is kept."""

import torch

from hpcddp.data.pool import BufferPool


def test_kept_batches_are_never_reused():
    pool = BufferPool(limit=4)
    kept = []
    for i in range(10):
        array = pool.get((3,), "float32")
        array[:] = i
        kept.append(torch.from_numpy(array)[1:])  # a view keeps the buffer too
    assert [int(t[0]) for t in kept] == list(range(10))
    assert pool.allocated == 10


def test_released_batches_are_reused():
    pool = BufferPool(limit=4)
    for i in range(50):
        batch = torch.from_numpy(pool.get((3,), "float32"))
        batch.fill_(i)
        del batch
    assert pool.allocated == 1
    other = pool.get((4,), "float32")
    assert other.shape == (4,) and pool.allocated == 2
