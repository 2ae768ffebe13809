"""Horovod's basic API on hpcddp's world: start and stop, ranks and sizes, what is built.

``init()`` starts hpcddp (``hpcddp.init()``: device binding, thread counts, the
watchdog, the torch.distributed group) on the communicator Horovod would use, then the
negotiation engine (``engine.py``) over it. Every query but the build queries raises
Horovod's ``ValueError`` before ``init()``; the build queries answer what this package
carries: MPI always, never Gloo, NCCL, DDL, oneCCL or ROCm, CUDA where torch has it.

Example::

    import hpcddp.horovod as hvd
    hvd.init()
    torch.cuda.set_device(hvd.local_rank())   # where there are GPUs
"""

import atexit
import os
import threading
import warnings
from typing import Optional, Sequence, Union

from hpcddp.horovod import process_sets as _sets
from hpcddp.horovod.common import (  # noqa: F401 - their public home
    NOT_INITIALIZED, OP_NAMES, Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt,
    Max, Min, Product, Sum)

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "HorovodInternalError",
           "HostsUpdatedInterrupt", "init", "shutdown", "is_initialized", "size", "rank",
           "local_size", "local_rank", "cross_size", "cross_rank", "is_homogeneous",
           "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled",
           "gloo_built", "nccl_built", "ddl_built", "ccl_built", "cuda_built",
           "rocm_built", "start_timeline", "stop_timeline", "check_average"]

class _State:
    def __init__(self):
        self.lock = threading.Lock()
        self.world = None    # hpcddp's World over Horovod's communicator
        self.engine = None   # engine.Engine
        self.cross_rank = self.cross_size = 0
        self.homogeneous = True
        self.exit_registered = False


_state = _State()


def _communicator(comm):
    """The mpi4py communicator Horovod's ``comm`` argument names (None: the world)."""
    from mpi4py import MPI

    if comm is None:
        return None
    if isinstance(comm, MPI.Comm):
        return comm
    try:
        ranks = sorted(int(r) for r in comm)
    except TypeError:
        raise ValueError("Invalid type of argument comm. Expected list of rank integers or "
                         "mpi4py.MPI.Comm object.") from None
    if not ranks:
        return None
    world = MPI.COMM_WORLD
    bad = [r for r in ranks if not 0 <= r < world.size]
    if bad:
        raise ValueError(f"hvd.init(comm={comm!r}): ranks {bad} are not ranks of "
                         f"MPI_COMM_WORLD (size {world.size})")
    if world.rank not in ranks:
        raise ValueError(f"hvd.init(comm={comm!r}): this process, rank {world.rank} of "
                         f"MPI_COMM_WORLD, is not in the list; start Horovod on the "
                         f"processes it names only, or add this rank")
    return world.Create_group(world.group.Incl(ranks))


def init(comm: Optional[Union[Sequence[int], "object"]] = None,
         process_sets: Optional[Union[Sequence["_sets.ProcessSet"], str]] = None) -> None:
    """Start Horovod: ``hpcddp.init()`` on ``comm``, then the engine and process sets.

    Args:
        comm: None (every rank of ``MPI_COMM_WORLD``), a list of ranks of it, or an
            mpi4py communicator (duplicated, as Horovod does).
        process_sets: ``ProcessSet`` objects to set up now besides the global one, or
            ``"dynamic"`` to allow ``add_process_set`` later (also
            ``HOROVOD_DYNAMIC_PROCESS_SETS=1``).

    A second call while Horovod runs does nothing.

    .. warning:: Collective over ``comm``.
    """
    from hpcddp import runtime, timeline
    from hpcddp.env import get_setting
    from hpcddp.comm.owner import OWNER
    from hpcddp.horovod import affinity, lanes
    from hpcddp.horovod.engine import Engine
    from hpcddp.horovod.settings import log_level, unheeded
    from hpcddp.timeline.profiler import start_timeline

    with _state.lock:
        if _state.engine is not None:
            return
        if isinstance(process_sets, str):
            if process_sets.lower() != "dynamic":
                raise ValueError(f"hvd.init(process_sets={process_sets!r}): give a list of "
                                 f"ProcessSet objects or 'dynamic'")
            os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
            process_sets = []
        base = _communicator(comm)
        world = runtime.current_world()
        trace = os.environ.get("HOROVOD_TIMELINE") or None
        if trace == "DYNAMIC":  # Horovod's: start_timeline() starts it later
            trace = None
        lanes.mark_cycles(os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "0") not in ("", "0"))
        if world is None:
            world = runtime.init(base, timeline=trace if not get_setting("TIMELINE") else None)
        elif trace and not timeline.recording():
            start_timeline(trace, world.comm)
        elif base is not None and world.size != base.size:
            raise ValueError(f"hvd.init(comm=...): hpcddp already runs on {world.size} "
                             f"ranks, not on the {base.size} this comm holds; call "
                             f"hvd.init(comm) before hpcddp.init(), or hvd.init() alone")
        _require_helper_thread()
        _state.world = world
        node_ranks = world.comm.allgather((world.node_rank, world.local_rank))
        per_node = {}
        for node, _ in node_ranks:
            per_node[node] = per_node.get(node, 0) + 1
        _state.homogeneous = len(set(per_node.values())) == 1
        # Horovod's cross communicator: the ranks of every node with this local rank.
        same_local = [node for node, local in node_ranks if local == world.local_rank]
        _state.cross_size = len(same_local)
        _state.cross_rank = sorted(same_local).index(world.node_rank)
        log_level()
        _state.engine = Engine(world)
        affinity.place(OWNER.thread, world)
        if world.rank == 0:
            for line in unheeded(os.environ):
                warnings.warn(f"hvd.init(): {line}", stacklevel=2)
        _sets.start(_state.engine, list(process_sets or []))
        if not _state.exit_registered:
            atexit.register(shutdown)
            _state.exit_registered = True


def _require_helper_thread() -> None:
    """The engine runs on hpcddp's MPI thread beside the threads that call ``hvd``, which
    needs ``MPI_THREAD_SERIALIZED`` or more."""
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        raise ValueError("hvd.init(): MPI was started below MPI_THREAD_SERIALIZED, and "
                         "Horovod's engine runs on hpcddp's MPI thread; leave mpi4py's "
                         "thread level at its default (multiple) or set "
                         "MPI4PY_RC_THREAD_LEVEL=serialized")


def shutdown() -> None:
    """Stop the engine (pending operations fail with ``HorovodInternalError``); hpcddp's
    world stays for ``hpcddp.shutdown()``. ``init()`` may be called again after it."""
    with _state.lock:
        engine, _state.engine = _state.engine, None
    if engine is not None:
        _sets.stop()
        engine.close()


def abandon() -> None:
    """Let the engine go without a collective (a recovery inside the job: its
    communicators are revoked); ``init()`` on the rebuilt world starts a new one."""
    with _state.lock:
        engine, _state.engine = _state.engine, None
    if engine is not None:
        _sets.stop()
        engine.abandon()


def is_initialized() -> bool:
    """Whether Horovod runs (``init()`` called, ``shutdown()`` not)."""
    return _state.engine is not None


def engine():
    """The running engine; ``ValueError`` before ``init()``."""
    found = _state.engine
    if found is None:
        raise ValueError(NOT_INITIALIZED)
    return found


def _world():
    if _state.engine is None:
        raise ValueError(NOT_INITIALIZED)
    return _state.world


def size() -> int:
    """The number of Horovod processes."""
    return _world().size


def rank() -> int:
    """This process's Horovod rank."""
    return _world().rank


def local_size() -> int:
    """The number of Horovod processes on this node."""
    return _world().local_size


def local_rank() -> int:
    """This process's rank among those on its node."""
    return _world().local_rank


def cross_size() -> int:
    """The number of nodes with a process of this local rank."""
    _world()
    return _state.cross_size


def cross_rank() -> int:
    """The rank of this node among those with a process of this local rank."""
    _world()
    return _state.cross_rank


def is_homogeneous() -> bool:
    """Whether every node runs the same number of processes."""
    _world()
    return _state.homogeneous


def mpi_threads_supported() -> bool:
    """Whether MPI runs at ``MPI_THREAD_MULTIPLE``."""
    from mpi4py import MPI

    _world()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """MPI carries every operation (there is no other controller)."""
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """0: no NCCL (Horovod returns NCCL's version code where it has it)."""
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """Whether CUDA tensors can be reduced (torch built with CUDA)."""
    import torch

    return torch.version.cuda is not None


def rocm_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record the timeline into ``file_path`` from now (hpcddp's Chrome trace, a lane per
    tensor, written as the job runs); one being recorded into another file is written
    first. ``mark_cycles``: a ``CYCLE_START`` moment for each negotiation round of the
    coordinator. As in Horovod, the job must run with ``HOROVOD_TIMELINE`` set
    (``DYNAMIC``: nothing is recorded until this call).

    .. warning:: Collective.
    """
    from hpcddp import timeline
    from hpcddp.horovod import lanes
    from hpcddp.timeline.profiler import start_timeline as start

    world = _world()
    if not os.environ.get("HOROVOD_TIMELINE"):
        raise ValueError("Set HOROVOD_TIMELINE=DYNAMIC to enable dynamic timeline usage.")
    lanes.mark_cycles(bool(mark_cycles))
    recorder = timeline.current()
    if recorder is not None:
        if os.path.abspath(recorder.path) == os.path.abspath(file_path):
            return
        recorder.close()
    start(file_path, world.comm)


def stop_timeline() -> None:
    """Write the timeline being recorded (on rank 0) and stop recording.

    .. warning:: Collective.
    """
    from hpcddp import timeline

    _world()
    recorder = timeline.current()
    if recorder is not None:
        recorder.close()


def check_average(op, average):
    """Horovod's op from its deprecated ``average=`` and ``op=`` arguments."""

    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one "
                             "of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed "
                      "in v1.0", DeprecationWarning)
        return Average if average else Sum
    return Average
