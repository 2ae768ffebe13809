"""Judging the CUDA-aware self-test. The commands here stand in for a GPU that this
machine lacks; the real self-test runs in tests/mpi/test_world.py on a GPU machine."""

import sys

import pytest
import torch

from hpcddp.comm.selftest import run_self_test
from hpcddp.env import clean_environment


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


def test_job_variables_go_and_mpi_settings_stay():
    # Open MPI 4 under mpirun in a container (as seen on the GPU test machine), Hydra, Slurm.
    job = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:4000", "OMPI_MCA_ess": "^singleton",
           "OMPI_MCA_ess_base_jobid": "123", "OMPI_MCA_pmix": "^s1,s2", "PMIX_RANK": "1",
           "PMIX_NAMESPACE": "prterun-1", "PMIX_SERVER_URI41": "x", "PMI_FD": "5",
           "PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "SLURM_STEP_ID": "0",
           "SLURM_PROCID": "1", "PALS_RANKID": "1"}
    settings = {"OMPI_MCA_plm": "isolated", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                "PMIX_MCA_gds": "hash", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_pml": "ucx",
                "MV2_USE_CUDA": "1", "MPICH_GPU_SUPPORT_ENABLED": "1",
                "MPIR_CVAR_ENABLE_GPU": "1", "UCX_TLS": "cuda,sm", "SLURM_JOB_ID": "7",
                "CUDA_VISIBLE_DEVICES": "0", "PATH": "/usr/bin"}
    assert clean_environment({**job, **settings}) == settings


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the verdict on a machine without CUDA")
def test_torch_variant_without_cuda_fails_and_says_why():
    # No CuPy here, so the torch variant runs; without a GPU it must fail, not pass.
    from hpcddp.world import device_self_test
    result = device_self_test()
    assert not result.passed and "CUDA" in result.reason
