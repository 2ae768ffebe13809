"""The watchdog: no hpcddp wait lasts forever, and a stuck job says where it is stuck.

A helper thread on every rank looks, a few times a second, at the waits this rank is in
(``activity.py``). It does not depend on the stuck operation: it talks on a private
control communicator of its own, with small point-to-point messages.

- A wait older than ``HPCDDP_STALL_WARN`` seconds: it asks every rank what it is doing
  and prints, once, which ranks have not reached the collective and where they are.
- A wait older than ``HPCDDP_TIMEOUT`` seconds: the same report, then ``MPI_Abort``.
- A rank that leaves the job (its script ends, ``sys.exit``, ``hpcddp.shutdown()``)
  tells every other rank, with its collective counts. A rank waiting in a collective
  the one that left never reached cannot succeed, and ends the job at once; this is
  also how uneven inputs without ``join()`` end. Leaving waits, bounded by the timeout,
  until every rank has left, so ``MPI_Finalize`` never waits for a rank stuck elsewhere.

Every MPI call of the thread is handed to hpcddp's MPI thread (``hpcddp.comm.serial``),
which makes it between the polls of the main thread's waits, so asking other ranks
needs ``MPI_THREAD_SERIALIZED`` only. Below it (single, funneled) the thread calls no
MPI until the timeout: the report then shows this rank's wait and stack only, and the one
MPI call it makes is ``MPI_Abort``.
"""

import atexit
import sys
import threading
import time
from typing import Dict, List, Optional

from mpi4py import MPI

from hpcddp.comm import activity, serial
from hpcddp.comm.lifetime import Closable, free_comm
from hpcddp.comm.topology import clone_comm
from hpcddp.faults.abort import abort_job
from hpcddp.faults.findings import others_there, rank_state, uneven_ranks
from hpcddp.faults.launcher_end import end_stuck
from hpcddp.faults.report import describe_rank, different_said, ranks_said, wait_report_text
from hpcddp.faults.suspects import silent_nodes, slow_nodes

__all__ = ["Watchdog"]

_QUERY, _REPLY, _LEFT = 1, 2, 3
_ANSWER_SECONDS = 5.0  # how long a report waits for the other ranks' answers
_LEAVING_TICK = 0.005  # the thread's period once this rank is leaving
_DEFER_SECONDS = 10.0  # how long a rank cut off from rank 0's node leaves the verdict to it
# How long the thread waits for the MPI thread to take a call. It is busy only for single
# calls, except in a blocking call that has no nonblocking form (making a communicator):
# a lost rank can keep it there, and the watchdog must still time out.
_LOCK_SECONDS = 0.5


class Watchdog(Closable):
    """Watch this rank's waits; warn of stalls, end the job on a timeout.

    Args:
        comm: the hpcddp world's communicator; the watchdog duplicates it.
        timeout: seconds a wait may last before the job ends; 0: never.
        stall_warn: seconds after which a wait is reported once; 0: never.
        hosts: each rank's node (``World.hosts``).

    .. warning:: Construction and ``close()`` are collective.
    """

    _what = "hpcddp watchdog"

    def __init__(self, comm, timeout: float, stall_warn: float, hosts: List[str]):
        self.comm = clone_comm(comm, "hpcddp.watchdog")
        self.rank, self.size = self.comm.rank, self.comm.size
        self.hosts = list(hosts)  # to name a silent node
        self.timeout, self.stall_warn = timeout, stall_warn
        self.threaded = MPI.Query_thread() >= MPI.THREAD_SERIALIZED  # the MPI thread's
        limits = [s for s in (timeout, stall_warn) if s > 0]
        self.tick = min([0.2] + [s / 10 for s in limits])
        self.departed: Dict[int, dict] = {}
        self._leaving = False
        self._leave_wait = None
        self._replies: Dict[int, dict] = {}
        self._ended: list = []  # waits whose missing ranks the launcher ended (ULFM)
        self._asked_at = 0.0
        self._sends: List["MPI.Request"] = []  # the main thread sends too (depart)
        self._sending = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set: the thread looks now, not at its next tick
        self._thread = threading.Thread(target=self._run, name="hpcddp-watchdog", daemon=True)
        self._opened()
        atexit.register(self.depart)  # runs before lifetime's close_all (registered first)
        self._thread.start()

    # -- leaving -------------------------------------------------------------------------

    def depart(self) -> None:
        """Tell every other rank that this one is leaving, with its collective counts.

        Called first by ``hpcddp.shutdown()`` and at interpreter exit. Idempotent. The
        note is not final: closing what is still open (``lifetime.close_all``) may issue
        collectives after it (a timeline's gather). The final note goes when the
        watchdog itself is closed, after every owner newer than it.
        """
        if self._leaving or self._closed:
            return
        self._leaving = True
        self._tell_departure(final=False)
        self._wake.set()  # the others' departures are taken as they come, not per tick

    def _tell_departure(self, final: bool) -> None:
        if self.threaded:
            # As long as any wait may last (HPCDDP_TIMEOUT): a call that keeps the MPI
            # thread for ever ends the job by then, through the watchdog.
            self._send_to_others(_LEFT, dict(activity.snapshot(stack=False), final=final),
                                 patience=self.timeout or -1)

    def _gone(self) -> Dict[int, dict]:
        """The departures that prove a rank issues no more collectives: any note while
        this rank is still at work (the leaver's closing collectives cannot match the
        work's), only final notes once this rank is leaving too (its own closing
        collectives are the ones the leaver may still issue)."""
        if not self._leaving:
            return self.departed
        return {r: note for r, note in self.departed.items() if note.get("final")}

    def _wait_for_departures(self) -> None:
        """Wait until every rank has left, watched like any other wait."""
        with activity.waiting("leaving the job (waiting for every rank to finish)") as wait:
            self._leave_wait = wait
            if self.threaded:
                while len(self._gone()) < self.size - 1 and self._thread.is_alive():
                    time.sleep(0.005)
            else:
                request = self.comm.Ibarrier()
                while not request.Test():
                    time.sleep(0.005)

    def _release(self) -> None:
        self.depart()
        self._tell_departure(final=True)
        self._wait_for_departures()
        self._stop.set()
        self._wake.set()
        self._thread.join()
        if self.threaded:
            self._serve()
            serial.wait_all(self._sends)
        atexit.unregister(self.depart)
        activity.set_reference(None)
        free_comm(self.comm)

    def _abandon(self) -> None:
        self._leaving = True
        self._stop.set()
        self._wake.set()
        atexit.unregister(self.depart)
        activity.set_reference(None)

    # -- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(_LEAVING_TICK if self._leaving else self.tick)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self.threaded:
                self._serve()
            self._check()

    def _send(self, rank: int, tag: int, message, patience: float = _LOCK_SECONDS) -> None:
        """Send ``message`` if the MPI thread takes the call within ``patience`` seconds
        (-1: for as long as it takes). A departure waits longer than a question or an
        answer: lost, the others would wait for this rank until their timeout."""
        with self._sending:
            try:
                self._sends.append(serial.call(
                    MPI.Intracomm.isend, self.comm, message, dest=rank, tag=tag,
                    timeout=None if patience < 0 else patience))
            except serial.OwnerBusy:
                pass

    def _send_to_others(self, tag: int, message, patience: float = _LOCK_SECONDS) -> None:
        for rank in range(self.size):
            if rank != self.rank:
                self._send(rank, tag, message, patience)

    def _serve(self) -> None:
        """Take every message that has come: answer questions, note departures."""
        while True:
            try:
                taken = serial.call(_take, self.comm, timeout=_LOCK_SECONDS)
            except serial.OwnerBusy:
                return
            if taken is None:
                break
            message, source, tag = taken
            if tag == _QUERY:
                self._send(source, _REPLY, dict(activity.snapshot(), leaving=self._leaving))
            elif tag == _REPLY:
                self._replies[source] = dict(message,
                                             answered_s=time.monotonic() - self._asked_at)
            elif tag == _LEFT:
                self.departed[source] = message
        with self._sending:
            try:
                self._sends = serial.call(_unfinished, self._sends, timeout=_LOCK_SECONDS)
            except serial.OwnerBusy:
                pass

    def _check(self) -> None:
        now = time.monotonic()
        for wait in activity.current_waits():
            if self._gone_before(wait):
                self._fail(wait, None, {"reason": "departed"})
            elif self.timeout and now - wait.since >= self.timeout and \
                    not any(wait is ended for ended in self._ended):
                self._fail(wait, f"no progress for {now - wait.since:.0f} s "
                                 f"(HPCDDP_TIMEOUT={self.timeout:g})",
                           {"reason": "timeout", "setting": "HPCDDP_TIMEOUT",
                            "seconds": self.timeout}, defer=True)
            elif self.stall_warn and not wait.warned and now - wait.since >= self.stall_warn:
                wait.warned = True
                self._warn(wait)

    def _gone_before(self, wait) -> List[int]:
        """Ranks that left without issuing collective ``wait.seq`` of its channel."""
        if wait.channel is None:
            return []
        name = wait.channel.name
        return [rank for rank, note in sorted(self._gone().items())
                if rank in wait.channel.members
                and note["channels"].get(name, (0, 0))[0] < wait.seq]

    # -- reports -------------------------------------------------------------------------

    def _ask_everyone(self) -> Dict[int, dict]:
        """Every other rank's snapshot, as far as they answer within a few seconds."""
        if not self.threaded:
            return {}
        self._replies = {}
        self._asked_at = time.monotonic()
        self._send_to_others(_QUERY, None)
        self._serve_until(lambda: len(self._replies) >= self.size - 1, _ANSWER_SECONDS)
        return dict(self._replies)

    def _serve_until(self, done, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline:
            self._serve()
            time.sleep(0.01)

    def _missing(self, wait, replies) -> List[int]:
        """Ranks that have not reached ``wait`` (or, leaving, have not left)."""
        if wait is self._leave_wait:
            return [r for r in range(self.size) if r != self.rank and r not in self._gone()]
        if wait.channel is None:
            return [r for r in range(self.size) if r != self.rank]
        name = wait.channel.name
        return [r for r in wait.channel.members if r != self.rank
                and (r not in replies or replies[r]["channels"].get(name, (0, 0))[0] < wait.seq)]

    # A report is found as data (the JSON report's fields: hpcddp.faults.findings) and
    # said in words from that data by hpcddp.faults.report.

    def _state(self, rank: int, replies) -> dict:
        return rank_state(rank, replies, self.departed, self.hosts[rank], self.threaded,
                          _ANSWER_SECONDS)

    def _others_there(self, wait, replies) -> List[dict]:
        return others_there(wait.channel.name if wait.channel else None, wait.seq,
                            wait.call, replies)

    def _report(self, wait, reason: str, replies, facts: dict):
        """The report of ``wait`` that cannot complete: (its text, its fields)."""
        missing = self._missing(wait, replies)
        nodes = len(set(self.hosts)) > 1 and self.threaded  # other nodes it can name
        different = self._others_there(wait, replies)
        uneven = uneven_ranks(missing, replies, self.departed,
                              activity.snapshot(stack=False)["channels"])
        fix = ("give every rank the same number of batches, or wrap the training loop in "
               "`with model.join():`" if uneven else
               "set HPCDDP_DEBUG=detail to find where the ranks' collectives differ"
               if different else None)
        fields = dict(facts, kind="wait", not_arrived=missing,
                      ranks={str(r): self._state(r, replies) for r in missing},
                      silent_nodes=silent_nodes(self.hosts, self.rank, missing, replies,
                                                self.departed) if nodes else [],
                      slow_nodes=slow_nodes(self.hosts, self.rank, replies,
                                            self.departed) if nodes else [],
                      different_collectives=different, uneven=uneven, fix=fix,
                      stack=activity.main_stack(),
                      wait={"what": wait.describe(), "call": wait.call,
                            "channel": wait.channel.name if wait.channel else None,
                            "seq": wait.seq})
        return wait_report_text(fields, reason, len(set(self.hosts)) > 1), fields

    def _warn(self, wait) -> None:
        replies = self._ask_everyone()
        missing = self._missing(wait, replies)
        several = len(set(self.hosts)) > 1
        who = "; ".join([describe_rank(r, self._state(r, replies), several, stack=False)
                         for r in missing] + different_said(self._others_there(wait, replies)))
        limit = (f"the job ends after HPCDDP_TIMEOUT={self.timeout:g} s" if self.timeout
                 else "HPCDDP_TIMEOUT=0: it will wait forever")
        sys.stderr.write(f"hpcddp: rank {self.rank}: stalled for {self.stall_warn:g} s "
                         f"(HPCDDP_STALL_WARN) in {wait.describe()}; not arrived: "
                         f"{ranks_said(missing) if missing else 'none'}. {who + '. ' if who else ''}"
                         f"Still waiting; {limit}.\n")
        sys.stderr.flush()

    def _fail(self, wait, reason: Optional[str], facts: dict, defer: bool = False) -> None:
        replies = self._ask_everyone()
        if facts["reason"] == "departed":
            # Named after the answers, so every rank that has left by now is known, not
            # only the first. A rank that answers "leaving" has its note on the way.
            self._serve_until(lambda: all(r in self.departed for r, reply in replies.items()
                                          if reply["leaving"]), _ANSWER_SECONDS)
            gone = self._gone_before(wait)
            reason = f"{ranks_said(gone)} left the job before reaching it, so it can never complete"
            facts = dict(facts, departed=gone)
        missing = self._missing(wait, replies)
        if facts["reason"] == "timeout" and not self._others_there(wait, replies) and \
                end_stuck(self.comm, self.rank, missing, wait.describe(), reason):
            self._ended.append(wait)  # its failure, now on the way, ends it
            return
        if defer:
            seconds = _DEFER_SECONDS if self._cut_off_from_rank_zero(replies) \
                else self._lower_rank_timing_out(replies)
            if seconds:
                self._defer(seconds)
                if wait not in activity.current_waits():
                    return  # the link came back and the wait completed
        # A wait that completes only now, past the timeout, still ends the job: on a link
        # that crawls, every collective could complete just after it and the job go on
        # for ever.
        text, fields = self._report(wait, reason, replies, facts)
        abort_job(self.comm, "a wait cannot complete; aborting all ranks", detail=text,
                  facts=fields)

    def _cut_off_from_rank_zero(self, replies) -> bool:
        """Whether this rank is on another node than rank 0's and a rank there did not
        answer. Not all of them: over a link that crawls, one answer can get through
        while the rank that will report, waiting as long as this one, stays silent."""
        home = self.hosts[0]
        if not self.threaded or self.hosts[self.rank] == home:
            return False
        return any(r not in replies and r not in self.departed
                   for r, host in enumerate(self.hosts) if host == home)

    def _lower_rank_timing_out(self, replies) -> float:
        """Seconds to leave the verdict to a lower-numbered rank that waits too and will
        time out within ``_DEFER_SECONDS`` (0: none does).

        When several ranks wait in different collectives (uneven inputs: one in a DDP
        step, the others in a barrier), all of them time out at about the same moment,
        and whichever aborts first ends the job before the others can write their
        reports. One report is enough, and it should be the same one whatever the
        timing: the lowest-numbered waiting rank's. If that rank does not end the job
        in time (its watchdog cannot), this one reports afterwards.
        """
        longest = [max(w["seconds"] for w in reply["waits"])
                   for rank, reply in replies.items() if rank < self.rank and reply["waits"]]
        if not longest:
            return 0.0
        left = max(0.0, self.timeout - max(longest))
        return left + _ANSWER_SECONDS + 1.0 if left < _DEFER_SECONDS else 0.0

    def _defer(self, seconds: float) -> None:
        """Leave the verdict to another rank for ``seconds``, answering questions meanwhile.

        Cut off from rank 0's node (a rank there does not answer), a rank gives rank 0's
        side ``_DEFER_SECONDS`` to report and end the job. A link that fails between
        nodes leaves each side seeing the other silent, and both time out together. The
        report that matters is rank 0's side's: the launcher runs there (mpiexec, srun
        and mpirun start on the allocation's first node), so its output arrives. A job
        ended from the far side first can lose both reports: the far side's behind the
        failing link, and the near side's, whose ranks die (seen: of SIGSEGV inside MPI)
        as the far side's are killed. If the other rank is truly gone, this rank ends the
        job itself afterwards.
        """
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self._stop.is_set():
            self._serve()
            time.sleep(0.05)


def _take(comm):
    """The next message that has come (message, source, tag), or None; on the MPI thread."""
    status = MPI.Status()  # even a Status is made with MPI calls
    # A matched probe: the message received is the one probed.
    probed = MPI.Intracomm.improbe(comm, MPI.ANY_SOURCE, MPI.ANY_TAG, status)
    if probed is None:
        return None
    return probed.recv(), status.Get_source(), status.Get_tag()


def _unfinished(requests) -> List["MPI.Request"]:
    return [request for request in requests if not MPI.Request.Test(request)]
