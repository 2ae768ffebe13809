"""Recovery inside the job, where the MPI has ULFM (Open MPI 5 under
``mpirun --with-ft ulfm``): the survivors of a dead rank shrink the job and go on.

The rank that meets the failure first (an MPI error of a dead peer, on any thread) has
every communicator of hpcddp revoked (``hpcddp.faults.failed``), so every survivor,
wherever it waits, gets an error and comes here. Then, on each survivor:

1. ``MPIX_Comm_shrink`` of the world's parent communicator: a new communicator of the
   living, agreed by all of them (fault tolerant: a rank that dies meanwhile is left
   out too).
2. Where whole nodes were lost, a side that holds half of the nodes or fewer (without
   rank 0's) ends itself: a link down splits the job, and only one side may go on
   (``hpcddp.elastic.quorum``). Below ``HPCDDP_ELASTIC_MIN_RANKS`` survivors the job ends
   with a report, as without ULFM. Otherwise the new rank 0 has the launcher end the
   ranks left behind (``hpcddp.faults.launcher_end``): one that Open MPI's failure detector declared
   failed may still live (a frozen node, a stopped process), and the launcher waits for
   every process it started before the job can end.
3. hpcddp's world is let go of without a collective (its helper threads stopped, its
   communicators left revoked) and made again on the survivors (``runtime.rejoin``):
   nodes, threads, reductions, the watchdog, torch's default group.
4. Each ``DistributedDataParallel`` builds its communicators and buckets again; each
   ``ShardedLoader`` deals its samples over the survivors (anything hpcddp opened that
   has a ``_rejoin`` follows the new world).
5. The state goes back to the newest commit any survivor holds: each restores its own
   last commit, and the lowest rank holding the newest one gives it to the others. (A
   rank may have committed a step whose collectives completed there but failed on
   another rank; that commit is whole, since its step's reductions completed.)
6. The reset callbacks run (a learning rate scaled to the new size, say), a report
   names what was lost and where training resumed (stderr, and ``HPCDDP_REPORT_DIR``'s
   ``hpcddp-recovery-rank<N>.json``), and ``run`` calls the function again.
"""

import json
import os
import socket
import sys
import time
from typing import Any, Callable, List, Tuple

from mpi4py import MPI

from hpcddp.comm import lifetime, serial
from hpcddp.comm.ranks import ranks_text
from hpcddp.faults.report import ranks_said, report_path
from hpcddp.env import get_setting
from hpcddp.faults.abort import abort_job
from hpcddp.faults.failed import (armed_recovery, failed_nodes, is_process_failure, revoke_all,
                                  take_noted, ulfm_enabled)
from hpcddp.faults.launcher_end import end_processes, world_ranks
from hpcddp.elastic.quorum import holds_quorum, leave_minority
from hpcddp.runtime import current_world, rejoin

__all__ = ["RECOVERY_REPORT", "Recovery", "recover", "recoverable", "recovered",
           "rejoin_survivors", "until_recovered"]

RECOVERY_REPORT = "hpcddp-recovery-rank{rank}.json"  # beside HPCDDP_REPORT_DIR's reports


_where = {}  # the communicator to shrink, its nodes, this rank there, the models to rejoin


class Recovery(dict):
    """What one recovery did (its report's fields): ``lost_ranks``, ``lost_nodes``,
    ``size_before``, ``size_after``, ``commit``, ``seconds``."""


def recoverable(error: BaseException, recovering: bool = False) -> bool:
    """Whether ``error`` ended ``run``'s function (or, ``recovering``, a recovery) because
    ranks died, under ULFM. In a recovery any MPI error is taken: a rank that dies there
    can fail a call with another class (``MPI_ERR_INTERN`` from ``MPI_Comm_idup``), and the
    next shrink tells who is left."""
    noted = take_noted()
    if not ulfm_enabled():
        return False
    return is_process_failure(error) or noted is not None or (
        recovering and isinstance(error, MPI.Exception))


def _shrink(parent) -> "MPI.Intracomm":
    revoke_all()  # again: a survivor whose own call failed must wake the others too
    limit = get_setting("TIMEOUT")
    try:  # the owner's timeout bounds its start and its run: half of the limit each
        return serial.call(MPI.Comm.Shrink, parent, timeout=limit / 2 if limit else None)
    except serial.OwnerBusy:
        # MPIX_Comm_shrink agrees among every rank MPI still counts as alive: one that
        # lives but no longer takes part, and that no failure detector has declared
        # failed, holds it for ever (seen on 3 nodes x 1 rank, the second node frozen:
        # Open MPI 5.0's detector took 60 s, or declared rank 0 failed too).
        abort_job(parent, f"the survivors' MPIX_Comm_shrink did not complete within "
                  f"HPCDDP_TIMEOUT={limit:g} s: a rank that MPI still counts as alive no "
                  f"longer takes part (a node frozen or cut off that the failure detector "
                  f"has not declared failed); ending the job",
                  facts={"kind": "recovery_stuck", "setting": "HPCDDP_TIMEOUT"})


def _survivors(parent, shrunk) -> List[int]:
    """The ranks of ``parent`` that are in ``shrunk``."""
    return list(MPI.Group.Translate_ranks(shrunk.Get_group(), list(range(shrunk.Get_size())),
                                          parent.Get_group()))


def rejoin_survivors() -> Tuple[Any, Recovery]:
    """Steps 1 to 4: shrink to the survivors, end the job below
    ``HPCDDP_ELASTIC_MIN_RANKS``, rebuild hpcddp and every DDP on them. Returns the new
    world and the recovery's facts so far (what was lost since the world the recovery
    began from, over every attempt: one that failed part way is made again).

    .. warning:: Collective over the survivors (every one of them comes here).
    """
    old = current_world()
    if old is not None:
        _where.update(parent=old.parent, hosts=list(old.hosts), rank=old.rank,
                      models=[o for o in lifetime.open_owners() if hasattr(o, "_rejoin")])
    # else a recovery that failed part way (a rank died in it, or a failure was noted
    # meanwhile) left no world: its shrunk communicator is the one to shrink again.
    # (began: the world until_recovered began from; origin: each rank's index there)
    parent, hosts, origin = _where["parent"], _where["hosts"], _where["origin"]
    began, rank_before, models = _where["began"], origin[_where["rank"]], _where["models"]
    shrunk = _shrink(parent)
    kept = serial.call(_survivors, parent, shrunk)
    _where.update(parent=shrunk, hosts=[hosts[r] for r in kept], rank=shrunk.rank,
                  origin=[origin[r] for r in kept])
    lost = [r for r in range(len(began)) if r not in _where["origin"]]
    facts = Recovery(kind="recovery", lost_ranks=lost, lost_nodes=failed_nodes(lost, began),
                     size_before=len(began), size_after=len(kept), rank_before=rank_before)
    if get_setting("ELASTIC_QUORUM") and not holds_quorum(began, _where["origin"]):
        leave_minority(facts, began, _where["origin"])
    least = get_setting("ELASTIC_MIN_RANKS")
    if len(kept) < least:
        abort_job(shrunk, f"{ranks_said(lost)} died and {len(kept)} ranks are left, fewer than "
                  f"HPCDDP_ELASTIC_MIN_RANKS={least}; ending the job",
                  facts=dict(facts, kind="process_failed", failed_ranks=lost,
                             setting="HPCDDP_ELASTIC_MIN_RANKS"))
    if shrunk.rank == 0:
        left = [r for r in range(len(hosts)) if r not in kept]  # parent's ranks
        not_ended = end_processes(serial.call(world_ranks, parent, left))
        facts["ended_by_launcher"] = not_ended is None
        if not_ended is not None:
            sys.stderr.write(f"hpcddp: {ranks_said(lost)} could not be ended through the "
                             f"launcher ({not_ended}); if they still live, the job ends "
                             f"only when they do\n")
    world = rejoin(shrunk)
    for model in models:
        model._rejoin(world)
    return world, facts


def recovered(world, facts: Recovery, recoveries: List[Recovery], commit: int,
              values: dict, began: float) -> Recovery:
    """Step 6's report: ``facts`` completed with where training goes on (``commit``
    and its ``values``) and the seconds since ``began``, appended to ``recoveries``, said
    on stderr and written to ``HPCDDP_REPORT_DIR``."""
    facts.update(rank=world.rank, commit=commit, values=values,
                 seconds=round(time.monotonic() - began, 3), time=time.time())
    recoveries.append(facts)
    _tell(world, recoveries)
    return facts


def recover(state, began: float) -> Recovery:
    """Shrink to the survivors, rebuild hpcddp on them and restore the newest commit of
    ``state`` (an ``hpcddp.elastic.State``).

    .. warning:: Collective over the survivors (every one of them comes here).
    """
    world, facts = rejoin_survivors()
    state.restore_newest()
    state.on_reset()
    return recovered(world, facts, state.recoveries, state.commits, state.values(), began)


def until_recovered(attempt: Callable[[], Any]) -> Any:
    """``attempt()``, a recovery, made again while ranks die during it (each time one
    more shrink, of the last one's communicator); its result. Its report counts what
    was lost since the world it began from."""
    world = current_world()
    _where.update(began=list(world.hosts), origin=list(range(world.size)))
    while True:
        try:
            with armed_recovery():
                return attempt()
        except Exception as error:  # noqa: BLE001 - only a process failure is taken
            if not recoverable(error, recovering=True):
                raise


def _tell(world, recoveries: List[Recovery]) -> None:
    facts = recoveries[-1]
    lost = facts["lost_ranks"]
    where = "; ".join(f"{n['node']} (rank{'s' if len(n['ranks']) > 1 else ''} "
                      f"{ranks_text(n['ranks'])})" for n in facts["lost_nodes"])
    if world.rank == 0:
        sys.stderr.write(
            f"hpcddp: {ranks_said(lost)} of {facts['size_before']} died ({where}); "
            f"{facts['size_after']} ranks go on from commit {facts['commit']} "
            f"({', '.join(f'{k}={v}' for k, v in facts['values'].items()) or 'no values'}), "
            f"recovered in {facts['seconds']:.2f} s\n")
        sys.stderr.flush()
    path = report_path(world.rank)
    if path is None:
        return
    path = os.path.join(os.path.dirname(path), RECOVERY_REPORT.format(rank=world.rank))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.partial", "w") as out:
            json.dump({"kind": "recoveries", "rank": world.rank, "host": socket.gethostname(),
                       "recoveries": recoveries}, out, indent=1, default=str)
        os.replace(f"{path}.partial", path)
    except OSError as error:  # training goes on; the report said it on stderr
        sys.stderr.write(f"hpcddp: rank {world.rank}: the recovery report {path} could not "
                         f"be written: {error}\n")
