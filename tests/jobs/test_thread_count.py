"""A rank's torch threads under mpiexec, at each level of the order torch users expect:
HPCDDP_NUM_THREADS, then OMP_NUM_THREADS, then torch.set_num_threads before init(), then
hpcddp's default (2 ranks sharing this machine's cores)."""

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
