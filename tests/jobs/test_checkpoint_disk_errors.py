"""A full disk or a file-size limit during save: raised on every rank, the previous
checkpoint intact and still the one a load returns."""

import errno
import os
import subprocess
import warnings

import pytest
import torch
from mpi4py import MPI

import hpcddp.checkpoint as checkpoint


def _loads_step_one(directory):
    model = torch.nn.Linear(256, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = checkpoint.load(directory, model, comm=MPI.COMM_SELF, device="cpu")
    assert resumed is not None and resumed.step == 1
    assert not [n for n in os.listdir(directory) if n.startswith(".tmp")]


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    # Room for one checkpoint of 257 KiB, not two.
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({made.stderr.strip()}); needs root")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_full_disk_is_raised_on_every_rank(run_job, small_tmpfs):
    directory = small_tmpfs / "ckpt"
    job = run_job(["tests/jobs/scripts/save_fails.py", directory], n=2, timeout=120)
    assert job.returncode == 0, job.stderr
    for rank in (0, 1):
        assert f"rank {rank}: OSError errno={errno.ENOSPC}" in job.stdout
    # A failed write names no file of itself; the error names the checkpoint and the room.
    assert job.stdout.count(f"while writing checkpoint {directory}/step-000000002 (") == 2
    assert "MiB free there); nothing of it was published" in job.stdout
    _loads_step_one(directory)


def test_file_size_limit_gives_efbig_on_every_rank(run_job, tmp_path):
    directory = tmp_path / "ckpt"
    job = run_job(["tests/jobs/scripts/save_fails.py", directory, "fsize"], n=2, timeout=120)
    assert job.returncode == 0, job.stderr
    for rank in (0, 1):
        assert f"rank {rank}: OSError errno={errno.EFBIG}" in job.stdout
    _loads_step_one(directory)
