"""The checkpoint file as written by rank 0's store: torch's zip format, without torch's
CRC32 of every record (the manifest's XXH3-128 covers every byte, checked at load), read
back by torch.load and by Python's zipfile, and torch's process-wide CRC32 option left
as it was, also when a save fails."""

import json
import os
import zipfile

import numpy as np
import pytest
import torch
import xxhash

from hpcddp.checkpoint import store


def _state():
    torch.manual_seed(0)
    return {"model": {"w": torch.randn(300, 7), "b": torch.arange(5)}, "step": 3}


def test_records_carry_no_crc32_and_the_manifest_digest_covers_the_file(tmp_path):
    path = store.write_checkpoint(tmp_path, 3, _state(), 2)
    data = os.path.join(path, store.STATE)
    with zipfile.ZipFile(data) as archive:
        records = archive.infolist()
    assert records and all(record.CRC == 0 for record in records), \
        [(r.filename, r.CRC) for r in records]
    with open(os.path.join(path, store.MANIFEST)) as f:
        manifest = json.load(f)
    with open(data, "rb") as f:
        assert manifest["files"][store.STATE]["xxh3_128"] == xxhash.xxh3_128(f.read()).hexdigest()
    loaded = torch.load(data, weights_only=True)
    assert torch.equal(loaded["model"]["w"], _state()["model"]["w"]) and loaded["step"] == 3


def test_crc32_option_is_restored_after_a_save_and_after_a_failed_one(tmp_path):
    assert torch.serialization.get_crc32_options() is True
    store.write_checkpoint(tmp_path, 1, _state(), 1)
    assert torch.serialization.get_crc32_options() is True
    with pytest.raises(Exception):
        store.write_checkpoint(tmp_path, 2, {"bad": lambda: None}, 1)  # unpicklable
    assert torch.serialization.get_crc32_options() is True
    assert not os.path.exists(os.path.join(tmp_path, store.checkpoint_name(2)))


def test_a_torch_save_with_crc32_still_has_it(tmp_path):
    # The process-wide option is off only inside a checkpoint save.
    torch.save(_state(), tmp_path / "plain.pt")
    with zipfile.ZipFile(tmp_path / "plain.pt") as archive:
        assert any(record.CRC != 0 for record in archive.infolist())


def test_checkpoints_no_longer_kept_vanish_at_once_and_are_deleted_behind(tmp_path):
    paths = [store.write_checkpoint(tmp_path, step, _state(), 1) for step in (1, 2, 3)]
    store.remove_old(tmp_path, 1, keep=paths[-1])
    # At once, before the background deletion ends: only the newest is a checkpoint.
    assert [n for n in os.listdir(tmp_path) if n.startswith("step-")] == \
        [os.path.basename(paths[-1])]
    assert store.candidates(tmp_path) == [paths[-1]]
    store.finish_removal()
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(paths[-1]), store.LATEST])


def test_a_removal_cut_short_by_a_crash_is_finished_by_the_next_save(tmp_path):
    path = store.write_checkpoint(tmp_path, 1, _state(), 1)
    left = tmp_path / ".removing-step-000000000-4242"
    left.mkdir()
    (left / store.STATE).write_bytes(b"half deleted")
    assert all(".removing-" not in p for p in store.candidates(tmp_path))
    store.remove_stale_temporaries(tmp_path, saving=True)
    assert not left.exists() and os.path.exists(path)


def test_the_map_rank_0_broadcasts_from_takes_mpis_writes_and_keeps_them_from_the_file(
        tmp_path):
    """MPI_Bcast's buffer is INOUT at the root: MPICH's broadcast to 8 ranks or more
    writes the root's pieces back into it (a read-only map ended rank 0 with SIGSEGV
    there). The map must take such writes, and the checkpoint's file must not see them."""
    from hpcddp.checkpoint.delivery import _populated_map
    path = tmp_path / "state.pt"
    path.write_bytes(bytes(range(256)) * 64)
    with open(path, "rb") as f:
        mapped = _populated_map(f.fileno(), 256 * 64)
    view = np.frombuffer(mapped, np.uint8)
    assert view.flags.writeable
    view[:256] = 7  # as MPI's allgather phase writes the root's buffer
    assert bytes(mapped[:4]) == b"\x07" * 4
    assert path.read_bytes() == bytes(range(256)) * 64
