"""Which shared-memory names a process removes from /dev/shm: at an abort, every MPI
library's job segment that it maps (MPICH's node segment, Open MPI's sm segment, UCX's
and Intel MPI's), never a file it does not map or another program's; in init(), only
MPICH's node segment (Open MPI's ranks attach to each other's segments lazily).

Each case runs in a process of its own without MPI, which maps the files it is given:
the test's own process may have MPI started, and its segments are not the test's."""

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm")

_MAPPER = r"""
import json, mmap, sys
from hpcddp.startup.mpi_init import JOB_SEGMENTS, MPICH_SEGMENT, unlink_mapped_segments
pattern, names = sys.argv[1], sys.argv[2:]
maps = []
for name in names:
    with open(name, "rb+") as f:
        maps.append(mmap.mmap(f.fileno(), 4096))
print(json.dumps(unlink_mapped_segments(pattern={"all": JOB_SEGMENTS,
                                                 "mpich": MPICH_SEGMENT}[pattern])))
"""


@pytest.fixture
def shm_files():
    """Make 4 KiB files in /dev/shm under the names given; removed at the end."""
    made = []

    def make(*names):
        for name in names:
            path = SHM / name
            path.write_bytes(bytes(4096))
            made.append(path)
        return [str(SHM / name) for name in names]

    yield make
    for path in made:
        path.unlink(missing_ok=True)


def _unlink_in_a_process_mapping(pattern, mapped):
    done = subprocess.run([sys.executable, "-c", _MAPPER, pattern, *mapped],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_an_abort_removes_every_mpi_library_segment_it_maps_and_nothing_else(shm_files):
    tag = uuid.uuid4().hex[:8]
    libraries = shm_files(f"mpich_shm_{tag}_0", f"sm_segment.node1.0.{tag}.1",
                          f"ucx_shm_posix_{tag}", f"Intel_MPI_{tag}")
    others = shm_files(f"hpcddp-test-{tag}", f"psm2_shm.{tag}")
    unmapped = shm_files(f"sm_segment.node1.0.{tag}.2")  # a peer's: this process never maps it
    removed = _unlink_in_a_process_mapping("all", libraries + others)
    assert sorted(removed) == sorted(libraries)
    assert not any(Path(name).exists() for name in libraries)
    assert all(Path(name).exists() for name in others + unmapped)


def test_init_removes_only_mpich_node_segment(shm_files):
    tag = uuid.uuid4().hex[:8]
    node = shm_files(f"mpich_shm_{tag}_3")
    kept = shm_files(f"sm_segment.node1.0.{tag}.0", f"ucx_shm_posix_{tag}")
    assert _unlink_in_a_process_mapping("mpich", node + kept) == node
    assert not Path(node[0]).exists() and all(Path(name).exists() for name in kept)


def test_an_unreadable_map_removes_nothing(shm_files, tmp_path):
    from hpcddp.startup.mpi_init import JOB_SEGMENTS, unlink_mapped_segments

    path = Path(shm_files(f"mpich_shm_{uuid.uuid4().hex[:8]}_0")[0])
    assert unlink_mapped_segments(str(tmp_path / "no-such-maps"), JOB_SEGMENTS) == []
    assert path.exists()
