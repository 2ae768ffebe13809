"""The timeline in a running job: every rank's spans in one file, and torch.profiler."""

import json
import os

import torch
import torch.nn.functional as F

import hpcddp
from ddp_models import MLP
from hpcddp import timeline
from hpcddp.timeline.profiler import start_timeline


def _steps(model, steps=3):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        optimizer.zero_grad()
        F.mse_loss(model(torch.randn(8, 8)), torch.zeros(8, 3)).backward()
        optimizer.step()


def test_every_rank_writes_into_one_trace_on_a_common_clock(world, folder):
    path = os.path.join(os.path.dirname(folder), "trace.json")
    model = hpcddp.DistributedDataParallel(MLP(), bucket_cap_mb=0.001)
    recorder = start_timeline(path, world.comm)
    _steps(model)
    world.comm.Barrier()
    barrier = timeline.now() - recorder.origin  # after the same barrier on every rank
    recorder.close()
    assert not timeline.recording()
    if world.rank == 0:
        data = json.load(open(path))
        spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
        assert {e["pid"] for e in spans} == set(range(world.size))
        names = {e["name"] for e in spans}
        assert {"forward", "backward", "SGD.step"} <= names
        assert len({e["tid"] for e in spans if e["tid"] >= 100}) == len(model.reducer.layouts)
    ends = world.comm.gather(barrier / 1e3, root=0)
    if world.rank == 0:  # the clocks, aligned at the first barrier, agree at the second
        assert all(max(s["ts"] + s["dur"] for s in spans if s["pid"] == r) < ends[r]
                   for r in range(world.size))
    model.close()


def test_spans_appear_in_a_torch_profiler_trace_without_a_timeline(world):
    model = hpcddp.DistributedDataParallel(MLP(), bucket_cap_mb=0.001)
    _steps(model, 1)  # the first step rebuilds the buckets
    assert not timeline.recording()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        _steps(model, 1)
    names = {event.key for event in prof.key_averages()}
    assert {"hpcddp::forward", "hpcddp::launch bucket 0", "hpcddp::wait bucket 0",
            "hpcddp::copy back bucket 0"} <= names
    model.close()
