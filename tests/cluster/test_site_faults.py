"""Faults on nodes built as a site's own harness builds them (``tests/cluster/site``: its
own namespaces, bridge and 1 Gbit/s links, an ssh-style agent that enters a node and
sets its hostname, no /etc/hosts entries; nothing of ``testbed``), with nothing
set but what ``make demo`` installs, ``UCX_TLS=tcp,self`` and ``HPCDDP_TIMEOUT``. The
job's output goes to a regular file, as under ``sbatch``: ``mpiexec ... > job.log 2>&1``.

A user's MLP (1024-wide layers, 1 MiB buckets, no pause) trains on 2 nodes x 2 ranks; the
second node's link goes down, or the node freezes (SIGSTOP), or its ranks are killed (as
the OOM killer would; a node that dies whole is, to the others, a link down and a frozen
node at once). Each ends the job within ``HPCDDP_TIMEOUT`` + 30 s with a line naming that node,
no rank dies of a signal of its own (MPICH's UCX module died of SIGSEGV here), and the
log keeps every line the job wrote before the fault."""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs_util import BIN, clean_env, mpi_flavour

SITE = Path(__file__).resolve().parent / "site"
NAME, SUBNET = "hdsite", "10.231.0"  # also in the Makefile's test-cluster target
NODES = [f"{NAME}-n1", f"{NAME}-n2"]
TIMEOUT = 20
LIMIT = TIMEOUT + 30
# A rank dead of a signal of its own: SIGSEGV, SIGABRT, SIGBUS, SIGILL, SIGFPE.
CRASHED = re.compile(r"EXIT CODE: (11|6|7|4|8)\b|Segmentation fault|signal 11")

pytestmark = pytest.mark.skipif(mpi_flavour() != "mpich", reason="hydra's ssh launcher")


def _harness(*args, check=True):
    return subprocess.run([str(SITE / "site_cluster.sh"), *args], capture_output=True,
                          text=True, timeout=120, check=check)


@pytest.fixture(scope="module")
def site():
    if os.geteuid() != 0:
        pytest.skip("building network namespaces needs root")
    missing = [tool for tool in ("ip", "tc", "nsenter", "unshare") if not shutil.which(tool)]
    if missing:
        pytest.skip(f"missing {', '.join(missing)}")
    _harness("down", NAME, check=False)
    built = _harness("up", NAME, str(len(NODES)), SUBNET, "1gbit", check=False)
    try:
        if built.returncode == 2:
            pytest.skip(built.stderr.strip())
        assert built.returncode == 0, built.stderr
        yield NODES
    finally:
        _harness("down", NAME, check=False)


def _start(log: Path) -> subprocess.Popen:
    hosts = ",".join(f"{node}:2" for node in NODES)
    command = (f'exec "{BIN / "mpiexec"}" -launcher ssh -launcher-exec "{SITE / "ssh"}" '
               f'-iface {NAME}-br -hosts {hosts} -n 4 "{sys.executable}" '
               f'"{SITE / "mlp.py"}" 1000000 > "{log}" 2>&1')
    # What make demo installs, nothing more: no network module chosen, no provider.
    env = clean_env({"UCX_TLS": "tcp,self", "HPCDDP_TIMEOUT": str(TIMEOUT),
                     "MPIR_CVAR_CH4_NETMOD": None, "FI_PROVIDER": None})
    return subprocess.Popen(["bash", "-c", command], env=env, start_new_session=True)


def _wait_for(log: Path, text: str, proc, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            pytest.fail(f"the job ended before '{text}': {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"no '{text}' within {seconds:g} s: {log.read_text(errors='replace')[-3000:]}")


@pytest.mark.parametrize("fault", ["link_down", "frozen", "killed"])
def test_a_fault_on_a_site_built_node_ends_the_job_named_and_the_log_keeps_every_line(
        site, tmp_path, fault):
    victim = site[1]
    log = tmp_path / "job.log"
    proc = _start(log)
    try:
        _wait_for(log, "step 5 ", proc, 180)
        action = {"link_down": ("link", NAME, victim, "down"),
                  "frozen": ("freeze", NAME, victim), "killed": ("kill", NAME, victim)}[fault]
        _harness(*action)
        faulted = time.monotonic()
        try:
            proc.wait(timeout=LIMIT + 30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job still ran {LIMIT + 30} s after the fault: "
                        f"{log.read_text(errors='replace')[-3000:]}")
        ended = time.monotonic() - faulted
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _harness("reset", NAME, check=False)
    data = log.read_bytes()
    text = data.decode(errors="replace")
    assert b"\0" not in data, f"NUL bytes in the log: {data[:200]!r}"
    assert proc.returncode != 0, text[-3000:]
    assert ended < LIMIT, f"ended {ended:.1f} s after the fault: {text[-3000:]}"
    # Every line the job wrote before the fault is still there.
    for rank, node in enumerate(node for node in site for _ in range(2)):
        assert f"rank {rank} of 4 on {node}" in text, text[:3000]
    assert all(f"step {k} " in text for k in range(6)), text[:3000]
    assert not CRASHED.search(text), text[-4000:]
    # The watchdog's report ("No rank on node N ... answered"), or hydra's of a killed rank.
    named = [line for line in text.splitlines()
             if f"node {victim} " in line or f"RUNNING AT {victim}" in line]
    assert named, f"no line names {victim}: {text[-4000:]}"
