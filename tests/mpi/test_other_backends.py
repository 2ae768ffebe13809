"""Groups of another backend beside hpcddp's default group: torch makes them through the
default group's store (gloo's ranks swap addresses there), which rank 0 serves and a
process joins only when something first needs it. Checked against the sums themselves
and against torch's own gloo group made the usual way."""

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from hpcddp.backend.shared_store import SharedStore


def _default_store():
    return dist.distributed_c10d._get_default_store()


def test_hpcddp_groups_open_no_connection(world):
    # MPI alone starts the job: before anything asks for another backend's group, no
    # rank has touched TCP, and rank 0 serves no store (below MPI_THREAD_SERIALIZED,
    # where no thread may answer a question later, it opens it at init()).
    group = dist.new_group(list(range(world.size)))  # hpcddp's backend
    dist.barrier(group)
    store = _default_store()
    inner = store.underlying_store if hasattr(store, "underlying_store") else store
    assert isinstance(inner, SharedStore)
    connected = world.comm.allgather(inner.connected)
    assert not any(connected), f"ranks connected to the store: {connected}"
    serving = world.comm.allgather(inner.broker.serving)
    assert serving == [world.thread_level not in ("multiple", "serialized")] + \
        [False] * (world.size - 1), serving


def test_a_client_without_the_jobs_secret_finds_no_key(world):
    # Anyone who reaches the store's port can connect (torch's TCPStore authenticates
    # nobody); the keys are under the secret that rank 0 sent the ranks through MPI.
    store = _default_store()
    inner = store.underlying_store if hasattr(store, "underlying_store") else store
    inner.set(f"probe-{world.rank}", b"the job's")
    world.comm.Barrier()
    if world.rank == 0:
        host, port = inner.broker.where()
        outsider = dist.TCPStore(host, port, world.size, False, timeout=timedelta(seconds=2))
        keys = [f"probe-{r}" for r in range(world.size)]
        assert not outsider.check(keys)
        with pytest.raises(Exception):  # a key it names is one it waits for in vain
            outsider.get("probe-0")
        secret = inner.broker.secret
        assert len(secret) == 32 and outsider.check([f"{secret}/{k}" for k in keys])
        if world.num_nodes == 1:
            assert host == "127.0.0.1"
    world.comm.Barrier()


def test_a_gloo_group_beside_hpcddps_default_group_works(world, gloo):
    group = dist.new_group(backend="gloo")
    assert dist.get_backend(group) == "gloo"
    mine = torch.arange(5, dtype=torch.float64) * (world.rank + 1)
    summed = mine.clone()
    dist.all_reduce(summed, group=group)
    reference = mine.clone()
    dist.all_reduce(reference, group=gloo)  # torch's gloo group, made with its own store
    torch.testing.assert_close(summed, reference, rtol=0, atol=0)
    everyone = [None] * world.size
    dist.all_gather_object(everyone, {"rank": world.rank}, group=group)
    assert everyone == [{"rank": r} for r in range(world.size)]
    # What gloo alone offers, on the gloo group.
    dist.monitored_barrier(group=group)
    dist.destroy_process_group(group)


def test_a_gloo_group_of_some_ranks(world):
    if world.size < 3:
        pytest.skip("needs a rank outside the group")
    members = [0, world.size - 1]
    group = dist.new_group(members, backend="gloo")
    if world.rank in members:
        value = torch.tensor([float(world.rank)])
        dist.all_reduce(value, group=group)
        assert value.item() == float(sum(members))
    else:
        assert group == dist.GroupMember.NON_GROUP_MEMBER
    dist.barrier()
