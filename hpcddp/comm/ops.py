"""Reduction operations by name, including bfloat16, which MPI does not know.

bfloat16 buffers travel as raw 16-bit words; a user-defined MPI operation widens them to
float32, reduces, and rounds back to nearest-even, so the sum of two bf16 values equals
torch's ``(a.float() + b.float()).bfloat16()``.
"""

import numpy as np
from mpi4py import MPI

__all__ = ["BFLOAT16", "BOOL", "mpi_op", "bf16_to_f32", "f32_to_bf16"]

BFLOAT16 = "bfloat16"  # raw bfloat16 words (uint16)
BOOL = "bool"          # booleans as bytes (uint8)

_NATIVE = {
    "sum": MPI.SUM, "product": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
    "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR,
}
# On 0/1 bytes, sum and product of bools are "any" and "all".
_BOOL = {"sum": "bor", "product": "band"}
_NUMPY = {"sum": np.add, "product": np.multiply, "min": np.minimum, "max": np.maximum}
_user_ops = {}


def bf16_to_f32(words: np.ndarray) -> np.ndarray:
    """Widen raw bfloat16 words (uint16) to float32."""
    return (words.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 words (uint16), nearest-even, NaN kept NaN."""
    bits = values.view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded)


def _bf16_op(name):
    combine = _NUMPY[name]

    def reduce_bf16(inbuf, inoutbuf, datatype):
        a = np.frombuffer(inbuf, dtype=np.uint16)
        b = np.frombuffer(inoutbuf, dtype=np.uint16)
        b[...] = f32_to_bf16(combine(bf16_to_f32(a), bf16_to_f32(b)))

    return MPI.Op.Create(reduce_bf16, commute=True)


def mpi_op(name: str, kind=None) -> "MPI.Op":
    """Return the MPI operation ``name`` (sum, product, min, max, band, bor, bxor).

    Args:
        name: the reduction.
        kind: ``BFLOAT16`` when the buffer holds raw bfloat16 words, ``BOOL`` for
            booleans as bytes; otherwise ignored.
    """
    if name not in _NATIVE:
        raise ValueError(f"reduction {name!r} is not supported; use one of {sorted(_NATIVE)}")
    if kind == BOOL:
        return _NATIVE[_BOOL.get(name, name)]
    if kind != BFLOAT16:
        return _NATIVE[name]
    if name not in _NUMPY:
        raise ValueError(f"reduction {name!r} is not defined for bfloat16")
    # Created on first use: MPI must be initialized before MPI_Op_create.
    if name not in _user_ops:
        _user_ops[name] = _bf16_op(name)
    return _user_ops[name]
