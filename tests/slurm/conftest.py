"""A real single-node Slurm for the tests in this folder, or a skip that says why."""

import sys

import pytest

from jobs_util import ROOT
from testbed import SlurmCluster, Unavailable


@pytest.fixture(scope="session")
def slurm():
    try:
        cluster = SlurmCluster.start()
    except Unavailable as why:
        pytest.skip(f"no Slurm here: {why}")
    yield cluster
    cluster.stop()


@pytest.fixture
def submit(slurm, tmp_path):
    """Submit ``slurm/train.sbatch`` from the repository root with this venv's Python."""
    def run(*args, log="train.out", sbatch_args=()):
        path = tmp_path / log
        job = slurm.sbatch(*sbatch_args, "--chdir", ROOT, "--output", path,
                           ROOT / "slurm" / "train.sbatch", *args,
                           env={"PYTHON": sys.executable,
                                "HPCDDP_HEAL_DIR": str(tmp_path / f"heal-{log}")})
        return job, path
    return run
