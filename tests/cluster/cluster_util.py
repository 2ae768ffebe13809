"""Starting MPI jobs on the emulated cluster and watching how they end."""

import subprocess
import sys
import time

from jobs_util import (Finished, ROOT, clean_env, communicate_or_kill, mpi_flavour, mpiexec,
                       run_command)

__all__ = ["ROOT", "on_nodes", "start_on_nodes", "wait_for_line", "finish"]


def _command(cluster, argv, ranks_per_node, nodes):
    return [*mpiexec(), *cluster.mpiexec_args(ranks_per_node, nodes, mpi_flavour()),
            sys.executable, *map(str, argv)]


def on_nodes(cluster, argv, ranks_per_node=1, nodes=None, env=None, timeout=300):
    """Run ``python ARGV`` as ``ranks_per_node`` ranks on each of ``nodes``; a ``Finished``."""
    return run_command(_command(cluster, argv, ranks_per_node, nodes),
                       env=cluster.env(clean_env(env)), timeout=timeout)


def start_on_nodes(cluster, argv, ranks_per_node=1, nodes=None, env=None):
    """Start the job without waiting; stdout and stderr merged, read line by line."""
    return subprocess.Popen(_command(cluster, argv, ranks_per_node, nodes),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cluster.env(clean_env(env)), cwd=ROOT, start_new_session=True)


def wait_for_line(proc, prefix, timeout):
    """Read ``proc``'s output until a line starts with ``prefix``; the lines read."""
    seen, deadline = [], time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(prefix):
            return seen
        if time.monotonic() > deadline:
            break
    raise AssertionError(f"no line {prefix!r} within {timeout} s:\n{''.join(seen)[-3000:]}")


def finish(proc, earlier, timeout):
    """Wait for ``proc`` to end (killed with its process group after ``timeout``)."""
    start = time.monotonic()
    out, _, timed_out = communicate_or_kill(proc, timeout)
    return Finished(proc.returncode, "".join(earlier) + out, "", time.monotonic() - start,
                    timed_out)
