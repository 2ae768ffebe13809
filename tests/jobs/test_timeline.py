"""HPCDDP_TIMELINE on the demo: a trace every rank wrote into, showing overlap, drawn."""

import json
import os
import re
import subprocess
import sys

import pytest


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    from jobs_util import launch

    folder = tmp_path_factory.mktemp("timeline")
    path = folder / "trace" / "digits.json"  # its folder is made
    job = launch(["examples/train_digits.py", "--run-dir", folder, "--epochs", "1"], n=2,
                 env={"HPCDDP_TIMELINE": str(path)}, timeout=300)
    assert job.returncode == 0, job.stderr
    return path


def _spans(trace):
    events = json.loads(trace.read_text())["traceEvents"]
    return [e for e in events if e["ph"] == "X"]


def test_the_trace_is_json_with_every_ranks_spans(trace):
    spans = _spans(trace)
    assert {e["pid"] for e in spans} == {0, 1}
    for rank in (0, 1):
        names = {e["name"] for e in spans if e["pid"] == rank}
        for expected in ("forward", "backward", "launch bucket 0", "wait bucket 1",
                         "copy back bucket 0", "Adam.step", "loader wait"):
            assert expected in names, (rank, expected)
        reductions = {e["tid"] for e in spans if e["pid"] == rank and e["tid"] >= 100}
        assert reductions == {100, 101}  # the demo's two buckets, a lane each


def test_a_bucket_reduction_overlaps_backward(trace):
    """Bucket 0 (the linear layers) is issued while the convolutions' gradients are still
    being computed: its reduction starts before that backward ends."""
    spans = _spans(trace)
    overlapping = 0
    for rank in (0, 1):
        backwards = [(e["ts"], e["ts"] + e["dur"]) for e in spans
                     if e["pid"] == rank and e["name"] == "backward"]
        for e in spans:
            if e["pid"] == rank and e["tid"] == 100:
                start, end = e["ts"], e["ts"] + e["dur"]
                overlapping += any(b0 < start < b1 and end > start for b0, b1 in backwards)
    assert overlapping > 0


def test_hpcddp_timeline_draws_a_png_and_measures_the_overlap(trace, tmp_path):
    picture = tmp_path / "overlap.png"
    done = subprocess.run([sys.executable, "-m", "hpcddp", "timeline", str(trace), "-o",
                           str(picture)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    share = re.search(r"\((\d+) %\) overlapping backward", done.stdout)
    assert share and int(share.group(1)) > 0, done.stdout
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and os.path.getsize(picture) > 10_000


def test_a_file_that_is_not_a_trace_is_named(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text("{}")
    done = subprocess.run([sys.executable, "-m", "hpcddp", "timeline", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and f"cannot read {bad} as a trace" in done.stderr
