"""The two-process self-test as real jobs under this MPI's launcher: the CPU analogue of
the device-buffer checks (host buffers) passes, an Iallreduce that crashes (as Open MPI's
does on device buffers, open-mpi/ompi#9845) leaves the ring, and on a machine without a
GPU the device variant fails and says so instead of passing."""

import pytest
import torch
from jobs_util import mpich_segments, segments_left_since

from hpcddp.startup.selftest import HOST_PAIR_SETUP, pair_launcher, run_device_checks

# The same job with MPI's allreduce replaced by a segfault, the way a libnbc reduction
# with host code on a device pointer ends.
CRASHING_IALLREDUCE = HOST_PAIR_SETUP + r"""
import signal
class _CrashingIallreduce:
    def __init__(self, comm):
        self._comm = comm
    def __getattr__(self, name):
        return getattr(self._comm, name)
    def Iallreduce(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGSEGV)
comm = _CrashingIallreduce(comm)
"""


def test_host_buffers_pass_both_checks_on_real_transports():
    verdict = run_device_checks(HOST_PAIR_SETUP, pair_launcher())
    assert verdict.p2p.passed and verdict.iallreduce.passed, verdict.describe()
    assert verdict.reduction == "mpi"
    assert verdict.seconds > 0


def test_a_crashing_iallreduce_leaves_the_ring_and_says_why():
    before = mpich_segments()
    verdict = run_device_checks(CRASHING_IALLREDUCE, pair_launcher())
    assert segments_left_since(before) == []  # the crashed job's MPICH segment is unnamed
    assert verdict.p2p.passed, verdict.describe()
    assert not verdict.iallreduce.passed
    assert "Iallreduce" in verdict.iallreduce.reason and "signal" in verdict.iallreduce.reason
    assert verdict.reduction == "ring"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the verdict without a GPU")
def test_without_a_gpu_the_device_checks_fail_and_say_why():
    from hpcddp.runtime.world import device_self_test
    verdict = device_self_test()
    assert verdict.reduction == "staged"
    assert "CUDA" in verdict.p2p.reason or "cuda" in verdict.p2p.reason, verdict.p2p.reason
