"""Open MPI's failure detector needs this process to make MPI progress: with the detector
on its own thread (``OMPI_MCA_mpi_ft_detector_thread``), Open MPI 5.0's ``MPI_Finalize``
waited for ever on its ring of heartbeats (every clean 3-rank job hung at its end here),
so hpcddp runs the detector in the progress engine (``detect_silent_ranks``) and gives
it progress: a thread of its own asks MPI for a message on ``MPI_COMM_SELF`` every tenth
of a heartbeat period, from ``MPI_Init`` to the start of ``MPI_Finalize``. Without it
a rank would send no heartbeat while nothing of it entered MPI (importing a program's
modules after hpcddp, computing before ``hpcddp.init()``), and its watcher would declare
it failed. A process that is stopped sends none, and is found.

Needs ``MPI_THREAD_MULTIPLE`` (the thread enters MPI beside hpcddp's MPI thread); at a
lower level the detector is left off before ``MPI_Init``
(``mpi_init.detect_silent_ranks``)."""

import atexit
import threading

__all__ = ["pump"]


def pump(period: float) -> None:
    """Start the thread (once MPI is started), to stop at exit before ``MPI_Finalize``."""
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        return
    stop = threading.Event()

    def run():
        while not stop.wait(period):
            MPI.COMM_SELF.Iprobe()  # progress: heartbeats sent, missed ones noticed

    thread = threading.Thread(target=run, name="hpcddp-heartbeats", daemon=True)
    thread.start()

    def end():
        stop.set()
        thread.join()
    atexit.register(end)  # before mpi4py's MPI_Finalize, which runs after atexit's
