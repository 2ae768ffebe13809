"""A Horovod program that reads its own timeline while it runs (rank 0), as Horovod's
timeline tests do: ``live`` under ``HOROVOD_TIMELINE=<file>``, ``dynamic`` under
``HOROVOD_TIMELINE=DYNAMIC`` with ``start_timeline``/``stop_timeline`` into the files
given after it, ``unset`` without ``HOROVOD_TIMELINE``, ``gone``: the timeline's folder
removed before the job ends (as Horovod's timeline test removes its temporary folder).
Each check prints one line."""

import json
import os
import shutil
import sys
import time

import torch

import hpcddp.horovod as hvd
from hpcddp.timeline import read_events


def names(path, wanted=()):
    """(lane, event) pairs in the file; rank 0 writes every 20 ms, so until ``wanted``
    are there, read again (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        events = read_events(path)
        lanes = {e["tid"]: e["args"]["name"] for e in events
                 if e.get("name") == "thread_name"}
        seen = {(lanes.get(e["tid"], ""), e["name"]) for e in events if e["ph"] in "Xi"}
        if set(wanted) <= seen or time.monotonic() > deadline:
            return seen
        time.sleep(0.02)


def allreduce(name):
    out = hvd.allreduce(torch.tensor([1.0, 2.0, 3.0]), name=name)
    assert out.tolist() == [1.0, 2.0, 3.0], out


def main():
    torch.set_num_threads(1)
    mode = sys.argv[1]
    hvd.init()
    if mode == "live":
        allreduce("test_allreduce")
        if hvd.rank() == 0:
            seen = names(os.environ["HOROVOD_TIMELINE"],
                         [("allreduce.test_allreduce", "ALLREDUCE")])
            print("live", json.dumps(sorted(seen)), flush=True)
        hvd.barrier()
    elif mode == "dynamic":
        for path, mark in zip(sys.argv[2:], (True, False)):
            hvd.start_timeline(path, mark_cycles=mark)
            allreduce(f"in_{os.path.basename(path)}")
            hvd.barrier()
            if hvd.rank() == 0:
                seen = names(path, [(f"allreduce.in_{os.path.basename(path)}", "ALLREDUCE")])
                print("running", path, json.dumps(sorted(seen)), flush=True)
            hvd.stop_timeline()
            if hvd.rank() == 0:  # stopped: the whole trace, valid JSON, every rank
                with open(path) as f:
                    whole = json.load(f)["traceEvents"]
                print("stopped", path, sorted({e["pid"] for e in whole}), flush=True)
        allreduce("after_stop")
    elif mode == "gone":
        allreduce("before_gone")
        hvd.barrier()
        if hvd.rank() == 0:
            shutil.rmtree(os.path.dirname(os.environ["HOROVOD_TIMELINE"]))
        hvd.barrier()
    elif mode == "unset":
        try:
            hvd.start_timeline(sys.argv[2])
        except ValueError as error:
            print(f"rank {hvd.rank()} refused: {error}", flush=True)
    print(f"rank {hvd.rank()} done", flush=True)


if __name__ == "__main__":
    main()
