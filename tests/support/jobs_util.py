"""Launching whole MPI jobs as subprocesses and watching how they end."""

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpcddp.env import clean_environment

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def mpiexec():
    """The launcher as a command line: ``MPIEXEC`` when set (a command with its flags,
    for example ``mpirun --oversubscribe`` under Open MPI), else this environment's
    ``mpiexec``."""
    if os.environ.get("MPIEXEC"):
        return shlex.split(os.environ["MPIEXEC"])
    candidate = BIN / "mpiexec"
    return [str(candidate) if candidate.exists() else "mpiexec"]


def job_sizes():
    """The rank counts of the whole-job tests that run at several: ``HPCDDP_TEST_JOB_RANKS``
    (comma-separated), 2 and 3 by default; the runs under other MPIs and at another
    thread level take 2 (the launcher's and the thread level's part is the same at 3)."""
    value = os.environ.get("HPCDDP_TEST_JOB_RANKS", "2,3")
    try:
        sizes = [int(n) for n in value.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 2:
        raise ValueError(f"HPCDDP_TEST_JOB_RANKS={value!r}: give rank counts of 2 or more, "
                         f"comma-separated (e.g. 2,3)")
    return sizes


def mpi_flavour():
    """Which MPI this environment has, told by the MPI package installed here (not by
    hpcddp): ``openmpi``, ``impi`` (Intel MPI's impi-rt) or ``mpich``."""
    from importlib import metadata
    for flavour, package in (("openmpi", "openmpi"), ("impi", "impi-rt")):
        try:
            metadata.distribution(package)
            return flavour
        except metadata.PackageNotFoundError:
            pass
    return "mpich"


def launcher_kind():
    """How hpcddp should name the launcher of this environment's MPI: Open MPI's
    ``mpirun``, else Hydra (the mpich wheel's and Intel MPI's ``mpiexec``)."""
    return "mpirun (Open MPI)" if mpi_flavour() == "openmpi" else "mpiexec (Hydra)"


class Finished:
    def __init__(self, returncode, stdout, stderr, seconds, timed_out):
        self.returncode, self.seconds, self.timed_out = returncode, seconds, timed_out
        self.stdout, self.stderr = stdout, stderr
        self.output = stdout + stderr


def clean_env(extra):
    """This environment without another launcher's job variables, plus ``extra`` (a
    value of None removes the variable)."""
    env = clean_environment(os.environ)
    for name, value in (extra or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def launch(args, n=None, env=None, timeout=120):
    """Run ``[mpiexec -n N] python ARGS``; on timeout kill the whole process group.

    Killing only mpiexec would leave its ranks running (and spinning in MPI progress).
    """
    command = ([*mpiexec(), "-n", str(n)] if n else []) + [sys.executable] + [str(a) for a in args]
    return run_command(command, env=env, timeout=timeout)


def run_command(command, env=None, timeout=120, cwd=ROOT):
    """Run ``command`` in its own session; on timeout kill its whole process group."""
    start = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(env), cwd=cwd, start_new_session=True)
    stdout, stderr, timed_out = communicate_or_kill(proc, timeout)
    return Finished(proc.returncode, stdout, stderr, time.monotonic() - start, timed_out)


def communicate_or_kill(proc, timeout):
    """``proc.communicate()``; after ``timeout`` s its whole process group is killed
    first (killing only mpiexec would leave its ranks spinning). (stdout, stderr,
    timed out)."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return stdout, stderr, False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return stdout, stderr, True


def mpich_segments():
    """The names of MPICH's shared-memory files in /dev/shm now."""
    return {path.name for path in Path("/dev/shm").glob("mpich_shm_*")}


def job_segments():
    """The names in /dev/shm now that any MPI library gives a job's shared memory
    (``hpcddp.startup.mpi_init.JOB_SEGMENTS``: MPICH's, Open MPI's, UCX's, Intel MPI's)."""
    from hpcddp.startup.mpi_init import JOB_SEGMENTS

    return {path.name for path in Path("/dev/shm").iterdir()
            if re.match(JOB_SEGMENTS, str(path))} if Path("/dev/shm").is_dir() else set()


def segments_left_since(before, now=mpich_segments):
    """The shared-memory files named since ``before`` (a ``now()``: MPICH's unless told)
    that no process maps any more: what an ended job left behind. A job that runs beside
    (pytest-xdist) still maps its own."""
    new = now() - before
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue  # ended meanwhile, or not ours to read
        mapped.update(name for name in new if f"/dev/shm/{name}" in text)
    return sorted(new - mapped)
