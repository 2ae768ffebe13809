"""Prove that MPI really reduces CUDA device buffers before training relies on it.

Detection can say yes for an MPI that then segfaults on a device pointer
(mpi4py/mpi4py#115), and one element on COMM_SELF proves little: an MPI may copy a device
buffer to itself and still crash when a message crosses a real transport, and Open MPI's
non-blocking allreduce on device buffers reduces with host code (open-mpi/ompi#9845,
#12045) while its point-to-point is fine. A segfault cannot be caught inside the process
that suffers it, so each operation DDP relies on runs once, in a job of its own: two
processes under the MPI's own launcher, with the launcher's and the scheduler's
variables removed so it neither joins the user's job nor asks the scheduler for more.
A crash in one check cannot hide the other's verdict, and neither can crash or hang the
user's job. The verdict picks ``HPCDDP_REDUCE=auto``'s reduction on device buffers.
"""

import os
import shutil
import subprocess
import sys
import time
from typing import NamedTuple, Optional, Sequence

from hpcddp.env.jobvars import clean_environment
from hpcddp.startup.mpi_library import launcher_of_loaded_mpi

__all__ = ["CUPY_PAIR_SETUP", "DeviceVerdict", "HOST_PAIR_SETUP", "PAIR_CHECKS", "SelfTest",
           "pair_launcher", "pair_test_code", "run_device_checks", "run_pair_check"]


class SelfTest(NamedTuple):
    passed: bool
    reason: str


def _gist(text: str, lines: int = 3) -> str:
    """The last few non-blank lines of ``text``, on one line."""
    kept = [line.strip() for line in text.splitlines() if line.strip().strip("-")]
    return " | ".join(kept[-lines:]) or "no output"


# Launched locally: a scheduler's variables would make the launcher ask it for the nodes.
_SCHEDULER_PREFIXES = ("SLURM_", "PBS_", "LSB_", "COBALT_", "FLUX_")


_PAIR_TEMPLATE = r"""
import os
import sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
rank, size = comm.rank, comm.size
check = sys.argv[1]
comm.Barrier()  # both have mapped MPICH's node segment: its name goes, which a crash keeps
if rank == 0:
    from hpcddp.startup.mpi_init import unlink_mapped_segments
    unlink_mapped_segments()


def say(said):
    os.write(1, ("hpcddp-pair-check %s %s\n" % (check, said)).encode())  # one write


def run():
    n = 1 << 16  # 256 KiB of float32: past the eager limit, through the real protocol
    send, recv = make(n, rank + 1.0), make(n, 0.0)
    sync()
    if check == "iallreduce":
        comm.Iallreduce(send, recv, op=MPI.SUM).Wait()
        want = size * (size + 1) / 2
    else:
        left, right = (rank - 1) % size, (rank + 1) % size
        MPI.Request.Waitall([comm.Irecv(recv, source=left, tag=7),
                             comm.Isend(send, dest=right, tag=7)])
        want = left + 1.0
    sync()
    got = get(recv)
    wrong = [i for i in (0, n // 2, n - 1) if float(got[i]) != want]
    if size != 2:
        return "ran in a world of %d, not 2: the launcher is not this MPI's" % size
    if wrong:
        return "gave %r at element %d, not %r" % (float(got[wrong[0]]), wrong[0], want)
    return "ok"


try:
    exec({setup!r})  # makes make(n, value), sync() and get(buffer)
except BaseException as error:  # noqa: the verdict says what went wrong
    say("could not set up: %s" % (str(error) or type(error).__name__))
    sys.exit(1)
try:
    say(run())
except Exception as error:  # an MPI error raised, not a crash
    say("raised %s: %s" % (type(error).__name__, str(error).splitlines()[0] if str(error) else ""))
    sys.exit(1)
"""

# CuPy device buffers, each process on its own GPU where there are several.
CUPY_PAIR_SETUP = r"""
import cupy as xp
xp.cuda.Device(rank % xp.cuda.runtime.getDeviceCount()).use()
make = lambda n, value: xp.full(n, value, dtype=xp.float32)
sync = xp.cuda.runtime.deviceSynchronize
get = lambda a: a.get()
"""

# Host buffers: the same job on this machine's memory, the CPU analogue of the above.
HOST_PAIR_SETUP = r"""
import numpy as np
make = lambda n, value: np.full(n, value, dtype=np.float32)
sync = lambda: None
get = lambda a: a
"""

PAIR_CHECKS = ("p2p", "iallreduce")


def pair_test_code(setup: str = CUPY_PAIR_SETUP) -> str:
    """The two-process program; its first argument names the check (``PAIR_CHECKS``)."""
    return _PAIR_TEMPLATE.format(setup=setup.strip())


def pair_launcher(setting: str = "") -> Sequence[str]:
    """The command that starts 2 processes of this MPI: ``setting`` (e.g. ``"mpirun
    --oversubscribe"``), else the launcher installed with the MPI library this process
    loaded, else the ``mpiexec`` beside this Python (the ``mpich`` wheel's in a virtual
    environment), else ``mpiexec`` or ``mpirun`` on PATH. Another MPI's launcher would
    start two singletons, and the check would fail for the launcher's sake."""
    if setting.strip():
        return setting.split() + ["-n", "2"]
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = launcher_of_loaded_mpi() or (beside if os.access(beside, os.X_OK) else None) or \
        shutil.which("mpiexec") or shutil.which("mpirun")
    if found is None:
        raise FileNotFoundError("no mpiexec or mpirun to start the two-process self-test; "
                                "set HPCDDP_SELFTEST_LAUNCHER to the MPI's launcher")
    return [found, "-n", "2"]


def run_pair_check(launcher: Sequence[str], check: str, setup: str = CUPY_PAIR_SETUP,
                   timeout: float = 60.0) -> SelfTest:
    """Run one check (``p2p``: Isend/Irecv around a ring; ``iallreduce``) as a job of two
    processes started by ``launcher``, and judge it: both must print the right numbers."""
    what = "Isend/Irecv" if check == "p2p" else "Iallreduce"
    env = {k: v for k, v in clean_environment(os.environ).items()
           if not k.startswith(_SCHEDULER_PREFIXES)}
    if os.geteuid() == 0:  # Open MPI's launcher refuses root without these
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    command = [*launcher, sys.executable, "-c", pair_test_code(setup), check]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env, start_new_session=True)
    except subprocess.TimeoutExpired:
        return SelfTest(False, f"{what} of device buffers between 2 processes hung for "
                               f"{timeout:.0f}s")
    said = [line.split(None, 2)[2] for line in done.stdout.splitlines()
            if line.startswith(f"hpcddp-pair-check {check} ")]
    if len(said) == 2 and all(s == "ok" for s in said) and done.returncode == 0:
        return SelfTest(True, f"{what} of device buffers between 2 processes passed")
    wrong = [s for s in said if s != "ok"]
    if wrong:
        return SelfTest(False, f"{what} of device buffers between 2 processes {wrong[0]}")
    how = f"died of signal {-done.returncode}" if done.returncode < 0 else \
        f"failed (exit {done.returncode})"
    return SelfTest(False, f"{what} of device buffers between 2 processes {how}: "
                           f"{_gist(done.stderr + done.stdout)}")


class DeviceVerdict(NamedTuple):
    """What the two-process checks found, and what ``HPCDDP_REDUCE=auto`` makes of it."""

    p2p: SelfTest
    iallreduce: SelfTest
    seconds: float

    @property
    def reduction(self) -> str:
        """``mpi`` where both pass (MPI's own allreduce on device buffers), ``ring`` where
        only point-to-point passes (hpcddp's ring on device buffers), else ``staged``
        (pinned host memory)."""
        if self.p2p.passed and self.iallreduce.passed:
            return "mpi"
        return "ring" if self.p2p.passed else "staged"

    def describe(self) -> str:
        return (f"{self.p2p.reason}; {self.iallreduce.reason} ({self.seconds:.1f} s): "
                f"{_VERDICT_TEXT[self.reduction]}")


_VERDICT_TEXT = {"mpi": "MPI's own allreduce on device buffers",
                 "ring": "hpcddp's ring on device buffers (MPI's Iallreduce is not to be "
                         "trusted with them)",
                 "staged": "staging through pinned host memory"}


def run_device_checks(setup: str = CUPY_PAIR_SETUP, launcher: Optional[Sequence[str]] = None,
                      timeout: float = 60.0) -> DeviceVerdict:
    """Run the point-to-point check, then the allreduce check, each as its own job."""
    began = time.perf_counter()
    try:
        launcher = list(launcher) if launcher else list(pair_launcher())
    except FileNotFoundError as missing:
        failed = SelfTest(False, str(missing))
        return DeviceVerdict(failed, failed, time.perf_counter() - began)
    p2p = run_pair_check(launcher, "p2p", setup, timeout)
    iallreduce = run_pair_check(launcher, "iallreduce", setup, timeout)
    return DeviceVerdict(p2p, iallreduce, time.perf_counter() - began)
