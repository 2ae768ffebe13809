"""Which parameters share a gradient bucket: a pure function of sizes, dtypes and order.

Buckets fill in the order gradients are expected to become ready: reverse registration
order at first (backward runs roughly from the last layer to the first), then the order
actually observed in the first iteration. The first bucket is small so that
communication starts early; the rest hold up to ``bucket_cap_mb``. Each bucket holds one
dtype on one device, so it is one contiguous flat buffer.

A large parameter in host memory gets a bucket of its own (``solo``), reduced where its
gradient lies: copying it into a bucket and back costs about as much memory traffic as
the reduction itself, while one more message costs less than copying 1 MiB. Device
memory copies at hundreds of GB/s, so there the fewer messages of full buckets win.
"""

from typing import Dict, List, NamedTuple, Sequence, Tuple

__all__ = ["BucketLayout", "ParamSpec", "assign_buckets", "DEFAULT_CAP_MB",
           "FIRST_BUCKET_BYTES", "SOLO_BYTES"]

DEFAULT_CAP_MB = 25.0
FIRST_BUCKET_BYTES = 1 << 20
SOLO_BYTES = 1 << 20


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
    solo: bool = False  # one parameter, reduced in its own gradient (no bucket copies)


def assign_buckets(specs: Sequence[ParamSpec], order: Sequence[int],
                   cap_bytes: int, first_cap_bytes: int = FIRST_BUCKET_BYTES,
                   solo_bytes: int = 0) -> List[BucketLayout]:
    """Group parameters into buckets.

    Args:
        specs: one spec per parameter, indexed by parameter number.
        order: the parameter numbers in the order their gradients are expected.
        cap_bytes: the byte size at which a bucket is closed.
        first_cap_bytes: the smaller cap of the first bucket of each dtype and device.
        solo_bytes: a parameter in host memory at least this large gets a ``solo``
            bucket; 0 never.

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
    done: List[Tuple[int, List[int], bool]] = []  # (position of last member, members, solo)

    for position, index in enumerate(order):
        spec = specs[index]
        if solo_bytes and spec.device == "cpu" and spec.numel * spec.element_size >= solo_bytes:
            done.append((position, [index], True))
            continue
        key = (spec.dtype, spec.device)
        members = open_buckets.setdefault(key, [])
        members.append(index)
        open_bytes[key] = open_bytes.get(key, 0) + spec.numel * spec.element_size
        cap = first_cap_bytes if closed_count.get(key, 0) == 0 else cap_bytes
        if open_bytes[key] >= cap:
            done.append((position, members, False))
            closed_count[key] = closed_count.get(key, 0) + 1
            del open_buckets[key], open_bytes[key]
    position = len(order)
    for members in open_buckets.values():
        done.append((position, members, False))
        position += 1
    # Launch order: a bucket is ready once its last member is, so order by that.
    done.sort(key=lambda item: item[0])
    return [_layout(specs, members, solo) for _, members, solo in done]


def _layout(specs, members, solo) -> BucketLayout:
    offsets, total = [], 0
    for index in members:
        offsets.append(total)
        total += specs[index].numel
    first = specs[members[0]]
    return BucketLayout(tuple(members), tuple(offsets), total, first.dtype, first.device, solo)
