"""A loader position saved mid-epoch, after prefetch ran ahead, resumed in a new job."""

import json

import numpy as np
import pytest
import torch

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


@pytest.mark.parametrize("before, after", [(2, 3), (3, 2)])
def test_resume_on_another_number_of_ranks_loses_and_repeats_nothing(run_job, tmp_path,
                                                                     before, after):
    """Stopped mid-epoch at ``before`` ranks, resumed at ``after``: the epoch's samples
    are torch's permutation (DistributedSampler's, seed + epoch), the first part dealt as
    DistributedSampler deals it at ``before`` ranks, the rest once each at ``after``
    (padded, as DistributedSampler pads, to a multiple of the ranks)."""
    length, batches_before = 103, 3
    data = tmp_path / "data.h5"
    pack_arrays(data, {"y": np.arange(length)}, progress=False)
    files = {k: tmp_path / f"{k}.json" for k in ("stop", "resume", "state")}
    job = run_job(["tests/jobs/scripts/loader_resume.py", "stop", files["stop"], files["state"],
                   str(batches_before), data], n=before)
    assert job.returncode == 0, job.stderr
    job = run_job(["tests/jobs/scripts/loader_resume.py", "resume", files["resume"],
                   files["state"], data], n=after)
    assert job.returncode == 0, job.stderr
    # The loader says so once (rank 0), at the script's line, not at hpcddp's.
    said = [line for line in job.stderr.splitlines() if "ShardedLoader: resuming" in line]
    assert len(said) == 1 and f"on {after} ranks where it was saved on {before}" in said[0]
    assert "loader_resume.py:" in said[0] and "hpcddp/" not in said[0]
    stop, resume = (json.loads(files[k].read_text()) for k in ("stop", "resume"))

    generator = torch.Generator()
    generator.manual_seed(4 + 1)  # the script's seed and epoch
    order = torch.randperm(length, generator=generator).tolist()
    consumed = before * batches_before * 6
    for rank in range(before):  # DistributedSampler's deal: rank r takes order[r::before]
        seen = [y for batch in stop[rank]["batches"] for y in batch]
        assert seen == order[rank:consumed:before]
    rest = order[consumed:]
    padded = rest + rest[:-len(rest) % after]
    dealt = [[y for batch in resume[rank]["batches"] for y in batch] for rank in range(after)]
    for rank in range(after):
        assert dealt[rank] == padded[rank::after]
    assert sorted(y for part in dealt for y in part) == sorted(padded)
    assert set(order[:consumed]).isdisjoint(y for part in dealt for y in part)


def test_a_finished_epoch_resumed_on_another_number_of_ranks_is_over_quietly(run_job, tmp_path):
    """Saved after the last batch of epoch 1 at 2 ranks (103 samples, 9 batches of 6 per
    rank), resumed at 3: nothing is left of that epoch, and nothing is said."""
    data = tmp_path / "data.h5"
    pack_arrays(data, {"y": np.arange(103)}, progress=False)
    files = {k: tmp_path / f"{k}.json" for k in ("stop", "resume", "state")}
    job = run_job(["tests/jobs/scripts/loader_resume.py", "stop", files["stop"], files["state"],
                   "9", data], n=2)
    assert job.returncode == 0, job.stderr
    job = run_job(["tests/jobs/scripts/loader_resume.py", "resume", files["resume"],
                   files["state"], data], n=3)
    assert job.returncode == 0, job.stderr
    assert "ShardedLoader" not in job.stderr
    assert [rank["batches"] for rank in json.loads(files["resume"].read_text())] == [[]] * 3
