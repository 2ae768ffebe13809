"""The emulated cluster's input checks, and the guard that ends a launcher left waiting
on a node out of reach, run against a real process tree (a script named ``mpiexec``)."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from testbed import EmulatedCluster
from testbed.network import parse_rate, tbf_burst


@pytest.mark.parametrize("rate,bits", [("1gbit", 1e9), ("2.5gbit", 2.5e9), ("100mbit", 1e8),
                                       ("8kbit", 8e3), (" 1GBIT ", 1e9)])
def test_rates(rate, bits):
    assert parse_rate(rate) == bits


# tbf's bucket, by hand: a timer tick (1/250 s) of the rate, two 1514-byte frames, and
# 256 KB capped at a quarter of a second of the rate.
@pytest.mark.parametrize("rate,burst", [("8kbit", 3028),        # two frames: a crawl
                                        ("1mbit", 31250),       # 1/4 s of 125,000 B/s
                                        ("250mbit", 262144),    # 256 KB, as at every
                                        ("500mbit", 262144),    # rate the benchmarks use
                                        ("1gbit", 500000),      # a tick of 125 MB/s
                                        ("2.5gbit", 1250000)])
def test_a_crawling_link_has_no_fast_start_and_fast_links_keep_their_bucket(rate, burst):
    assert tbf_burst(parse_rate(rate)) == burst


@pytest.mark.parametrize("rate", ["1g", "fast", "1 gbit", "-1gbit", ""])
def test_bad_rate_named_with_the_form(rate):
    with pytest.raises(ValueError, match="is not of the form 100mbit, 1gbit"):
        parse_rate(rate)


@pytest.mark.parametrize("name", ["Upper", "with-dash", "toolongname1", "1abc", ""])
def test_bad_cluster_name_refused_before_anything_is_built(name):
    with pytest.raises(ValueError, match="cluster name .*lowercase letters and digits"):
        EmulatedCluster.up(nodes=2, name=name)


def test_bad_node_count():
    with pytest.raises(ValueError, match="nodes=0: an emulated cluster has 1 to 32 nodes"):
        EmulatedCluster.up(nodes=0, name="x")


def _state(fabric):
    """A cluster's state as ``up`` writes it (nothing is built: only its arguments and
    settings are asked for)."""
    return {"name": "x", "nodes": ["x-n1", "x-n2"], "addresses": ["10.1.0.1", "10.1.0.2"],
            "bridge": "xbr", "bridge_address": "10.1.0.254", "prefix": 24, "rate": None,
            "fabric": {"bridge": "xfb", "bridge_address": "10.2.0.254", "prefix": 24,
                       "addresses": ["10.2.0.1", "10.2.0.2"]} if fabric else None}


@pytest.mark.parametrize("flavour,expected", [
    ("mpich", {"UCX_NET_DEVICES": "eth1", "FI_TCP_IFACE": "eth1"}),
    ("impi", {"FI_TCP_IFACE": "eth1"}),
    ("openmpi", {"OMPI_MCA_btl_tcp_if_include": "eth1"})])
def test_with_a_fabric_every_mpi_is_told_to_carry_its_ranks_traffic_there(flavour, expected):
    cluster = EmulatedCluster(_state(fabric=True))
    assert cluster.fabric_settings(flavour) == expected
    assert {k: v for k, v in cluster.env({}, flavour).items() if k in expected} == expected
    args = cluster.mpiexec_args(2, flavour=flavour)
    if flavour == "openmpi":  # its daemons call back on the management subnet
        assert args[args.index("btl_tcp_if_include") + 1] == "eth1"
        assert args[args.index("oob_tcp_if_include") + 1] == "10.1.0.0/24"
    else:  # hydra calls back on the management bridge
        assert args[args.index("-iface") + 1] == "xbr"
        for name, value in expected.items():
            assert args[args.index(name) - 1:args.index(name) + 2] == ["-genv", name, value]


def test_without_a_fabric_mpi_keeps_the_one_network():
    cluster = EmulatedCluster(_state(fabric=False))
    assert cluster.fabric_settings("mpich") == {}
    assert "UCX_NET_DEVICES" not in cluster.mpiexec_args(1)
    args = cluster.mpiexec_args(1, flavour="openmpi")
    assert args[args.index("btl_tcp_if_include") + 1] == "10.1.0.0/24"
    with pytest.raises(ValueError, match="cluster 'x' has no fabric: build it with"):
        cluster.set_fabric_link("x-n1", False)


CHILD = textwrap.dedent("""
    import sys, time
    from hpcddp.faults.launcher_guard import end_launcher_later, launcher_ancestor
    print(launcher_ancestor(), flush=True)
    if sys.argv[1] == "end":
        end_launcher_later(0.5)
""")


def _launcher(tmp_path, after):
    """A process named mpiexec that runs a child rank, then ``after``."""
    script = tmp_path / "mpiexec"
    script.write_text(f'#!/bin/sh\n"$@"\n{after}\n')
    script.chmod(0o755)
    return script


def test_launcher_found_among_ancestors(tmp_path):
    script = _launcher(tmp_path, "true")
    proc = subprocess.run([str(script), "sh", "-c", f'"{sys.executable}" -c \'{CHILD}\' find'],
                          capture_output=True, text=True, timeout=60)
    found = eval(proc.stdout.strip())  # (pid, start time, name)
    assert found[2] == "mpiexec"
    assert found[0] != os.getpid()


def test_no_launcher_found_outside_one(tmp_path):
    proc = subprocess.run(["sh", "-c", f'"{sys.executable}" -c \'{CHILD}\' find'],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "None", proc.stdout + proc.stderr


def _ended_by_the_guard(script, signal_number=15):
    """Run ``script``'s rank, which starts the guard; the launcher's stderr once both of
    its pipes ended, after checking the guard ended it by ``signal_number`` within 30 s."""
    start = time.monotonic()
    proc = subprocess.Popen([str(script), sys.executable, "-c", CHILD, "end"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=50)  # returns at the end of both pipes
    finally:
        os.killpg(proc.pid, 9)
    assert proc.returncode == -signal_number, (proc.returncode, err)
    assert time.monotonic() - start < 30
    return err


def test_launcher_still_waiting_after_the_grace_is_ended(tmp_path):
    # The launcher's wait stands for hydra's wait on a proxy that cannot answer.
    err = _ended_by_the_guard(_launcher(tmp_path, "sleep 60 >/dev/null 2>&1 & wait"))
    assert "mpiexec (pid" in err and "ending mpiexec" in err, err


def test_the_launcher_is_asked_first_so_it_removes_its_session_files(tmp_path):
    # As prterun does on SIGTERM, and cannot on SIGKILL: its $TMPDIR/ompi.PID would stop
    # a later prterun given the same PID from starting.
    session = tmp_path / "session"
    session.mkdir()
    script = _launcher(tmp_path, f"trap 'rm -r {session}; trap - TERM; kill -TERM $$' TERM\n"
                                 "sleep 60 >/dev/null 2>&1 & wait")
    _ended_by_the_guard(script)
    assert not session.exists()


def test_a_launcher_that_ignores_the_request_is_killed_and_its_session_removed(
        tmp_path, monkeypatch):
    # As prterun waiting on a daemon out of reach: the guard removes the directory named
    # after its PID that holds PMIx's files named after it, and nothing else of $TMPDIR.
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    script = _launcher(tmp_path, 'mkdir "$TMPDIR/ompi.$$" "$TMPDIR/other.$$"\n'
                                 'touch "$TMPDIR/ompi.$$/pmix.node1.tool.$$" '
                                 '"$TMPDIR/other.$$/data" "$TMPDIR/data.$$"\n'
                                 'echo $$ > "$TMPDIR/pid"\n'
                                 "trap '' TERM\nwhile :; do sleep 1; done")
    err = _ended_by_the_guard(script, signal_number=9)
    assert "ending mpiexec" in err, err
    pid = (tmp_path / "pid").read_text().strip()
    assert not (tmp_path / f"ompi.{pid}").exists()
    assert (tmp_path / f"other.{pid}" / "data").exists() and (tmp_path / f"data.{pid}").exists()


def test_launcher_that_ends_in_time_is_left_alone(tmp_path):
    script = _launcher(tmp_path, "exit 3")
    proc = subprocess.run([str(script), sys.executable, "-c", CHILD, "end"],
                          capture_output=True, text=True, timeout=50)
    assert proc.returncode == 3
    time.sleep(1.0)
    assert "ending mpiexec" not in proc.stderr


def test_the_launchers_children_that_hold_its_output_end_with_it(tmp_path):
    # The sleep stands for the ssh client to a node out of reach: it shares the
    # launcher's output, so a reader sees no end of it while the client lives.
    err = _ended_by_the_guard(_launcher(tmp_path, "sleep 120 & wait"))
    assert "ending mpiexec and the 1 process it started on this node" in err, err


def test_a_batch_log_keeps_every_line_the_job_wrote_before_and_after_the_guards(tmp_path):
    # As under sbatch: the launcher's output is a regular file it did not open with
    # O_APPEND. The guard's line goes in between the job's lines, and nothing is lost:
    # reopened with mode "w" by its /proc path, the log kept the guard's line alone, then
    # NUL bytes up to where the launcher went on writing.
    script = _launcher(tmp_path, "echo 'the job, before the guard' >&2\n"
                                 "trap 'echo \"the launcher, after SIGTERM\" >&2; exit 143' TERM\n"
                                 "sleep 60 >/dev/null 2>&1 & wait")
    log = tmp_path / "job.log"
    start = time.monotonic()
    with open(log, "w") as out:  # the shell's `> job.log 2>&1`: no O_APPEND
        out.write("the batch script, first line\n")
        out.flush()
        proc = subprocess.Popen([str(script), sys.executable, "-c", CHILD, "end"],
                                stdout=out, stderr=out, start_new_session=True)
        try:
            proc.wait(timeout=50)
        finally:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 143 and time.monotonic() - start < 30
    text = log.read_text()
    assert "\0" not in text, repr(text)
    lines = [line for line in text.splitlines() if not line.startswith("(")]
    order = ["the batch script, first line", "the job, before the guard", "hpcddp: mpiexec",
             "the launcher, after SIGTERM"]
    found = [next((i for i, line in enumerate(lines) if line.startswith(o)), None)
             for o in order]
    assert None not in found and found == sorted(found), text
