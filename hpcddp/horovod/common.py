"""What every part of ``hpcddp.horovod`` shares: Horovod's ops as its ints, its errors."""

__all__ = ["Average", "Sum", "Adasum", "Min", "Max", "Product", "OP_NAMES",
           "NOT_INITIALIZED", "HorovodInternalError", "HostsUpdatedInterrupt"]

# Horovod's reduction ops, as the ints Horovod gives them (its ReduceOp enum).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
            Product: "Product"}

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


class HorovodInternalError(RuntimeError):
    """An operation failed because a rank or the network did (elastic training restores
    the last commit on it)."""


class HostsUpdatedInterrupt(RuntimeError):
    """The hosts of an elastic job changed (elastic training syncs on it)."""

    def __init__(self, skip_sync: bool = False):
        super().__init__("the hosts of the job changed")
        self.skip_sync = skip_sync
