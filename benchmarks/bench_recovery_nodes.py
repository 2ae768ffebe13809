"""A node lost mid-training across emulated nodes: recovery inside the job under ULFM
against the batch script's restart, on 2 x 2 and 3 x 1 nodes.

Each run trains tests/jobs/scripts/elastic_train.py (a DDP MLP, a commit every 3 steps, a
checkpoint every 2 commits, a ``dist.all_reduce`` of its own each step) for ``--steps``
steps with no pause, and faults the second node when rank 0 reaches step ``--fault-at``,
while the ranks compute and reduce:

- ``killed``: every process on the node but the launcher's daemon is SIGKILLed (the
  OOM killer, an operator), under Open MPI's ``mpirun --with-ft ulfm``: the survivors go
  on at the smaller size;
- ``frozen``: every process on the node, the daemon too, is stopped (SIGSTOP); the
  failure detector declares its ranks failed and the survivors go on; the node is woken
  when training ends, so that the job can end;
- ``link``: the node's link goes down; the side with the majority of the nodes (or rank
  0's) goes on, the other leaves; the link comes back when training ends;
- ``restart``: the ``killed`` fault under MPICH (``.venv``), healed as slurm/train.sbatch
  heals it: the job ends, and a new job resumes from the last checkpoint on the other
  nodes: at full size with the third node standing in (2 x 2), or on the two nodes left
  (3 x 1, no spare).

Per run: the seconds from the fault to the first step completed afterwards (at the new
size, or in the new job), the step training resumed at (the fault is made once rank 0
has done step ``--fault-at``: a commit every 3 steps, a checkpoint every 6), exit codes,
a job ended at the shrink's deadline (``recovery_stuck``), a hang (past the timeout), a
crash, and whether the
final parameters are those of one process trained on every step's global batch
(tests/support/elastic_reference.py). JSON in results/recovery_nodes.json.

Run as root, both venvs built (``make venv .venv-openmpi/.hpcddp-installed``):
``python benchmarks/bench_recovery_nodes.py --runs 20`` (``--layouts 3x1 --kinds
killed,restart`` for some of them). It builds its own emulated cluster (``hdbench``) and
removes it at the end.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import mpi4py

mpi4py.rc.initialize = mpi4py.rc.finalize = False  # this driver only launches jobs

from common import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests/support")]
from elastic_reference import elastic_reference, trained_as  # noqa: E402
from testbed.nodes import EmulatedCluster  # noqa: E402

SCRIPT = ROOT / "tests/jobs/scripts/elastic_train.py"
LAYOUTS = {"2x2": (2, 2), "3x1": (3, 1)}
FLAVOURS = {"openmpi": ROOT / ".venv-openmpi/bin/python", "mpich": ROOT / ".venv/bin/python"}
FIRST = re.compile(r"^rank \d+ of (\d+): first step at ([\d.]+)$", re.M)
RESUMED = re.compile(r"(?:goes on|resumed) at step (\d+)")


class Job:
    """A job started on the emulated nodes, its output gathered by a thread."""

    def __init__(self, cluster, flavour, nodes, per_node, folder, steps, fault_at):
        python = FLAVOURS[flavour]
        command = cluster.launch(str(python), per_node, nodes, flavour)
        if flavour == "openmpi":
            command[1:1] = ["--with-ft", "ulfm"]
        command += [str(SCRIPT), str(folder / "ckpt"), str(folder / "params.json"), str(steps)]
        env = cluster.env(dict(os.environ, ELASTIC_TIMES="1", ELASTIC_SAY_AT=str(fault_at),
                               HPCDDP_TIMEOUT="30", OMP_NUM_THREADS="1",
                               HPCDDP_REPORT_DIR=str(folder / "reports")), flavour)
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, cwd=ROOT, start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self):
        return "".join(self.lines)

    def wait_for(self, prefix, timeout):
        deadline = time.monotonic() + timeout
        while not any(line.startswith(prefix) for line in self.lines):
            if time.monotonic() > deadline or (self.proc.poll() is not None
                                               and not self.reader.is_alive()):
                return False
            time.sleep(0.02)
        return True

    def end(self, timeout):
        """The exit code, or None: it hung and was killed."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
            self.reader.join()
            return None
        self.reader.join()
        return self.proc.returncode



def _first_after(text, size, after):
    times = [float(t) for n, t in FIRST.findall(text) if int(n) == size and float(t) > after]
    return max(times) - after if times else None


def _crashed(text):
    return "Segmentation" in text or "signal 11" in text or "EXIT CODE: 11" in text


def fault_run(cluster, kind, layout, folder, expected, steps, fault_at):
    nodes, per_node = LAYOUTS[layout]
    victim = cluster.nodes[1]
    job = Job(cluster, "openmpi", cluster.nodes[:nodes], per_node, folder, steps, fault_at)
    hung = not job.wait_for(f"at step {fault_at}", 180)
    faulted = time.time()
    try:
        if not hung and kind == "killed":
            cluster.kill_node(victim, launcher_too=False)
        elif not hung and kind == "frozen":
            cluster.freeze_node(victim)
        elif not hung:
            cluster.set_link(victim, False)
        job.wait_for("rank 0 finished", 180)  # or the job ended without it
    finally:
        if kind == "frozen":
            cluster.freeze_node(victim, frozen=False)
        if kind == "link":
            cluster.set_link(victim, True)
    code = job.end(60)
    resumed = [int(s) for s in RESUMED.findall(job.text)]
    return {"exit": code, "hung": hung or code is None, "crash": _crashed(job.text),
            "identical": trained_as(folder / "params.json", expected),
            "seconds": _first_after(job.text, nodes * per_node - per_node, faulted),
            "resumed_at": min(resumed) if resumed else None,
            "ended": "recovery_stuck" if "MPIX_Comm_shrink did not complete" in job.text
            else None}


def restart_run(cluster, layout, folder, expected, steps, fault_at):
    nodes, per_node = LAYOUTS[layout]
    job = Job(cluster, "mpich", cluster.nodes[:nodes], per_node, folder, steps, fault_at)
    hung = not job.wait_for(f"at step {fault_at}", 180)
    faulted = time.time()
    cluster.kill_node(cluster.nodes[1], launcher_too=False)
    code = job.end(60)
    # onto the spare (2 x 2), or, with none left (3 x 1), on the nodes that remain
    spare = [n for i, n in enumerate(cluster.nodes) if i != 1][:nodes]
    successor = Job(cluster, "mpich", spare, per_node, folder, steps, -1)
    code2 = successor.end(180)
    resumed = [int(s) for s in RESUMED.findall(successor.text)]
    return {"exit": [code, code2], "hung": hung or code is None or code2 is None,
            "crash": _crashed(job.text + successor.text),
            "identical": trained_as(folder / "params.json", expected),
            "seconds": _first_after(successor.text, len(spare) * per_node, faulted),
            "resumed_at": min(resumed) if resumed else None}


def summary(runs):
    seconds = [r["seconds"] for r in runs if r["seconds"] is not None]
    resumed = [r["resumed_at"] for r in runs if r["resumed_at"] is not None]
    return {"runs": len(runs), "hangs": sum(r["hung"] for r in runs),
            "crashes": sum(r["crash"] for r in runs),
            "identical": sum(r["identical"] for r in runs),
            "median_s": statistics.median(seconds) if seconds else None,
            "max_s": max(seconds) if seconds else None,
            "recovered": len(seconds), "ended_stuck": sum(r.get("ended") == "recovery_stuck"
                                                          for r in runs),
            "resumed_at": [min(resumed), max(resumed)] if resumed else None}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--layouts", default="2x2,3x1")
    parser.add_argument("--kinds", default="killed,frozen,link,restart")
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument("--fault-at", type=int, default=200)
    parser.add_argument("--name", default="recovery_nodes", help="results/<name>.json")
    args = parser.parse_args()
    expected = elastic_reference(args.steps)
    layouts, kinds = args.layouts.split(","), args.kinds.split(",")
    runs = {f"{layout} {kind}": [] for layout in layouts for kind in kinds}
    cluster = EmulatedCluster.up(nodes=3, name="hdbench")
    try:
        for i in range(args.runs):  # interleaved: the machine's drift falls on all alike
            for layout in layouts:
                for kind in kinds:
                    with tempfile.TemporaryDirectory(prefix="hpcddp-nodes-",
                                                     ignore_cleanup_errors=True) as folder:
                        if kind == "restart":
                            found = restart_run(cluster, layout, Path(folder), expected,
                                                args.steps, args.fault_at)
                        else:
                            found = fault_run(cluster, kind, layout, Path(folder), expected,
                                              args.steps, args.fault_at)
                    runs[f"{layout} {kind}"].append(found)
                    print(layout, kind, i, found, flush=True)
    finally:
        cluster.down()
    result = {key: summary(found) for key, found in runs.items()}
    for key, said in result.items():
        print(f"{key}: {said}")
    ratios = {}
    for layout in layouts:
        restart = result.get(f"{layout} restart", {}).get("median_s")
        for kind in kinds:
            mine = result[f"{layout} {kind}"]["median_s"]
            if kind != "restart" and restart and mine:
                ratios[f"{layout} restart / {kind}"] = restart / mine
    print(ratios)
    path = write(args.name, {"benchmark": "a node lost mid-training on emulated nodes: "
                             "recovery inside the job (ULFM) against the restart onto a "
                             "spare", "steps": args.steps, "fault_at_step": args.fault_at,
                             "summary": result, "ratios": ratios, "runs": runs,
                             "when": time.strftime("%Y-%m-%d")},
                 SimpleNamespace(is_main=True, size=1))
    print(path)


if __name__ == "__main__":
    sys.exit(main())
