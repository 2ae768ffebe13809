"""``horovod.torch.sync_batch_norm``: hpcddp's ``SyncBatchNorm`` (CPU and CUDA)."""

from hpcddp.ddp.syncbn import SyncBatchNorm  # noqa: F401
