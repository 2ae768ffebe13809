"""A rank five times slower than the others is named once, with its node, and training
goes on (hpcddp/ddp/stragglers.py); with no slow rank nobody is named."""

import re
import socket

import pytest

ENV = {"HPCDDP_STRAGGLER_STEPS": "10"}


@pytest.mark.parametrize("slow", [2, 0])
def test_a_slow_rank_is_named_once_and_training_goes_on(run_job, slow):
    job = run_job(["tests/jobs/scripts/straggler.py", slow], n=3, timeout=120, env=ENV)
    assert job.returncode == 0, job.output
    assert all(f"rank {r}: trained 60 steps" in job.stdout for r in range(3)), job.output
    named = re.findall(r"hpcddp: rank (\d) on (\S+) is ([\d.]+)x slower", job.stderr)
    assert [(int(r), host) for r, host, _ in named] == [(slow, socket.gethostname())], \
        job.stderr
    assert float(named[0][2]) <= 8.0, job.stderr  # about five times, less on a busy machine


def test_no_rank_is_named_when_none_is_slow(run_job):
    job = run_job(["tests/jobs/scripts/straggler.py"], n=3, timeout=120, env=ENV)
    assert job.returncode == 0, job.output
    assert "slower than the other ranks" not in job.stderr, job.stderr
