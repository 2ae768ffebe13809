"""JPEG bytes to pixels, for transforms that decode images stored as variable-length rows.

simplejpeg (libjpeg-turbo, decoding straight into a NumPy array) is used when it is
installed; it decodes about 1.7 times as fast as Pillow here (benchmarks/bench_decode.py).
Pillow is the fallback. Neither is a dependency of hpcddp: ``pip install simplejpeg`` (or
the ``demo`` extra, which has both).
"""

import functools
import io

import numpy as np

_DECODERS = ("simplejpeg", "pillow")


@functools.lru_cache(maxsize=None)
def jpeg_decoder(prefer: str = "auto") -> str:
    """The decoder ``decode_jpeg`` uses: ``"simplejpeg"`` when installed, else ``"pillow"``."""
    if prefer not in ("auto",) + _DECODERS:
        raise ValueError(f"decoder={prefer!r} is not one of 'auto', 'simplejpeg', 'pillow'")
    for name in _DECODERS if prefer == "auto" else (prefer,):
        try:
            __import__("simplejpeg" if name == "simplejpeg" else "PIL.Image")
            return name
        except ImportError:
            continue
    raise ImportError(f"decoding JPEG needs {'simplejpeg or Pillow' if prefer == 'auto' else prefer}"
                      ": pip install simplejpeg (or, in hpcddp's clone, pip install '.[demo]')")


def decode_jpeg(data, gray: bool = False, decoder: str = "auto") -> np.ndarray:
    """Decode one JPEG, given as bytes or a 1-D uint8 array or CPU tensor (a row of an
    ``h5py.vlen_dtype(np.uint8)`` dataset), to uint8 pixels: HxWx3 RGB, or HxW if ``gray``."""
    raw = np.ascontiguousarray(np.asarray(data if not isinstance(data, bytes)
                                          else np.frombuffer(data, np.uint8)))
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise ValueError(f"a JPEG must be 1-D uint8 bytes, not {raw.dtype} of shape {raw.shape}")
    if jpeg_decoder(decoder) == "simplejpeg":
        import simplejpeg
        pixels = simplejpeg.decode_jpeg(raw, colorspace="GRAY" if gray else "RGB")
        return pixels[..., 0] if gray else pixels
    from PIL import Image
    with Image.open(io.BytesIO(raw.tobytes())) as picture:
        return np.asarray(picture.convert("L" if gray else "RGB"))
