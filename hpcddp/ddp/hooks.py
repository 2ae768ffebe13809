"""What is done to a full bucket: the bucket hook.

A hook is called with a ``GradBucket`` once all its gradients are in and returns a
handle (``hpcddp.comm.Handle``) whose ``wait()`` gives the reduced flat tensor. It also
says by what each gradient is divided as it enters the bucket (``divisor``); that is
where averaging happens, and nowhere else. The reducer moves buckets and knows nothing
of averaging.
"""

from hpcddp.transport import Transfer

__all__ = ["AllreduceMean"]


class AllreduceMean:
    """The default hook: the mean over ranks, as torch's DDP computes it without a hook.

    Every gradient is divided by the world size as it enters the bucket (fused into
    that copy), and the bucket is then summed by one non-blocking allreduce; 16-bit
    sums over many ranks cannot overflow this way.

    Args:
        transport: the gradient communicator's transport.
    """

    def __init__(self, transport):
        self.transport = transport
        self.divisor = transport.comm.size

    def __call__(self, bucket) -> Transfer:
        buffer = bucket.buffer()
        return self.transport.allreduce(
            buffer, slot=bucket.index(), route=bucket.route,
            name=f"DDP bucket {bucket.index()} ({buffer.numel()} {buffer.dtype}, "
                 f"{len(bucket.layout.params)} parameters)")
