"""torch.distributed's default store is opened only when a group of another backend needs
it: a job that trains on hpcddp alone listens on no port of hpcddp's. Told apart from
MPI's own ports (its network module and launcher listen too, on every rank alike) by
comparing rank 0 with the other ranks, and checked to fail where a store is opened."""

import json

import pytest
from jobs_util import ROOT


def _ports(job):
    found = {}
    for line in job.stdout.splitlines():
        if line.startswith("ports "):
            seen = json.loads(line[len("ports "):])
            found[seen["rank"]] = seen
    return found


@pytest.mark.parametrize("n", [2, 3])
def test_a_job_without_another_backend_listens_on_no_port_of_hpcddps(run_job, n):
    job = run_job(["tests/jobs/scripts/store_ports.py"], n=n, timeout=90,
                  env={"PYTHONPATH": str(ROOT / "tests" / "support")})
    assert job.returncode == 0, job.output[-3000:]
    ports = _ports(job)
    assert sorted(ports) == list(range(n)), job.stdout
    # Trained on hpcddp: rank 0 listens on as many ports as every other rank (MPI's).
    counts = [len(ports[r]["trained"]) for r in range(n)]
    assert len(set(counts)) == 1, ports
    # The gloo group's store: one port more on rank 0 than gloo gives every rank, and on
    # loopback alone, as every rank shares this node.
    added = {r: sorted(set(map(tuple, ports[r]["gloo"])) - set(map(tuple, ports[r]["trained"])))
             for r in range(n)}
    assert len(added[0]) == len(added[1]) + 1, added
    assert all(address == "127.0.0.1" for address, _ in added[0]), added
