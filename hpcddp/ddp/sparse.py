"""Sparse gradients (``nn.Embedding(sparse=True)``): reduced apart from the buckets.

A sparse gradient's rows differ from rank to rank, so it cannot share a flat bucket.
The ranks' gradients are summed by ``hpcddp.transport.sparse`` into one coalesced sparse
tensor, divided as the dense buckets are: torch's DDP gives each sparse parameter a
bucket of its own and reduces it the same way.
"""

from typing import List, Optional

import torch
from torch import nn

from hpcddp.transport.sparse import allreduce_sparse as sum_sparse

__all__ = ["allreduce_sparse", "sparse_parameters"]


def sparse_parameters(module: nn.Module, params: List[torch.Tensor]) -> List[int]:
    """Indices (in ``params``) of the weights of embeddings built with ``sparse=True``."""
    sparse = {id(m.weight) for m in module.modules()
              if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) and m.sparse}
    return [i for i, p in enumerate(params) if id(p) in sparse]


def allreduce_sparse(comm, grad: Optional[torch.Tensor], like: torch.Tensor,
                     divisor: int) -> Optional[torch.Tensor]:
    """The sum over ranks of the sparse ``grad`` (None: no rows), divided by ``divisor``;
    None when no rank has a gradient.

    .. warning:: Collective, blocking.
    """
    total = sum_sparse(comm, grad, like)
    return None if total is None else total / divisor
