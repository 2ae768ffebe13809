"""A checkpoint save turns torch's zip-record CRC32 off while it writes; saves that
overlap in threads leave it as the process had it before the first began."""

import torch

from hpcddp.checkpoint.store import without_zip_crc32


def test_overlapping_saves_restore_the_crc_option_when_the_last_ends():
    get, put = torch.serialization.get_crc32_options, torch.serialization.set_crc32_options
    before = get()
    put(True)
    try:
        first, second = without_zip_crc32(), without_zip_crc32()
        first.__enter__()
        assert get() is False
        second.__enter__()  # a second save, in another thread, begins before the first ends
        first.__exit__(None, None, None)
        assert get() is False  # the second is still writing
        second.__exit__(None, None, None)
        assert get() is True
    finally:
        put(before)


def test_a_users_choice_to_skip_crc_is_kept():
    get, put = torch.serialization.get_crc32_options, torch.serialization.set_crc32_options
    before = get()
    put(False)
    try:
        with without_zip_crc32():
            assert get() is False
        assert get() is False
    finally:
        put(before)
