"""``horovod.torch.elastic``: hpcddp's, at the job's fixed size (``hpcddp.horovod.elastic``)."""

from hpcddp.horovod.elastic import *  # noqa: F401,F403
from hpcddp.horovod.elastic import __all__  # noqa: F401
