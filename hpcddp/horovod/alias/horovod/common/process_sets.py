"""``horovod.common.process_sets``: ``hpcddp.horovod``'s process sets."""

from hpcddp.horovod.process_sets import (  # noqa: F401
    ProcessSet, add_process_set, global_process_set, remove_process_set)
