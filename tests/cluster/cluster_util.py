"""Starting MPI jobs on the emulated cluster and watching how they end."""

import os
import signal
import subprocess
import sys
import threading
import time

from jobs_util import Finished, ROOT, clean_env, mpi_flavour, mpiexec, run_command
from train_output import read_log

__all__ = ["ROOT", "on_nodes", "start_on_nodes", "wait_for_line", "finish", "SLURM_ENV",
           "SLURM_LAUNCH", "SLURM_NODES", "SLURM_EPOCHS", "wait_for_log"]

# slurm/train.sbatch's jobs on the emulated Slurm. The ranks' traffic crosses the links,
# not shared memory (see docs/many-nodes.md): UCX (MPICH) or libfabric (Intel MPI) over
# TCP; Open MPI's TCP BTL has only the node's link.
SLURM_ENV = {"PYTHON": sys.executable, "UCX_TLS": "tcp,self",
             **({"FI_PROVIDER": "tcp"} if mpi_flavour() == "impi" else {})}
# How the script starts each MPI's ranks on two nodes, chosen by itself from the wheel:
# hydra for the mpich wheel (srun --mpi=pmi2 fails now and then), else srun.
SLURM_LAUNCH = {"mpich": "4 ranks, mpiexec in the allocation",
                "openmpi": "4 ranks, srun --mpi=pmix",
                "impi": "4 ranks, srun --mpi=pmi2"}[mpi_flavour()]
SLURM_NODES = ["--nodes=2", "--ntasks-per-node=2"]
SLURM_EPOCHS = ["--epochs", "20"]


def wait_for_log(log, words, seconds=240):
    """Wait until the job's log ``log`` holds ``words``."""
    deadline = time.monotonic() + seconds
    while words not in read_log(log):
        assert time.monotonic() < deadline, read_log(log)[-2000:]
        time.sleep(0.2)


def _command(cluster, argv, ranks_per_node, nodes, launcher_args=()):
    return [*mpiexec(), *launcher_args,
            *cluster.mpiexec_args(ranks_per_node, nodes, mpi_flavour()),
            sys.executable, *map(str, argv)]


def on_nodes(cluster, argv, ranks_per_node=1, nodes=None, env=None, timeout=300):
    """Run ``python ARGV`` as ``ranks_per_node`` ranks on each of ``nodes``; a ``Finished``."""
    return run_command(_command(cluster, argv, ranks_per_node, nodes),
                       env=cluster.env(clean_env(env)), timeout=timeout)


def start_on_nodes(cluster, argv, ranks_per_node=1, nodes=None, env=None, launcher_args=()):
    """Start the job without waiting; stdout and stderr merged, read line by line.
    ``launcher_args`` go to the launcher before the placement (``--with-ft ulfm``)."""
    return subprocess.Popen(_command(cluster, argv, ranks_per_node, nodes, launcher_args),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cluster.env(clean_env(env)), cwd=ROOT, start_new_session=True)


def wait_for_line(proc, prefix, timeout):
    """Read ``proc``'s output until a line starts with ``prefix``; the lines read. A job
    that says nothing more is killed with its process group at ``timeout`` (its output
    then ends), so the wait cannot outlast it."""
    seen = []
    timer = threading.Timer(timeout, _kill_group, (proc,))
    timer.start()
    try:
        for line in proc.stdout:
            seen.append(line)
            if line.startswith(prefix):
                return seen
    finally:
        timer.cancel()
    raise AssertionError(f"no line {prefix!r} within {timeout} s:\n{''.join(seen)[-3000:]}")


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def finish(proc, earlier, timeout):
    """Wait for ``proc`` to end (killed with its process group after ``timeout``). The
    ``Finished`` also has ``timeline``: each line but the training's own ``step`` lines,
    after the seconds from this call to its arrival, to tell where a slow end spent its
    time."""
    start = time.monotonic()
    stamped = []

    def read():
        for line in proc.stdout:
            stamped.append((time.monotonic() - start, line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    try:  # the output can end before the launcher does: its end is bounded too
        timed_out = reader.is_alive()
        proc.wait(timeout=0 if timed_out else max(0.0, start + timeout - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)
        reader.join()
        proc.wait()
    job = Finished(proc.returncode, "".join(earlier + [line for _, line in stamped]), "",
                   time.monotonic() - start, timed_out)
    job.timeline = "".join(f"{seconds:6.1f} s  {line}" for seconds, line in stamped
                           if not line.startswith("step "))
    return job
