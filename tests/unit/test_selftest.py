"""Judging the CUDA-aware self-test. The commands here stand in for a GPU that this
machine lacks; the real self-test runs in tests/mpi/test_world.py on a GPU machine."""

import sys

from hpcddp.comm.selftest import run_self_test


def _python(code):
    return [sys.executable, "-c", code]


def test_segfault_in_the_subprocess_is_a_failure_not_a_crash():
    result = run_self_test(_python("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"))
    assert not result.passed and "signal 11" in result.reason and "segfault" in result.reason


def test_wrong_value_is_a_failure():
    result = run_self_test(_python("print('hpcddp-self-test-result 6.0')"))
    assert not result.passed and "gave 6.0" in result.reason


def test_error_and_hang_are_failures():
    error = run_self_test(_python("raise SystemExit('cudaErrorNoDevice')"))
    assert not error.passed and "cudaErrorNoDevice" in error.reason
    hang = run_self_test(_python("import time; time.sleep(30)"), timeout=1)
    assert not hang.passed and "hung" in hang.reason


def test_right_value_passes():
    assert run_self_test(_python("print('hpcddp-self-test-result 3.0')")).passed


def test_launcher_variables_do_not_reach_the_subprocess(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    code = ("import os; print('hpcddp-self-test-result', 3.0 if not "
            "any(k in os.environ for k in ('PMI_SIZE', 'SLURM_STEP_NUM_TASKS')) else 0.0)")
    assert run_self_test(_python(code)).passed
