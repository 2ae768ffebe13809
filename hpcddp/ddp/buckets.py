"""Which parameters share a gradient bucket: a pure function of sizes, dtypes and order.

Buckets fill in the order gradients are expected to become ready: reverse registration
order at first (backward runs roughly from the last layer to the first), then the order
actually observed in the first iteration. The first bucket is small so that
communication starts early; the rest hold up to ``bucket_cap_mb``. Each bucket holds one
dtype on one device, so it is one contiguous flat buffer.
"""

from typing import Dict, List, NamedTuple, Sequence, Tuple

__all__ = ["BucketLayout", "ParamSpec", "assign_buckets", "DEFAULT_CAP_MB",
           "FIRST_BUCKET_BYTES"]

DEFAULT_CAP_MB = 25.0
FIRST_BUCKET_BYTES = 1 << 20


class ParamSpec(NamedTuple):
    """What bucketing needs to know of a parameter."""

    numel: int
    element_size: int
    dtype: str
    device: str


class BucketLayout(NamedTuple):
    """One bucket: its parameters (indices) and where each starts in the flat buffer."""

    params: Tuple[int, ...]
    offsets: Tuple[int, ...]
    numel: int
    dtype: str
    device: str


def assign_buckets(specs: Sequence[ParamSpec], order: Sequence[int],
                   cap_bytes: int, first_cap_bytes: int = FIRST_BUCKET_BYTES
                   ) -> List[BucketLayout]:
    """Group parameters into buckets.

    Args:
        specs: one spec per parameter, indexed by parameter number.
        order: the parameter numbers in the order their gradients are expected.
        cap_bytes: the byte size at which a bucket is closed.
        first_cap_bytes: the smaller cap of the first bucket of each dtype and device.

    Returns:
        Buckets in launch order. A bucket is closed once it reaches its cap, so a single
        parameter larger than the cap gets a bucket of its own.

    Example::

        >>> s = [ParamSpec(10, 4, "float32", "cpu")] * 3
        >>> [b.params for b in assign_buckets(s, [2, 1, 0], cap_bytes=80, first_cap_bytes=40)]
        [(2,), (1, 0)]
    """
    if sorted(order) != list(range(len(specs))):
        raise ValueError("order must name every parameter exactly once")
    open_buckets: Dict[Tuple[str, str], List[int]] = {}
    open_bytes: Dict[Tuple[str, str], int] = {}
    closed_count: Dict[Tuple[str, str], int] = {}
    done: List[Tuple[int, List[int]]] = []  # (position of last member, members)

    for position, index in enumerate(order):
        spec = specs[index]
        key = (spec.dtype, spec.device)
        members = open_buckets.setdefault(key, [])
        members.append(index)
        open_bytes[key] = open_bytes.get(key, 0) + spec.numel * spec.element_size
        cap = first_cap_bytes if closed_count.get(key, 0) == 0 else cap_bytes
        if open_bytes[key] >= cap:
            done.append((position, members))
            closed_count[key] = closed_count.get(key, 0) + 1
            del open_buckets[key], open_bytes[key]
    position = len(order)
    for members in open_buckets.values():
        done.append((position, members))
        position += 1
    # Launch order: a bucket is ready once its last member is, so order by that.
    done.sort(key=lambda item: item[0])
    return [_layout(specs, members) for _, members in done]


def _layout(specs, members) -> BucketLayout:
    offsets, total = [], 0
    for index in members:
        offsets.append(total)
        total += specs[index].numel
    first = specs[members[0]]
    return BucketLayout(tuple(members), tuple(offsets), total, first.dtype, first.device)
