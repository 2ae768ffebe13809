"""The model of scale against the textbook costs of each algorithm, written out here by
hand (Thakur, Rabenseifner and Gropp's alpha-beta costs of MPICH's collectives; the
ring's ``2 (p - 1)`` steps of ``1/p``), and ``hpcddp predict`` as a user runs it. How
close the model comes to real jobs is benchmarks/bench_scale.py's, on the emulated
cluster."""

import json
import subprocess
import sys

import pytest

from hpcddp.commands.predict import bucket_bytes
from hpcddp.commands.scale_model import (Fabric, Link, Workload, allreduce_seconds,
                                      ddp_step_seconds, fit_link)

ALPHA, BETA = 50e-6, 1 / 30e6          # the link: 50 us, 30 MB/s
FAST = 1e15                            # sums, copies and shared memory that cost nothing
LINKED = Fabric(Link(ALPHA, 1 / BETA), Link(0.0, FAST), FAST, FAST)
S = 16 << 20


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_the_ring_costs_2_p_minus_1_steps_of_a_pth(nodes):
    expected = 2 * (nodes - 1) * ALPHA + 2 * (nodes - 1) / nodes * S * BETA
    assert allreduce_seconds(LINKED, nodes, 1, S, "ring") == pytest.approx(expected)


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_mpi_is_recursive_halving_then_doubling(nodes):
    log_p = {2: 1, 4: 2, 8: 3}[nodes]
    expected = 2 * log_p * ALPHA + 2 * (nodes - 1) / nodes * S * BETA
    assert allreduce_seconds(LINKED, nodes, 1, S, "mpi") == pytest.approx(expected)


def test_mpi_on_three_ranks_folds_one_in_with_two_whole_messages():
    two = 2 * ALPHA + S * BETA  # the power of two's exchanges: halves, both ways
    assert allreduce_seconds(LINKED, 3, 1, S, "mpi") == \
        pytest.approx(two + 2 * (ALPHA + S * BETA))


def test_node_aware_sends_2_n_minus_1_over_n_per_link_whatever_the_ranks_per_node():
    # 2 nodes x 4 ranks: each node sends half the buffer each way, 4 ranks sharing the link
    # in 4 allreduces of a quarter each; one exchange each way of each, so 2 latencies.
    expected = 2 * ALPHA + S * BETA
    assert allreduce_seconds(LINKED, 2, 4, S, "node") == pytest.approx(expected, rel=1e-6)
    # MPICH's own on such nodes: one rank per node reduces, then allreduces the whole
    # buffer with the other node's (the same bytes over the link), and broadcasts.
    assert allreduce_seconds(LINKED, 2, 4, S, "mpi") == \
        pytest.approx(2 * ALPHA + S * BETA, rel=1e-6)
    slow_inside = LINKED._replace(within=Link(0.0, 1e9))
    assert allreduce_seconds(slow_inside, 2, 4, S, "mpi") == \
        pytest.approx(2 * ALPHA + S * BETA + 2 * 2 * S / 1e9, rel=1e-6)


def test_sums_slower_than_the_link_set_the_ring_s_pace():
    slow_sums = LINKED._replace(sum_bytes_per_s=1e6)
    assert allreduce_seconds(slow_sums, 4, 1, S, "ring") == \
        pytest.approx(6 * ALPHA + 3 * (S / 4) / 1e6)


def test_a_step_hides_every_bucket_but_what_comes_after_the_backward():
    one = allreduce_seconds(LINKED, 2, 1, 1 << 20, "ring")
    # 1 s of compute: the buckets are ready at 0.5 and 1.0 s of the backward (forward
    # 0.0); the first one's reduction ends long before the second is ready.
    work = Workload(1.0, (1 << 20, 1 << 20), forward_share=0.0, backward_share=1.0)
    step = ddp_step_seconds(LINKED, 2, 1, work, "ring")
    assert step["step"] == pytest.approx(1.0 + one)
    assert step["exposed"] == pytest.approx(one)
    assert step["communication"] == pytest.approx(2 * one)
    # Compute shorter than the reductions: they run back to back after the first is ready.
    quick = ddp_step_seconds(LINKED, 2, 1, work._replace(compute_s=1e-3), "ring")
    assert quick["step"] == pytest.approx(0.5e-3 + 2 * one)


def test_a_link_is_fitted_back_from_its_own_messages():
    link = Link(30e-6, 117e6)
    samples = [(b, link.seconds(b)) for b in (4096, 1 << 20, 16 << 20) for _ in range(3)]
    fitted = fit_link(samples)
    assert fitted.latency_s == pytest.approx(30e-6)
    assert fitted.bytes_per_s == pytest.approx(117e6)
    with pytest.raises(ValueError, match="two sizes"):
        fit_link([(4096, 1e-3), (4096, 2e-3)])


def test_bad_input_names_the_value():
    with pytest.raises(ValueError, match="reduction 'tree'"):
        allreduce_seconds(LINKED, 2, 1, S, "tree")
    with pytest.raises(ValueError, match="0 nodes"):
        allreduce_seconds(LINKED, 0, 1, S, "ring")


def test_buckets_are_laid_out_as_hpcddp_s_are():
    mib = 1 << 20
    assert bucket_bytes(60 * mib, 25 * mib) == [mib, 25 * mib, 25 * mib, 9 * mib]
    assert bucket_bytes(mib // 2, 25 * mib) == [mib // 2]


def test_predict_prints_a_row_per_node_count_with_auto_s_choice():
    done = subprocess.run([sys.executable, "-m", "hpcddp", "predict", "--nodes", "1,4",
                           "--ranks-per-node", "4", "--grad-mib", "98", "--compute-ms", "100",
                           "--link-gbit", "1", "--json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["nodes"], r["auto"]) for r in rows] == [(1, "mpi"), (4, "node")]
    # 98 MiB over 1 Gbit/s links cannot hide behind 100 ms: the step is link-bound.
    assert rows[1]["steps_ms"]["node"] > 2 * 3 / 4 * 98 * (1 << 20) * 8 / 1e9 * 1e3
    assert rows[1]["efficiency"] < 0.2
    bad = subprocess.run([sys.executable, "-m", "hpcddp", "predict", "--grad-mib", "-1",
                          "--compute-ms", "100"], capture_output=True, text=True)
    assert bad.returncode == 2 and "gradients of" in bad.stderr, bad.stderr
