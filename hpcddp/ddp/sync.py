"""Construction-time agreement: same parameters on every rank, then rank 0's values."""

from collections import OrderedDict

import torch

from hpcddp.comm import activity
from hpcddp.comm.ranks import by_value, ranks_text

__all__ = ["broadcast_tensors", "verify_same_parameters"]


def verify_same_parameters(comm, named_params) -> None:
    """Raise on every rank if ranks differ in parameter count, names, shapes or dtypes.

    The message names the first differing parameter and the ranks involved.

    .. warning:: Collective.
    """
    mine = [(name, tuple(p.shape), str(p.dtype)) for name, p in named_params]
    with activity.blocking("DDP parameter check", comm):
        everyone = comm.allgather(mine)
    reference = everyone[0]
    for position in range(max(len(ranks) for ranks in everyone)):
        seen = by_value(params[position] if position < len(params) else None
                        for params in everyone)
        if len(seen) > 1:
            said = "; ".join(
                f"ranks {ranks_text(ranks)}: " +
                ("no parameter" if entry is None else
                 f"{entry[0]} shape {list(entry[1])} {entry[2]}")
                for entry, ranks in seen)
            raise RuntimeError(
                f"DistributedDataParallel: ranks hold different models. Parameter "
                f"#{position} differs: {said} (rank 0 has {len(reference)} parameters). "
                f"Build the same model on every rank before wrapping it.")


def broadcast_tensors(transport, tensors, root: int = 0) -> None:
    """Overwrite ``tensors`` with rank ``root``'s values, one flat message per dtype and
    device, through ``transport`` (a ``hpcddp.transport.Transport``).

    .. warning:: Collective and a synchronization point.
    """
    groups = OrderedDict()
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        flat = torch.cat([t.reshape(-1) for t in group]) if len(group) > 1 else \
            group[0].reshape(-1).clone()
        transport.broadcast(flat, root, name=f"DDP broadcast of {len(group)} tensors "
                                             f"({flat.numel()} {flat.dtype})").wait()
        if transport.comm.rank != root:
            offset = 0
            for t in group:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
