"""``horovod.torch.optimizer``: ``hpcddp.horovod``'s API (Horovod's modules re-export it alike)."""

from hpcddp.horovod import *  # noqa: F401,F403
