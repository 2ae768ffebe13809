"""``dist.init_process_group(backend="hpcddp")`` under mpiexec with no torchrun
variables: the same world as ``hpcddp.init()``, in either order, with no TCP store; a
rank that contradicts MPI is refused on every rank."""

import re

import pytest

SCRIPT = "tests/jobs/scripts/init_process_group.py"
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")



@pytest.mark.parametrize("how, n", [("torch-first", 2), ("torch-first", 3), ("hpcddp-first", 2),
                                    ("import-order", 2), ("framework", 2), ("framework", 3)])
def test_init_process_group_joins_the_mpi_world(run_job, monkeypatch, how, n):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    job = run_job([SCRIPT, how], n=n, timeout=90)
    assert job.returncode == 0, job.output[-3000:]
    lines = re.findall(r"rank (\d)/(\d) hpcddp (\d)/(\d) backend (\S+) sum (\d+) mpi (\d+) "
                       r"same-comm (True|False)", job.stdout)
    assert sorted(int(line[0]) for line in lines) == list(range(n)), job.stdout
    total = n * (n + 1) // 2
    for rank, size, wrank, wsize, backend, got, mpi, same in lines:
        assert (rank, size) == (wrank, wsize) and int(size) == n
        assert backend == "hpcddp" and int(got) == int(mpi) == total and same == "True"


def test_a_rank_that_contradicts_mpi_is_refused_on_every_rank(run_job, monkeypatch):
    for name in TORCHRUN_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    job = run_job([SCRIPT, "wrong-rank"], n=2, timeout=90)
    assert job.returncode != 0 and not job.timed_out, job.output[-3000:]
    message = ("init_process_group(backend='hpcddp') was given rank=0 (MPI: 1) on rank 1 "
               "(1 rank(s) disagree with MPI)")
    assert job.stderr.count(message) == 2, job.stderr[-3000:]
    assert job.seconds < 60
