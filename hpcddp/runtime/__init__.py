"""``init()``, ``get_world()``, ``shutdown()``: the one owner of hpcddp's state in a process.

``init()`` creates the ``World`` (the library's private communicators, device and
threads), exports torchrun's variables from MPI where unset (``hpcddp.env.torchrun``:
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` ...), initializes torch.distributed's default
group on the ``"hpcddp"`` backend (``import hpcddp`` registered it: ``hpcddp.backend.torch_init``),
and installs the abort-on-error hook. Everything hpcddp opens on MPI afterwards (DDP
wrappers, loaders, process groups, the progress thread) registers with
``hpcddp.comm.lifetime``; ``shutdown()`` closes it all, newest first, and frees the
world last. ``finalize()`` does the same and then finalizes MPI, for a process that
must leave MPI before it exits (the preemption path)."""

import atexit
import gc
import os
import warnings
from datetime import timedelta
from typing import Optional, Union

from hpcddp.env import ConfigError, detect_launcher, get_setting, unknown_settings
from hpcddp.env.config import LOADER_WORKER_VARIABLE
from hpcddp.env.torchrun import disagreements, export, torchrun_values
from hpcddp.startup.mpi_init import refuse_in_child, start_mpi
from hpcddp.startup.tracker import keep_tracker_apart

# MPI starts here, bounded by HPCDDP_TIMEOUT (a rank that never starts MPI would hold
# the others in MPI_Init for good); the imports below would start it unbounded.
start_mpi(get_setting("TIMEOUT"))
# A launcher ends a rank with its whole process group; the names the rank's
# multiprocessing queues hold in /dev/shm are removed by a tracker outside it.
if detect_launcher().world_size is not None:
    keep_tracker_apart()

from mpi4py import MPI  # noqa: E402

from hpcddp.backend.groups import (destroy_default_group, dist_is_hpcddp,  # noqa: E402
                                   init_default_group)
from hpcddp.comm import lifetime  # noqa: E402
from hpcddp.comm.topology import MissingRanksError  # noqa: E402
from hpcddp.faults.abort import abort_job, install_abort_hook, uninstall_abort_hook  # noqa: E402
from hpcddp.faults.watchdog import Watchdog  # noqa: E402
from hpcddp.runtime.world import World  # noqa: E402
from hpcddp.timeline.profiler import connect as connect_timeline, start_timeline  # noqa: E402

__all__ = ["current_world", "finalize", "get_world", "init", "rejoin", "shutdown"]

_WORLD: Optional[World] = None
_state = {}


def _seconds(timeout) -> float:
    """``init``'s timeout (seconds or a timedelta; None: ``HPCDDP_TIMEOUT``) in seconds."""
    if timeout is None:
        return get_setting("TIMEOUT")
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not seconds >= 0:
        raise ValueError(f"hpcddp.init(timeout={timeout!r}): give seconds >= 0 (0: no "
                         f"limit) or a datetime.timedelta")
    return seconds


def init(comm=None, *, torch_group: Optional[bool] = None,
         timeout: Union[float, timedelta, None] = None, timeline: Optional[str] = None) -> World:
    """Join the job: bind devices and threads and set up torch.distributed on MPI.

    Idempotent: later calls return the same ``World``.

    Args:
        comm: an mpi4py communicator to train on; COMM_WORLD by default. hpcddp works
            on a private duplicate of it.
        torch_group: initialize torch.distributed's default group on MPI (unless one is
            already initialized). Defaults to ``HPCDDP_TORCH_GROUP`` (on).
        timeout: seconds (or a ``timedelta``) any hpcddp wait may last before the job
            ends with a report of where it is stuck (``hpcddp.faults.watchdog``); 0 waits
            for ever. Defaults to ``HPCDDP_TIMEOUT`` (600 s, as torch's). It also bounds
            the wait for every rank to reach ``init()``.
        timeline: record a timeline of every rank into this Chrome trace file, written
            at shutdown (``hpcddp timeline`` draws it). Defaults to ``HPCDDP_TIMELINE``
            (off).

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
    if os.environ.get(LOADER_WORKER_VARIABLE):
        raise RuntimeError(
            "hpcddp.init() ran in a ShardedLoader worker process: a spawned worker imports "
            "the training script again, and a worker must never join the MPI job. Put the "
            "training code under `if __name__ == \"__main__\":`")
    refuse_in_child()
    if _WORLD is not None:
        if comm is not None and comm != _WORLD.parent:
            raise RuntimeError(
                "hpcddp.init() was already called with another communicator; call "
                "hpcddp.shutdown() first to switch communicators")
        return _WORLD
    seconds = _seconds(timeout)
    try:
        world = World(comm, timeout=seconds)
    except MissingRanksError as error:
        abort_job(MPI.COMM_WORLD if comm is None else comm, str(error),
                  facts={"kind": "startup", "setting": "HPCDDP_TIMEOUT"})
    try:
        world.torchrun_exported = _export_torchrun_variables(world)
    except ConfigError:
        world.close()
        raise
    world.timeout = seconds
    world.watchdog = Watchdog(world.comm, seconds, get_setting("STALL_WARN"), world.hosts)
    if world.is_main:
        for message in unknown_settings():
            warnings.warn(message, stacklevel=2)
        if world.network_advice():  # before a fault can crash a rank, not after
            warnings.warn(f"hpcddp: {world.network_advice()}", stacklevel=2)
    _WORLD = world
    if get_setting("TORCH_GROUP") if torch_group is None else torch_group:
        init_default_group(_WORLD)
    # After torch's group: torch wraps sys.excepthook at init_process_group and buffers
    # what the hook it wraps prints, which an abort inside it would lose.
    if get_setting("ABORT_ON_ERROR"):
        install_abort_hook(_WORLD.comm, _WORLD.hosts)
    connect_timeline()
    trace = timeline if timeline is not None else get_setting("TIMELINE")
    if trace:
        start_timeline(trace, _WORLD.comm)
    _freeze_heap(get_setting("GC_FREEZE"))
    return _WORLD


def _freeze_heap(when: str) -> None:
    """``gc.freeze()`` at init, at exit or never (``HPCDDP_GC_FREEZE``).

    At exit it holds nothing of the script's: the interpreter's last collections need
    not walk torch's objects again. At init, a full collection during training, a pause
    on one rank that the others wait out at the next collective, skips them too, but
    also the script's objects made before ``init()``.
    """
    if when == "init":
        gc.freeze()
    if when != "off" and not _state.get("freeze_at_exit"):
        _state["freeze_at_exit"] = True
        # Registered after the watchdog's and lifetime's exit handlers, so it runs
        # before them (last in, first out), and before the interpreter's collections.
        atexit.register(gc.freeze)


def _export_torchrun_variables(world: World):
    """Give this process torchrun's variables from MPI (``hpcddp.env.torchrun``); return
    the names set. A launcher's value that MPI contradicts is an error on every rank.

    .. warning:: Collective over ``world.comm``.
    """
    values = torchrun_values(world.rank, world.size, world.local_rank, world.local_size,
                             world.node_rank, world.num_nodes)
    found = world.comm.allgather(disagreements(values, os.environ))
    said = [f"rank {rank}: {'; '.join(wrong)}" for rank, wrong in enumerate(found) if wrong]
    if said:
        more = f" (and {len(said) - 3} more ranks)" if len(said) > 3 else ""
        raise ConfigError(
            f"hpcddp.init(): torchrun's variables disagree with MPI: {' | '.join(said[:3])}"
            f"{more}. A framework reading them (Accelerate, Lightning, the Trainer) would "
            f"train as another rank than MPI's. Unset them and hpcddp.init() sets them "
            f"from MPI, or correct the launcher or script that set them")
    return export(values, os.environ)


def get_world() -> World:
    """Return the ``World`` of ``hpcddp.init()``, initializing on first use."""
    return _WORLD if _WORLD is not None else init()


def current_world() -> Optional[World]:
    """The ``World`` of ``hpcddp.init()``, or None before it (never initializes)."""
    return _WORLD


def world_for_torch() -> World:
    """The ``World`` for a group or rendezvous torch asks the ``"hpcddp"`` backend for
    (``hpcddp.backend.torch_init``): ``init()``'s, made without starting torch's default
    group (torch is creating one)."""
    return _WORLD if _WORLD is not None else init(torch_group=False)


def shutdown() -> None:
    """Undo ``init()``: close what hpcddp opened on MPI, newest first, then the world.

    DDP wrappers, loaders and process groups still open are closed (their
    communicators freed, MPI-IO files closed), torch.distributed's default group is
    destroyed if it is hpcddp's, the world's communicators are freed, and the torchrun
    variables ``init()`` exported are removed.

    .. warning:: Collective.
    """
    global _WORLD
    if _WORLD is None:
        return
    _WORLD.watchdog.depart()
    destroy_default_group()
    uninstall_abort_hook()
    lifetime.close_all()
    for name in getattr(_WORLD, "torchrun_exported", ()):  # a later init() may differ
        os.environ.pop(name, None)
    _WORLD = None


def rejoin(comm) -> World:
    """Start again on ``comm``, the survivors of a failure (``hpcddp.elastic``): the old
    world and all it opened let go of without a collective (``lifetime.abandon_all``),
    then ``init(comm)`` as at the start, torch's default group included if it was
    hpcddp's. What a ``DistributedDataParallel`` holds it rebuilds itself.

    .. warning:: Collective over ``comm``.
    """
    global _WORLD
    old = _WORLD
    had_group = old is not None and dist_is_hpcddp()
    lifetime.abandon_all()
    if had_group:
        destroy_default_group()  # its communicators are let go of already: local
    for name in getattr(old, "torchrun_exported", ()):
        os.environ.pop(name, None)
    _WORLD = None
    return init(comm, torch_group=had_group, timeout=old.timeout if old else None)


def finalize() -> None:
    """``shutdown()``, then ``MPI_Finalize``: nothing of hpcddp is left open in MPI.

    .. warning:: Collective; MPI cannot be used afterwards in this process.
    """
    shutdown()
    lifetime.before_finalize()
    if not MPI.Is_finalized():
        MPI.Finalize()
