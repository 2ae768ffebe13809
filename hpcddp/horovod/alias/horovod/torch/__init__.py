"""``horovod.torch``: ``hpcddp.horovod``'s API."""

from hpcddp.horovod import *  # noqa: F401,F403 - the alias is the whole API
from hpcddp.horovod import __all__  # noqa: F401
