"""The sum over ranks of sparse COO tensors, whose nonzeros differ from rank to rank.

A sparse tensor cannot be reduced elementwise in place: each rank holds other indices,
and as many as it happens to. Each rank's coalesced indices and values are allgathered
(their counts first, then ``Allgatherv``) and the whole coalesced again, which sums the
entries that several ranks hold, as gloo's sparse allreduce does. Tensors on a GPU
travel through host memory. Used by the DDP reducer for ``nn.Embedding(sparse=True)``
gradients and by the torch.distributed backend for ``all_reduce`` of a sparse tensor.
"""

from typing import Optional

import numpy as np
import torch

from hpcddp.comm import activity
from hpcddp.transport.routes import host_array

__all__ = ["allreduce_sparse"]


def allreduce_sparse(comm, tensor: Optional[torch.Tensor],
                     like: torch.Tensor) -> Optional[torch.Tensor]:
    """The coalesced sum over ranks of the sparse ``tensor`` (None: no entries on this
    rank), shaped and placed like ``like``; None when no rank has a tensor.

    .. warning:: Collective, blocking.
    """
    if tensor is not None:
        tensor = tensor.coalesce().cpu()
    mine = (tensor._nnz(), tensor.sparse_dim()) if tensor is not None else None
    with activity.named("sparse tensor sizes"):
        everyone = comm.allgather(mine)
    dims = {dim for _, dim in filter(None, everyone)}
    if not dims:
        return None
    if len(dims) > 1:
        raise ValueError(f"sparse all_reduce: the ranks' sparse tensors have different "
                         f"numbers of sparse dimensions ({sorted(dims)}); every rank must "
                         f"pass a tensor of shape {list(like.shape)} laid out alike")
    sparse_dim = dims.pop()
    if tensor is not None:
        indices, values = tensor.indices().t().contiguous(), tensor.values().contiguous()
    else:
        indices = torch.empty((0, sparse_dim), dtype=torch.int64)
        values = torch.empty((0,) + tuple(like.shape[sparse_dim:]), dtype=like.dtype)
    counts = [part[0] if part else 0 for part in everyone]
    all_indices = torch.empty((sum(counts), sparse_dim), dtype=torch.int64)
    with activity.named("sparse tensor indices"):
        comm.Allgatherv(host_array(indices.reshape(-1))[0],
                        [host_array(all_indices.reshape(-1))[0],
                         [c * sparse_dim for c in counts]])
    row = int(np.prod(like.shape[sparse_dim:], dtype=np.int64))
    all_values = torch.empty((sum(counts),) + tuple(like.shape[sparse_dim:]),
                             dtype=like.dtype)
    with activity.named("sparse tensor values"):
        comm.Allgatherv(host_array(values.reshape(-1))[0],
                        [host_array(all_values.reshape(-1))[0], [c * row for c in counts]])
    total = torch.sparse_coo_tensor(all_indices.t(), all_values, like.shape,
                                    check_invariants=True)
    return total.coalesce().to(like.device)
