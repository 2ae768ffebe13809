"""hpcddp's torch.distributed groups: the group made when torch asks the ``"hpcddp"``
backend for one, torch's default group on MPI, and the communicator behind a group.
"""

import torch
import torch.distributed as dist

from hpcddp.backend.process_group import BACKEND, MPIProcessGroup
from hpcddp.backend.shared_store import forget_shared_store, shared_store
from hpcddp.torch_compat import backend_of

__all__ = ["comm_of", "destroy_default_group", "dist_is_hpcddp", "group_for",
           "init_default_group"]


def comm_of(group):
    """Return the mpi4py communicator behind an hpcddp process group (None: the default)."""
    group = group if group is not None else dist.group.WORLD
    backend = group
    if not isinstance(group, MPIProcessGroup):
        try:
            backend = backend_of(group, torch.device("cpu"))
        except RuntimeError:
            backend = None
    if not isinstance(backend, MPIProcessGroup):
        raise TypeError(f"process group {group!r} is not an hpcddp (MPI) group; pass an "
                        f"mpi4py communicator or a group created after hpcddp.init()")
    return backend.comm


def group_for(world, options) -> MPIProcessGroup:
    """The group torch asks the ``"hpcddp"`` backend for (``hpcddp.backend.torch_init``
    registers it): on a duplicate of ``world``'s communicator, or of the part of it that
    holds ``options.global_ranks_in_group``, with the group's ``timeout`` on every wait
    (torch's default is 30 minutes; ``HPCDDP_TIMEOUT``'s watchdog ends the job at 10).

    .. warning:: Collective over the group's ranks.
    """
    ranks = list(options.global_ranks_in_group or [])
    if not ranks or ranks == list(range(world.size)):
        comm = world.comm.Dup()
    else:
        comm = world.comm.Create_group(world.comm.group.Incl(ranks))
    comm.Set_name(f"hpcddp.torch.{options.group_id}")
    timeout = getattr(options, "timeout", None)
    seconds = timeout.total_seconds() if timeout is not None else 0.0
    return MPIProcessGroup(comm, world.cuda_aware, owns_comm=True, reduction=world.reduction,
                           timeout=seconds if seconds > 0 else None,
                           device_reductions=world.device_reductions)


def init_default_group(world) -> bool:
    """Initialize torch.distributed's default group on MPI, unless one exists.

    Returns:
        True if hpcddp initialized it, False if the user already had one.
    """
    if dist.is_initialized():
        return False
    # Ranks find each other through MPI; the store is for groups of other backends.
    dist.init_process_group(BACKEND, store=shared_store(world), rank=world.rank,
                            world_size=world.size)
    return True


def dist_is_hpcddp() -> bool:
    """Whether torch.distributed's default group is hpcddp's."""
    return dist.is_initialized() and dist.get_backend() == BACKEND


def destroy_default_group() -> None:
    """Destroy torch.distributed's default group if it is hpcddp's."""
    if dist_is_hpcddp():
        dist.destroy_process_group()
        forget_shared_store()
