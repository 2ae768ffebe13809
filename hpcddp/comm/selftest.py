"""Prove that MPI really accepts CUDA device buffers before training relies on it.

Detection can say yes for an MPI that then segfaults on a device pointer
(mpi4py/mpi4py#115). A segfault cannot be caught inside the process that suffers it, so
a one-element device-buffer allreduce runs once in a subprocess: an MPI singleton with
the launcher's variables removed, so it does not try to join the job. Its exit and its
printed result decide.
"""

import os
import subprocess
import sys
from typing import NamedTuple, Optional, Sequence

from hpcddp.env.jobvars import clean_environment

__all__ = ["SelfTest", "run_self_test", "self_test_code", "CUPY_SETUP"]

# Runs in the subprocess after ``setup`` has made ``send``, ``recv`` (one float32 each, on
# the GPU) and ``get``, which reads a value back to the host. Any array type MPI can take
# as a device buffer (__cuda_array_interface__ / DLPack) will do.
_TEMPLATE = r"""
from mpi4py import MPI
{setup}
MPI.COMM_SELF.Allreduce(send, recv, op=MPI.SUM)
print("hpcddp-self-test-result", get(recv))
"""

# CuPy (the cuda12/cuda13 extras). The torch variant lives with the torch glue in
# ``hpcddp.world``: this package never imports torch, not even in a subprocess.
CUPY_SETUP = r"""
import cupy as xp
send = xp.full(1, 3.0, dtype=xp.float32); recv = xp.zeros(1, dtype=xp.float32)
xp.cuda.runtime.deviceSynchronize()
get = lambda a: float(a.get()[0])
"""


def self_test_code(setup: str = CUPY_SETUP) -> str:
    """The self-test program, with ``setup`` allocating its device buffers."""
    return _TEMPLATE.format(setup=setup.strip())


class SelfTest(NamedTuple):
    passed: bool
    reason: str


def run_self_test(command: Optional[Sequence[str]] = None, timeout: float = 120.0) -> SelfTest:
    """Run the device-buffer allreduce in a subprocess and judge it.

    Args:
        command: the command to run; by default this Python on ``self_test_code()``.
        timeout: seconds before the test counts as failed.
    """
    command = list(command) if command else [sys.executable, "-c", self_test_code()]
    env = clean_environment(os.environ)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return SelfTest(False, f"device-buffer allreduce self-test hung for {timeout:.0f}s")
    if done.returncode < 0:
        return SelfTest(False, f"device-buffer allreduce self-test died of signal "
                               f"{-done.returncode} (a segfault means MPI cannot read GPU memory)")
    if done.returncode != 0:
        return SelfTest(False, f"device-buffer allreduce self-test failed (exit "
                               f"{done.returncode}): {_gist(done.stderr)}")
    for line in done.stdout.splitlines():
        if line.startswith("hpcddp-self-test-result"):
            value = float(line.split()[-1])
            if value == 3.0:
                return SelfTest(True, "device-buffer allreduce self-test passed")
            return SelfTest(False, f"device-buffer allreduce self-test gave {value}, not 3.0")
    return SelfTest(False, "device-buffer allreduce self-test printed no result")


def _gist(stderr: str, lines: int = 3) -> str:
    """The last few non-blank lines of ``stderr``, on one line."""
    kept = [line.strip() for line in stderr.splitlines() if line.strip().strip("-")]
    return " | ".join(kept[-lines:]) or "no output"
