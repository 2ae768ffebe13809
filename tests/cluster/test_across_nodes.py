"""hpcddp on several nodes: the MPI test suites, run as one job across emulated nodes,
against the same independent references as on one node (single-process training on the
global batch, torch's DDP and collectives on gloo, DataLoader with DistributedSampler,
torch.load of the checkpoint file), with MPI's reduction and with hpcddp's ring."""

import re

import pytest

from cluster_util import on_nodes

# What changes when ranks sit on different hosts: world facts, DDP, the torch.distributed
# backend, the loader, checkpoint delivery, the timeline; test_nodes.py only runs here.
SUITE = ["tests/mpi/test_world.py", "tests/mpi/test_nodes.py",
         "tests/mpi/test_ddp_vs_single.py", "tests/mpi/test_ddp_vs_torch.py",
         "tests/mpi/test_process_group.py", "tests/mpi/test_data.py",
         "tests/mpi/test_checkpoint_delivery.py", "tests/mpi/test_checkpoint.py",
         "tests/mpi/test_timeline.py"]
RING_SUITE = ["tests/mpi/test_ring.py", "tests/mpi/test_ddp_vs_single.py",
              "tests/mpi/test_process_group.py"]
LAYOUTS = {"2x2": (2, 2), "3x1": (3, 1)}  # nodes x ranks per node


def _pytest_job(cluster, layout, files, env=None):
    nodes, per_node = LAYOUTS[layout]
    job = on_nodes(cluster, ["-m", "pytest", "-p", "hpcddp.testing", "-p", "no:cacheprovider",
                             *files], ranks_per_node=per_node, nodes=cluster.nodes[:nodes],
                   env=env, timeout=600)
    assert not job.timed_out, job.output[-4000:]
    assert job.returncode == 0, job.output[-6000:]
    assert f"({nodes} node(s))" in job.stdout, job.stdout[-2000:]
    summary = job.stdout.strip().splitlines()[-1]
    assert re.search(r"\d+ passed", summary) and not re.search(r"\d+ (failed|error)", summary), \
        summary
    return job


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mpi_suite_across_nodes(cluster, layout):
    job = _pytest_job(cluster, layout, SUITE)
    # test_nodes.py ran rather than skipped: its checks need several nodes.
    assert "needs ranks on at least 2 nodes" not in job.stdout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ring_suite_across_nodes(cluster, layout):
    _pytest_job(cluster, layout, RING_SUITE, env={"HPCDDP_REDUCE": "ring"})
