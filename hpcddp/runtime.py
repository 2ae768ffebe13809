"""``init()``, ``get_world()``, ``shutdown()``: the one owner of hpcddp's state in a process.

``init()`` creates the ``World`` (the library's private communicators, device and
threads), registers the ``"hpcddp"`` torch.distributed backend and initializes its
default group, and installs the abort-on-error hook. Everything hpcddp opens on MPI
afterwards (DDP wrappers, loaders, process groups, the progress thread) registers with
``hpcddp.comm.lifetime``; ``shutdown()`` closes it all, newest first, and frees the
world last. ``finalize()`` does the same and then finalizes MPI, for a process that
must leave MPI before it exits (the preemption path).
"""

from typing import Optional

from mpi4py import MPI

from hpcddp.comm import lifetime
from hpcddp.comm.abort import install_abort_hook, uninstall_abort_hook
from hpcddp.env import get_setting
from hpcddp.process_group import destroy_default_group, init_default_group, register_backend
from hpcddp.world import World

__all__ = ["finalize", "get_world", "init", "shutdown"]

_WORLD: Optional[World] = None


def init(comm=None, *, torch_group: Optional[bool] = None) -> World:
    """Join the job: bind devices and threads and set up torch.distributed on MPI.

    Idempotent: later calls return the same ``World``.

    Args:
        comm: an mpi4py communicator to train on; COMM_WORLD by default. hpcddp works
            on a private duplicate of it.
        torch_group: initialize torch.distributed's default group on MPI (unless one is
            already initialized). Defaults to ``HPCDDP_TORCH_GROUP`` (on).

    Returns:
        The ``World`` of this rank.

    Raises:
        SingletonLaunchError: the launcher started several processes but MPI sees one.
        RuntimeError: called again with a different communicator.

    Example::

        world = hpcddp.init()
        model = hpcddp.DistributedDataParallel(model.to(world.device))

    .. warning:: Collective: every rank of ``comm`` must call it.
    """
    global _WORLD
    if _WORLD is not None:
        if comm is not None and comm != _WORLD.parent:
            raise RuntimeError(
                "hpcddp.init() was already called with another communicator; call "
                "hpcddp.shutdown() first to switch communicators")
        return _WORLD
    _WORLD = World(comm)
    register_backend(_world_for_backend)
    if get_setting("TORCH_GROUP") if torch_group is None else torch_group:
        init_default_group(_WORLD)
    # After torch's group: torch wraps sys.excepthook at init_process_group and buffers
    # what the hook it wraps prints, which an abort inside it would lose.
    if get_setting("ABORT_ON_ERROR"):
        install_abort_hook(_WORLD.comm)
    return _WORLD


def get_world() -> World:
    """Return the ``World`` of ``hpcddp.init()``, initializing on first use."""
    return _WORLD if _WORLD is not None else init()


def _world_for_backend() -> World:
    """The World for a group torch asks the backend for; it must not start torch's
    default group again (torch is creating one)."""
    return _WORLD if _WORLD is not None else init(torch_group=False)


def shutdown() -> None:
    """Undo ``init()``: close what hpcddp opened on MPI, newest first, then the world.

    DDP wrappers, loaders and process groups still open are closed (their
    communicators freed, MPI-IO files closed), torch.distributed's default group is
    destroyed if it is hpcddp's, and the world's communicators are freed.

    .. warning:: Collective.
    """
    global _WORLD
    if _WORLD is None:
        return
    destroy_default_group()
    uninstall_abort_hook()
    lifetime.close_all()
    _WORLD = None


def finalize() -> None:
    """``shutdown()``, then ``MPI_Finalize``: nothing of hpcddp is left open in MPI.

    .. warning:: Collective; MPI cannot be used afterwards in this process.
    """
    shutdown()
    lifetime.close_all()
    if not MPI.Is_finalized():
        MPI.Finalize()
