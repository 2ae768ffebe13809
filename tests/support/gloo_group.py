"""torch's gloo process group over TCP, made beside hpcddp's (the reference)."""

import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def _store_host(world):
    """Loopback on one node; across nodes, rank 0's address as its hostname resolves."""
    return "127.0.0.1" if world.num_nodes == 1 else socket.gethostbyname(world.hostname)


def make_gloo_group(world):
    # Rank 0's store listens on a port the kernel picks (port 0) and says which; a port
    # found free beforehand can be taken by another job before the store binds it.
    store = None
    if world.rank == 0:
        store = dist.TCPStore(_store_host(world), 0, world.size, True,
                              timeout=timedelta(seconds=60), wait_for_workers=False)
    host, port = world.comm.bcast((store.host, store.port) if store is not None else None,
                                  root=0)
    if store is None:
        store = dist.TCPStore(host, port, world.size, False, timeout=timedelta(seconds=60))
    group = dist.ProcessGroup(store, world.rank, world.size)
    backend = dist.ProcessGroupGloo(store, world.rank, world.size, timedelta(seconds=60))
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:  # gloo reduces CUDA tensors through host memory
        group._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO,
                                backend)
    # Known to torch.distributed's rank tables, as a group from new_group() would be, so
    # that torch's Join can ask for this rank in it.
    dist.distributed_c10d._world.pg_group_ranks[group] = {r: r for r in range(world.size)}
    # Named, as new_group() names its groups, so a DeviceMesh can be built on it
    # (DeviceMesh.from_group) for FSDP2 on gloo.
    name = f"gloo-reference-{id(group)}"
    group._set_group_name(name)
    dist.distributed_c10d._world.pg_names[group] = name
    dist.distributed_c10d._register_process_group(name, group)
    return group, backend, store


def make_single_rank_gloo_group():
    """A gloo group of this rank alone (what ``dist.new_subgroups(group_size=1)`` makes)."""
    store = dist.HashStore()
    group = dist.ProcessGroup(store, 0, 1)
    backend = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=60))
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)
    return group, backend, store
