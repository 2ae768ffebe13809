"""A cost model of hpcddp's reductions and of a DDP step: a model, never a measurement.

Every path a message takes costs ``latency + bytes / bandwidth`` (``Link``). A fabric
(``Fabric``) has two: a node's link to the others, full duplex and shared by the node's
ranks, and the path between two ranks of one node (shared memory, NVLink); and two
rates of one rank's memory work: summing one buffer into another, copying one.

Each reduction hpcddp runs is priced as its algorithm moves data
(``allreduce_seconds``):

- ``ring``: ``2 (p - 1)`` steps; in each every rank sends ``1/p`` of the buffer to the
  next, and the ring, ordered by node, crosses each node's link once each way. The sums
  of one slice overlap the messages of the others, so the slower of the two counts.
- ``mpi``: recursive halving then doubling (Rabenseifner's, the textbook choice for
  large buffers): ``2 log2 p`` messages, each rank sending ``2 (p - 1) / p`` of the
  buffer; on nodes of several ranks, MPICH's way: a reduce to one rank per node, the
  allreduce among those, a broadcast inside each node. An MPI library chooses its own
  algorithm, and the model cannot know which: MPICH 5's over TCP took 1.6 to 2.1 times
  this on 4 and 8 nodes (benchmarks/bench_scale.py), which is why
  ``HPCDDP_REDUCE=auto`` runs hpcddp's ring there.
- ``node``: a reduce-scatter inside the node, one allreduce per local rank across the
  nodes (all of them sharing the link: each node sends ``2 (n - 1) / n`` of the buffer),
  an allgather inside the node; slices pipeline the three stages, so the slowest stage
  counts whole and the other two for one slice.

A DDP step (``ddp_step_seconds``) is the compute of a step with no communication, split
as forward, backward and the rest; buckets become ready as the backward reaches them
(in proportion to their bytes: an assumption), are reduced one after the other, and
the step ends when the last bucket is reduced and the backward is done.

``fit_link`` finds a link's latency and bandwidth from timed messages (least squares);
``benchmarks/bench_scale.py`` fits a fabric on the emulated cluster and checks the
model's predictions against jobs there; ``hpcddp predict`` uses it.
"""

import math
from typing import Dict, NamedTuple, Sequence, Tuple

__all__ = ["Fabric", "Link", "Workload", "allreduce_seconds", "ddp_step_seconds",
           "fit_link", "REDUCTIONS", "SLICE_BYTES"]

REDUCTIONS = ("mpi", "ring", "node")
SLICE_BYTES = 4 << 20  # the node-aware allreduce's slice (hpcddp.transport.allreduce.node_aware)


class Link(NamedTuple):
    """A path messages take: each costs ``latency_s + bytes / bytes_per_s``."""

    latency_s: float
    bytes_per_s: float

    def seconds(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bytes_per_s

    def shared(self, ways: int) -> "Link":
        """The same path carrying ``ways`` streams at once: each gets its share."""
        return Link(self.latency_s, self.bytes_per_s / ways)


class Fabric(NamedTuple):
    """Where a job runs.

    Args:
        between: a node's link to the others (per direction; the node's ranks share it).
        within: the path between two ranks of one node.
        sum_bytes_per_s: one rank adding one buffer into another (bytes of the input).
        copy_bytes_per_s: one rank copying a buffer (gradients into a bucket and back).
    """

    between: Link
    within: Link
    sum_bytes_per_s: float
    copy_bytes_per_s: float


class Workload(NamedTuple):
    """A DDP step: ``compute_s`` with no communication (forward, backward, optimizer),
    of which the backward takes ``backward_share`` after a forward of
    ``forward_share``; buckets, in the order they become ready, in bytes."""

    compute_s: float
    buckets: Tuple[int, ...]
    forward_share: float = 1 / 3
    backward_share: float = 2 / 3


def _check(nodes: int, ranks_per_node: int, nbytes: float) -> None:
    if nodes < 1 or ranks_per_node < 1:
        raise ValueError(f"a layout of {nodes} nodes x {ranks_per_node} ranks: both must be "
                         "at least 1")
    if nbytes < 0:
        raise ValueError(f"a buffer of {nbytes} bytes: give 0 or more")


def _rabenseifner(fabric: Fabric, ranks: int, nbytes: float, link: Link) -> float:
    """MPI's allreduce of ``nbytes`` among ``ranks`` over ``link``: recursive halving,
    then doubling, among the largest power of two of them (the others first hand their
    buffer to a partner and get the result back)."""
    if ranks == 1:
        return 0.0
    steps = int(math.log2(ranks))
    core = 1 << steps
    seconds = 0.0
    if core != ranks:
        seconds += 2 * link.seconds(nbytes) + nbytes / fabric.sum_bytes_per_s
    for k in range(1, steps + 1):  # halving: the buffer's half, quarter... to a partner
        part = nbytes / (1 << k)
        seconds += 2 * link.seconds(part) + part / fabric.sum_bytes_per_s
    return seconds


def allreduce_seconds(fabric: Fabric, nodes: int, ranks_per_node: int, nbytes: float,
                      reduction: str) -> float:
    """Seconds one allreduce of ``nbytes`` takes by ``reduction`` on ``nodes`` x
    ``ranks_per_node`` ranks (the model's)."""
    _check(nodes, ranks_per_node, nbytes)
    size = nodes * ranks_per_node
    if size == 1 or nbytes == 0:
        return 0.0
    if reduction == "ring":
        # Every step waits for its slowest edge: a node's link where there are several
        # nodes (each link carries one edge each way), shared memory otherwise.
        edge = fabric.between if nodes > 1 else fabric.within
        chunk = nbytes / size
        wire = 2 * (size - 1) * chunk / edge.bytes_per_s
        sums = (size - 1) * chunk / fabric.sum_bytes_per_s
        return 2 * (size - 1) * edge.latency_s + max(wire, sums)
    if reduction == "mpi":
        if nodes == 1 or ranks_per_node == 1:
            link = fabric.between if nodes > 1 else fabric.within
            return _rabenseifner(fabric, size, nbytes, link)
        # MPICH's on nodes of several ranks (MPIR_CVAR_ENABLE_SMP_ALLREDUCE, on by
        # default): a reduce to one rank per node, their allreduce, a broadcast back.
        tree = math.ceil(math.log2(ranks_per_node))
        inside = tree * (fabric.within.seconds(nbytes) + nbytes / fabric.sum_bytes_per_s)
        spread = tree * fabric.within.seconds(nbytes)
        return inside + _rabenseifner(fabric, nodes, nbytes, fabric.between) + spread
    if reduction == "node":
        if ranks_per_node == 1 or nodes == 1:
            return allreduce_seconds(fabric, nodes, ranks_per_node, nbytes, "mpi")

        def inside(total: float) -> float:  # a reduce-scatter or an allgather in the node
            part = total / ranks_per_node
            return (ranks_per_node - 1) * (fabric.within.seconds(part)
                                           + part / fabric.sum_bytes_per_s)

        def across(total: float) -> float:  # every local rank's share, over one link
            return _rabenseifner(fabric, nodes, total / ranks_per_node,
                                 fabric.between.shared(ranks_per_node))

        piece = min(nbytes, SLICE_BYTES)
        stages = [inside(nbytes), across(nbytes), inside(nbytes)]
        slowest = max(range(3), key=stages.__getitem__)
        fill = sum(f(piece) for i, f in enumerate((inside, across, inside)) if i != slowest)
        return stages[slowest] + fill
    raise ValueError(f"reduction {reduction!r}: choose one of {', '.join(REDUCTIONS)}")


def ddp_step_seconds(fabric: Fabric, nodes: int, ranks_per_node: int, work: Workload,
                     reduction: str) -> Dict[str, float]:
    """One DDP step's seconds (``step``), with its parts: ``compute`` (no
    communication), ``communication`` (every bucket's reduction, copies included) and
    ``exposed`` (what the backward did not hide)."""
    total = float(sum(work.buckets))
    if nodes * ranks_per_node == 1:  # one rank: no bucket is reduced or even copied
        return {"step": work.compute_s, "compute": work.compute_s, "communication": 0.0,
                "exposed": 0.0}
    forward = work.compute_s * work.forward_share
    backward = work.compute_s * work.backward_share
    rest = work.compute_s - forward - backward
    free_at, ready, busy = 0.0, forward, 0.0
    for nbytes in work.buckets:
        ready += backward * (nbytes / total if total else 0.0)
        cost = allreduce_seconds(fabric, nodes, ranks_per_node, nbytes, reduction) \
            + 2 * nbytes / fabric.copy_bytes_per_s
        free_at = max(free_at, ready) + cost
        busy += cost
    done = max(free_at, forward + backward)
    step = done + rest
    return {"step": step, "compute": work.compute_s, "communication": busy,
            "exposed": step - work.compute_s}


def fit_link(samples: Sequence[Tuple[float, float]]) -> Link:
    """The link whose ``latency + bytes / bandwidth`` best fits ``samples`` of (bytes,
    seconds of one message), by least squares.

    Raises:
        ValueError: fewer than two sizes, or times that do not grow with size.
    """
    sizes = sorted({float(b) for b, _ in samples})
    if len(sizes) < 2:
        raise ValueError(f"fitting a link needs messages of two sizes or more; got {sizes}")
    n = len(samples)
    mean_b = sum(b for b, _ in samples) / n
    mean_t = sum(t for _, t in samples) / n
    slope = sum((b - mean_b) * (t - mean_t) for b, t in samples) / \
        sum((b - mean_b) ** 2 for b, _ in samples)
    if slope <= 0:
        raise ValueError("the times do not grow with the message size: no bandwidth to fit "
                         f"({list(samples)})")
    return Link(max(0.0, mean_t - slope * mean_b), 1.0 / slope)

