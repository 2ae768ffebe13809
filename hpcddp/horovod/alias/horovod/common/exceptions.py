"""``horovod.common.exceptions``: the errors ``hpcddp.horovod`` raises."""

from hpcddp.horovod.common import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
