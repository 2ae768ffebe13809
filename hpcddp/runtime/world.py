"""``World``: where MPI meets torch.

Binds each rank to its device and thread count and decides CUDA-awareness. ``World``
owns the library's private communicators; ``hpcddp.runtime`` owns the ``World``.
"""

import importlib.util
import os
import socket
import warnings
from typing import Optional, Sequence, Tuple

import torch
from mpi4py import MPI

from hpcddp.comm import activity, backoff, serial
from hpcddp.comm.lifetime import Closable, free_comm
from hpcddp.comm.outcome import decide_on_root
from hpcddp.comm.ranks import by_value, ranks_text
from hpcddp.comm.serial import serialize
from hpcddp.comm.thread_level import thread_level_name
from hpcddp.comm.topology import clone_comm, forget_segment_names, node_layout
from hpcddp.env import (ConfigError, SingletonLaunchError, check_not_singleton, detect_launcher,
                        get_setting)
from hpcddp.env.torch_threads import choose_threads, torch_default
from hpcddp.startup.cuda_aware import detect_cuda_aware, info_value
from hpcddp.startup.mpi_init import JOB_SEGMENTS, unlink_mapped_segments
from hpcddp.startup.mpi_library import (library_version_line, mpich_network_module, rdma_devices,
                                     ucx_on_tcp_advice)
from hpcddp.transport.allreduce import policy

__all__ = ["World", "device_index", "device_self_test"]


def _machine() -> str:
    """This kernel's boot id: one for every node that is a container or a namespace of
    the same machine (their hostnames differ, their cores are the same); the hostname
    where the kernel does not say."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def _cpus_for_rank(local_comm, comm) -> Tuple[int, bool]:
    """Cores this rank may use: its affinity mask shared among the local ranks it overlaps;
    and whether the ranks on this machine whose masks overlap it outnumber its cores (an
    oversubscribed node, or nodes emulated on one machine).

    Launchers differ: mpiexec gives every rank the whole node, srun with binding gives
    each its own cores, and torch's default thread count follows neither (it differs
    between the two on the same node).
    """
    mine = set(os.sched_getaffinity(0))
    masks = local_comm.allgather(sorted(mine))
    sharing = sum(1 for mask in masks if mine.intersection(mask))
    here = _machine()
    everyone = comm.allgather((here, sorted(mine)))
    crowd = sum(1 for machine, mask in everyone if machine == here and mine.intersection(mask))
    return max(1, len(mine) // max(1, sharing)), crowd > len(mine)


def _check_threads(comm, asked: int) -> int:
    """``HPCDDP_NUM_THREADS``, refused on every rank if any rank has fewer cores.

    Far more threads than cores only slow a rank down, and torch crashes on absurd
    counts (100000 threads: a segmentation fault).

    .. warning:: Collective.
    """
    cores = len(os.sched_getaffinity(0))
    short = comm.allgather(cores if asked > cores else None)
    bad = [(rank, have) for rank, have in enumerate(short) if have is not None]
    if bad:
        said = ", ".join(f"rank {rank} may use {have}" for rank, have in bad[:4])
        raise ConfigError(f"HPCDDP_NUM_THREADS={asked} asks for more torch threads than "
                          f"there are cores ({said}). Use at most that many, or 0 to divide "
                          f"each rank's cores among the ranks sharing them")
    return asked


_TORCH_PAIR_SETUP = r"""
import torch
if not torch.cuda.is_available():
    raise SystemExit("no CUDA device: torch.cuda.is_available() is False")
torch.cuda.set_device(rank % torch.cuda.device_count())
make = lambda n, value: torch.full((n,), value, dtype=torch.float32, device="cuda")
sync = torch.cuda.synchronize
get = lambda a: a.cpu().numpy()
"""


def device_self_test():
    """Run the two-process device-buffer checks of ``hpcddp.startup.selftest`` (Isend/Irecv,
    then Iallreduce), on CuPy arrays where CuPy is installed, else on torch tensors.

    Returns:
        a ``DeviceVerdict``; its ``reduction`` is what ``HPCDDP_REDUCE=auto`` uses.
    """
    from hpcddp.startup.selftest import CUPY_PAIR_SETUP, pair_launcher, run_device_checks
    setup = CUPY_PAIR_SETUP if importlib.util.find_spec("cupy") else _TORCH_PAIR_SETUP
    launcher = get_setting("SELFTEST_LAUNCHER")
    return run_device_checks(setup, pair_launcher(launcher) if launcher else None)


def device_index(local_rank: int, visible: Sequence[Optional[str]], count: int) -> int:
    """The GPU index, among the ``count`` this rank sees, that local rank ``local_rank`` uses.

    ``visible`` holds every local rank's ``CUDA_VISIBLE_DEVICES`` (None where unset).
    Ranks that see the same GPUs share them out by their order among themselves: with
    the node's GPUs visible to all, local rank r takes GPU r (modulo the count, when
    ranks outnumber GPUs); a rank given GPUs of its own by the launcher (``srun
    --gpus-per-task``, ``--gpu-bind``) takes the first of them.
    """
    mine = visible[local_rank]
    position = sum(1 for other in visible[:local_rank] if other == mine)
    return position % count


def _bind_device(local_comm) -> torch.device:
    visible = local_comm.allgather(os.environ.get("CUDA_VISIBLE_DEVICES"))
    if not torch.cuda.is_available():
        return torch.device("cpu")
    index = device_index(local_comm.rank, visible, torch.cuda.device_count())
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


class World(Closable):
    """This rank's place in the job.

    Attributes:
        rank, size: in ``comm``.
        local_rank, local_size: among the ranks sharing this node's memory.
        node_rank, num_nodes: the node numbering.
        comm: a private duplicate of the communicator given to ``init``.
        local_comm: the node-local communicator.
        device: the ``torch.device`` this rank computes on.
        cuda_aware: whether MPI is given CUDA device buffers; ``cuda_aware_reason`` says why.
        device_verdict: the device-buffer self-test's ``DeviceVerdict`` where it ran (MPI
            reported CUDA support and no ``HPCDDP_CUDA_AWARE`` override), else None.
        device_reductions: whether MPI's own reducing collectives (``Ireduce``,
            ``Ireduce_scatter``) are given device buffers: where MPI is CUDA-aware and
            the self-test did not see its device ``Iallreduce`` fail; else staged.
        reduction: how allreduces are carried out, ``"mpi"`` (MPI's ``Iallreduce``) or
            ``"ring"`` (hpcddp's ring of point-to-point); ``reduction_reason`` says why.
        is_main: true on rank 0, the rank that prints and writes.
        launcher: the launcher that started this process, as text.
        num_threads: torch's intra-op thread count on this rank.
        cores: the cores this rank may use (its affinity mask, shared among the local
            ranks whose masks overlap it).
        oversubscribed: more ranks share this rank's cores than there are (counting the
            ranks of every node on this machine: emulated nodes share it); hpcddp's waits
            for MPI then pause (sleep) from the first poll instead of spinning first.
        yields: whether they do (``oversubscribed``, unless ``HPCDDP_YIELD`` says).
        thread_level: MPI's thread level ("multiple", ...).
        timeout: seconds an hpcddp wait may last before the job ends (0: no limit).
        watchdog: the ``hpcddp.faults.watchdog.Watchdog`` that enforces it.

    ``close()`` frees the communicators (``hpcddp.shutdown()`` does it).
    """

    _what = "hpcddp World"

    def __init__(self, comm=None, timeout: Optional[float] = None):
        parent = serialize(MPI.COMM_WORLD if comm is None else comm)
        try:
            check_not_singleton(serialize(MPI.COMM_WORLD).size)
        except SingletonLaunchError:
            # Refused, this process is still MPI's singleton, whose segments no other
            # process can attach to (Open MPI 5 leaves its own even after MPI_Finalize).
            unlink_mapped_segments(pattern=JOB_SEGMENTS)
            raise
        self.parent = parent
        self.comm = clone_comm(parent, timeout=timeout, what="hpcddp.init()")
        activity.set_reference(self.comm)  # reports name ranks of this world
        activity.channel_for(self.comm, "world")
        layout = node_layout(self.comm)
        self.local_comm = layout.local_comm
        # A job that ends without MPI_Finalize leaves no MPICH segment in /dev/shm.
        self.segments_unlinked = forget_segment_names(self.local_comm)
        self.rank, self.size = self.comm.rank, self.comm.size
        self.local_rank, self.local_size = layout.local_rank, layout.local_size
        self.node_rank, self.num_nodes = layout.node_rank, layout.num_nodes
        self.is_main = self.rank == 0
        self.hostname = socket.gethostname()
        # Each rank's node, for reports, and whether it has an RDMA device (UCX's transport).
        seen = self.comm.allgather((self.hostname, rdma_devices()))
        self.hosts = [host for host, _ in seen]
        self.network_module = mpich_network_module()  # None: not MPICH's ch4
        self._tcp_hosts = sorted({host for host, devices in seen if not devices})
        self.launcher = detect_launcher().describe()
        self.device = _bind_device(self.local_comm)
        cores, self.oversubscribed = _cpus_for_rank(self.local_comm, self.comm)
        self.cores = cores
        forced = get_setting("YIELD")  # None: auto, no wait spins where ranks outnumber cores
        self.yields = self.oversubscribed if forced is None else forced
        backoff.give_way(self.yields)
        self.num_threads, self.threads_reason = choose_threads(
            _check_threads(self.comm, get_setting("NUM_THREADS")), os.environ,
            torch.get_num_threads(), torch_default(), cores)
        torch.set_num_threads(self.num_threads)
        self.thread_level = thread_level_name()
        override = get_setting("CUDA_AWARE")
        kinds = serial.call(info_value, self.comm, "mpi_memory_alloc_kinds")
        aware = detect_cuda_aware(kinds, override)
        self.device_verdict = None  # the two-process self-test's, where it ran
        self.cuda_aware, self.cuda_aware_reason = aware.aware, aware.reason
        if aware.aware and override is None and torch.cuda.is_available():
            self._confirm_cuda_aware()
        self._choose_reduction(get_setting("REDUCE"))
        # MPI's own reducing collectives (Ireduce, Ireduce_scatter) reduce with host code
        # where its device Iallreduce does: device buffers go to them only where that passed.
        verdict = self.device_verdict
        self.device_reductions = self.cuda_aware and (verdict is None or verdict.iallreduce.passed)
        self._opened()

    def network_advice(self) -> Optional[str]:
        """What to set where MPICH's UCX module carries this job over TCP between nodes
        (a site's MPICH; the mpich wheel runs ofi unless told otherwise), else None."""
        if self.num_nodes > 1 and self.network_module == "ucx" and self._tcp_hosts:
            return ucx_on_tcp_advice(self._tcp_hosts)
        return None

    def _choose_reduction(self, setting: str) -> None:
        """Apply ``HPCDDP_REDUCE``: the allreduce algorithm, and staging when asked for.

        .. warning:: Collective: ranks on different algorithms would never match.
        """
        seen = by_value(self.comm.allgather(setting))
        if len(seen) > 1:
            said = "; ".join(f"{value} on ranks {ranks_text(ranks)}" for value, ranks in seen)
            raise ConfigError(f"HPCDDP_REDUCE differs between ranks ({said}); ranks reducing "
                              f"by different algorithms would wait for each other forever. "
                              f"Set the same value for every rank")
        if setting == "staged" and self.cuda_aware:
            self.cuda_aware = False
            self.cuda_aware_reason += "; HPCDDP_REDUCE=staged: staging through host memory"
        on_gpu = self.device.type == "cuda"
        # Open MPI's default allreduce uses a link one way at a time between nodes;
        # agreed, so that a setting given to some ranks only cannot split the choice.
        halves = library_version_line().startswith("Open MPI") and \
            policy.OMPI_MCA_ALLREDUCE not in os.environ
        self.reduction_facts = policy.WorldFacts(
            nodes=self.num_nodes, ranks_per_node=self.local_size,
            uniform=len(set(self.comm.allgather(self.local_size))) == 1,
            buffers=policy.DEVICE if self.cuda_aware and on_gpu else
            policy.PINNED if on_gpu else policy.HOST,
            mpi_halves_links=all(self.comm.allgather(halves)))
        verdict = self.device_verdict
        device_ring = None if verdict is None or verdict.reduction != "ring" else \
            f"{verdict.iallreduce.reason}, while {verdict.p2p.reason}"
        self.reduction, self.reduction_reason = policy.for_world(
            setting, self.reduction_facts, device_ring)

    def _confirm_cuda_aware(self) -> None:
        """Run the two-process device-buffer checks once (on rank 0) and keep the verdict:
        staging where point-to-point fails, the ring where only MPI's Iallreduce does.

        .. warning:: Collective.
        """
        verdict = decide_on_root(self.comm, device_self_test, what="device-buffer self-test")
        self.device_verdict = verdict
        if verdict.reduction != "staged":
            self.cuda_aware_reason += f"; {verdict.describe()}"
            return
        self.cuda_aware = False
        self.cuda_aware_reason += f"; but {verdict.describe()}"
        if self.is_main:
            warnings.warn(f"hpcddp: MPI reports CUDA support, but {verdict.p2p.reason}; "
                          f"gradients are staged through pinned host memory instead. Set "
                          f"HPCDDP_CUDA_AWARE=0 to skip the test, or fix the MPI's CUDA "
                          f"support (e.g. UCX_TLS with cuda_copy, MPICH_GPU_SUPPORT_ENABLED=1)",
                          stacklevel=3)

    def barrier(self) -> None:
        """Wait until every rank arrives.

        .. warning:: Synchronization point.
        """
        with activity.named("World.barrier()"):
            self.comm.Barrier()

    def _release(self) -> None:
        for comm in (self.local_comm, self.comm):
            free_comm(comm)

    free = Closable.close

    def __repr__(self):
        return (f"World(rank={self.rank}, size={self.size}, local_rank={self.local_rank}, "
                f"local_size={self.local_size}, node_rank={self.node_rank}, "
                f"num_nodes={self.num_nodes}, device={self.device}, "
                f"cuda_aware={self.cuda_aware}, reduction={self.reduction})")
