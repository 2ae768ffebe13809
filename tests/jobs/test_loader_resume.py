"""A loader position saved mid-epoch, after prefetch ran ahead, resumed in a new job."""

import json

import numpy as np
import pytest

from hpcddp.data.pack import pack_arrays


@pytest.mark.parametrize("ranks", [2, 3])
def test_resume_in_a_new_job_continues_with_the_next_batch(run_job, tmp_path, ranks):
    data = tmp_path / "data.h5"
    pack_arrays(data, {"y": np.arange(103)}, progress=False)
    files = {k: tmp_path / f"{k}.json" for k in ("full", "stop", "resume", "state")}
    job = run_job(["tests/jobs/scripts/loader_resume.py", "full", files["full"], data], n=ranks)
    assert job.returncode == 0, job.stderr
    job = run_job(["tests/jobs/scripts/loader_resume.py", "stop", files["stop"], files["state"],
                   "3", data], n=ranks)
    assert job.returncode == 0, job.stderr
    job = run_job(["tests/jobs/scripts/loader_resume.py", "resume", files["resume"],
                   files["state"], data], n=ranks)
    assert job.returncode == 0, job.stderr
    full, stop, resume = (json.loads(files[k].read_text()) for k in ("full", "stop", "resume"))
    for rank in range(ranks):
        assert stop[rank]["read_ahead"] > 0, "prefetch had not run ahead: the test proves nothing"
        assert len(stop[rank]["batches"]) == 3
        assert stop[rank]["batches"] + resume[rank]["batches"] == full[rank]["batches"]
