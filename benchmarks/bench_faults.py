"""The fault soak: faults injected at a random moment while emulated nodes train with no
pause, each kind many times, and how every run ended.

Run as root (it builds its own emulated cluster, ``testbed``, and removes it):

    python benchmarks/bench_faults.py --layout 2x2 --runs 20
    python benchmarks/bench_faults.py --layout 3x1 --runs 20 --level serialized
    python benchmarks/bench_faults.py --layout 2x2 --runs 3 --flavour openmpi   # or impi
    python benchmarks/bench_faults.py --layout 3x1 --append --fill 20  # top a file up

The job is ``tests/cluster/scripts/train_steps.py`` (checkpoints every 5 steps) on the
layout's nodes with ``HPCDDP_TIMEOUT=10``. Once rank 0 has printed step 20, the fault
lands after a random 0-2 s on the last node (or its last rank):

- ``ranks_killed``: every rank of the node SIGKILLed, its launcher proxy spared;
- ``node_lost``: everything on the node SIGKILLed, proxy included;
- ``link_down``: the node's link set down; ``crawl``: shaped to 8 kbit/s;
- ``frozen``: every process on the node SIGSTOPped;
- ``stuck``: the rank stays in user code for ever; ``slow``: it takes 5x as long per step
  (this one must not end the job: it must be named and training go on).

For each run: whether it hung (no end within the timeout + 60 s), crashed (a rank dead
of SIGSEGV, SIGBUS, SIGABRT, SIGFPE or SIGILL, as its launcher says or, for a rank its
launcher no longer sees, as the kernel's log does), ended with a line naming the node (or
the rank; an end within 1 s with no such line is counted apart: the launcher ended every
rank at once and none lived to report), the seconds from fault to end, what was left on
the nodes (ranks still alive up to ``LINGER`` seconds after the launcher ended, the MPI's
/dev/shm segments and their bytes), and whether a rerun on the healed cluster resumed to
the parameters of an uninterrupted run, and whether the job's log kept every line (the
launcher writes to a regular file, as under ``sbatch``, unless ``--output pipe``). The
MPI's own settings the soak runs with (none: what ``make demo`` installs) are kept in each
run's record, and ``soak_table.py`` shows them as its configuration. Under ``--flavour openmpi`` or ``impi`` the jobs
run in that MPI's virtual environment (``make test-mpis`` builds them) and its launcher
starts them. ``results/faults-<layout>-<level>[-<flavour>].json``, written
after every run; ``--append`` adds to that file's runs (each names its commit), and
``--table-from FILE`` recomputes a results file's table from its runs.
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from hpcddp.commands.lost import from_launcher
from hpcddp.env import clean_environment

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's testbed/
from testbed import EmulatedCluster, network  # noqa: E402
from testbed.nodes import FLAVOUR_VENVS  # noqa: E402
from soak_watch import OthersWatch, cmdline, kernel_faults, rank_pids, segments  # noqa: E402
RESULTS = Path(__file__).resolve().parent / "results"
SCRIPT = ROOT / "tests/cluster/scripts/train_steps.py"
TIMEOUT = 10
# A rank dead of SIGILL, SIGABRT, SIGBUS, SIGFPE or SIGSEGV, as each launcher says it:
# MPICH's hydra (exit code), Intel MPI's (signal), Open MPI's prterun (signal, then name).
CRASH = re.compile(r"EXIT CODE: (4|6|7|8|11)\b|KILLED BY SIGNAL: (4|6|7|8|11)\b|"
                   r"on\s+signal (4|6|7|8|11)\b|Segmentation fault|Bus error")
RESUME_STEPS = 1000  # a rerun trains to this step from the last checkpoint (every 5 steps)
SLOW_STEPS = 400     # the slow kind's whole run, which must end by itself
MPI_SETTINGS = ("MPIR_CVAR_", "FI_", "UCX_", "I_MPI_", "OMPI_MCA_", "PRTE_MCA_")
LINGER = TIMEOUT + 25  # how long ranks cut off from the launcher may take to end themselves
KINDS = ("ranks_killed", "node_lost", "link_down", "crawl", "frozen", "stuck", "slow")


class Job:
    """``mpiexec`` on the cluster, its merged output read line by line in a thread: from
    a pipe, or (``log``) from the regular file it writes to, as a batch job's log."""

    started = []  # every job's launcher, killed if the soak is stopped
    launcher_args = []  # --launcher-args: after the launcher's name, before its others

    def __init__(self, cluster, layout, argv, env, flavour="mpich", log=None):
        nodes, per_node = layout
        python = ROOT / FLAVOUR_VENVS[flavour] / "bin" / "python"
        launch = cluster.launch(python, per_node, cluster.nodes[:nodes], flavour)
        command = [launch[0], *Job.launcher_args, *launch[1:], str(SCRIPT), *map(str, argv)]
        base = dict(clean_environment(os.environ), **env)
        self.log = log
        # A file opened as a shell's `> job.log` opens it: written at its own offset.
        sink = open(log, "w") if log else subprocess.PIPE
        self.proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT,
                                     text=True, cwd=ROOT, env=cluster.env(base, flavour),
                                     start_new_session=True)
        if log:
            sink.close()
        Job.started.append(self.proc)
        self.lines, self.seen = [], threading.Event()
        self.reader = threading.Thread(target=self._tail if log else self._read, daemon=True)
        self.reader.start()

    def _take(self, line):
        self.lines.append(line)
        if line.startswith("step 20"):
            self.seen.set()

    def _read(self):
        for line in self.proc.stdout:
            self._take(line)

    def _tail(self):
        with open(self.log, errors="replace") as f:
            part = ""
            while True:
                ended = self.proc.poll() is not None
                part += f.read()
                *whole, part = part.split("\n")
                for line in whole:
                    self._take(line + "\n")
                if ended:
                    break
                time.sleep(0.1)
            if part:
                self._take(part)

    def end(self, timeout):
        """Wait for the job; kill its process group after ``timeout``. (rc, hung)."""
        try:
            self.proc.wait(timeout=timeout)
            hung = False
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            hung = True
        self.reader.join(timeout=10)
        return self.proc.returncode, hung

    @property
    def text(self):
        if self.log:  # the file as it ended, whatever became of the lines read meanwhile
            return Path(self.log).read_text(errors="replace")
        return "".join(self.lines)


def _ranks_left(cluster):
    """Ranks still alive on each node once the launcher has ended, after up to LINGER
    seconds: a node cut off from the launcher ends its own ranks (the watchdog's timeout,
    then its wait for rank 0's side to report); a frozen node's cannot end at all, so the
    wait ends once every rank left is a stopped one."""
    def alive(node):
        return [pid for pid in network.node_pids(node) if SCRIPT.name in cmdline(pid)]
    deadline = time.monotonic() + LINGER
    while time.monotonic() < deadline and any(
            not _stopped(pid) for node in cluster.nodes for pid in alive(node)):
        time.sleep(0.5)
    return {node: len(alive(node)) for node in cluster.nodes}


def _stopped(pid):
    """Whether ``pid`` is stopped by a signal (state T), or already gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _digest(text):
    found = re.findall(r"parameters_sha256=([0-9a-f]{64})", text)
    return found[-1] if found else None


def _inject(kind, cluster, victim, trigger):
    if kind == "ranks_killed":
        cluster.kill_node(victim, launcher_too=False)
    elif kind == "node_lost":
        cluster.kill_node(victim)
    elif kind == "link_down":
        cluster.set_link(victim, False)
    elif kind == "crawl":
        cluster.shape(victim, "8kbit")
    elif kind == "frozen":
        for pid in network.node_pids(victim):
            os.kill(pid, signal.SIGSTOP)
    else:  # stuck, slow: the program's own fault
        trigger.write_text(kind)


def _heal(cluster):
    for node in cluster.nodes:
        for pid in network.node_pids(node):
            os.kill(pid, signal.SIGCONT)
        cluster.set_link(node, True)
        cluster.shape(node, None)
        network.kill_node(node)


def _named(kind, text, victim, rank, ranks):
    if kind == "slow":
        return f"rank {rank} on {victim} is" in text
    if kind == "stuck":
        return f"Not arrived: rank {rank}." in text or f"rank {rank} is in user code" in text
    # The watchdog names the node and its ranks; a launcher, the node of a killed rank
    # (hydra: RUNNING AT, prterun: on node).
    return (victim in text and ranks in text or f"RUNNING AT {victim}" in text
            or f"on node {victim}" in text or (from_launcher(text) or {}).get("node") == victim)


def one_run(cluster, layout, kind, level, workdir, reference, rng, flavour="mpich",
            output="file"):
    nodes, per_node = layout
    victim = cluster.nodes[nodes - 1]
    rank = nodes * per_node - 1
    victims = list(range(rank - per_node + 1, rank + 1))
    ranks = ("rank " if per_node == 1 else "ranks ") + ",".join(map(str, victims))
    ckpt, trigger = workdir / "ckpt", workdir / "trigger"
    for stale in (ckpt, trigger):
        subprocess.run(["rm", "-rf", str(stale)])
    env = {"HPCDDP_TIMEOUT": str(TIMEOUT), "MPI4PY_RC_THREAD_LEVEL": level,
           "HPCDDP_STRAGGLER_STEPS": "20"}
    steps = SLOW_STEPS if kind == "slow" else 100_000
    before = segments()
    job = Job(cluster, layout, [ckpt, steps, "--trigger", trigger, "--victim", rank,
                                "--act", "slow" if kind == "slow" else "stuck"], env, flavour,
              log=workdir / "job.log" if output == "file" else None)
    others = OthersWatch(job.proc.pid)  # the job's launcher leads its own session
    if not job.seen.wait(180):
        job.end(1)
        raise RuntimeError(f"the job never reached step 20:\n{job.text[-3000:]}")
    time.sleep(rng.uniform(0.0, 2.0))
    pids = rank_pids(SCRIPT.name)
    seen_faults = kernel_faults(pids)  # none, unless a PID is reused
    fault_time = time.strftime("%Y-%m-%dT%H:%M:%S")
    _inject(kind, cluster, victim, trigger)
    faulted = time.monotonic()
    rc, hung = job.end(TIMEOUT + 60 if kind != "slow" else 600)
    took = time.monotonic() - faulted
    text = job.text
    left = _ranks_left(cluster)
    new = {k: v for k, v in segments().items() if k not in before}
    unseen = sorted(kernel_faults(pids) - seen_faults)  # ranks the launcher no longer saw
    lost_lines = job.log is not None and ("\0" in text or bool(job.lines)
                                          and not text.startswith(job.lines[0]))
    record = {"kind": kind, "fault_at": fault_time, "rc": rc, "hung": hung, "output": output,
              "log_kept": not lost_lines,
              "seconds": round(took, 1), "machine_shared": others.stop(),
              "crashed": bool(CRASH.search(text) or unseen),
              "named": _named(kind, text, victim, rank, ranks),
              "ranks_left": left, "shm_segments_left": len(new),
              "shm_bytes_left": sum(new.values())}
    if unseen:
        record["kernel_faults"] = unseen
    # How the watchdog named a node behind a failed link: silent, or slow to answer.
    verdict = [how for how, words in (("silent", f"No rank on node {victim} "),
                                      ("slow", f"Node {victim} (")) if words in text]
    if verdict:
        record["watchdog_named"] = verdict
    settings = {k: v for k, v in sorted(os.environ.items()) if k.startswith(MPI_SETTINGS)}
    if settings:  # the MPI's own settings this soak ran with (its network module, ...)
        record["mpi_settings"] = settings
    module = re.search(r"^network_module=(\S+)", text, re.M)
    if module and module.group(1) != "None":  # MPICH's, as the job's rank 0 said
        record["network_module"] = module.group(1)
    # hpcddp's own headlines (the watchdog's report, a straggler's warning), whole
    record["said"] = [line for line in text.splitlines() if line.startswith("hpcddp: ")][:4]
    thrown = [line for line in text.splitlines() if "uncaught exception" in line]
    if thrown:  # a thread of hpcddp's that raised: its rank's traceback
        tag = thrown[0].split(" of ")[0].replace("hpcddp: rank ", "[rank ") + "]"
        record["uncaught"] = [line for line in text.splitlines() if line.startswith(tag)][-30:]
    if not record["named"] or record["crashed"]:
        record["output_tail"] = text[-2000:]  # what the user saw instead
        # and what the ranks' reports said, their stacks left out
        record["reports"] = [line for line in text.splitlines() if line.startswith("hpcddp: ")
                             or line.startswith("[rank ") and "]   " not in line][:60]
    _heal(cluster)
    # A stopped rank left behind runs again for a moment when the soak heals its node
    # (SIGCONT, then SIGKILL): whether it dies of a fault signal meanwhile, counted apart.
    thawed = sorted(kernel_faults(pids) - seen_faults - set(unseen))
    if thawed:
        record["kernel_faults_when_healed"] = thawed
    for name in new:  # what the end left, so the next run starts clean
        Path("/dev/shm", name).unlink(missing_ok=True)
    if kind == "slow":
        record["identical"] = rc == 0 and _digest(text) == reference["slow"]
        return record
    rerun = Job(cluster, layout, [ckpt, RESUME_STEPS], env, flavour)
    rerun_rc, _ = rerun.end(300)
    record["identical"] = rerun_rc == 0 and _digest(rerun.text) == reference["resume"]
    if not record["identical"]:
        record["resume_rc"], record["resume_tail"] = rerun_rc, rerun.text[-2000:]
    _heal(cluster)
    return record


def _references(cluster, layout, level, workdir, flavour):
    env = {"HPCDDP_TIMEOUT": str(TIMEOUT), "MPI4PY_RC_THREAD_LEVEL": level}
    found = {}
    for key, steps in (("resume", RESUME_STEPS), ("slow", SLOW_STEPS)):
        subprocess.run(["rm", "-rf", str(workdir / "ref")])
        job = Job(cluster, layout, [workdir / "ref", steps], env, flavour)
        rc, _ = job.end(600)
        if rc != 0:
            raise RuntimeError(f"the uninterrupted run failed:\n{job.text[-3000:]}")
        found[key] = _digest(job.text)
    return found


def _no_survivor(record):
    """The launcher ended every rank within a second of the fault, with no report: no
    rank lived to name anything (hydra, when a node's proxy dies with it)."""
    return not record["named"] and not record["hung"] and record["seconds"] < 1.0


def summarize(records):
    ends = [r["seconds"] for r in records if not r["hung"]]
    return {"runs": len(records), "hangs": sum(r["hung"] for r in records),
            "crashes": sum(r["crashed"] for r in records),
            "crashes_seen_by_the_kernel_only": sum(bool(r.get("kernel_faults"))
                                                   for r in records),
            "crashes_when_a_stopped_rank_was_healed": sum(
                bool(r.get("kernel_faults_when_healed")) for r in records),
            "ends_without_naming": sum(not r["named"] and not _no_survivor(r)
                                       for r in records),
            "ended_by_the_launcher_with_no_survivor": sum(map(_no_survivor, records)),
            "end_seconds_median": statistics.median(ends) if ends else None,
            "end_seconds_max": max(ends) if ends else None,
            # The slow kind must not end: its seconds are the rest of a whole run.
            "ended_within_timeout_plus_30": None if any(r["kind"] == "slow" for r in records)
            else sum(r["seconds"] <= TIMEOUT + 30 for r in records),
            "ranks_left": sum(sum(r["ranks_left"].values()) for r in records),
            # Segments only where no other MPI job ran beside the run (it would leave
            # its own there for a while: hpcddp removes a job's once all its ranks are in).
            "shm_segments_left": sum(r["shm_segments_left"] for r in records
                                     if not r.get("machine_shared")),
            "shm_bytes_left": sum(r["shm_bytes_left"] for r in records
                                  if not r.get("machine_shared")),
            "runs_beside_other_mpi_jobs": sum(bool(r.get("machine_shared")) for r in records),
            "identical": sum(r["identical"] for r in records)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layout", default="2x2", help="NODESxRANKS_PER_NODE")
    parser.add_argument("--runs", type=int, default=20, help="runs per kind")
    parser.add_argument("--fill", type=int, default=None, metavar="N",
                        help="with --append: run the kinds in turn until the results file "
                             "holds N runs of each (instead of --runs)")
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--level", default="multiple", help="MPI4PY_RC_THREAD_LEVEL")
    parser.add_argument("--flavour", default="mpich", choices=sorted(FLAVOUR_VENVS),
                        help="the MPI: its virtual environment's Python and launcher")
    parser.add_argument("--launcher-args", default="", metavar="ARGS",
                        help="more arguments for the launcher, e.g. '--with-ft ulfm' (Open "
                             "MPI's process fault tolerance); kept in each run's record")
    parser.add_argument("--output", default="file", choices=("file", "pipe"),
                        help="where the launcher writes: a regular file, as a batch job's "
                             "log (the default), or a pipe")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=None, help="results/<name>.json")
    parser.add_argument("--out", default=None, metavar="JSON",
                        help="write the results here instead of results/<name>.json")
    parser.add_argument("--table-from", default=None, metavar="JSON",
                        help="only recompute the table of a results file from its runs")
    parser.add_argument("--append", action="store_true",
                        help="add this soak's runs to the results file's, of the same layout "
                             "and level (a soak of many runs per kind, over several sittings)")
    args = parser.parse_args()
    if args.table_from:
        path = Path(args.table_from)
        _write(path, json.loads(path.read_text()))
        return
    layout = tuple(int(x) for x in args.layout.split("x"))
    kinds = args.kinds.split(",")
    suffix = "" if args.flavour == "mpich" else f"-{args.flavour}"
    name = args.name or f"faults-{args.layout}-{args.level}{suffix}"
    out = Path(args.out) if args.out else RESULTS / f"{name}.json"
    data = {"benchmark": "fault soak", "layout": args.layout, "level": args.level,
            "flavour": args.flavour, "timeout": TIMEOUT, "table": {}, "runs": []}
    if args.append and out.exists():
        data = json.loads(out.read_text())
        held = (data["layout"], data["level"], data.get("flavour", "mpich"))
        if held != (args.layout, args.level, args.flavour):
            raise SystemExit(f"{out} holds a soak of {held[0]} at {held[1]} under {held[2]}, "
                             f"not {args.layout} at {args.level} under {args.flavour}: "
                             f"name another file (--name)")
    Job.launcher_args = args.launcher_args.split()
    rng = random.Random(args.seed)
    commit = _commit()
    # A soak started in the background ignores SIGINT; either signal removes its cluster.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, lambda *_: sys.exit(1))
    workdir = Path(f"/tmp/hpcddp-soak-{os.getpid()}")
    workdir.mkdir()
    cluster = EmulatedCluster.up(nodes=layout[0], rate="1gbit", name="hdsoak")
    try:
        reference = _references(cluster, layout, args.level, workdir, args.flavour)
        for kind in _turns(kinds, args.runs, data["runs"], args.fill):
            record = one_run(cluster, layout, kind, args.level, workdir, reference, rng,
                             args.flavour, args.output)
            record["commit"] = commit
            if Job.launcher_args:
                record["launcher_args"] = args.launcher_args
            data["runs"].append(record)
            print(json.dumps(record), flush=True)
            _write(out, data)  # every run kept, should the soak be stopped
    finally:
        for proc in Job.started:  # a job still running when the soak is stopped
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _heal(cluster)
        cluster.down()
        subprocess.run(["rm", "-rf", str(workdir)])
    for kind, row in data["table"].items():
        print(kind, json.dumps(row))


def _turns(kinds, runs, held, fill):
    """The kinds to run, in turn: ``runs`` times each, or, with ``fill``, each until the
    results hold ``fill`` runs of it (``held`` grows as the soak runs)."""
    if fill is None:
        for _ in range(runs):
            yield from kinds
        return
    while True:
        short = [k for k in kinds if sum(r["kind"] == k for r in held) < fill]
        if not short:
            return
        yield from short


def _commit():
    found = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT,
                           capture_output=True, text=True)
    return found.stdout.strip() or None


def _write(path, data):
    """The results file with its table recomputed from every run it holds."""
    kinds = list(dict.fromkeys(r["kind"] for r in data["runs"]))
    data["table"] = {k: summarize([r for r in data["runs"] if r["kind"] == k]) for k in kinds}
    data["runs_per_kind"] = min((row["runs"] for row in data["table"].values()), default=0)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


if __name__ == "__main__":
    main()
