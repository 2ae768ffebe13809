"""Construction-time agreement: same parameters on every rank, then rank 0's values."""

from collections import OrderedDict

import torch

from hpcddp.buffers import mpi_view

__all__ = ["broadcast_tensors", "verify_same_parameters"]


def verify_same_parameters(comm, named_params) -> None:
    """Raise on every rank if ranks differ in parameter count, names, shapes or dtypes.

    The message names the first differing parameter and the ranks involved.

    .. warning:: Collective.
    """
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named_params]
    everyone = comm.allgather(mine)
    reference = everyone[0]
    for position in range(max(len(ranks) for ranks in everyone)):
        seen = OrderedDict()
        for rank, params in enumerate(everyone):
            entry = params[position] if position < len(params) else None
            seen.setdefault(entry, []).append(rank)
        if len(seen) > 1:
            said = "; ".join(
                f"ranks {','.join(map(str, ranks))}: " +
                ("no parameter" if entry is None else
                 f"{entry[0]} shape {list(entry[1])} {entry[2]}")
                for entry, ranks in seen.items())
            raise RuntimeError(
                f"DistributedDataParallel: ranks hold different models. Parameter "
                f"#{position} differs: {said} (rank 0 has {len(reference)} parameters). "
                f"Build the same model on every rank before wrapping it.")


def broadcast_tensors(comm, tensors, cuda_aware: bool, root: int = 0) -> None:
    """Overwrite ``tensors`` with rank ``root``'s values, one flat message per dtype and device.

    .. warning:: Collective.
    """
    groups = OrderedDict()
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        flat = torch.cat([t.reshape(-1) for t in group]) if len(group) > 1 else \
            group[0].reshape(-1).clone()
        view = mpi_view(flat, cuda_aware)
        comm.Bcast(view.buf, root=root)
        if view.finish is not None:
            view.finish()
        if comm.rank != root:
            offset = 0
            for t in group:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
