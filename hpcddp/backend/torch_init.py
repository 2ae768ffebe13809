"""``dist.init_process_group("hpcddp")`` as a torch user writes it, under mpiexec or srun.

``import hpcddp`` registers the ``"hpcddp"`` backend with torch.distributed (at once if
torch.distributed is imported, else the moment it is: ``hpcddp.lazy.after_import``).
Frameworks and scripts written for torchrun then reach it the usual way: Lightning's
``DDPStrategy(process_group_backend="hpcddp")``, Accelerate, a script's own
``dist.init_process_group(backend="hpcddp")``.

torch's default ``env://`` rendezvous wants ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT``, and builds a TCP store on that port. An MPI job has none of them, and
needs none: rank and size come from MPI. For the ``hpcddp`` backend the ``env://``
rendezvous is answered from MPI instead (``hpcddp.init(torch_group=False)``, then the
store rank 0 serves for groups of other backends, ``hpcddp.backend.shared_store``): no variables,
no port to choose. A rank or world size that a framework
passes (Lightning's ``MPIEnvironment`` passes both, and sets its own ``MASTER_ADDR``) is
checked against MPI's. Other backends keep torch's rendezvous untouched.

``hpcddp.init()`` and ``init_process_group("hpcddp")`` give the same world, called in
either order: after ``hpcddp.init()`` has made the default group, a later
``init_process_group("hpcddp")`` through ``torch.distributed`` finds it and returns.
"""

import functools
import os
import sys
from typing import Callable
from urllib.parse import parse_qs, urlparse

from hpcddp.env import ConfigError, detect_launcher
from hpcddp.env.config import LOADER_WORKER_VARIABLE
from hpcddp.torch_compat import default_group, rendezvous_handlers

__all__ = ["BACKEND", "TrainingAloneError", "names_hpcddp", "register", "watch_for_training_alone"]

# hpcddp.backend.process_group.BACKEND, not imported here: that module starts MPI, and
# registering must not (a spawned DataLoader worker imports hpcddp too).
BACKEND = "hpcddp"

_state = {}


def _world():
    return _state["world_source"]()


def _create_group(options, _pg_options):
    # Imported here: hpcddp.backend.groups starts MPI, only once a group is asked for.
    from hpcddp.backend.groups import group_for
    return group_for(_world(), options)


def register(world_source: Callable) -> None:
    """Make ``"hpcddp"`` a torch.distributed backend with its MPI rendezvous. Idempotent;
    starts no MPI.

    Args:
        world_source: returns hpcddp's ``World`` when torch first asks for a group or a
            rendezvous, initializing it without torch's default group
            (``hpcddp.runtime.world_for_torch``, which ``import hpcddp`` passes).
    """
    if _state.get("registered"):
        return
    _state["registered"], _state["world_source"] = True, world_source
    # Imported here, not above: this module must be importable before torch.distributed
    # (importing that runs register()).
    import torch.distributed as dist

    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create_group, extended_api=True,
                                      devices=["cpu", "cuda"])
    # (torch.distributed's own name "rendezvous" is the function, not the module.)
    handlers = rendezvous_handlers()
    handlers["env"] = functools.partial(_env_rendezvous, handlers["env"])
    wrapped = _init_once(dist.distributed_c10d.init_process_group)
    dist.init_process_group = dist.distributed_c10d.init_process_group = wrapped


def names_hpcddp(backend) -> bool:
    """Whether a backend string asks for hpcddp on every device ("hpcddp",
    "cpu:hpcddp,cuda:hpcddp")."""
    if backend is None:
        return False
    parts = [part.split(":")[-1].strip().lower() for part in str(backend).split(",")]
    return bool(parts) and all(part == BACKEND for part in parts)


def _requested_backend():
    """The backend of the ``init_process_group`` call this rendezvous runs for.

    torch hands a rendezvous handler the URL alone. The handler is a generator that
    ``init_process_group`` itself advances, so that call is a frame or two above.
    """
    import torch.distributed as dist

    frame = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            break
        if (frame.f_code.co_name == "init_process_group"
                and frame.f_globals.get("__name__") == dist.distributed_c10d.__name__):
            return frame.f_locals.get("backend")
        frame = frame.f_back
    return None


def _env_rendezvous(torch_env, url, *args, **kwargs):
    if not names_hpcddp(_requested_backend()):
        try:
            yield from torch_env(url, *args, **kwargs)
        except ValueError as error:
            size = detect_launcher().world_size or 1
            if size > 1 and "environment variable" in str(error):
                # Accelerate under mpiexec: another backend, and no MASTER_ADDR.
                raise ValueError(
                    f"{error}. This process is one of {size} that "
                    f"{detect_launcher().describe()} started: call hpcddp.init() at the "
                    f"start of the script, and torch.distributed gets its group from MPI "
                    f"with none of these variables") from error
            raise
        return
    query = {key: values[-1] for key, values in parse_qs(urlparse(url).query).items()}
    world = _world()
    _check_given(world, query.get("rank", os.environ.get("RANK")),
                 query.get("world_size", os.environ.get("WORLD_SIZE")))
    # Ranks find each other through MPI; the store is for groups of other backends.
    from hpcddp.backend.shared_store import shared_store  # starts MPI: imported here
    yield (shared_store(world), world.rank, world.size)
    raise RuntimeError("hpcddp's rendezvous cannot be repeated: the MPI job is fixed")


def _check_given(world, rank, world_size) -> None:
    """Refuse, on every rank, a rank or world size that differs from MPI's.

    .. warning:: Collective.
    """
    given = [(name, value, mine) for name, value, mine in
             (("rank", rank, world.rank), ("world_size", world_size, world.size))
             if value not in (None, "", "-1") and int(value) != mine]
    everyone = world.comm.allgather(given)
    wrong = [(r, g) for r, g in enumerate(everyone) if g]
    if wrong:
        rank_of, said = wrong[0]
        what = ", ".join(f"{name}={value} (MPI: {mine})" for name, value, mine in said)
        raise ConfigError(
            f"init_process_group(backend='hpcddp') was given {what} on rank {rank_of} "
            f"({len(wrong)} rank(s) disagree with MPI): the hpcddp backend takes rank and "
            f"world size from MPI. Pass none, or MPI's (RANK/WORLD_SIZE set by another "
            f"launcher than this job's?)")


def _init_once(torch_init):
    """``init_process_group`` that returns at once when asked for hpcddp's default
    group and hpcddp already made it (``hpcddp.init()`` ran first)."""
    if getattr(torch_init, "_hpcddp_wrapped", False):
        return torch_init

    @functools.wraps(torch_init)
    def init_process_group(backend=None, *args, **kwargs):
        default = default_group()
        if default is not None and names_hpcddp(backend) and _is_hpcddp(default):
            _check_given(_world(), kwargs.get("rank"), kwargs.get("world_size"))
            return None
        return torch_init(backend, *args, **kwargs)

    init_process_group._hpcddp_wrapped = True
    return init_process_group


def _is_hpcddp(group) -> bool:
    from hpcddp.backend.groups import comm_of  # starts MPI: imported here
    try:
        comm_of(group)
    except TypeError:
        return False
    return True


class TrainingAloneError(RuntimeError):
    """A rank of a job of several took an optimizer step with no process group."""


def watch_for_training_alone() -> None:
    """Check once, at the first optimizer step of this process, that a rank of a job of
    several is not training alone (``refuse_training_alone``). The hook is torch's
    global optimizer step pre-hook; after the first step it returns at once. (It cannot
    remove itself: torch iterates over the global hooks while it runs them, and another
    global hook, the timeline's, would see that dict change.)"""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    checked = []

    def first_step(optimizer, args, kwargs):
        if not checked:
            checked.append(True)
            refuse_training_alone()

    register_optimizer_step_pre_hook(first_step)


def refuse_training_alone() -> None:
    """Raise ``TrainingAloneError`` if a launcher started this process as one rank of
    several and neither ``hpcddp.init()`` nor ``init_process_group`` has run.

    Each rank would train alone on all the data: Hugging Face's Trainer and Accelerate
    see a world of one when nothing set torchrun's variables, with no more than a warning.
    Processes a rank starts (DataLoader workers) are not asked.
    """
    import multiprocessing

    import torch.distributed as dist

    if multiprocessing.parent_process() is not None or os.environ.get(LOADER_WORKER_VARIABLE):
        return
    if dist.is_available() and dist.is_initialized():
        return
    runtime = sys.modules.get("hpcddp.runtime")  # imported by init(); importing starts MPI
    if runtime is not None and runtime.current_world() is not None:
        return
    launcher = detect_launcher()
    size = launcher.world_size or 1
    if size > 1:
        raise TrainingAloneError(
            f"hpcddp: this process is one of {size} that {launcher.describe()} started, "
            f"but it reached its first optimizer step with no process group: each rank "
            f"would train alone on all the data (Hugging Face's Trainer and Accelerate see "
            f"a world of 1). Call hpcddp.init() at the start of the script, before the "
            f"model, the Trainer or the Accelerator is made")
