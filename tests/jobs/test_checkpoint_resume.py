"""Resume equivalence: N steps in one job equal k steps, the end of the job, and a new job
resuming to N, bit for bit."""

import json

import numpy as np
import pytest
from jobs_util import launch

from hpcddp.data.pack import pack_arrays

TOTAL = 14
SCRIPT = "tests/jobs/scripts/train_resume.py"

@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(3)
    path = tmp_path_factory.mktemp("data") / "train.h5"
    pack_arrays(path, {"x": rng.standard_normal((37, 8)).astype(np.float32),
                       "y": rng.standard_normal((37, 3)).astype(np.float32)}, progress=False)
    return path


@pytest.fixture(scope="module")
def uninterrupted(data, tmp_path_factory):
    """``uninterrupted(ranks)``: every rank's losses and parameters after TOTAL steps in
    one job, run once for both stopping points."""
    runs = {}

    def run(ranks):
        if ranks not in runs:
            folder = tmp_path_factory.mktemp(f"full-{ranks}")
            job = launch([SCRIPT, data, folder / "ckpt", folder / "full.json", TOTAL], n=ranks)
            assert job.returncode == 0, job.stderr
            runs[ranks] = json.loads((folder / "full.json").read_text())
        return runs[ranks]
    return run


def _steps_per_epoch(n, ranks, batch=4):
    per_rank = -(-n // ranks)
    return -(-per_rank // batch)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("where", ["mid_epoch", "epoch_boundary"])
def test_resumed_run_equals_uninterrupted_run(run_job, tmp_path, data, uninterrupted, ranks,
                                              where):
    per_epoch = _steps_per_epoch(37, ranks)
    stop = per_epoch + 2 if where == "mid_epoch" else per_epoch
    part, rest = (tmp_path / f"{k}.json" for k in ("part", "rest"))
    job = run_job([SCRIPT, data, tmp_path / "ckpt", part, TOTAL, stop], n=ranks)
    assert job.returncode == 0, job.stderr
    job = run_job([SCRIPT, data, tmp_path / "ckpt", rest, TOTAL], n=ranks)
    assert job.returncode == 0, job.stderr
    assert f"resumed from {tmp_path / 'ckpt'}" in job.stdout
    full = uninterrupted(ranks)
    part, rest = (json.loads(p.read_text()) for p in (part, rest))
    for rank in range(ranks):
        assert part[rank]["losses"] + rest[rank]["losses"] == full[rank]["losses"]
        assert rest[rank]["params"] == full[rank]["params"]
    # Negative control: the part run's parameters are not the final ones.
    assert part[0]["params"] != full[0]["params"]
