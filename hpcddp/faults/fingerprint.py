"""``HPCDDP_DEBUG=detail``: every rank's collectives compared before they are issued.

Ranks that issue different collectives on one communicator (an allreduce on one rank, a
broadcast on another; a tensor of another shape) wait for each other forever, or
silently mix their data. With the check on, each collective's description (kind,
operation, dtype, shape, root) and sequence number is first gathered from every rank on
a communicator of its own; at the first difference every rank raises
``CollectiveMismatch`` naming the ranks and both calls, before anything is issued.
It costs one small blocking allgather per collective, so it is for debugging.
"""

from hpcddp.comm import activity
from hpcddp.comm.lifetime import Closable, free_comm
from hpcddp.comm.ranks import by_value, ranks_text
from hpcddp.comm.topology import clone_comm

__all__ = ["CollectiveCheck", "CollectiveMismatch"]


class CollectiveMismatch(RuntimeError):
    """Ranks issued different collectives at the same point; raised on every rank."""


class CollectiveCheck(Closable):
    """Compares each collective across the ranks of ``comm`` before it is issued.

    .. warning:: Construction, ``verify`` and ``close()`` are collective.
    """

    _what = "collective check"

    def __init__(self, comm):
        self.comm = clone_comm(comm, "hpcddp.check")
        self._opened()

    def verify(self, channel: "activity.Channel", seq: int, call: str) -> None:
        """Raise ``CollectiveMismatch`` on every rank unless all issue ``call`` as ``seq``.

        Args:
            channel: where the collective is counted.
            seq: its sequence number there.
            call: its description, e.g. ``"allreduce (sum) of float32[4]"``.
        """
        self._check_open()
        with activity.waiting(f"the collective check of {call}", channel, seq):
            calls = self.comm.allgather((seq, call))
        groups = by_value(calls)
        if len(groups) == 1:
            return
        said = "; ".join(f"{'rank' if len(r) == 1 else 'ranks'} {ranks_text(r)} "
                         f"{'issues' if len(r) == 1 else 'issue'} collective {s}: {c}"
                         for (s, c), r in groups)
        raise CollectiveMismatch(
            f"hpcddp: collective mismatch on {channel.name} (HPCDDP_DEBUG=detail): {said}. "
            f"Every rank must issue the same collectives, with the same shapes, dtypes and "
            f"roots, in the same order; a rank-dependent branch around a collective is the "
            f"usual cause")

    def _release(self) -> None:
        free_comm(self.comm)
