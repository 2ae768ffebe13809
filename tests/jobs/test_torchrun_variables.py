"""torchrun's variables under mpiexec: what init() gives a framework that reads them,
checked against MPI's own facts, and a launcher's value that MPI contradicts."""

import json

SCRIPT = r"""
import json, os, sys
from mpi4py import MPI
before = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
import hpcddp
world = hpcddp.init()
node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)
mpi = {"RANK": MPI.COMM_WORLD.rank, "WORLD_SIZE": MPI.COMM_WORLD.size,
       "LOCAL_RANK": node.rank, "LOCAL_WORLD_SIZE": node.size, "GROUP_RANK": 0,
       "GROUP_WORLD_SIZE": 1, "ROLE_RANK": MPI.COMM_WORLD.rank,
       "ROLE_WORLD_SIZE": MPI.COMM_WORLD.size}
seen = {k: int(os.environ[k]) for k in mpi}
sys.stdout.write("RESULT " + json.dumps({"before": before, "mpi": mpi, "seen": seen}) + "\n")
sys.stdout.flush()  # one write per line: the ranks' lines are not cut into each other
hpcddp.shutdown()
sys.stdout.write("AFTER " + json.dumps({k: os.environ.get(k) for k in mpi}) + "\n")
sys.stdout.flush()
"""


def _script(tmp_path):
    path = tmp_path / "torchrun_vars.py"
    path.write_text(SCRIPT)
    return path


def test_init_gives_torchruns_variables_from_mpi(run_job, tmp_path):
    job = run_job([_script(tmp_path)], n=3, timeout=90)
    assert job.returncode == 0, job.output
    results = [json.loads(line[7:]) for line in job.stdout.splitlines()
               if line.startswith("RESULT ")]
    assert len(results) == 3, job.output
    assert sorted(r["seen"]["RANK"] for r in results) == [0, 1, 2]
    for result in results:
        assert result["before"] == {"RANK": None, "WORLD_SIZE": None, "LOCAL_RANK": None}
        assert result["seen"] == result["mpi"]
    # shutdown() takes back what init() exported.
    after = [json.loads(line[6:]) for line in job.stdout.splitlines()
             if line.startswith("AFTER ")]
    assert after and all(set(a.values()) == {None} for a in after), after


def test_a_launchers_value_that_mpi_contradicts_fails_on_every_rank(run_job, tmp_path):
    # RANK=0 for every process: right on rank 0, wrong on ranks 1 and 2.
    job = run_job([_script(tmp_path)], n=3, timeout=90, env={"RANK": "0"})
    assert job.returncode != 0, job.output
    assert "RESULT " not in job.stdout
    assert job.stderr.count("torchrun's variables disagree with MPI") >= 3, job.stderr
    assert ("rank 1: RANK=0 (set before hpcddp.init()) where MPI gives 1 | rank 2: RANK=0 "
            "(set before hpcddp.init()) where MPI gives 2") in job.stderr


def test_a_launchers_value_that_agrees_is_kept(run_job, tmp_path):
    job = run_job([_script(tmp_path)], n=2, timeout=90, env={"WORLD_SIZE": "2"})
    assert job.returncode == 0, job.output
    after = [json.loads(line[6:]) for line in job.stdout.splitlines()
             if line.startswith("AFTER ")]
    assert len(after) == 2 and all(a["WORLD_SIZE"] == "2" and a["RANK"] is None
                                   for a in after), after
