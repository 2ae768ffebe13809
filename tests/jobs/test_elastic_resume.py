"""Where the MPI recovers no rank (MPICH here), an ``hpcddp.elastic`` program whose rank
is killed mid-step ends as every hpcddp job does, and the next job resumes from the
checkpoint its commits wrote: the final parameters are those of one process trained on
every step's global batch, computed here."""

import json

import pytest
import torch
from elastic_reference import elastic_reference
from jobs_util import ROOT, launch

SCRIPT = ROOT / "tests/jobs/scripts/elastic_train.py"
TOTAL, KILL_AT = 12, 8  # commits at steps 3, 6, 9; checkpoints at commits 2 (step 6), 4


def _reference():
    return elastic_reference(TOTAL)


@pytest.mark.parametrize("n", [2, 3])
def test_a_killed_rank_ends_the_job_and_the_next_resumes_from_the_last_commit(tmp_path, n):
    ckpt, out = tmp_path / "ckpt", tmp_path / "params.json"
    killed = launch([SCRIPT, ckpt, out, TOTAL, KILL_AT], n=n, timeout=120,
                    env={"HPCDDP_TIMEOUT": "60"})
    assert killed.returncode != 0 and not killed.timed_out, killed.output
    assert "signal 9" in killed.output or "Killed" in killed.output, killed.output
    assert not out.exists() and "finished" not in killed.stdout
    again = launch([SCRIPT, ckpt, out, TOTAL], n=n, timeout=120)
    assert again.returncode == 0, again.output
    for rank in range(n):
        assert f"rank {rank} resumed at step 6" in again.stdout, again.output
        assert f"rank {rank} finished at step {TOTAL}" in again.stdout, again.output
    for ours, one in zip(json.loads(out.read_text()), _reference()):
        torch.testing.assert_close(torch.tensor(ours), one, rtol=1e-5, atol=1e-6)
