"""One MPI job that runs tests of torch's own distributed suite in lock-step.

    mpiexec -n N python suite_job.py --backend hpcddp|gloo --out RESULTS --tests a,b,...

torch ships ``DistributedTest._DistTestBase`` in every wheel: the tests gloo, NCCL and UCC
are held to. torch runs each in N processes it spawns (``TestDistBackend._run``): each
makes the default group, runs the test body, and destroys the group. Here the ranks are
MPI's, and each test runs the same way on all of them, one after another: the default
group (``hpcddp`` on MPI, or ``gloo`` through a file store, the reference), the body,
then every rank's outcome, gathered through MPI and written by rank 0 as one JSON line.

The suite reads ``BACKEND`` when it is imported and gates its tests by name on it
(``BACKEND != "gloo"`` skips most of them). It is imported with ``BACKEND=gloo`` for both
backends, so both run the same selection; the tests that then ask for gloo by name, or
compare the backend's name, are listed in ``known.py`` with the reason.
"""

import argparse
import faulthandler
import json
import os
import sys
import tempfile
import traceback
import unittest
from datetime import timedelta

from mpi4py import MPI

parser = argparse.ArgumentParser()
parser.add_argument("--backend", choices=("hpcddp", "gloo"), required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--tests", default="", help="comma-separated names; empty: list them")
parser.add_argument("--pg-timeout", type=float, default=60.0)
parser.add_argument("--test-timeout", type=float, default=120.0)
args = parser.parse_args()

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.rank, COMM.size
TEMP = COMM.bcast(tempfile.mkdtemp(prefix="torch-suite-") if RANK == 0 else None, root=0)
os.environ.update(BACKEND="gloo", WORLD_SIZE=str(SIZE), TEMP_DIR=TEMP,
                  INIT_METHOD=f"file://{TEMP}/init", MASTER_ADDR="127.0.0.1")
if args.backend == "hpcddp":
    import hpcddp
    hpcddp.init(torch_group=False)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal import common_utils  # noqa: E402
from torch.testing._internal.common_distributed import TEST_SKIPS  # noqa: E402
from torch.testing._internal.distributed import distributed_test as suite  # noqa: E402

torch.set_num_threads(1)
SKIP_CODES = {skip.exit_code: skip.message for skip in TEST_SKIPS.values()}

if args.backend == "hpcddp":
    # A test that makes the default group again (after destroying it) asks for the
    # suite's BACKEND, gloo: on this run it is hpcddp's.
    _init = dist.init_process_group

    def _on_hpcddp(*a, backend=None, **kw):
        return _init(*a, backend="hpcddp" if backend in (None, "gloo") else backend, **kw)
    dist.init_process_group = _on_hpcddp


class Case(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
    """One test, run in this process as torch's ``_run`` runs it in a spawned one."""


def _names():
    return sorted(n for n in dir(suite.DistributedTest._DistTestBase) if n.startswith("test_"))


def _prepare():
    os.makedirs(os.path.join(TEMP, "barrier"), exist_ok=True)
    os.makedirs(os.path.join(TEMP, "test_dir"), exist_ok=True)
    COMM.Barrier()
    if RANK == 0:
        suite.Barrier.init()
    COMM.Barrier()
    suite.Barrier.barrier_id = 0


def _default_group(index, name):
    seconds = suite.CUSTOM_PG_TIMEOUT.get(name, args.pg_timeout)
    store = f"file://{TEMP}/pg-{index}"
    if args.backend == "hpcddp":
        dist.init_process_group(backend="hpcddp", timeout=timedelta(seconds=seconds))
    else:
        dist.init_process_group(backend="gloo", init_method=store, rank=RANK,
                                world_size=SIZE, timeout=timedelta(seconds=seconds))
    return store[len("file://"):]


def run_one(index, name):
    _prepare()
    outcome, detail = "passed", ""
    # A test that waits for ever outside MPI (a store no rank serves) ends this process,
    # and with it the job, after its stacks are printed; the driver goes on without it.
    faulthandler.dump_traceback_later(args.test_timeout, exit=True)
    try:
        file_name = _default_group(index, name)
        case = Case(name)
        case.rank, case.file_name = RANK, file_name
        common_utils.set_rng_seed()  # as torch's run_test does before each test
        case._barrier()
        getattr(case, name)()
        case._barrier()
    except unittest.SkipTest as skip:
        outcome, detail = "skipped", str(skip)
    except SystemExit as leave:
        code = leave.code if isinstance(leave.code, int) else 1
        if code in SKIP_CODES:
            outcome, detail = "skipped", SKIP_CODES[code]
        elif code:
            outcome, detail = "failed", f"sys.exit({leave.code!r})"
    except BaseException:  # noqa: BLE001 - every failure is a result here
        outcome, detail = "failed", traceback.format_exc()[-3000:]
    finally:
        faulthandler.cancel_dump_traceback_later()
        if dist.is_initialized():
            dist.destroy_process_group()
    return outcome, detail


def main():
    if not args.tests:
        if RANK == 0:
            with open(args.out, "w") as out:
                json.dump(_names(), out)
        return
    for index, name in enumerate(args.tests.split(",")):
        if RANK == 0:
            with open(args.out, "a") as out:  # the test under way, should the job die
                out.write(json.dumps({"test": name, "started": True}) + "\n")
        outcome = run_one(index, name)
        everyone = COMM.allgather(outcome)
        if RANK == 0:
            outcomes = [o for o, _ in everyone]
            final = ("failed" if "failed" in outcomes else
                     "skipped" if "skipped" in outcomes else "passed")
            details = {r: d for r, (o, d) in enumerate(everyone) if d}
            with open(args.out, "a") as out:
                out.write(json.dumps({"test": name, "outcome": final,
                                      "details": details}) + "\n")
    COMM.Barrier()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
