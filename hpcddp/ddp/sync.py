"""Construction-time agreement: same parameters on every rank, then rank 0's values."""

from collections import OrderedDict

import torch

from hpcddp.comm import activity
from hpcddp.comm.ranks import by_value, ranks_text

__all__ = ["broadcast_tensors", "verify_same_parameters"]


def verify_same_parameters(comm, named_params, named_buffers=()) -> None:
    """Raise on every rank if ranks differ in parameter or buffer count, names, shapes or
    dtypes: buffers are broadcast from rank 0 by position, so buffers that differ would be
    silently mixed up (same size) or fail deep in MPI (different sizes).

    The message names the first differing parameter or buffer and the ranks involved.

    .. warning:: Collective.
    """
    def describe(named):
        return [(name, tuple(t.shape), str(t.dtype)) for name, t in named]
    with activity.blocking("DDP parameter check", comm):
        everyone = comm.allgather((describe(named_params), describe(named_buffers)))
    for kind, index in (("parameter", 0), ("buffer", 1)):
        _first_difference(kind, [mine[index] for mine in everyone])


def _first_difference(kind, everyone) -> None:
    reference = everyone[0]
    for position in range(max(len(ranks) for ranks in everyone)):
        seen = by_value(entries[position] if position < len(entries) else None
                        for entries in everyone)
        if len(seen) > 1:
            said = "; ".join(
                f"ranks {ranks_text(ranks)}: " +
                (f"no {kind}" if entry is None else
                 f"{entry[0]} shape {list(entry[1])} {entry[2]}")
                for entry, ranks in seen)
            raise RuntimeError(
                f"DistributedDataParallel: ranks hold different models. {kind.capitalize()} "
                f"#{position} differs: {said} (rank 0 has {len(reference)} {kind}s). "
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
