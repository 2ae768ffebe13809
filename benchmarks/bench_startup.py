"""A job's start and end: what hpcddp adds to the torch import every rank pays.

Whole 2-rank jobs under mpiexec, interleaved, each started ``--runs`` times:

- ``torch_only``: every rank imports torch and exits (the floor of any torch MPI job);
- ``hpcddp``: every rank imports torch, runs ``hpcddp.init()``, one DDP step, and exits
  (the heap frozen as the interpreter exits, ``HPCDDP_GC_FREEZE=exit``, the default);
- ``hpcddp_freeze_init``: the same with the heap frozen at ``init()``
  (``HPCDDP_GC_FREEZE=init``);
- ``hpcddp_no_freeze``: the same never frozen (``HPCDDP_GC_FREEZE=off``).

For each: the job's wall time and its exit, from the script's last line to the end of
the launcher (the ranks' leaving handshake, MPI_Finalize, the interpreter's teardown).
And in one process: a full ``gc.collect()`` after ``hpcddp.init()``, with the heap
frozen at init and not, the pause a rank's full collection causes during training.

Run: ``python benchmarks/bench_startup.py`` (it starts the jobs itself).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")

JOB = """
import sys, time
import torch
if sys.argv[1] != "torch_only":
    import hpcddp
    hpcddp.init()
    model = hpcddp.DistributedDataParallel(torch.nn.Linear(64, 64))
    model(torch.ones(8, 64)).sum().backward()
print(f"last line at {time.time():.6f}", flush=True)
"""

GC = """
import gc, json, time
import torch
import hpcddp
hpcddp.init()
samples = []
for _ in range(5):
    start = time.perf_counter()
    gc.collect()
    samples.append(time.perf_counter() - start)
print(json.dumps({"tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count(),
                  "full_collection_ms": sorted(samples)[2] * 1e3}))
"""

KINDS = {"torch_only": {}, "hpcddp": {}, "hpcddp_freeze_init": {"HPCDDP_GC_FREEZE": "init"},
         "hpcddp_no_freeze": {"HPCDDP_GC_FREEZE": "off"}}


def _job(kind, script):
    env = dict(os.environ, **KINDS[kind])
    start = time.time()
    done = subprocess.run([MPIEXEC, "-n", "2", sys.executable, script, kind], env=env,
                          capture_output=True, text=True, timeout=300, check=True)
    end = time.time()
    last = max(float(line.split()[-1]) for line in done.stdout.splitlines()
               if line.startswith("last line at"))
    return end - start, end - last


def _gc(freeze):
    env = dict(os.environ, HPCDDP_GC_FREEZE=freeze)
    done = subprocess.run([sys.executable, "-c", GC], env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    return json.loads(done.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    script = HERE / "results" / ".startup_job.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(JOB)
    try:
        samples = {kind: [] for kind in KINDS}
        for kind in KINDS:  # warm the page cache
            _job(kind, script)
        for _ in range(args.runs):
            for kind in KINDS:
                samples[kind].append(_job(kind, script))
    finally:
        script.unlink()
    jobs = {kind: {"job_s": statistics.median(s[0] for s in values),
                   "exit_s": statistics.median(s[1] for s in values)}
            for kind, values in samples.items()}
    floor = jobs["torch_only"]["job_s"]
    for values in jobs.values():
        values["job_over_torch_only"] = values["job_s"] / floor
    result = {"runs": args.runs, "ranks": 2, "jobs": jobs,
              "gc_after_init": {"frozen": _gc("init"), "not_frozen": _gc("exit")},
              "cpus": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}
    path = HERE / "results" / "startup.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
