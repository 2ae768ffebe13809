"""The coordinator's decisions: which named operations are ready, whether their ranks
agree, and how ready allreduces fuse. Pure functions of the requests (``engine.py``
holds the table and sends the responses).

An operation of a process set, named by its kind and name, is ready once every rank of
the set has asked for it (ranks that start different kinds under one name start two
operations, each waiting for the other ranks: the stall check says so). Its ranks must
agree on the dtype, the device, the op, the scaling and the root; on the shape, but for the first dimension where allgather and
alltoall let it differ. A disagreement becomes an error response, which fails the
operation on every rank with a message naming the tensor, the values and the ranks.

Ready operations leave in the order they became ready. Consecutive ready allreduces that
agree in dtype, device, op and scaling are fused into one response up to the fusion
threshold; a group (``grouped_allreduce``) leaves only when all of its names are ready,
and whole.

Example::

    responses = ready_responses(table, sets, fusion_bytes=64 << 20)
"""

from operator import attrgetter
from typing import Dict, List, Optional, Sequence, Tuple

from hpcddp.horovod.common import OP_NAMES

__all__ = ["Response", "ready_responses", "mismatch", "stalled"]

_FUSABLE = ("allreduce",)
# The fields every rank of an operation must agree on, by kind (the shape apart).
_SAME = ("kind", "dtype", "device", "op", "root", "prescale", "postscale")
_EXACT = attrgetter(*_SAME, "shape")  # what ranks agree on wholly, for most kinds


class Response:
    """What every rank of a set runs: ``kind`` on the tensors ``names``, or ``error``.
    ``sizes`` holds per rank of the set what the kind needs (allgather: first
    dimensions; alltoall: the rows each rank sends to each; join: the last rank to
    join). ``joined`` holds, where ranks of the set have joined (``hvd.join``), each
    name's ``(shape, dtype, device)``: a joined rank reduces zeros of that form."""

    __slots__ = ("set_id", "kind", "names", "error", "sizes", "joined")

    def __init__(self, set_id, kind, names, error=None, sizes=None, joined=None):
        self.set_id, self.kind, self.names = set_id, kind, list(names)
        self.error, self.sizes, self.joined = error, sizes, joined

    def __getstate__(self):
        return (self.set_id, self.kind, self.names, self.error, self.sizes, self.joined)

    def __setstate__(self, state):
        self.set_id, self.kind, self.names, self.error, self.sizes, self.joined = state

    def __repr__(self):
        return f"Response({self.kind}, {self.names}{', error' if self.error else ''})"


def _shown(field: str, value) -> str:
    if field == "op":
        return OP_NAMES.get(value, str(value))
    if field == "shape":
        return f"[{', '.join(str(d) for d in value)}]"
    return str(value)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else \
        f"ranks {', '.join(str(r) for r in ranks)}"


def _disagree(name: str, kind: str, field: str, by_value: Dict) -> str:
    parts = [f"{_shown(field, value)} on {_ranks(sorted(ranks))}"
             for value, ranks in sorted(by_value.items(), key=lambda kv: min(kv[1]))]
    what = {"kind": "operation", "root": "root rank", "prescale": "prescale factor",
            "postscale": "postscale factor"}.get(field, field)
    return (f"hvd: mismatched {what} for {kind} {name!r} across ranks: "
            f"{'; '.join(parts)}. Every rank must start an operation of one name with the "
            f"same {what}")


def mismatch(requests: Dict[int, "object"]) -> Optional[str]:
    """The error message where the ranks' requests of one name disagree; else None."""
    first = requests[min(requests)]
    if first.kind not in ("allgather", "alltoall"):
        agreed = _EXACT(first)
        if all(_EXACT(request) == agreed for request in requests.values()):
            return None
    for field in _SAME:
        by_value: Dict = {}
        for rank, request in requests.items():
            by_value.setdefault(getattr(request, field), []).append(rank)
        if len(by_value) > 1:
            return _disagree(first.name, first.kind, field, by_value)
    free_first = first.kind in ("allgather", "alltoall")
    by_shape: Dict = {}
    for rank, request in requests.items():
        shape = request.shape
        key = (len(shape),) + tuple(shape[1:]) if free_first else shape
        by_shape.setdefault(key, []).append(rank)
    if len(by_shape) > 1:
        shown = {requests[ranks[0]].shape: ranks for ranks in by_shape.values()}
        message = _disagree(first.name, first.kind, "shape", shown)
        if free_first:
            message += " (the first dimension may differ; the others may not)"
        return message
    if first.kind == "alltoall":
        bad = [(rank, r.splits) for rank, r in requests.items()
               if r.splits is not None and sum(r.splits) > (r.shape[0] if r.shape else 0)]
        if bad:
            rank, splits = bad[0]
            return (f"hvd: alltoall {first.name!r} on rank {rank}: splits {list(splits)} sum "
                    f"to {sum(splits)}, more than the tensor's {requests[rank].shape[0]} rows")
    return None


def _sizes(kind: str, requests: Dict[int, "object"], ranks: Sequence[int]):
    if kind == "allgather":
        return [requests[r].shape[0] if requests[r].shape else 1 for r in ranks]
    if kind == "alltoall":
        n = len(ranks)
        rows = []
        for r in ranks:
            request = requests[r]
            if request.splits is not None:
                rows.append(list(request.splits))
            else:
                total = request.shape[0] if request.shape else 0
                rows.append([total // n] * n if total % n == 0 else None)
        return rows
    return None


def _fusable(a, b) -> bool:
    return a.kind in _FUSABLE and all(getattr(a, f) == getattr(b, f)
                                      for f in ("kind", "dtype", "device", "op", "prescale",
                                                "postscale"))


# What a joined rank takes part in: it contributes zeros to allreduces (an average still
# divides by the set's size) and waits in barriers; any other kind fails on the others.
_JOINED_TAKE_PART = ("allreduce", "barrier")


def _form(request):
    return (request.shape, request.dtype, request.device, request.op, request.prescale,
            request.postscale)


def _joined_error(kind: str, name: str, absent: Sequence[int]) -> str:
    return (f"hvd: {kind} {name!r} cannot run while {_ranks(sorted(absent))} "
            f"{'has' if len(absent) == 1 else 'have'} joined (hvd.join): a joined rank "
            f"takes part only in allreduces and barriers")


def ready_responses(table: Dict[Tuple[int, str, str], "object"], sets: Dict[int, "object"],
                    fusion_bytes: int, joined: Optional[Dict[int, List[int]]] = None
                    ) -> List[Response]:
    """Take every ready operation out of ``table`` (a ``(set, kind, name)`` key to the
    ranks' requests so far) and return the responses, in the order they became ready.

    ``joined`` holds per set the ranks that have called ``hvd.join``, in the order they
    did: an operation is ready once every other rank has asked for it, and a join, once
    every rank has joined, leaves after every other response of its set (and clears the
    set's joined ranks)."""
    joined = {} if joined is None else joined
    ready = []
    for key, pending in table.items():
        set_info = sets.get(key[0])
        if set_info is None or not pending.requests:
            continue
        absent = [r for r in joined.get(key[0], ()) if r not in pending.requests]
        first = pending.requests[min(pending.requests)]
        if first.kind == "join":
            absent = []
        if len(pending.requests) + len(absent) == len(set_info.ranks):
            ready.append((first.kind == "join", pending.order, key, pending, absent,
                          set_info))
    ready.sort(key=lambda item: item[:2])
    # A group leaves only whole: every name of it ready.
    groups: Dict[Tuple[int, object], int] = {}
    for _, _, key, pending, _, _ in ready:
        group = pending.requests[min(pending.requests)].group
        if group is not None:
            groups[(key[0], group[0])] = groups.get((key[0], group[0]), 0) + 1
    responses: List[Response] = []
    open_fusion: Optional[Tuple[Response, object, int]] = None
    for _, _, key, pending, absent, set_info in ready:
        requests = pending.requests
        first = requests[min(requests)]
        group = first.group
        if group is not None and groups[(key[0], group[0])] < group[1]:
            continue
        del table[key]
        if absent and first.kind not in _JOINED_TAKE_PART:
            error = _joined_error(first.kind, first.name, absent)
        else:
            error = mismatch(requests)
        ranks = set_info.ranks
        if error is not None:
            responses.append(Response(key[0], first.kind, [first.name], error=error))
            open_fusion = None
            continue
        forms = [_form(first)] if joined.get(key[0]) else None
        nbytes = first.nbytes()
        if open_fusion is not None:
            response, head, total = open_fusion
            same_group = (group is None and head.group is None) or \
                (group is not None and head.group is not None and group[0] == head.group[0])
            if response.set_id == key[0] and _fusable(head, first) and \
                    (total + nbytes <= fusion_bytes or (group is not None and same_group)):
                response.names.append(first.name)
                if response.joined is not None:
                    response.joined.extend(forms)
                open_fusion = (response, head, total + nbytes)
                continue
        if first.kind == "join":
            response = Response(key[0], "join", [first.name],
                                sizes=[joined.pop(key[0], [min(requests)])[-1]])
        else:
            response = Response(key[0], first.kind, [first.name],
                                sizes=_sizes(first.kind, requests, ranks), joined=forms)
        if first.kind == "alltoall" and any(row is None for row in response.sizes):
            bad = next(r for r, row in zip(ranks, response.sizes) if row is None)
            response = Response(key[0], first.kind, [first.name], error=(
                f"hvd: alltoall {first.name!r} without splits on rank {bad}: its "
                f"{requests[bad].shape[0]} rows do not divide among {len(ranks)} ranks; "
                f"pass splits="))
        responses.append(response)
        open_fusion = (response, first, nbytes) if first.kind in _FUSABLE and \
            response.error is None else None
    return responses


def _other_kinds(table, set_id, kind, name) -> str:
    """Where other ranks started another kind of operation of the same name (a program
    whose ranks disagree on what ``name`` is), said in a stall's message.

    >>> from types import SimpleNamespace as P
    >>> table = {(0, "allreduce", "x"): P(requests={0: 1}), (0, "allgather", "x"): P(requests={1: 1})}
    >>> _other_kinds(table, 0, "allreduce", "x")
    '; an allgather of that name was started on rank 1'
    """
    said = [f"{'an' if other[0] in 'aeiou' else 'a'} {other} of that name was started on "
            f"{_ranks(sorted(pending.requests))}"
            for (s, other, n), pending in table.items()
            if s == set_id and n == name and other != kind]
    return "".join("; " + line for line in said)


def stalled(table, sets, stall_s: float, shutdown_s: float, log) -> None:
    """Warn once of each operation some ranks started ``stall_s`` ago and others have
    not; past ``shutdown_s`` (when set) raise, ending the job through hpcddp's abort."""
    import time

    if stall_s <= 0:
        return
    now = time.monotonic()
    for (set_id, kind, name), pending in table.items():
        waited = now - pending.since
        info = sets.get(set_id)
        if info is None or waited < stall_s:
            continue
        missing = [r for r in info.ranks if r not in pending.requests]
        elsewhere = _other_kinds(table, set_id, kind, name)
        if shutdown_s > 0 and waited >= shutdown_s:
            raise RuntimeError(f"hvd: {kind} {name!r} started {waited:.0f} s ago on "
                               f"{_ranks(sorted(pending.requests))} and never on "
                               f"{_ranks(missing)}{elsewhere} "
                               f"(HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)")
        if not pending.warned:
            pending.warned = True
            log.warning("hvd: %s %r started %.0f s ago on %s and not yet on %s%s: those "
                        "ranks may have stopped, or started operations in another order of "
                        "names that never meets", kind, name, waited,
                        _ranks(sorted(pending.requests)), _ranks(missing), elsewhere)
