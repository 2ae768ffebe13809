"""Which allreduce algorithm carries a buffer: every choice hpcddp makes of it, in one place.

Three questions, asked at three times, answered here and nowhere else:

- at ``init()``, which reduction the world uses, from ``HPCDDP_REDUCE`` and the layout
  (``for_world``);
- for each buffer, whether another reduction does better for that one: hpcddp's ring for
  16-bit floats in host memory, MPI's own for a buffer the node-aware allreduce would
  not cut into slices (``for_buffer``);
- for ``bucket_cap_mb="auto"``, which reductions the autotuner measures
  (``worth_trying``).

The three are pure functions: facts in, a name (and for the world, the reason its
messages give) out. ``World`` gathers the world's facts, agreed across ranks; a
communicator's ``Reductions`` (below) holds the algorithms it has made, the one in use,
and asks ``for_buffer`` about each tensor it is given.

Example::

    facts = WorldFacts(nodes=2, ranks_per_node=4, uniform=True, buffers="host buffers")
    for_world("auto", facts).name      # "node"
    worth_trying("auto", "node", on_gpu=False, layout=facts)   # ("node", "mpi", "ring")
"""

from typing import Dict, NamedTuple, Optional, Tuple

import torch

from hpcddp.env import ConfigError
from hpcddp.transport.allreduce.mpi import MPIAllreduce, Reduction
from hpcddp.transport.allreduce.node_aware import NodeAwareAllreduce, NodeGroups
from hpcddp.transport.allreduce.ring import RingAllreduce

__all__ = ["Choice", "OMPI_MCA_ALLREDUCE", "REDUCTIONS", "Reductions", "WorldFacts", "for_buffer",
           "for_world", "make_reduction", "worth_trying"]

HOST, DEVICE, PINNED = "host buffers", "device buffers", "pinned host buffers"


class WorldFacts(NamedTuple):
    """The facts of a world that the choice depends on.

    Args:
        nodes: nodes in the job.
        ranks_per_node: this node's ranks.
        uniform: every node holds the same number of ranks.
        buffers: where MPI finds the data: ``HOST``, ``DEVICE`` (a CUDA-aware MPI) or
            ``PINNED`` (GPU tensors staged through host memory).
        mpi_halves_links: MPI's own allreduce is known to use each link one way at a
            time: Open MPI's default algorithm (``OMPI_MCA_coll_libnbc_iallreduce_algorithm``
            unset; ``OMPI_MCA_ALLREDUCE``, below).
    """

    nodes: int
    ranks_per_node: int
    uniform: bool
    buffers: str
    mpi_halves_links: bool = False


# The Open MPI setting that makes its own allreduce a ring, for messages and for
# the notes that name it.
OMPI_MCA_ALLREDUCE = "OMPI_MCA_coll_libnbc_iallreduce_algorithm"


class Choice(NamedTuple):
    """A reduction (``"mpi"``, ``"ring"`` or ``"node"``) and why, as messages say it."""

    name: str
    reason: str


def for_world(setting: str, layout: WorldFacts, device_ring: Optional[str] = None) -> Choice:
    """The reduction of a world for ``HPCDDP_REDUCE=setting``.

    Args:
        setting: ``auto``, ``mpi``, ``ring``, ``node`` or ``staged`` (MPI's reduction on
            staged buffers; the caller stages).
        layout: the world's layout.
        device_ring: where the device-buffer self-test found MPI's own reduction unfit
            and the ring fit, what it found; None otherwise.

    Raises:
        ConfigError: ``node`` where the nodes hold different numbers of ranks.
    """
    where, nodes = layout.buffers, layout.nodes
    shape = f"{nodes} nodes x {layout.ranks_per_node} ranks"
    if setting == "node" and not layout.uniform:
        raise ConfigError("HPCDDP_REDUCE=node: the nodes hold different numbers of ranks, "
                          "and the node-aware allreduce needs the same number on each. "
                          "Start as many ranks on every node, or set HPCDDP_REDUCE=auto")
    if setting == "ring":
        return Choice("ring", f"HPCDDP_REDUCE=ring: hpcddp's ring on {where}")
    if setting == "node":
        return Choice("node", f"HPCDDP_REDUCE=node: node-aware (within the node, across "
                              f"{nodes} nodes, within the node) on {where}")
    if setting in ("mpi", "staged"):
        return Choice("mpi", f"HPCDDP_REDUCE={setting}: MPI's Iallreduce on {where}")
    if nodes > 1 and layout.ranks_per_node > 1 and layout.uniform and where == HOST:
        # Each node's link carries 2(n-1)/n of the buffer, not 2(p-1)/p or more.
        return Choice("node", f"HPCDDP_REDUCE=auto: node-aware on {where} ({shape}: shared "
                              f"memory inside the node, then each node sends the least an "
                              f"allreduce can over its link)")
    if nodes > 2 and layout.ranks_per_node == 1 and where == HOST:
        # On 3 nodes or more MPI's own allreduce moves about half of what a link can,
        # the ring nearly all (docs/benchmarks.md#across-emulated-nodes).
        return Choice("ring", f"HPCDDP_REDUCE=auto: hpcddp's ring on {where} ({shape}: "
                              f"every link carries 2(n-1)/n of the buffer, evenly)")
    if nodes == 2 and layout.ranks_per_node == 1 and where == HOST and \
            layout.mpi_halves_links:
        # Open MPI 5's own allreduce uses each link one way at a time unless its ring is
        # set (docs/benchmarks.md#across-emulated-nodes, docs/which-mpi.md).
        return Choice("ring", f"HPCDDP_REDUCE=auto: hpcddp's ring on {where} ({shape}: "
                              f"Open MPI's own allreduce sends one way at a time here; "
                              f"{OMPI_MCA_ALLREDUCE}=1 makes it a ring)")
    if where == DEVICE and device_ring is not None:
        return Choice("ring", f"HPCDDP_REDUCE=auto: hpcddp's ring on {where} (the "
                              f"self-test: {device_ring})")
    why = "one node" if nodes == 1 else \
        "one rank per node" if layout.ranks_per_node == 1 else \
        "nodes with different numbers of ranks" if not layout.uniform else "GPU buffers"
    return Choice("mpi", f"HPCDDP_REDUCE=auto: MPI's Iallreduce on {where} ({why})")


def for_buffer(current: str, nbytes: int, slice_bytes: int, on_device: bool, ranks: int,
               half: bool) -> str:
    """The reduction for one buffer of ``nbytes`` where ``current`` is in use.

    MPI reduces float16 and bfloat16 (``half``) in software, element by element, several
    times slower than float32 of twice the bytes; the ring sums them with torch's
    vectorized kernels. The node-aware allreduce's three stages cost more than they
    save on one of its slices (``slice_bytes``), where MPI's own is latency-bound
    anyway.
    """
    if current == "node" and nbytes <= slice_bytes:
        return "mpi"
    if current == "ring" or on_device or ranks == 1 or not half:
        return current
    return "ring"


def worth_trying(setting: str, chosen: str, on_gpu: bool, layout: WorldFacts) -> Tuple[str, ...]:
    """The reductions the autotuner measures: the world's choice first, then the others
    that can run here. ``HPCDDP_REDUCE`` other than ``auto`` fixes the reduction."""
    if setting != "auto":
        return (chosen,)
    names = [chosen]
    if not on_gpu:  # MPI's own on device buffers is only trusted where the world chose it
        names.append("mpi")
    names.append("ring")
    if not on_gpu and layout.nodes > 1 and layout.ranks_per_node > 1:
        names.append("node")
    return tuple(dict.fromkeys(names))


REDUCTIONS = {cls.name: cls for cls in (MPIAllreduce, RingAllreduce, NodeAwareAllreduce)}


def make_reduction(name: str, comm, cuda) -> Reduction:
    """The reduction ``name`` on ``comm``. Collective. A group whose nodes hold different
    numbers of its ranks (a torch subgroup, a DDP process_group) cannot run the
    node-aware allreduce; it uses MPI's."""
    if name == "node":
        groups = NodeGroups(comm)
        if groups.why_not() is None:
            return NodeAwareAllreduce(comm, cuda, groups)
        groups.free()
        name = "mpi"
    return REDUCTIONS[name](comm, cuda)


class Reductions:
    """The reductions of one communicator, and the one in use.

    Args:
        comm: the communicator.
        cuda: the CUDA API.
        name: the reduction in use at first (``REDUCTIONS``).
    """

    def __init__(self, comm, cuda, name: str):
        self.comm, self.cuda = comm, cuda
        self._made: Dict[str, Reduction] = {}
        self.use(name)

    def _get(self, name: str) -> Reduction:
        if name not in self._made:
            self._made[name] = make_reduction(name, self.comm, self.cuda)
        return self._made[name]

    def use(self, name: str) -> None:
        """Carry out allreduces started from now on by ``name``; those already started
        finish as they were issued.

        .. warning:: Collective, at the same point on every rank: ranks reducing one
           buffer by different algorithms would wait for each other forever.
        """
        if name not in REDUCTIONS:
            raise ValueError(f"reduction={name!r}; use one of {sorted(REDUCTIONS)}")
        self.current = self._get(name)

    def for_tensor(self, tensor: torch.Tensor, on_device: bool) -> Reduction:
        """The reduction for ``tensor`` (``for_buffer``)."""
        current = self.current
        name = for_buffer(
            current.name, tensor.numel() * tensor.element_size(),
            current.slice_bytes, on_device, self.comm.size,
            tensor.dtype in (torch.float16, torch.bfloat16))
        return current if name == current.name else self._get(name)

    def free(self) -> None:
        """Free what the reductions hold (the node-aware allreduce's communicators)."""
        for reduction in self._made.values():
            reduction.free()
        self._made = {}
