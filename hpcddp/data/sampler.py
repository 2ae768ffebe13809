"""Which samples each rank reads, and in what order.

The default mode reproduces ``torch.utils.data.distributed.DistributedSampler`` exactly:
a permutation drawn from ``seed + epoch`` with torch's generator, padded by repeating
its head (or cut, with ``drop_last``) to a multiple of the world size, then dealt out
round-robin. ``exact=True`` deals out the permutation with no padding and no cut: every
sample goes to exactly one rank, and rank lengths differ by at most one. Padding counts
some samples twice (pytorch/pytorch#25162), so exact mode is for evaluation; in DDP
training ranks would take different numbers of steps.
"""

import math
from typing import Optional, Sequence

import numpy as np
import torch

__all__ = ["DistributedSampler", "global_order", "rank_indices", "chunked_order"]


def global_order(n: int, shuffle: bool, seed: int, epoch: int) -> np.ndarray:
    """The epoch's order of all ``n`` sample indices (torch's ``randperm`` when shuffling)."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    return torch.randperm(n, generator=generator).numpy()


def chunked_order(n: int, chunk: int, seed: int, epoch: int, window: int = 8,
                  bounds: Optional[Sequence[int]] = None) -> np.ndarray:
    """A shuffle that reads whole chunks: chunk order is shuffled, and samples are shuffled
    within groups of ``window`` consecutive chunks of that order.

    For chunked or compressed datasets, where a random row costs a whole chunk's read and
    decompression, and for many files: ``bounds`` (each block's first row, then ``n``)
    makes the blocks uneven, one per file. Deterministic in ``seed + epoch``, so every
    rank computes the same one.
    """
    rng = np.random.Generator(np.random.PCG64(seed + epoch))
    if bounds is None:
        bounds = list(range(0, n, chunk)) + [n]
    ends = dict(zip(bounds[:-1], bounds[1:]))
    starts = np.array(bounds[:-1], dtype=np.int64)
    rng.shuffle(starts)
    pieces = []
    for group in range(0, len(starts), window):
        members = np.concatenate([np.arange(s, ends[s]) for s in starts[group:group + window]])
        rng.shuffle(members)
        pieces.append(members)
    return np.concatenate(pieces) if pieces else np.arange(0, dtype=np.int64)


def per_rank_count(n: int, num_replicas: int, drop_last: bool) -> int:
    """torch's ``num_samples``: how many indices each rank gets in the default mode."""
    if drop_last and n % num_replicas:
        return math.ceil((n - num_replicas) / num_replicas)
    return math.ceil(n / num_replicas)


def rank_indices(order: np.ndarray, num_replicas: int, rank: int, drop_last: bool = False,
                 exact: bool = False) -> np.ndarray:
    """Deal ``order`` out to the ranks; return rank ``rank``'s share, in order."""
    if exact:
        return order[rank::num_replicas]
    n = len(order)
    total = per_rank_count(n, num_replicas, drop_last) * num_replicas
    if total > n:
        order = np.resize(order, total)  # repeats from the head, as torch pads
    return order[rank:total:num_replicas]


class DistributedSampler(torch.utils.data.Sampler):
    """torch's ``DistributedSampler``, with defaults from ``hpcddp.init()`` and an exact mode.

    Args:
        dataset: anything with ``len()``.
        num_replicas: defaults to the hpcddp world's size.
        rank: defaults to the hpcddp world's rank.
        shuffle: as torch's.
        seed: as torch's.
        drop_last: as torch's.
        exact: no padding and no dropping; every sample is yielded by exactly one rank.
            For evaluation only: ranks differ in length by at most one.

    Example::

        sampler = hpcddp.DistributedSampler(dataset)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for batch in DataLoader(dataset, batch_size=64, sampler=sampler): ...
    """

    def __init__(self, dataset, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 exact: bool = False):
        if num_replicas is None or rank is None:
            from hpcddp.runtime import get_world
            world = get_world()
            num_replicas = world.size if num_replicas is None else num_replicas
            rank = world.rank if rank is None else rank
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank={rank} is not in [0, num_replicas={num_replicas})")
        self.dataset, self.num_replicas, self.rank = dataset, num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.exact = shuffle, seed, drop_last, exact
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the next epoch's permutation from ``seed + epoch``."""
        self.epoch = epoch

    def indices(self) -> np.ndarray:
        order = global_order(len(self.dataset), self.shuffle, self.seed, self.epoch)
        return rank_indices(order, self.num_replicas, self.rank, self.drop_last, self.exact)

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        n = len(self.dataset)
        if self.exact:
            return len(range(self.rank, n, self.num_replicas))
        return per_rank_count(n, self.num_replicas, self.drop_last)
