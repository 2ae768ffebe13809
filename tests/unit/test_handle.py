"""Handle: completion callbacks in order, buffers held, the sender of a receive.

Runs on an MPI world of one: a rank can send to itself.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpcddp.comm import Handle


def test_callbacks_run_once_in_order_after_completion():
    comm = MPI.COMM_SELF
    data = np.arange(4.0)
    ran = []
    handle = Handle([comm.Iallreduce(MPI.IN_PLACE, data)], keep=[data],
                    on_complete=lambda: ran.append("first"))
    handle.then(lambda: ran.append("second"))
    handle.wait()
    handle.wait()
    assert ran == ["first", "second"] and handle.done
    handle.then(lambda: ran.append("late"))  # already complete: runs at once
    assert ran == ["first", "second", "late"]


def test_receive_reports_its_source():
    comm = MPI.COMM_SELF
    incoming = np.empty(3)
    handle = Handle([comm.Irecv(incoming, source=MPI.ANY_SOURCE, tag=7)], statuses=True)
    comm.Send(np.ones(3), dest=0, tag=7)
    assert handle.source() == 0 and np.all(incoming == 1)


def test_source_needs_statuses():
    handle = Handle([MPI.COMM_SELF.Ibarrier()])
    with pytest.raises(ValueError, match="statuses=True"):
        handle.source()
    handle.wait()
