"""H5Dataset in DataLoader workers, and `hpcddp pack` as a user runs it."""

import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hpcddp.data import DataFileError, H5Dataset, inspect_file


@pytest.fixture
def arrays(tmp_path):
    x = np.random.default_rng(1).standard_normal((57, 3, 2)).astype(np.float32)
    y = np.arange(57, dtype=np.int32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "more.npz", y=y, mask=y % 2 == 0)
    return tmp_path, x, y


def _pack(*args):
    return subprocess.run([sys.executable, "-m", "hpcddp", "pack", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_pack_contiguous_then_read_back_in_worker_processes(arrays):
    folder, x, y = arrays
    out = folder / "train.h5"
    job = _pack(out, folder / "x.npy", folder / "more.npz")
    assert job.returncode == 0, job.stderr
    assert "100%" in job.stderr  # the tqdm progress bar
    infos = {i.key: i for i in inspect_file(out)}
    assert all(i.readable_by_offset for i in infos.values())
    ds = H5Dataset(out, ["x", "y", "mask"])
    loader = DataLoader(ds, batch_size=10, num_workers=2)
    xs, ys, masks = (torch.cat(parts) for parts in zip(*loader))
    np.testing.assert_array_equal(xs.numpy(), x)
    np.testing.assert_array_equal(ys.numpy(), y)
    assert masks.dtype == torch.bool and masks.tolist() == (y % 2 == 0).tolist()


def test_pack_chunked_and_compressed(arrays):
    folder, x, _ = arrays
    out = folder / "gz.h5"
    assert _pack(out, "feat=" + str(folder / "x.npy"), "--chunk-rows", 8,
                 "--compression", "gzip", "--quiet").returncode == 0
    with h5py.File(out) as f:
        assert f["feat"].chunks == (8, 3, 2) and f["feat"].compression == "gzip"
        np.testing.assert_array_equal(f["feat"][()], x)


def test_pack_shards_split_the_rows_in_order(arrays):
    folder, x, y = arrays
    job = _pack(folder / "part.h5", folder / "x.npy", folder / "more.npz", "--shards", 4,
                "--quiet")
    assert job.returncode == 0, job.stderr
    assert "part-*.h5" in job.stdout
    paths = sorted(folder.glob("part-*.h5"))
    assert [p.name for p in paths] == [f"part-{i:05d}.h5" for i in range(4)]
    lengths = [len(H5Dataset(p, ["x"])) for p in paths]
    assert sum(lengths) == 57 and max(lengths) - min(lengths) <= 1
    ds = torch.utils.data.ConcatDataset([H5Dataset(p, ["x", "y"]) for p in paths])
    xs, ys = (torch.cat(parts) for parts in zip(*DataLoader(ds, batch_size=10)))
    np.testing.assert_array_equal(xs.numpy(), x)
    np.testing.assert_array_equal(ys.numpy(), y)
    assert _pack(folder / "p.h5", folder / "x.npy", "--shards", 58).returncode == 2


def test_pack_refuses_arrays_of_different_lengths_and_leaves_nothing(arrays):
    folder, _, _ = arrays
    np.save(folder / "short.npy", np.zeros(3))
    out = folder / "bad.h5"
    job = _pack(out, folder / "x.npy", folder / "short.npy")
    assert job.returncode == 2 and "equal length" in job.stderr and not out.exists()


def test_dataset_checks_lengths(tmp_path):
    path = tmp_path / "uneven.h5"
    with h5py.File(path, "w") as f:
        f["a"], f["b"] = np.zeros(4), np.zeros(5)
    with pytest.raises(DataFileError, match="different lengths"):
        H5Dataset(path, ["a", "b"])


def test_pack_variable_length_rows_checked_against_h5py(tmp_path):
    from hpcddp.data.pack import pack_arrays

    images = [b"\x01\x02\x03", b"", bytes(range(200))]
    vectors = [np.arange(n, dtype=np.float32) for n in (4, 1, 2)]
    out = tmp_path / "vlen.h5"
    pack_arrays(out, {"image": images, "name": ["a", "ü", ""], "vector": vectors},
                progress=False)
    with h5py.File(out) as f:  # what h5py itself reads back
        assert h5py.check_vlen_dtype(f["image"].dtype) == np.uint8
        assert [bytes(r) for r in f["image"][()]] == images
        assert list(f["name"].asstr()[()]) == ["a", "ü", ""]
        assert all(np.array_equal(a, b) for a, b in zip(f["vector"][()], vectors))
    ds = H5Dataset(out)
    image, name, vector = ds[2]
    assert image.dtype == torch.uint8 and bytes(image.numpy()) == images[2]
    assert name == "" and torch.equal(vector, torch.arange(2, dtype=torch.float32))
    with pytest.raises(ValueError, match="mixes str"):
        pack_arrays(tmp_path / "bad.h5", {"x": ["a", b"b"]}, progress=False)
    with pytest.raises(ValueError, match="different dtypes"):
        pack_arrays(tmp_path / "bad.h5", {"x": [np.zeros(2), np.zeros(2, np.int8)]},
                    progress=False)
    assert not (tmp_path / "bad.h5").exists()
