"""What the engine moves between ranks and keeps per operation: a rank's ``Request`` (sent
to the coordinator, compared across ranks), its ``Entry`` (the tensors and the handle's
outcome), a joined rank's stand-in entry, the coordinator's ``Pending`` requests of one
name, and a process set as the engine knows it."""

import threading
import time
from math import prod
from typing import Any, Callable, Dict, Optional, Sequence

from hpcddp import timeline

__all__ = ["Entry", "Pending", "ProcessSetInfo", "Request", "zeros_entry"]


class Request:
    """What one rank asks of an operation; the coordinator compares them across ranks."""

    __slots__ = ("rank", "set_id", "name", "kind", "dtype", "shape", "device", "op", "root",
                 "prescale", "postscale", "group", "splits")

    def __init__(self, set_id, name, kind, dtype="", shape=(), device="cpu", op=None,
                 root=None, prescale=1.0, postscale=1.0, group=None, splits=None):
        self.rank = -1
        self.set_id, self.name, self.kind = set_id, name, kind
        self.dtype, self.shape, self.device = dtype, tuple(shape), device
        self.op, self.root = op, root
        self.prescale, self.postscale = prescale, postscale
        self.group = group      # (group key, its number of names) for grouped operations
        self.splits = splits    # alltoall: rows sent to each rank of the set

    def __getstate__(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __setstate__(self, state):
        for slot, value in zip(self.__slots__, state):
            setattr(self, slot, value)

    def key(self):
        """What names this operation across ranks: its process set, kind and name."""
        return (self.set_id, self.kind, self.name)

    def nbytes(self) -> int:
        return prod(self.shape) * _ITEMSIZE.get(self.dtype, 8)


_ITEMSIZE = {"uint8": 1, "int8": 1, "bool": 1, "int16": 2, "float16": 2, "bfloat16": 2,
             "int32": 4, "float32": 4, "int64": 8, "float64": 8}


class Entry:
    """One operation of this rank: its request, its tensors, its outcome (a handle)."""

    def __init__(self, request: Request, tensor, output, finish: Optional[Callable] = None):
        self.request, self.tensor, self.output = request, tensor, output
        self.finish = finish      # output from what execute() left, on the engine thread
        self.done = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.extra: Any = None    # what the coordinator told every rank (sizes, splits)
        self.zeros = False        # a joined rank's stand-in (zeros_entry): no caller
        self.submitted = timeline.now() if timeline.recording() else None


def zeros_entry(response, k: int) -> "Entry":
    """What a joined rank contributes to the ``k``-th name of ``response``: zeros of the
    others' shape and dtype (nothing, for a barrier)."""
    import torch

    shape, dtype, device, op, prescale, postscale = response.joined[k]
    request = Request(response.set_id, response.names[k], response.kind, dtype, shape,
                      device, op=op, prescale=prescale, postscale=postscale)
    tensor = torch.zeros(shape, dtype=getattr(torch, dtype), device=device) if dtype else None
    entry = Entry(request, tensor, tensor)
    entry.zeros = True
    return entry


class ProcessSetInfo:
    """A process set as the engine knows it: its Horovod ranks, this rank in it (None
    outside), and on its members the executor of its collectives."""

    def __init__(self, set_id: int, ranks: Sequence[int], rank: Optional[int], executor):
        self.set_id, self.ranks, self.rank, self.executor = set_id, list(ranks), rank, executor


class Pending:
    """The coordinator's view of one (set, name): each rank's request so far."""

    __slots__ = ("requests", "since", "order", "warned")

    def __init__(self, order: int):
        self.requests: Dict[int, Request] = {}
        self.since = time.monotonic()
        self.order, self.warned = order, False
