"""``horovod.common``, served by hpcddp."""
