"""Sparse gradients (``nn.Embedding(sparse=True)``): reduced apart from the buckets.

A sparse gradient's rows differ from rank to rank, so it cannot share a flat bucket.
Each rank's coalesced gradient is allgathered (row indices, then values) and summed into
one coalesced sparse tensor, divided as the dense buckets are: torch's DDP gives each
sparse parameter a bucket of its own and reduces it the same way. The message sizes
differ per rank, so the counts travel first. Gradients on a GPU travel through host
memory.
"""

from typing import List, Optional

import numpy as np
import torch
from torch import nn

from hpcddp.comm import activity
from hpcddp.transport.routes import host_array

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
    if grad is not None:
        grad = grad.coalesce().cpu()
        indices, values = grad.indices().contiguous(), grad.values().contiguous()
    else:
        indices = torch.empty((1, 0), dtype=torch.int64)
        values = torch.empty((0,) + tuple(like.shape[1:]), dtype=like.dtype)
    with activity.blocking("sparse gradient sizes", comm):
        everyone = comm.allgather((indices.shape[1], grad is not None))
    if not any(has for _, has in everyone):
        return None
    counts = [count for count, _ in everyone]
    all_indices = torch.empty(sum(counts), dtype=torch.int64)
    with activity.blocking("sparse gradient indices", comm):
        comm.Allgatherv(host_array(indices.reshape(-1))[0],
                        [host_array(all_indices)[0], counts])
    row = int(np.prod(like.shape[1:], dtype=np.int64))
    all_values = torch.empty((sum(counts),) + tuple(like.shape[1:]), dtype=like.dtype)
    with activity.blocking("sparse gradient values", comm):
        comm.Allgatherv(host_array(values.reshape(-1))[0],
                        [host_array(all_values.reshape(-1))[0], [c * row for c in counts]])
    total = torch.sparse_coo_tensor(all_indices.unsqueeze(0), all_values, like.shape,
                                    check_invariants=True)
    return (total.coalesce() / divisor).to(like.device)
