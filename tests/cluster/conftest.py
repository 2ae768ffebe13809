"""An emulated cluster of three nodes (network namespaces, ``testbed``) for the
tests in this folder, or a skip that says why, and a second one with a fabric beside its
management network for the tests that fail only the fabric. Each is removed at the end
of the session, also when a test fails; ``make test-cluster`` removes them again should
pytest be killed."""

import os
import re

import pytest

from cluster_util import ROOT, SLURM_ENV, SLURM_EPOCHS, SLURM_LAUNCH, SLURM_NODES
from testbed import EmulatedCluster, SlurmCluster, Unavailable
from train_output import final_result, read_log

NAME = "hdtest"  # also in the Makefile's test-cluster target
FABRIC_NAME = "hdfab"  # the same


def _emulated(**how):
    """An emulated cluster built as ``how`` says, removed after use; a skip saying why
    where none can be built."""
    try:
        built = EmulatedCluster.up(**how)
    except Unavailable as why:
        pytest.skip(f"no emulated cluster here: {why}")
    try:
        yield built
    finally:
        built.down()


def _slurm_on(cluster):
    """A real Slurm on ``cluster``: slurmctld on its bridge, a slurmd in each node."""
    try:
        slurm = SlurmCluster.start(cpus=2, nodes=cluster)
    except Unavailable as why:
        pytest.skip(f"no Slurm on the emulated cluster: {why}")
    yield slurm
    slurm.stop()


@pytest.fixture(scope="session")
def cluster():
    """Three nodes, unshaped; ``make test-cluster-8`` asks for more, and for slower links
    (``HPCDDP_TEST_CLUSTER_NODES``, ``HPCDDP_TEST_CLUSTER_RATE``)."""
    nodes = int(os.environ.get("HPCDDP_TEST_CLUSTER_NODES", "3"))
    rate = os.environ.get("HPCDDP_TEST_CLUSTER_RATE") or None
    yield from _emulated(nodes=nodes, rate=rate, name=NAME)


@pytest.fixture
def healthy(cluster):
    """The cluster, its links restored after the test whatever it did to them."""
    yield cluster
    for node in cluster.nodes:
        cluster.set_link(node, True)
        cluster.shape(node, None)


@pytest.fixture(scope="session")
def slurm_nodes(cluster):
    """A real Slurm on the emulated nodes: slurmctld on the bridge, a slurmd in each node."""
    yield from _slurm_on(cluster)


@pytest.fixture(scope="session")
def fabric_cluster():
    """Three nodes with two networks: the management one (hostnames, Slurm, the
    launchers) and a fabric (``eth1``) that carries MPI."""
    yield from _emulated(nodes=3, name=FABRIC_NAME, fabric=True)


@pytest.fixture(scope="session")
def fabric_slurm(fabric_cluster):
    """A real Slurm on the fabric cluster, its daemons on the management network."""
    yield from _slurm_on(fabric_cluster)


@pytest.fixture(scope="session")
def uninterrupted(slurm_nodes, tmp_path_factory):
    """What slurm/train.sbatch's 2 x 2 job of 20 epochs ends with when nothing
    interrupts it (size and accuracy, parameters' digest); it trains across two nodes,
    4 ranks started the MPI's way, to the demo's accuracy."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    log = folder / "train.out"
    job = slurm_nodes.sbatch(*SLURM_NODES, "--chdir", ROOT, "--output", log,
                             ROOT / "slurm" / "train.sbatch", "--run-dir", folder / "run",
                             *SLURM_EPOCHS, env=dict(SLURM_ENV,
                                                     HPCDDP_HEAL_DIR=str(folder / "heal")))
    assert slurm_nodes.wait(job, timeout=400)["JobState"] == "COMPLETED", read_log(log)[-3000:]
    text = read_log(log)
    result = final_result(text)
    assert result[0] is not None and result[1] is not None, text[-3000:]
    (size, accuracy), _ = result
    assert size == 4 and accuracy >= 0.95, text[-2000:]
    assert SLURM_LAUNCH in text, text[-3000:]
    assert re.search(r"^world_size=4 .* nodes=2$", text, re.M), text[-3000:]
    return result
