"""``HOROVOD_TIMELINE`` records a Horovod program's operations as Horovod draws them: a
lane per tensor on every rank (``allreduce.<name>``), each operation's negotiation, then
the operation, in hpcddp's Chrome trace: rank 0's events written as the job runs, the
whole trace at exit; ``HOROVOD_TIMELINE=DYNAMIC`` with ``start_timeline``/``stop_timeline``
and ``HOROVOD_TIMELINE_MARK_CYCLES`` as in Horovod's own timeline tests."""

import json

from jobs_util import ROOT, launch

SCRIPT = ROOT / "tests/jobs/scripts/horovod_train.py"
LIVE = ROOT / "tests/jobs/scripts/horovod_timeline.py"
STEPS = 4  # the script's
PARAMETERS = ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_each_tensor_has_a_lane_with_its_negotiations_and_operations(tmp_path):
    trace = tmp_path / "hvd.json"
    job = launch([SCRIPT, "hpcddp.horovod"], n=2, timeout=180,
                 env={"HOROVOD_TIMELINE": str(trace)})
    assert job.returncode == 0, job.output
    assert job.stdout.count("agrees with one process on the global batch") == 2, job.output
    events = json.loads(trace.read_text())["traceEvents"]
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    for rank in range(2):
        spans = {}
        for e in events:
            name = lanes.get((e["pid"], e["tid"]), "")
            if e["ph"] == "X" and e["pid"] == rank and name:
                spans.setdefault(name, []).append(e)
        # broadcast_parameters names each broadcast by its state-dict key, and
        # DistributedOptimizer each gradient's allreduce by its parameter's name.
        for parameter in PARAMETERS:
            kinds = [e["name"] for e in sorted(spans[f"broadcast.{parameter}"],
                                               key=lambda e: e["ts"])]
            assert kinds == ["NEGOTIATE_BROADCAST", "BROADCAST"], (rank, kinds)
            kinds = [e["name"] for e in sorted(spans[f"allreduce.{parameter}"],
                                               key=lambda e: e["ts"])]
            assert kinds == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"] * STEPS, (rank, kinds)


def _lines(job, word):
    return [line.split(" ", 2)[1:] if word != "live" else [line.split(" ", 1)[1]]
            for line in job.stdout.splitlines() if line.startswith(word + " ")]


def test_the_file_is_read_while_the_job_runs_with_its_cycles_marked(tmp_path, n=2):
    trace = tmp_path / "live.json"
    job = launch([LIVE, "live"], n=n, timeout=120,
                 env={"HOROVOD_TIMELINE": str(trace), "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert job.returncode == 0, job.output
    [[seen]] = _lines(job, "live")
    seen = {tuple(pair) for pair in json.loads(seen)}
    assert {("allreduce.test_allreduce", "NEGOTIATE_ALLREDUCE"),
            ("allreduce.test_allreduce", "ALLREDUCE"),
            ("negotiation cycles", "CYCLE_START")} <= seen, seen
    whole = json.loads(trace.read_text())["traceEvents"]  # at exit: every rank's
    assert {e["pid"] for e in whole} == set(range(n))


def test_dynamic_timeline_starts_and_stops_into_new_files(tmp_path):
    first, second = tmp_path / "one.json", tmp_path / "two.json"
    job = launch([LIVE, "dynamic", str(first), str(second)], n=2, timeout=120,
                 env={"HOROVOD_TIMELINE": "DYNAMIC"})
    assert job.returncode == 0, job.output
    assert not (ROOT / "DYNAMIC").exists() and not (tmp_path / "DYNAMIC").exists()
    running = {path: {tuple(p) for p in json.loads(seen)}
               for path, seen in _lines(job, "running")}
    one, two = running[str(first)], running[str(second)]
    assert ("allreduce.in_one.json", "ALLREDUCE") in one, one
    assert ("negotiation cycles", "CYCLE_START") in one, one  # mark_cycles=True
    assert ("allreduce.in_two.json", "ALLREDUCE") in two, two
    assert not any(name == "CYCLE_START" for _, name in two), two  # mark_cycles=False
    assert not any(lane.startswith("allreduce.in_one") for lane, _ in two), two
    assert _lines(job, "stopped") == [[str(first), "[0, 1]"], [str(second), "[0, 1]"]]
    after = json.loads(second.read_text())["traceEvents"]
    assert not any("after_stop" in json.dumps(e) for e in after)


def test_start_timeline_without_horovod_timeline_is_refused_on_every_rank(tmp_path):
    job = launch([LIVE, "unset", str(tmp_path / "t.json")], n=2, timeout=120,
                 env={"HOROVOD_TIMELINE": None})
    assert job.returncode == 0, job.output
    for rank in range(2):
        assert f"rank {rank} refused: Set HOROVOD_TIMELINE=DYNAMIC" in job.stdout, job.output
    assert not (tmp_path / "t.json").exists()


def test_a_timeline_whose_folder_was_removed_is_said_at_exit_not_raised(tmp_path):
    folder = tmp_path / "gone"
    folder.mkdir()
    job = launch([LIVE, "gone"], n=2, timeout=120,
                 env={"HOROVOD_TIMELINE": str(folder / "t.json")})
    assert job.returncode == 0, job.output
    assert job.stdout.count("done") == 2, job.output
    assert "Traceback" not in job.output and "Exception ignored" not in job.output, job.output
    assert f"the timeline's whole trace could not be written to {folder / 't.json'}" \
        in job.output, job.output
    assert not folder.exists()
