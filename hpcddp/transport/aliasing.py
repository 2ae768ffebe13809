"""Where the tensors of one collective sit in memory, and how MPI must see them.

torch's collectives may pass an input that lies inside the output: FSDP2 all-gathers
each rank's shard from a view of the very buffer it gathers into, and a reduce-scatter
may write into a view of its own input. gloo accepts that. MPI does not: MPICH refuses
aliased buffers ("Buffers must not be aliased"), and where it fails to notice (a
partial overlap) the result is silently wrong. An input already at its rank's place in
an allgather's output travels as ``MPI_IN_PLACE``; any other overlap is copied first.
Lists of unequal parts (torch's uneven ``all_gather`` and ``reduce_scatter``) travel as
one flat buffer with per-rank counts.
"""

from itertools import accumulate
from typing import List, Sequence, Tuple

import torch

__all__ = ["check_parts", "counts_and_displs", "displs", "in_place_chunk", "overlaps", "split_counts",
           "unflatten_into", "unstack_into"]


def _span(tensor: torch.Tensor) -> Tuple[int, int]:
    """The byte range from a tensor's first element to past its last (strides included)."""
    if tensor.numel() == 0:
        return (tensor.data_ptr(), tensor.data_ptr())
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    start = tensor.data_ptr()
    return (start, start + (last + 1) * tensor.element_size())


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors share any bytes of memory (conservative for strided views)."""
    if a.device != b.device or a.numel() == 0 or b.numel() == 0:
        return False
    (a0, a1), (b0, b1) = _span(a), _span(b)
    return a0 < b1 and b0 < a1


def in_place_chunk(output: torch.Tensor, tensor: torch.Tensor, rank: int) -> bool:
    """Whether ``tensor`` is exactly rank ``rank``'s chunk of a flat, contiguous
    allgather ``output`` (so that MPI may gather with ``MPI_IN_PLACE``)."""
    return (output.is_contiguous() and tensor.is_contiguous()
            and tensor.dtype == output.dtype and tensor.device == output.device
            and tensor.data_ptr() == output.data_ptr()
            + rank * tensor.numel() * tensor.element_size())


def displs(counts: Sequence[int]) -> List[int]:
    """Displacements of consecutive parts of ``counts`` elements."""
    return [0] + list(accumulate(counts))[:-1]


def counts_and_displs(counts: Sequence[int]) -> Tuple[List[int], List[int]]:
    return list(counts), displs(counts)


def split_counts(tensor: torch.Tensor, split_sizes: Sequence[int], size: int):
    """Element counts and displacements for an alltoallv split along dim 0."""
    rows = list(split_sizes) if split_sizes else [tensor.shape[0] // size] * size
    per_row = tensor[0].numel() if tensor.dim() > 0 and tensor.shape[0] else 1
    return counts_and_displs([r * per_row for r in rows])


def unstack_into(stacked: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    for out, part in zip(outputs, stacked.unbind(0)):
        out.copy_(part)


def unflatten_into(flat: torch.Tensor, outputs: Sequence[torch.Tensor]) -> None:
    offset = 0
    for out in outputs:
        out.copy_(flat[offset:offset + out.numel()].view_as(out))
        offset += out.numel()


def check_parts(call, whole_name, whole, part_name, part, size):
    """Refuse a whole that is not ``size`` parts (MPI would fail with a count error)."""
    if whole.numel() != part.numel() * size or whole.dtype != part.dtype:
        raise ValueError(
            f"{call}: the {whole_name} must hold the group's {size} ranks' {part_name}s of "
            f"{part.numel()} {str(part.dtype)[6:]} each, {part.numel() * size} elements, but "
            f"has {whole.numel()} {str(whole.dtype)[6:]}; size the {whole_name} as "
            f"{part_name}.numel() * group size")
