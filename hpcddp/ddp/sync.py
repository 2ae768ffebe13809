"""Construction-time agreement: same parameters on every rank, then rank 0's values."""

from collections import OrderedDict

import torch

from hpcddp.comm import activity
from hpcddp.comm.ranks import by_value, ranks_text

__all__ = ["BROADCAST_BYTES", "broadcast_tensors", "verify_same_parameters"]

# The largest packed message of a broadcast (torch's DDP broadcasts in 250 MiB buckets).
BROADCAST_BYTES = 32 << 20


def verify_same_parameters(comm, named_params, named_buffers=()) -> None:
    """Raise on every rank if ranks differ in parameter or buffer count, names, shapes or
    dtypes: buffers are broadcast from rank 0 by position, so buffers that differ would be
    silently mixed up (same size) or fail deep in MPI (different sizes).

    The message names the first differing parameter or buffer and the ranks involved.

    .. warning:: Collective.
    """
    def describe(named):
        return [(name, tuple(t.shape), str(t.dtype)) for name, t in named]
    with activity.named("DDP parameter check"):
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


def broadcast_tensors(transport, tensors, root: int = 0,
                      cap_bytes: int = BROADCAST_BYTES) -> None:
    """Overwrite ``tensors`` with rank ``root``'s values, through ``transport`` (a
    ``hpcddp.transport.Transport``).

    Memory stays bounded whatever the model's size, as in torch's DDP (which broadcasts
    in 250 MiB buckets): a contiguous tensor of at least ``cap_bytes`` is broadcast where
    it lies, and smaller ones travel packed into flat messages of at most ``cap_bytes``,
    one dtype and device each. At most one packed copy exists at a time.

    .. warning:: Collective and a synchronization point.
    """
    groups = OrderedDict()
    for t in tensors:
        groups.setdefault((t.dtype, t.device), []).append(t)
    for group in groups.values():
        for run in _runs(group, cap_bytes):
            _broadcast_run(transport, run, root)


def _runs(group, cap_bytes):
    """``group`` cut into runs to broadcast as one message each, in order: a large
    contiguous tensor alone, the others packed up to ``cap_bytes``."""
    run, size = [], 0
    for t in group:
        nbytes = t.numel() * t.element_size()
        if nbytes >= cap_bytes and t.is_contiguous():
            if run:
                yield run
            yield [t]
            run, size = [], 0
            continue
        if run and size + nbytes > cap_bytes:
            yield run
            run, size = [], 0
        run.append(t)
        size += nbytes
    if run:
        yield run


def _broadcast_run(transport, run, root: int) -> None:
    if len(run) == 1 and run[0].is_contiguous():
        flat = run[0].view(-1)  # in place: no copy, nothing to copy back
    else:
        flat = torch.cat([t.reshape(-1) for t in run])
    transport.broadcast(flat, root, name=f"DDP broadcast of {len(run)} tensors "
                                         f"({flat.numel()} {flat.dtype})").wait()
    if transport.comm.rank != root and flat.data_ptr() != run[0].data_ptr():
        offset = 0
        for t in run:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
