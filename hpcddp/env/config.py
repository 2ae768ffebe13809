"""The one getter for ``HPCDDP_*`` environment variables.

Every setting hpcddp reads is declared in ``_SETTINGS`` with its kind, default and
meaning, so ``hpcddp doctor`` and the docs' settings page can list them and a typo in a
value is reported with the value quoted instead of being read as "off".
"""

import difflib
import os
import signal
from typing import List, Mapping, NamedTuple, Optional, Union

__all__ = ["ConfigError", "describe_settings", "get_setting", "signal_number", "unknown_settings"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
    """An ``HPCDDP_*`` variable holds a value hpcddp cannot read."""


class _Setting(NamedTuple):
    kind: str  # "bool", "tristate" (bool or "auto"), "int", "seconds", "str", "choice"
    default: Union[bool, int, str, None]
    help: str
    choices: tuple = ()


_SETTINGS = {
    "ABORT_ON_ERROR": _Setting(
        "bool", True,
        "An uncaught exception on any rank prints its traceback with the rank and aborts "
        "the whole job (MPI_Abort), so no rank waits forever in a collective."),
    "AUTOTUNE": _Setting(
        "bool", False,
        "Tune every hpcddp.DistributedDataParallel as bucket_cap_mb='auto' does, from "
        "the cap it was given: during the first steps, measure backward and the "
        "communication left after it for bucket caps, the first bucket's cap, large "
        "parameters alone or in buckets and the reduction (where HPCDDP_REDUCE=auto), "
        "then keep the cheapest."),
    "AUTOTUNE_LOG": _Setting(
        "str", "",
        "With autotuning, rank 0 writes every setting tried, its measured steps and "
        "cost, and the one chosen, to this CSV file, appended after what it holds. "
        "Empty: no file."),
    "AUTOTUNE_STEPS": _Setting(
        "int", 64,
        "The most training steps an autotuning search may take (warm-up steps after "
        "each switch included); it stops earlier once no neighbouring setting is "
        "cheaper."),
    "CUDA_AWARE": _Setting(
        "tristate", None,
        "Override CUDA-awareness detection: 1 hands device buffers to MPI, 0 stages "
        "through host memory. Unset: ask the MPI library."),
    "DEBUG": _Setting(
        "choice", "off",
        "detail: before each collective (DDP buckets, torch.distributed on the hpcddp "
        "group), compare its kind, shape, dtype, root and sequence number across the "
        "ranks and raise on every rank at the first difference, naming the ranks and both "
        "calls (one small allgather per collective).", ("off", "detail")),
    "GC_FREEZE": _Setting(
        "choice", "exit",
        "When hpcddp moves the objects alive at that moment into the garbage collector's "
        "permanent generation (gc.freeze()), which no collection walks. exit: as the "
        "interpreter exits, so its last collections skip torch's ~170,000 objects and "
        "ranks leave sooner; nothing of the script's is held. init: already at "
        "hpcddp.init(), so a full collection during training, a pause on one rank that "
        "every other rank waits out at the next collective, skips them too; cyclic "
        "garbage among objects made before init() is then never collected. off: never.",
        ("exit", "init", "off")),
    "HOROVOD_NICE": _Setting(
        "str", "auto",
        "The nice value hvd.init() gives hpcddp's MPI thread, which runs Horovod's engine: "
        "0-19, or auto: 19 where the rank's torch threads take every core it may use (the "
        "engine's polling and reductions then give way to backward on the same core; "
        "a core that is idle still runs them at once), else unchanged."),
    "ELASTIC_DETECT": _Setting(
        "seconds", 3.0,
        "Under ULFM (Open MPI's mpirun --with-ft ulfm), a process whose heartbeat has not "
        "come for this long is declared failed by Open MPI's failure detector (a frozen "
        "node, a node cut off, a stopped process), so hpcddp.elastic.run recovers from it "
        "as from a dead one; the survivors then have the launcher end it. Sets "
        "OMPI_MCA_mpi_ft_detector (in MPI's progress engine, kept turning by a thread of "
        "hpcddp's; a heartbeat every fifth of this) unless the job sets it; needs "
        "MPI_THREAD_MULTIPLE. 0: no detector (such a rank is found by HPCDDP_TIMEOUT "
        "and ends the job)."),
    "ELASTIC_MIN_RANKS": _Setting(
        "int", 1,
        "Under ULFM (Open MPI's mpirun --with-ft ulfm), hpcddp.elastic.run goes on "
        "after ranks die while at least this many survive; with fewer the job ends with "
        "a report, as without ULFM."),
    "ELASTIC_QUORUM": _Setting(
        "bool", True,
        "Under ULFM, where a recovery loses ranks with their whole node (a node dead, "
        "frozen or cut off), hpcddp.elastic.run goes on only on the side that holds more "
        "than half of the job's nodes, or half with rank 0's node; the other side's ranks "
        "end with exit code 3 and a report, so that a split job (a link down) does not "
        "train twice into one checkpoint folder. 0: every side goes on."),
    "INFLIGHT_MB": _Setting(
        "int", 32,
        "The most megabytes of host memory (tensors on the CPU, pinned staging buffers) "
        "one communicator has in MPI operations at once; an operation that would pass "
        "it is issued, in its turn, once earlier ones complete (one always goes, "
        "whatever its size). MPI's non-blocking allreduce keeps scratch as large as its "
        "message, so this bounds the memory reductions in flight take beside the "
        "gradients. Device buffers handed to a CUDA-aware MPI are not counted. 0: no "
        "bound."),
    "NUM_THREADS": _Setting(
        "int", 0,
        "torch intra-op threads per rank; 0 means the cores available to this rank "
        "divided among the local ranks that share them."),
    "PREEMPT_SIGNAL": _Setting(
        "str", "USR1",
        "The signal that warns of preemption (e.g. sbatch --signal=B:USR1@120): training "
        "checkpoints at the next step and, under Slurm, requeues itself."),
    "PROGRESS_THREAD": _Setting(
        "bool", False,
        "During backward, hpcddp's MPI thread also tests the buckets in flight between "
        "gradient hooks (every 50 us to 0.5 ms), not only when a hook launches one: it "
        "helps where the cores are idle during backward (a GPU's), and costs where they "
        "compute it."),
    "REDUCE": _Setting(
        "choice", "auto",
        "How gradients and dist.all_reduce are summed. auto: node-aware with several ranks "
        "on each of several nodes, the ring with one rank on each of three nodes or more "
        "(host buffers; two under Open MPI's default allreduce), else MPI's own "
        "allreduce, on device "
        "buffers where the MPI is proven to reduce them; mpi: MPI's allreduce; ring: "
        "hpcddp's ring of non-blocking point-to-point (device buffers where MPI is "
        "CUDA-aware, host buffers otherwise); node: reduce within the node, across nodes, "
        "then share within the node; staged: GPU tensors through pinned host memory and "
        "MPI's allreduce.", ("auto", "mpi", "ring", "node", "staged")),
    "REPORT_DIR": _Setting(
        "str", "",
        "A rank that ends the job (an uncaught exception, Ctrl-C, a wait that cannot "
        "complete) also writes what it prints as JSON, hpcddp-report-rank<N>.json, in "
        "this folder: the ranks and nodes named, each missing rank's state, the fix. "
        "For batch scripts that decide whether to requeue. Empty: text only."),
    "SELFTEST_LAUNCHER": _Setting(
        "str", "",
        "The command that starts the device-buffer self-test's two processes, before "
        "its '-n 2' (e.g. 'mpirun --oversubscribe'). Empty: the mpiexec beside this "
        "Python, else mpiexec or mpirun on PATH."),
    "SOLO_BUCKET_KB": _Setting(
        "int", 1024,
        "A parameter in host memory of at least this many KiB is reduced in its own "
        "gradient tensor instead of being copied into a bucket and back; 0: every "
        "parameter goes into a bucket of bucket_cap_mb, as in torch."),
    "STAGING_CHUNK_KB": _Setting(
        "int", 4096,
        "Without CUDA-aware MPI, GPU buckets are staged through pinned host memory in "
        "pieces of this many KiB, so each piece's copies overlap with the reduction of "
        "its neighbours; 0 stages each bucket whole."),
    "STALL_WARN": _Setting(
        "seconds", 60.0,
        "A wait in an hpcddp collective longer than this prints, once, which ranks have "
        "not arrived and what they are doing; 0: no warning."),
    "STRAGGLER_STEPS": _Setting(
        "int", 50,
        "Every this many synchronized DDP steps the ranks compare how long each computed "
        "(its step time less its waits in hpcddp), and rank 0 names, once, a rank that "
        "took over twice the median of the others: every other rank waits for it in each "
        "reduction. One small allgather per check; 0: no check."),
    "TIMELINE": _Setting(
        "str", "",
        "Record a timeline of every rank (forward, backward, each DDP bucket's launch, "
        "reduction, wait and copy back, optimizer steps, loader waits) into this Chrome "
        "trace file, written at shutdown; open it in Perfetto or draw it with hpcddp "
        "timeline. Empty: off."),
    "TIMEOUT": _Setting(
        "seconds", 600.0,
        "A wait in an hpcddp collective longer than this ends the job (MPI_Abort) with a "
        "report of the stuck operation and of the ranks that have not arrived, as "
        "hpcddp.init(timeout=...) does; it also bounds the MPIX_Comm_shrink of a "
        "recovery inside the job (hpcddp.elastic under ULFM). 0: wait forever."),
    "TORCH_GROUP": _Setting(
        "bool", True,
        "hpcddp.init() initializes torch.distributed's default group on MPI unless one "
        "is already initialized."),
    "YIELD": _Setting(
        "tristate", None,
        "Whether hpcddp's waits for MPI sleep from their first poll (1) or poll back to "
        "back for a few milliseconds first (0). auto (unset): sleep where the ranks "
        "sharing a rank's cores outnumber them (more ranks than cores, counting every "
        "node on the same kernel; a container limited by a CPU quota, not an affinity "
        "mask, needs 1)."),
}


def get_setting(name: str, environ: Optional[Mapping[str, str]] = None):
    """Return the value of ``HPCDDP_<name>``, parsed by its declared kind.

    Args:
        name: the setting without its prefix, e.g. ``"CUDA_AWARE"``.
        environ: the environment to read; ``os.environ`` by default.

    Returns:
        bool, int, str, or None for an unset tristate.

    Raises:
        ConfigError: the value cannot be parsed; the message quotes it.
    """
    spec = _SETTINGS[name]
    var = "HPCDDP_" + name
    raw = (os.environ if environ is None else environ).get(var)
    if raw is None or raw.strip() == "":
        return spec.default
    value = raw.strip().lower()
    if spec.kind in ("bool", "tristate"):
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        if spec.kind == "tristate" and value == "auto":
            return None
        allowed = "1/0, true/false, yes/no, on/off" + (", auto" if spec.kind == "tristate" else "")
        raise ConfigError(f"{var}={raw!r} is not a boolean; use one of {allowed}")
    if spec.kind == "choice":
        if value in spec.choices:
            return value
        raise ConfigError(f"{var}={raw!r} is not one of {', '.join(spec.choices)}; e.g. "
                          f"{var}={spec.choices[0]}")
    if spec.kind == "int":
        try:
            number = int(value)
        except ValueError:
            number = -1
        if number < 0:
            raise ConfigError(f"{var}={raw!r} is not a non-negative integer; e.g. {var}=4")
        return number
    if spec.kind == "seconds":
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds >= 0 or seconds == float("inf"):
            raise ConfigError(f"{var}={raw!r} is not a number of seconds; e.g. {var}=600, "
                              f"or {var}=0 for none")
        return seconds
    return raw


# Read by hpcddp's test suite and scripts (slurm/train.sbatch: the launcher, spares and
# healing), or set by the library for its own processes.
_ELSEWHERE = ("TEST_GPU", "TEST_EXIT_S", "SRUN_MPI", "LAUNCHER", "SPARE_NODES", "MAX_RESTARTS",
              "MIN_NODES", "HEAL", "HEAL_DIR", "LOADER_WORKER")

# Set in the environment of ShardedLoader's worker processes (hpcddp.data.workers).
LOADER_WORKER_VARIABLE = "HPCDDP_LOADER_WORKER"


def unknown_settings(environ: Optional[Mapping[str, str]] = None) -> List[str]:
    """One message for each ``HPCDDP_*`` variable hpcddp does not read (a misspelling is
    otherwise silently ignored), naming the nearest real setting."""
    messages = []
    known = list(_SETTINGS) + list(_ELSEWHERE)
    for var in sorted(os.environ if environ is None else environ):
        name = var[len("HPCDDP_"):]
        if not var.startswith("HPCDDP_") or name in known:
            continue
        near = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hint = f"did you mean HPCDDP_{near[0]}?" if near else \
            "the Settings page of the docs (docs/settings.md) lists them"
        messages.append(f"hpcddp: {var} is set but is no hpcddp setting, so it has no effect; "
                        f"{hint}")
    return messages


def signal_number(name: str) -> int:
    """The signal ``name`` (USR1, SIGUSR1 or a number such as 10, as ``sbatch --signal``
    takes) stands for; ConfigError when there is none, or it cannot be caught."""
    key = name.strip().upper()
    if key.isdigit():
        try:
            number = signal.Signals(int(key))
        except ValueError:
            raise ConfigError(f"HPCDDP_PREEMPT_SIGNAL={name!r}: there is no signal {key} on "
                              f"this system; use a name such as USR1, USR2 or TERM") from None
    else:
        number = getattr(signal, key if key.startswith("SIG") else "SIG" + key, None)
        if not isinstance(number, signal.Signals):
            raise ConfigError(f"HPCDDP_PREEMPT_SIGNAL={name!r} names no signal; use e.g. "
                              f"USR1, USR2 or TERM")
    if number in (signal.SIGKILL, signal.SIGSTOP):
        raise ConfigError(f"HPCDDP_PREEMPT_SIGNAL={name!r} is {number.name}, which no "
                          f"process can catch; use e.g. USR1, USR2 or TERM")
    return int(number)


def describe_settings():
    """Return ``(variable, kind, default, help)`` for every setting hpcddp reads."""
    return [("HPCDDP_" + n, s.kind, s.default, s.help) for n, s in sorted(_SETTINGS.items())]
