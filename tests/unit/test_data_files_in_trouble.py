"""HDF5 files that are not what they seem: still being written, truncated while read,
damaged inside a compressed chunk, or not a dataset at all. Each is a real file on disk,
and the writer is a real second process."""

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

from hpcddp.data import DataFileError, H5Dataset, inspect_file
from hpcddp.data.readers import H5pyReader, MemmapReader

# A writer that creates the file, writes the first half of the rows, flushes, says so
# and keeps the file open until its stdin closes.
_WRITER = textwrap.dedent("""
    import sys, h5py, numpy as np
    path, libver, locking, swmr = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
    f = h5py.File(path, "w", libver=libver, locking=locking)
    if swmr:
        d = f.create_dataset("x", (0, 4), "f4", maxshape=(None, 4), chunks=(8, 4))
        f.swmr_mode = True
        d.resize((50, 4))
    else:
        d = f.create_dataset("x", (100, 4), "f4")
    d[:50] = 1.0
    f.flush()
    print("written", flush=True)
    sys.stdin.read()
    f.close()
""")


@pytest.fixture
def writer(tmp_path):
    """Start a writer process on a new file; yields ``start(libver, locking, swmr)``."""
    started = []

    def start(libver="earliest", locking=True, swmr=False):
        path = tmp_path / f"growing-{len(started)}.h5"
        process = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), libver, str(int(locking)),
             str(int(swmr))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        started.append(process)
        assert process.stdout.readline().strip() == "written"
        return path

    yield start
    for process in started:
        process.stdin.close()
        process.wait(timeout=30)


@pytest.mark.parametrize("libver, locking", [("earliest", True), ("earliest", False),
                                             ("latest", True), ("latest", False)])
def test_a_file_open_for_writing_is_refused(writer, libver, locking):
    # The half not yet written would read as zeros; HDF5 itself opens it without a word
    # when the writer's locking is off and its superblock is of the default version.
    path = writer(libver, locking)
    with pytest.raises(DataFileError) as info:
        H5Dataset(path, ["x"])
    message = str(info.value)
    assert str(path) in message and "open for writing by another process" in message
    assert "h5clear -s" in message and "swmr=True" in message


def test_the_same_file_reads_once_the_writer_has_closed_it(writer, tmp_path):
    path = writer("earliest", True)
    with pytest.raises(DataFileError):
        inspect_file(path)
    # The fixture's writer closes the file at teardown; here a copy closed at once.
    with h5py.File(tmp_path / "closed.h5", "w") as f:
        f["x"] = np.ones((100, 4), np.float32)
    inspect_file(tmp_path / "closed.h5")
    assert H5Dataset(tmp_path / "closed.h5", ["x"])[99][0].sum() == 4


def test_a_swmr_file_is_refused_unless_asked_then_reads_the_flushed_rows(writer):
    path = writer("latest", True, swmr=True)
    with pytest.raises(DataFileError, match="being written in SWMR mode.*pass swmr=True"):
        H5Dataset(path, ["x"])
    dataset = H5Dataset(path, ["x"], swmr=True)
    assert len(dataset) == 50
    assert all(float(dataset[i][0].sum()) == 4.0 for i in (0, 49))


def _contiguous(path, rows=4096):
    x = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8)
    with h5py.File(path, "w") as f:
        f["x"] = x
    return x


def test_a_file_truncated_under_the_memmap_reader_is_an_error_naming_it(tmp_path):
    path = tmp_path / "data.h5"
    x = _contiguous(path)
    reader = MemmapReader(path, inspect_file(path, ["x"]))
    np.testing.assert_array_equal(reader.read(np.array([3, 1]))[0], x[[3, 1]])
    # Without the check this read touches unmapped pages: SIGBUS, exit code 7, no words.
    os.truncate(path, os.path.getsize(path) // 2)
    with pytest.raises(DataFileError, match=rf"{path} shrank to \d+ bytes.*'x'"):
        reader.read(np.array([4095]))
    reader.close()


def test_a_corrupt_compressed_chunk_names_the_file_key_and_rows(tmp_path):
    path = tmp_path / "gz.h5"
    x = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(16, 16), compression="gzip")
        chunk = f["x"].id.get_chunk_info(2)  # rows 32..47
    with open(path, "r+b") as f:
        f.seek(chunk.byte_offset + chunk.size // 2)
        f.write(b"\xde\xad\xbe\xef" * 8)
    reader = H5pyReader(path, inspect_file(path, ["x"]))
    np.testing.assert_array_equal(reader.read(np.array([5, 20]))[0], x[[5, 20]])
    with pytest.raises(DataFileError) as info:
        reader.read(np.array([40, 33]))
    message = str(info.value)
    assert str(path) in message and "'x'" in message and "rows 33..40" in message
    reader.close()


def test_not_a_dataset_each_says_what_it_is(tmp_path):
    with h5py.File(tmp_path / "scalar.h5", "w") as f:
        f["x"] = 3.0
    with pytest.raises(DataFileError, match="'x' is a scalar"):
        inspect_file(tmp_path / "scalar.h5", ["x"])
    (tmp_path / "folder.h5").mkdir()
    with pytest.raises(DataFileError, match="is a directory; pass the HDF5 file itself"):
        inspect_file(tmp_path / "folder.h5")
    (tmp_path / "notes.txt").write_text("not hdf5\n" * 100)
    with pytest.raises(DataFileError, match="is not an HDF5 file"):
        inspect_file(tmp_path / "notes.txt")
