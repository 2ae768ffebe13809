"""decode_jpeg against Pillow decoding the same file its own way, with each decoder."""

import importlib.util
import io

import numpy as np
import pytest
import torch

PIL_Image = pytest.importorskip("PIL.Image")

from hpcddp.data import decode_jpeg, jpeg_decoder  # noqa: E402


def _jpeg(mode, shape=(40, 56)):
    rng = np.random.default_rng(3)
    channels = (3,) if mode == "RGB" else ()
    small = rng.integers(0, 256, (8, 8) + channels, dtype=np.uint8)
    picture = PIL_Image.fromarray(small).convert(mode).resize(shape[::-1], PIL_Image.BICUBIC)
    buffer = io.BytesIO()
    picture.save(buffer, format="JPEG", quality=85)
    return buffer.getvalue()


def _reference(data, mode):
    with PIL_Image.open(io.BytesIO(data)) as picture:
        picture.load()
        return np.array(picture.convert(mode))


def _decoders():
    return ["pillow"] + (["simplejpeg"] if importlib.util.find_spec("simplejpeg") else [])


@pytest.mark.parametrize("decoder", _decoders())
@pytest.mark.parametrize("as_type", [bytes, np.ndarray, torch.Tensor])
def test_decodes_a_row_to_the_pixels_pillow_reads(decoder, as_type):
    data = _jpeg("RGB")
    row = {bytes: data, np.ndarray: np.frombuffer(data, np.uint8),
           torch.Tensor: torch.tensor(list(data), dtype=torch.uint8)}[as_type]
    pixels = decode_jpeg(row, decoder=decoder)
    assert pixels.dtype == np.uint8 and pixels.shape == (40, 56, 3)
    np.testing.assert_array_equal(pixels, _reference(data, "RGB"))


@pytest.mark.parametrize("decoder", _decoders())
def test_a_grayscale_jpeg_decodes_to_two_dimensions(decoder):
    data = _jpeg("L")
    pixels = decode_jpeg(data, gray=True, decoder=decoder)
    assert pixels.shape == (40, 56)
    np.testing.assert_array_equal(pixels, _reference(data, "L"))


def test_auto_prefers_simplejpeg_when_installed():
    assert jpeg_decoder() == _decoders()[-1]


def test_bad_input_and_unknown_decoder_are_named():
    with pytest.raises(ValueError, match="1-D uint8"):
        decode_jpeg(np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="float32"):
        decode_jpeg(np.zeros(8, np.float32))
    with pytest.raises(ValueError, match="'libjpeg'"):
        decode_jpeg(_jpeg("RGB"), decoder="libjpeg")
