"""Run torch's distributed suite (``suite_job.py``) on MPI-launched ranks to the end.

A test that hangs or kills a rank ends its job (hpcddp's watchdog, gloo's timeout, the
launcher); it is recorded as ``crashed`` and a new job goes on with the tests after it.
"""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

HERE = Path(__file__).resolve().parent
JOB = HERE / "suite_job.py"


def _mpiexec() -> str:
    return str(Path(sys.executable).parent / "mpiexec")


def _job(ranks: int, backend: str, out: Path, tests: List[str], env: Dict[str, str],
         timeout: float) -> subprocess.CompletedProcess:
    command = [_mpiexec(), "-n", str(ranks), sys.executable, str(JOB), "--backend", backend,
               "--out", str(out), "--tests", ",".join(tests)]
    try:
        return subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as late:
        return subprocess.CompletedProcess(command, -9, late.stdout or "", late.stderr or "")


def names() -> List[str]:
    """Every test of ``DistributedTest._DistTestBase`` in the installed torch."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "names.json"
        done = _job(1, "gloo", out, [], _env(), 300)
        if done.returncode != 0:
            raise RuntimeError(f"listing torch's suite failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def _env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    from hpcddp.env import clean_environment
    env = clean_environment(os.environ)
    env.update(OMP_NUM_THREADS="1", HPCDDP_TIMEOUT="60", PYTORCH_PRINT_REPRO_ON_FAILURE="0")
    env.update(extra or {})
    return env


def run(ranks: int, backend: str, tests: List[str], job_timeout: float = 1800) -> Dict[str, dict]:
    """Each test's outcome (passed, failed, skipped, crashed) and details, by name."""
    results: Dict[str, dict] = {}
    left = list(tests)
    with tempfile.TemporaryDirectory() as tmp:
        attempt = 0
        while left:
            out = Path(tmp) / f"results-{attempt}.jsonl"
            done = _job(ranks, backend, out, left, _env(), job_timeout)
            started = None
            for line in out.read_text().splitlines() if out.exists() else []:
                record = json.loads(line)
                if record.get("started"):
                    started = record["test"]
                else:
                    results[record["test"]] = record
                    started = None
            if started is None and len(results) < len(tests) and not \
                    [t for t in left if t in results]:
                started = left[0]  # the job died before its first test began
            if started is not None:
                results[started] = {"test": started, "outcome": "crashed",
                                    "details": {"job": (done.stdout + done.stderr)[-3000:]}}
            left = [t for t in left if t not in results]
            attempt += 1
            if done.returncode == 0 and left:
                raise RuntimeError(f"the job ended well without running {left[:5]}")
    return results
