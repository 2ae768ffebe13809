"""A rank's torch threads under mpiexec, at each level of the order torch users expect:
HPCDDP_NUM_THREADS, then OMP_NUM_THREADS, then torch.set_num_threads before init(), then
hpcddp's default (2 ranks sharing this machine's cores); and which ranks' waits for MPI
give way, as hpcddp doctor says, with more ranks than cores and with HPCDDP_YIELD."""

import json
import os

import pytest

SCRIPT = r"""
import json, sys
import hpcddp
import torch
if sys.argv[1] != "-":
    torch.set_num_threads(int(sys.argv[1]))
world = hpcddp.init()
sys.stdout.write("RESULT " + json.dumps({"torch": torch.get_num_threads(),
                                         "world": world.num_threads,
                                         "why": world.threads_reason}) + "\n")
sys.stdout.flush()  # one write per line: the ranks' lines are not cut into each other
"""

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize("env, set_in_script, expected, why", [
    ({"HPCDDP_NUM_THREADS": "1", "OMP_NUM_THREADS": "2"}, "2", 1, "HPCDDP_NUM_THREADS=1"),
    ({"OMP_NUM_THREADS": "3"}, "2", 3, "OMP_NUM_THREADS=3"),
    ({}, "3", 3, "torch.set_num_threads(3) before hpcddp.init()"),
    ({}, "-", max(1, CORES // 2), "the cores of this rank's affinity mask"),
], ids=["hpcddp", "omp", "script", "default"])
def test_thread_count_follows_the_order(run_job, tmp_path, env, set_in_script, expected, why):
    script = tmp_path / "threads.py"
    script.write_text(SCRIPT)
    env = dict({"OMP_NUM_THREADS": None, "HPCDDP_NUM_THREADS": None}, **env)
    job = run_job([script, set_in_script], n=2, timeout=90, env=env)
    assert job.returncode == 0, job.output
    results = [json.loads(line[7:]) for line in job.stdout.splitlines()
               if line.startswith("RESULT ")]
    assert len(results) == 2, job.output
    for result in results:
        assert result["torch"] == result["world"] == expected, result
        assert result["why"].startswith(why), result


@pytest.mark.parametrize("ranks, env, said", [
    (CORES + 1, {}, "more ranks than cores share them: their waits for MPI sleep from the "
                    "first poll"),
    (2, {"HPCDDP_YIELD": "1"}, "HPCDDP_YIELD=1: their waits for MPI sleep from the first poll"),
    (CORES + 1, {"HPCDDP_YIELD": "0"}, "more ranks than cores share them, but HPCDDP_YIELD=0 "
                                       "keeps their waits for MPI spinning"),
    (2, {}, None),
], ids=["crowded", "forced", "refused", "a_core_each"])
def test_doctor_says_which_ranks_waits_give_way(run_job, ranks, env, said):
    if CORES > 3:
        pytest.skip(f"needs more ranks than cores; this machine has {CORES} cores")
    job = run_job(["-m", "hpcddp", "doctor", "--no-bandwidth"], n=ranks, timeout=90,
                  env=dict({"HPCDDP_YIELD": None}, **env))
    assert job.returncode == 0, job.output
    if said is None:  # 2 ranks on 2 cores or more: nothing to say
        assert "waits for MPI" not in job.stdout, job.output
    else:
        every = ",".join(map(str, range(ranks)))
        assert f"ranks {every}: {said}" in job.stdout, job.output
