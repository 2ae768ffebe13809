"""How long a Slurm job that loses a node takes to heal, and what the loss costs it.

Run as root (it builds its own emulated cluster of 3 nodes with a real Slurm, and
removes both):

    python benchmarks/bench_heal.py --runs 2
    python benchmarks/bench_heal.py --runs 2 --fault fabric_link_down --name heal-fabric

``slurm/train.sbatch`` trains the digits demo (``--epochs 20``, a checkpoint each
epoch) on 2 nodes x 2 ranks. Once epoch 3 is logged, the second node is lost while its
slurmd lives, so Slurm sees nothing wrong: ``--fault ranks_killed`` SIGKILLs every rank
on it; ``--fault fabric_link_down`` builds the cluster with a fabric for MPI beside the
management network and takes the node's fabric link down, its ranks alive and silent
(``HPCDDP_TIMEOUT``, ``--timeout``, says how soon the watchdog gives up on them). Two
modes:

- ``spare``: ``--nodes=3`` with ``HPCDDP_SPARE_NODES=1``; the script starts the step
  again on the first and third nodes inside the same allocation;
- ``successor``: ``--nodes=2``, no spare; the script submits its successor excluding the
  node, which Slurm starts once the first job has ended.

For each run: seconds from the kill to the line naming the lost node, to the training
script's ``resumed from`` line (training going again), and to the job's end (the
successor's, in that mode); the epoch it resumed at; whether it ended with the
parameters of the same job run with no fault. The peer, timed in the same run: that
uninterrupted job's wall time, so ``end / uninterrupted`` is what the loss costs in all.
``results/heal.json``.
"""

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's testbed/
sys.path.insert(0, str(ROOT / "tests" / "support"))
from testbed import EmulatedCluster  # noqa: E402
from testbed.slurm import SlurmCluster  # noqa: E402
from train_output import final_result, read_log  # noqa: E402
RESULTS = Path(__file__).resolve().parent / "results"
EPOCHS = ["--epochs", "20"]
ENV = {"PYTHON": sys.executable, "UCX_TLS": "tcp,self"}
_SUCCESSOR = re.compile(r"submitted job (\d+) to go on without")


def _submit(slurm, folder, nodes, spares=0, env=None):
    folder.mkdir(parents=True, exist_ok=True)  # Slurm makes no folder for --output
    log = folder / "train.out"
    env = dict(env or ENV, HPCDDP_HEAL_DIR=str(folder / "heal"),
               HPCDDP_SPARE_NODES=str(spares))
    job = slurm.sbatch(f"--nodes={nodes}", "--ntasks-per-node=2", "--chdir", ROOT,
                       "--output", log, ROOT / "slurm" / "train.sbatch",
                       "--run-dir", folder / "run", *EPOCHS, env=env)
    return job, log


def _until(log, pattern, deadline):
    while True:
        found = re.search(pattern, read_log(log))
        if found:
            return found, time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{pattern!r} not in {log} in time:\n{read_log(log)[-2000:]}")
        time.sleep(0.2)


def uninterrupted(slurm, folder, env):
    began = time.monotonic()
    job, log = _submit(slurm, folder, nodes=2, env=env)
    info = slurm.wait(job, timeout=600)
    assert info["JobState"] == "COMPLETED", read_log(log)[-3000:]
    return time.monotonic() - began, final_result(read_log(log))


def heal_run(slurm, cluster, folder, mode, reference, fault, env):
    began = time.monotonic()
    job, log = _submit(slurm, folder, nodes=3 if mode == "spare" else 2,
                       spares=1 if mode == "spare" else 0, env=env)
    _until(log, r"epoch 3:", time.monotonic() + 300)
    victim = cluster.nodes[1]
    if fault == "fabric_link_down":
        cluster.set_fabric_link(victim, False)
    else:
        assert cluster.kill_node(victim, launcher_too=False), f"nothing ran in {victim}"
    killed = time.monotonic()
    deadline = killed + 600
    _, named = _until(log, rf"hpcddp: lost node {victim}", deadline)
    resumed_at, resumed = _until(log, r"resumed from .*: continuing at epoch (\d+)", deadline)
    last = job
    if mode == "successor":
        last = int(_until(log, _SUCCESSOR.pattern, deadline)[0].group(1))
    info = slurm.wait(last, timeout=600)
    ended = time.monotonic()
    if fault == "fabric_link_down":
        cluster.set_fabric_link(victim, True)
    text = read_log(log)
    result = final_result(text)
    why = re.search(rf"hpcddp: lost node {victim}: ([^;]*);", text)
    return {"mode": mode, "fault": fault, "state": info["JobState"], "nodes": info["NodeList"],
            "named_by": why and why.group(1),
            "lost_named_s": round(named - killed, 2), "resumed_s": round(resumed - killed, 2),
            "end_s": round(ended - killed, 2), "wall_s": round(ended - began, 2),
            "resumed_at_epoch": int(resumed_at.group(1)),
            "accuracy": result[0] and result[0][1],
            "same_parameters_as_uninterrupted": result == reference}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs of each mode (default 2)")
    parser.add_argument("--name", default="heal", help="results/NAME.json")
    parser.add_argument("--fault", choices=("ranks_killed", "fabric_link_down"),
                        default="ranks_killed", help="how the second node is lost")
    parser.add_argument("--timeout", default="10",
                        help="HPCDDP_TIMEOUT for fabric_link_down (default 10 s)")
    args = parser.parse_args()
    fabric = args.fault == "fabric_link_down"
    cluster = EmulatedCluster.up(nodes=3, name="hdheal", fabric=fabric)
    env = dict(ENV, **cluster.fabric_settings(),
               **({"HPCDDP_TIMEOUT": args.timeout} if fabric else {}))
    slurm = None
    runs, references = [], []
    try:
        slurm = SlurmCluster.start(cpus=2, nodes=cluster)
        work = Path(slurm.dir) / "bench"
        seconds, reference = uninterrupted(slurm, work / "uninterrupted", env)
        references.append(round(seconds, 2))
        for index in range(args.runs):
            for mode in ("spare", "successor"):
                run = heal_run(slurm, cluster, work / f"{mode}-{index}", mode, reference,
                               args.fault, env)
                run["wall_over_uninterrupted"] = round(run["wall_s"] / seconds, 3)
                runs.append(run)
                print(json.dumps(run), flush=True)
    finally:
        if slurm is not None:
            slurm.stop()
        cluster.down()
    table = {}
    for mode in ("spare", "successor"):
        mine = [r for r in runs if r["mode"] == mode]
        table[mode] = {key: statistics.median(r[key] for r in mine)
                       for key in ("lost_named_s", "resumed_s", "end_s", "wall_s",
                                   "wall_over_uninterrupted")}
        table[mode]["healed"] = sum(r["state"] == "COMPLETED" and
                                    r["same_parameters_as_uninterrupted"] for r in mine)
        table[mode]["runs"] = len(mine)
    what = {"ranks_killed": "the second node's ranks SIGKILLed after epoch 3, its slurmd "
                            "alive",
            "fabric_link_down": "MPI on a fabric apart from the management network; the "
                                "second node's fabric link down after epoch 3, its ranks "
                                f"and slurmd alive, HPCDDP_TIMEOUT={args.timeout}"}[args.fault]
    out = {"benchmark": "a Slurm job healing after it loses a node (bench_heal.py)",
           "fault": args.fault,
           "layout": "2 nodes x 2 ranks of 3 emulated Slurm nodes, the digits demo, 20 "
                     f"epochs, MPICH 5 through the script's mpiexec; {what}",
           "uninterrupted_wall_s": references, "table": table, "runs": runs}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
