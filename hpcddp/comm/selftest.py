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

__all__ = ["SelfTest", "run_self_test", "SELF_TEST_CODE"]

# Runs in the subprocess. CuPy when it is there (the cuda12/cuda13 extras), else torch;
# both hand MPI the device pointer (__cuda_array_interface__ / DLPack).
SELF_TEST_CODE = r"""
import sys
from mpi4py import MPI
try:
    import cupy as xp
    send = xp.full(1, 3.0, dtype=xp.float32); recv = xp.zeros(1, dtype=xp.float32)
    xp.cuda.runtime.deviceSynchronize()
    get = lambda a: float(a.get()[0])
except ImportError:
    import torch
    torch.cuda.init()
    send = torch.full((1,), 3.0, device="cuda"); recv = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    get = lambda a: float(a.cpu()[0])
MPI.COMM_SELF.Allreduce(send, recv, op=MPI.SUM)
print("hpcddp-self-test-result", get(recv))
"""

_LAUNCHER_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "SLURM_STEP", "SLURM_PROCID", "MPI_LOCAL",
                      "HYDRA", "MV2_", "I_MPI_HYDRA", "PALS_")
# The user's own settings, not the job's: Open MPI refuses to start as root without them.
_KEPT = ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


class SelfTest(NamedTuple):
    passed: bool
    reason: str


def run_self_test(command: Optional[Sequence[str]] = None, timeout: float = 120.0) -> SelfTest:
    """Run the device-buffer allreduce in a subprocess and judge it.

    Args:
        command: the command to run; by default this Python on ``SELF_TEST_CODE``.
        timeout: seconds before the test counts as failed.
    """
    command = list(command) if command else [sys.executable, "-c", SELF_TEST_CODE]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(_LAUNCHER_PREFIXES) or k in _KEPT}
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
