"""The examples run as a user runs them, and do what they say."""

import re

from train_output import parameters_digest


def test_digits_demo_trains_to_95_percent_and_resumes(run_job, tmp_path):
    args = ["examples/train_digits.py", "--run-dir", tmp_path]
    job = run_job(args, n=2, timeout=300)
    assert job.returncode == 0, job.stderr
    final = re.search(r"^world_size=2 test_accuracy=(\d\.\d+)$", job.stdout, re.M)
    assert final and float(final.group(1)) >= 0.95, job.stdout
    assert "(360 samples)" in job.stdout  # exact-mode evaluation counts each test sample once
    assert re.search(r"epoch 0: train_loss=[\d.]+ test_accuracy=[\d.]+ \(360 samples\) "
                     r"samples/s=\d+", job.stdout)
    # Its log is not a terminal: a line per epoch for the progress, no redrawn bar.
    assert "\r" not in job.stderr
    assert re.findall(r"^epoch (\d+): 100%", job.stderr, re.M) == [str(e) for e in range(12)]
    # The same command again finds the last checkpoint and has nothing left to train.
    again = run_job(args + ["--epochs", "12"], n=2, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "resumed from" in again.stdout and "all 12 epochs are already trained" in again.stdout
    assert "--epochs 16" in again.stdout and "Slurm" not in again.stdout
    assert parameters_digest(again.stdout) == parameters_digest(job.stdout)
    assert f"test_accuracy={final.group(1)}" in again.stdout


def test_ddp_tutorial_port_runs(run_job):
    job = run_job(["examples/ddp_tutorial.py"], n=2, timeout=120)
    assert job.returncode == 0, job.stderr
    for rank in (0, 1):
        assert f"Finished running DDP checkpoint example on rank {rank}." in job.stdout


def test_jpeg_example_decodes_in_workers_and_learns(run_job, tmp_path):
    job = run_job(["examples/train_jpeg.py", "--data", tmp_path, "--workers", "1"], n=2,
                  timeout=300)
    assert job.returncode == 0, job.stderr
    accuracies = re.findall(r"^epoch \d: test_accuracy=(\d\.\d+) "
                            r"\(360 samples, 1 simplejpeg decode", job.stdout, re.M)
    assert len(accuracies) == 6 and float(accuracies[-1]) >= 0.9, job.stdout
