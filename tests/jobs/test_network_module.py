"""The mpich wheel runs on its ofi network module unless the user chose: what libfabric
itself says (its log names the providers it registers only once MPICH's ofi module opens
it; under UCX it stays silent), not what hpcddp says it set."""

import re

import pytest
from jobs_util import mpi_flavour

pytestmark = pytest.mark.skipif(mpi_flavour() != "mpich", reason="the mpich wheel's modules")

LIBFABRIC_SAYS = "registering provider"


@pytest.mark.parametrize("chosen, opened", [(None, True), ("ucx", False), ("ofi", True)])
def test_the_wheel_uses_ofi_by_default_and_the_users_choice_wins(run_job, chosen, opened):
    job = run_job(["tests/jobs/scripts/netmod_job.py"], n=2, timeout=60,
                  env={"FI_LOG_LEVEL": "info", "MPIR_CVAR_CH4_NETMOD": chosen})
    assert job.returncode == 0, job.output[-3000:]
    assert (LIBFABRIC_SAYS in job.stderr) is opened, job.stderr[-2000:]
    for rank in (0, 1):  # (hydra may join two ranks' lines: found anywhere)
        said = re.search(rf"rank {rank}: (MPIR_CVAR_CH4_NETMOD=\S+) reason=(.*?)(rank|$)",
                         job.stdout, re.M)
        assert said and said.group(1) == f"MPIR_CVAR_CH4_NETMOD={chosen or 'ofi'}", job.stdout
        assert ("set by the user" in said.group(2)) is (chosen is not None), job.stdout
