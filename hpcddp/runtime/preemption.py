"""Preemption: a warning signal, agreement at a step boundary, a checkpoint, a requeue.

Slurm warns a job before ending it (``#SBATCH --signal=B:USR1@120``, forwarded by the
batch script to the ranks, or ``--signal=USR1@120`` straight to them). The handler only
sets a flag; at the next step boundary every rank learns, through a one-integer
allreduce, whether any rank was warned, so all of them stop at the same step, save the
same checkpoint, and rank 0 requeues the job exactly once.

Ctrl-C takes the same road: ``mpiexec`` (and ``srun``, on a second Ctrl-C) passes SIGINT
to every rank, the ranks agree at the next step boundary, save, and exit with status 130
and one line saying that the checkpoint holds that step and how to resume; nothing is
requeued. A second Ctrl-C on a rank ends it at once (KeyboardInterrupt, one line per
rank from the abort hook).
"""

import os
import signal
import subprocess
import sys
from typing import Optional

from mpi4py import MPI

from hpcddp.comm import activity
from hpcddp.env import get_setting, signal_number
from hpcddp.runtime import finalize, get_world

__all__ = ["Preemption"]


def _slurm_job_id() -> Optional[str]:
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


class Preemption:
    """Catch the preemption warning and turn it into a clean stop on every rank.

    Args:
        signum: the signal; by default ``HPCDDP_PREEMPT_SIGNAL`` (USR1).
        comm: the communicator to agree on; the hpcddp world's by default.
        interrupt: also stop this way on the first Ctrl-C (SIGINT), without a requeue.

    Example::

        preemption = hpcddp.Preemption()
        for x, y in loader:
            train_step(x, y)
            if preemption.requested():          # collective, every step
                hpcddp.checkpoint.save("ckpt", model, optimizer, loader=loader, step=step)
                preemption.requeue_and_exit()

    .. warning:: ``requested()`` is collective: call it at the same step on every rank.
    """

    def __init__(self, signum: Optional[int] = None, comm=None, interrupt: bool = True):
        if comm is None:
            comm = get_world().comm
        self.comm = comm
        self.signum = signum if signum is not None else signal_number(
            get_setting("PREEMPT_SIGNAL"))
        self.received = False     # the preemption signal, on this rank
        self.interrupted = False  # Ctrl-C, on this rank
        self.was_interrupt = False  # agreed: some rank was interrupted (no requeue)
        self._previous = signal.signal(self.signum, self._handle)
        self._previous_int = None
        if interrupt and self.signum != signal.SIGINT:
            self._previous_int = signal.signal(signal.SIGINT, self._interrupt)

    def _handle(self, signum, frame):
        self.received = True  # only a flag: the work happens at a step boundary

    def _interrupt(self, signum, frame):
        self.interrupted = True
        # A second Ctrl-C is not patient: it raises KeyboardInterrupt where the rank is.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def requested(self) -> bool:
        """True on every rank once any rank has received the signal.

        .. warning:: Collective (one small allreduce).
        """
        with activity.named("Preemption.requested()"):
            agreed = self.comm.allreduce(int(self.received) | 2 * int(self.interrupted),
                                         op=MPI.BOR)
        self.was_interrupt = bool(agreed & 2)
        return bool(agreed)

    def requeue_and_exit(self, code: int = 0) -> None:
        """Finalize MPI on every rank, then requeue (rank 0, under Slurm) and exit.

        After a Ctrl-C nothing is requeued and the exit status is 130 (as for SIGINT).

        Slurm ends the running step as soon as the job is requeued. MPI is finalized
        first so no rank is killed inside MPI: a rank killed there leaves its shared
        memory segments behind, and the requeued job, which has the same job and step
        ids, would attach to them and fail in ``MPI_Init``.

        .. warning:: Collective; does not return.
        """
        with activity.named("Preemption.requeue_and_exit()"):
            self.comm.Barrier()
        rank = self.comm.rank
        sys.stdout.flush()
        # Everything hpcddp opened on MPI (MPI-IO files above all) is closed first.
        finalize()
        if self.was_interrupt:
            if rank == 0:
                print("hpcddp: interrupted (Ctrl-C); the checkpoint saved holds this step: "
                      "run the same command to resume", flush=True)
            sys.exit(130)
        job = _slurm_job_id() if rank == 0 else None
        if rank == 0:
            # Said before the requeue: Slurm ends the step as soon as the job is requeued,
            # and a line printed after it may never reach the log.
            print("hpcddp: preempted; " + (f"requeueing Slurm job {job}" if job else
                                            "not under Slurm, exiting"), flush=True)
        if job:
            done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
            if done.returncode != 0:
                print(f"hpcddp: preempted, but scontrol requeue {job} failed: "
                      f"{done.stderr.strip()}", flush=True)
                sys.exit(1)
        sys.exit(code)

    def close(self) -> None:
        """Restore the previous handlers."""
        signal.signal(self.signum, self._previous)
        if self._previous_int is not None:
            signal.signal(signal.SIGINT, self._previous_int)
