"""``HOROVOD_TIMELINE`` records a Horovod program's operations as Horovod draws them: a
lane per tensor on every rank, each operation's negotiation, then the operation, in
hpcddp's Chrome trace (written at exit)."""

import json

from jobs_util import ROOT, launch

SCRIPT = ROOT / "tests/jobs/scripts/horovod_train.py"
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
            if e["ph"] == "X" and e["pid"] == rank and name.startswith("hvd "):
                spans.setdefault(name[4:], []).append(e)
        # broadcast_parameters names each broadcast by its state-dict key, and
        # DistributedOptimizer each gradient's allreduce by its parameter's name.
        for parameter in PARAMETERS:
            kinds = [e["name"] for e in sorted(spans[parameter], key=lambda e: e["ts"])]
            assert kinds == ["NEGOTIATE_BROADCAST", "BROADCAST"] + \
                ["NEGOTIATE_ALLREDUCE", "ALLREDUCE"] * STEPS, (rank, kinds)
