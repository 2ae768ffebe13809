"""Which shared-memory names a process removes from /dev/shm: at an abort, every MPI
library's job segment that it maps (MPICH's node segment, Open MPI's sm segment, UCX's
and Intel MPI's), never a file it does not map or another program's; in init(), only
MPICH's node segment (Open MPI's ranks attach to each other's segments lazily)."""

import mmap
import os
import uuid
from pathlib import Path

import pytest

from hpcddp.comm.startup import JOB_SEGMENTS, unlink_mapped_segments

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="needs /dev/shm")


@pytest.fixture
def mapped():
    """Make files in /dev/shm under the names given, map each into this process; the
    names that are still there at the end are removed."""
    maps, made = [], []

    def make(name, map_it=True):
        path = SHM / name
        with open(path, "wb+") as f:
            f.truncate(4096)
            if map_it:
                maps.append(mmap.mmap(f.fileno(), 4096))
        made.append(path)
        return path

    yield make
    for m in maps:
        m.close()
    for path in made:
        path.unlink(missing_ok=True)


def test_an_abort_removes_every_mpi_library_segment_it_maps_and_nothing_else(mapped):
    tag = uuid.uuid4().hex[:8]
    libraries = [mapped(f"mpich_shm_{tag}_0"), mapped(f"sm_segment.node1.0.{tag}.1"),
                 mapped(f"ucx_shm_posix_{tag}"), mapped(f"Intel_MPI_{tag}")]
    others = [mapped(f"hpcddp-test-{tag}"), mapped(f"psm2_shm.{tag}"),
              mapped(f"sm_segment.node1.0.{tag}.2", map_it=False)]  # a peer's, not mapped
    removed = unlink_mapped_segments(pattern=JOB_SEGMENTS)
    assert sorted(removed) == sorted(map(str, libraries))
    assert not any(path.exists() for path in libraries)
    assert all(path.exists() for path in others)


def test_init_removes_only_mpich_node_segment(mapped):
    tag = uuid.uuid4().hex[:8]
    node = mapped(f"mpich_shm_{tag}_3")
    kept = [mapped(f"sm_segment.node1.0.{tag}.0"), mapped(f"ucx_shm_posix_{tag}")]
    assert unlink_mapped_segments() == [str(node)]
    assert not node.exists() and all(path.exists() for path in kept)


def test_an_unreadable_map_removes_nothing(mapped, tmp_path):
    path = mapped(f"mpich_shm_{uuid.uuid4().hex[:8]}_0")
    assert unlink_mapped_segments(str(tmp_path / "no-such-maps")) == []
    assert path.exists() and os.path.getsize(path) == 4096
