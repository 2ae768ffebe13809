"""Which side of a split job goes on after a recovery.

A link that goes down, or a node that freezes and wakes, splits the job in two: under
ULFM's failure detector each side declares the other failed and shrinks to itself. Had
both gone on, two trainings would write one checkpoint folder (seen here: a 2 x 2 job
whose second node's link went down trained on both sides, and a rename of the one side's
checkpoint failed on the other's). So where ranks are lost with their whole node, the
survivors go on only if they hold more than half of the nodes the job had before, or
exactly half with the node of its lowest rank. Both sides reckon from the same nodes, so
at most one of them goes on; the other ends itself (``leave_minority``), without
``MPI_Abort``, which would end the other side too where the launcher still reaches it.

Ranks lost while others of their node live (a rank killed, stopped or stuck) split
nothing: their node's kernel and launcher daemon are the survivors', which end them.
``HPCDDP_ELASTIC_QUORUM=0`` lets every side go on (each then needs a checkpoint folder of
its own).
"""

import os
import socket
import sys
from typing import List, Sequence

from mpi4py import MPI

from hpcddp.comm.ranks import ranks_text
from hpcddp.faults.report import write_report

__all__ = ["MINORITY_EXIT", "holds_quorum", "leave_minority"]

MINORITY_EXIT = 3  # the exit code of a rank that leaves the job to the other side


def _nodes(hosts: Sequence[str]) -> List[str]:
    return list(dict.fromkeys(hosts))


def holds_quorum(hosts: Sequence[str], kept: Sequence[int]) -> bool:
    """Whether the ranks ``kept`` of a job whose rank ``r`` ran on ``hosts[r]`` go on:
    none of its nodes was lost whole, or they hold more than half of its nodes, or half
    with ``hosts[0]`` (the lowest rank's node)."""
    before = _nodes(hosts)
    mine = set(hosts[r] for r in kept)
    if len(mine) == len(before):
        return True
    return 2 * len(mine) > len(before) or (2 * len(mine) == len(before) and hosts[0] in mine)


def leave_minority(facts: dict, hosts: Sequence[str], kept: Sequence[int]) -> None:
    """End this rank, on the side of a split that does not go on: said on stderr and in
    its report (named by its rank in ``MPI_COMM_WORLD``, apart from the other side's)."""
    rank = MPI.COMM_WORLD.Get_rank()
    mine = _nodes([hosts[r] for r in kept])
    others = [n for n in _nodes(hosts) if n not in mine]
    message = (f"{len(mine)} of the job's {len(_nodes(hosts))} nodes ({', '.join(mine)}) "
               f"{'is' if len(mine) == 1 else 'are'} left on this side; the others "
               f"({', '.join(others)}) no longer answer and may go on without them (a link "
               f"down, a node frozen): so that one side "
               f"trains, this side, the smaller or the one without rank 0's node, ends "
               f"(HPCDDP_ELASTIC_QUORUM=0 lets each side go on)")
    sys.stderr.write(f"hpcddp: rank {rank} (rank {facts['rank_before']} of "
                     f"{facts['size_before']}, with ranks {ranks_text(kept)}) on "
                     f"{socket.gethostname()}: {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    write_report(rank, facts["size_before"], message, MINORITY_EXIT,
                 facts=dict(facts, kind="minority", kept_nodes=mine, lost_whole=others,
                            setting="HPCDDP_ELASTIC_QUORUM"))
    os._exit(MINORITY_EXIT)
