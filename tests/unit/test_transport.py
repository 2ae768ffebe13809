"""The ordering logic of bucket transfers, with a stand-in CUDA API.

No GPU here, so streams and events are stand-ins that record what is asked of them and
complete only when a test says so; the MPI calls are real (``COMM_SELF``) and so are
the tensors (on the CPU). The same transfers run on a real GPU in
``tests/mpi/test_ddp_vs_single.py`` and ``test_ddp_vs_torch.py`` (their CUDA variants).
"""

import time
from contextlib import contextmanager

import pytest
import torch
from mpi4py import MPI

from hpcddp.transport.pinned import HostBuffer
from hpcddp.transport import Transport


class FakeEvent:
    def __init__(self, cuda):
        self.cuda, self.done, self.name = cuda, False, f"event{len(cuda.events)}"
        cuda.events.append(self)

    def record(self, stream):
        self.cuda.log.append(("record", self.name, stream.name))

    def query(self):
        return self.done

    def synchronize(self):
        self.cuda.log.append(("synchronize", self.name))
        self.done = True


class FakeStream:
    def __init__(self, cuda, name):
        self.cuda, self.name = cuda, name

    def wait_event(self, event):
        self.cuda.log.append(("wait", self.name, event.name))


class FakeCuda:
    """Records the calls a Transport makes of ``torch.cuda``."""

    def __init__(self):
        self.log, self.events = [], []
        self.compute = FakeStream(self, "compute")

    def Event(self):  # noqa: N802 - the name torch.cuda uses
        return FakeEvent(self)

    def Stream(self, device):  # noqa: N802
        return FakeStream(self, "side")

    def current_stream(self, device):
        return self.compute

    @contextmanager
    def stream(self, stream):
        self.log.append(("enter", stream.name))
        yield
        self.log.append(("exit", stream.name))

    def synchronize(self):  # a device-wide sync: the transport must never call it
        self.log.append(("device-synchronize",))


@pytest.fixture
def cuda():
    return FakeCuda()


def transport(cuda):
    return Transport(MPI.COMM_SELF, cuda_aware=False, cuda=cuda, pinned=False)


def test_staged_bucket_is_copied_on_a_side_stream_after_its_producer(cuda):
    t = transport(cuda)
    bucket = torch.arange(6, dtype=torch.float32)
    transfer = t.allreduce(bucket, slot=0, route=t.staged)
    assert cuda.log == [("record", "event0", "compute"),  # gradients produced
                        ("wait", "side", "event0"),       # the copy waits for them
                        ("enter", "side"), ("record", "event1", "side"), ("exit", "side")]
    assert t.collectives == 0 and not transfer.issued, "issued before the copy completed"
    assert torch.equal(transfer.pieces[0].bindings[0].host, torch.arange(6, dtype=torch.float32))
    cuda.events[1].done = True
    t.advance()
    assert t.collectives == 1 and transfer.issued


def test_staged_result_is_copied_back_and_the_consumer_waits_for_it(cuda):
    t = transport(cuda)
    bucket = torch.arange(6, dtype=torch.float32)
    transfer = t.allreduce(bucket, slot=0, route=t.staged)
    bucket.zero_()  # whatever the bucket holds now, the result must come from MPI's buffer
    cuda.log.clear()
    transfer.wait()
    assert cuda.log == [("synchronize", "event1"),  # the copy's event, not the device
                        ("enter", "side"), ("exit", "side"),  # the copy back
                        ("record", "event2", "side"), ("wait", "compute", "event2")]
    assert torch.equal(bucket, torch.arange(6, dtype=torch.float32))


def test_large_staged_bucket_travels_in_pieces_each_issued_when_its_copy_is_done(cuda):
    t = Transport(MPI.COMM_SELF, cuda_aware=False, cuda=cuda, pinned=False, chunk_bytes=8)
    bucket = torch.arange(5, dtype=torch.float32)
    transfer = t.allreduce(bucket, slot=0, route=t.staged)
    parts = [p.bindings[0] for p in transfer.pieces]
    assert [b.tensor.tolist() for b in parts] == [[0, 1], [2, 3], [4]]
    assert [b.host.data_ptr() for b in parts] == [
        parts[0].host.data_ptr() + 8 * i for i in range(3)], "pieces share the staging buffer"
    assert len({b.ready.name for b in parts}) == 3, "one copy event per piece"
    parts[0].ready.done = True
    t.advance()
    assert t.collectives == 1, "the first piece goes while the others are still copying"
    bucket.zero_()
    cuda.log.clear()
    transfer.wait()
    assert torch.equal(bucket, torch.arange(5, dtype=torch.float32))
    assert t.collectives == 3
    # One copy back per piece, then the consumer waits once, for the last of them.
    assert cuda.log[-2:] == [("record", cuda.events[-1].name, "side"),
                             ("wait", "compute", cuda.events[-1].name)]
    assert cuda.log.count(("enter", "side")) == 3
    whole = Transport(MPI.COMM_SELF, cuda_aware=False, cuda=cuda, pinned=False, chunk_bytes=0)
    assert len(whole.allreduce(torch.ones(5), slot=0, route=whole.staged).pieces) == 1


def test_transfers_are_issued_in_start_order_whatever_completes_first(cuda):
    t = transport(cuda)
    first = t.allreduce(torch.ones(4), slot=0, route=t.staged)
    second = t.allreduce(torch.ones(8), slot=1, route=t.staged)
    second.ready.done = True
    t.advance()
    assert not first.issued and not second.issued and t.pending() == 2
    first.ready.done = True
    t.advance()
    assert first.issued and second.issued and t.pending() == 0


def test_waiting_for_a_later_transfer_issues_the_earlier_ones_first(cuda):
    t = transport(cuda)
    first = t.allreduce(torch.ones(4), slot=0, route=t.device)
    second = t.allreduce(torch.ones(8), slot=1, route=t.device)
    cuda.log.clear()
    second.wait()
    assert cuda.log == [("synchronize", first.ready.name), ("synchronize", second.ready.name)]
    assert first.issued and t.collectives == 2
    first.wait()
    assert torch.equal(first.result, torch.ones(4))


def test_device_bucket_waits_on_its_own_event_never_the_device(cuda):
    t = transport(cuda)
    transfer = t.allreduce(torch.ones(4), slot=0, route=t.device)
    assert cuda.log == [("record", "event0", "compute")]
    assert not transfer.issued
    transfer.ready.done = True
    t.advance()
    transfer.wait()
    assert all(b.host is None for p in transfer.pieces for b in p.bindings), \
        "a device bucket must not be staged"
    assert ("device-synchronize",) not in cuda.log
    assert cuda.log == [("record", "event0", "compute")], "nothing to copy back"


class SlowEvent(FakeEvent):
    """Completes after ``queries`` polls, noting how many transfers were issued by then."""

    def __init__(self, cuda, queries, transport):
        super().__init__(cuda)
        self.left, self.transport = queries, transport

    def query(self):
        self.left -= 1
        if self.left == 0:
            self.cuda.log.append(("done", self.name, self.transport.collectives))
        return self.left <= 0


def test_issue_all_issues_each_transfer_as_its_event_completes(cuda):
    t = transport(cuda)
    transfers = [t.allreduce(torch.ones(4), slot=i, route=t.device) for i in range(3)]
    for transfer, queries in zip(transfers, (2, 4, 9)):
        transfer.ready = SlowEvent(cuda, queries, t)
    cuda.log.clear()
    t.issue_all()
    assert t.pending() == 0 and t.collectives == 3
    # No blocking on events; the first was issued before the last one's data was ready.
    assert [e[0] for e in cuda.log] == ["done"] * 3
    assert [e[2] for e in cuda.log] == [0, 1, 2]
    for transfer in transfers:
        transfer.wait()
        assert torch.equal(transfer.result, torch.ones(4))


def test_host_bucket_is_issued_at_once_without_events(cuda):
    t = transport(cuda)
    transfer = t.allreduce(torch.ones(4), slot=0)
    assert transfer.route is t.host and transfer.issued and cuda.log == []
    transfer.wait()


def test_staging_buffer_per_bucket_survives_and_grows_only(cuda):
    t = transport(cuda)
    t.allreduce(torch.ones(100), slot=0, route=t.staged).wait()
    t.allreduce(torch.ones(10), slot=1, route=t.staged).wait()
    staging = t.staged.host_buffer(0)
    pointer = staging.get(1, torch.float32).data_ptr()
    t.allreduce(torch.ones(50), slot=0, route=t.staged).wait()  # smaller: reused
    assert staging.allocations == 1 and staging.get(1, torch.float32).data_ptr() == pointer
    t.allreduce(torch.ones(200), slot=0, route=t.staged).wait()  # larger: grows once
    assert staging.allocations == 2 and staging.capacity == 800
    assert t.staged.host_buffer(1).allocations == 1


def test_host_buffer_views_any_dtype_and_only_grows():
    buffer = HostBuffer(pinned=False)
    assert buffer.capacity == 0 and buffer.allocations == 0
    a = buffer.get(10, torch.float32)
    assert a.shape == (10,) and a.dtype == torch.float32 and buffer.capacity == 40
    b = buffer.get(20, torch.bfloat16)
    assert b.data_ptr() == a.data_ptr() and buffer.allocations == 1
    buffer.get(11, torch.float32)
    assert buffer.capacity == 44 and buffer.allocations == 2


def test_cpu_tensors_go_to_mpi_from_their_own_memory():
    t = Transport(MPI.COMM_SELF, cuda_aware=True)
    assert t.route_for(torch.ones(2)) is t.host
    t = Transport(MPI.COMM_SELF, cuda_aware=False)
    assert t.route_for(torch.ones(2, dtype=torch.bfloat16)) is t.host


class _DeviceTensor:
    """What ``route_for`` reads of a CUDA tensor (there is no GPU here)."""
    is_cuda, dtype = True, torch.float32


def test_mpi_reductions_of_device_buffers_are_staged_where_its_iallreduce_failed():
    """Open MPI's Ireduce_scatter and Ireduce reduce device buffers with host code, as its
    Iallreduce does (a SIGSEGV under FSDP2 on a GPU): with ``device_reductions`` off they
    are staged, while data that MPI only moves stays on the device."""
    dev = _DeviceTensor()
    t = Transport(MPI.COMM_SELF, cuda_aware=True, pinned=False, device_reductions=False)
    assert t.route_for(dev) is t.device
    assert t.route_for(dev, reduces=True) is t.staged
    t = Transport(MPI.COMM_SELF, cuda_aware=True, pinned=False, device_reductions=True)
    assert t.route_for(dev, reduces=True) is t.device
    t = Transport(MPI.COMM_SELF, cuda_aware=False, pinned=False)
    assert t.route_for(dev, reduces=True) is t.staged and t.route_for(dev) is t.staged


def test_process_group_marks_mpis_own_reductions(monkeypatch):
    """The process group says which of its operations MPI reduces: reduce and
    reduce_scatter (even and uneven) do, all_gather and broadcast only move data."""
    import torch.distributed as dist

    from hpcddp.backend.process_group import MPIProcessGroup

    pg = MPIProcessGroup(MPI.COMM_SELF.Dup(), cuda_aware=True, owns_comm=True,
                         device_reductions=False)
    asked = []
    real = pg.transport.route_for
    monkeypatch.setattr(pg.transport, "route_for",
                        lambda tensor, reduces=False: asked.append(reduces) or real(tensor))
    try:
        def count(run):
            asked.clear()
            run()
            return set(asked)
        out, x = torch.zeros(3), torch.ones(3)
        assert count(lambda: pg._reduce_scatter_base(out, x).wait()) == {True}
        assert count(lambda: pg.reduce_scatter([out], [[x]]).wait()) == {True}
        assert count(lambda: pg.reduce([x], dist.ReduceOptions()).wait()) == {True}
        assert count(lambda: pg._allgather_base(out, x).wait()) == {False}
        assert count(lambda: pg.broadcast([x], dist.BroadcastOptions()).wait()) == {False}
    finally:
        pg.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_pinning_without_cuda_says_why():
    with pytest.raises(RuntimeError, match="pinned host memory needs CUDA"):
        HostBuffer(pinned=True).get(4, torch.float32)


def test_one_off_staged_operations_borrow_a_spare_buffer_and_give_it_back(cuda):
    t = transport(cuda)
    first = t.allreduce(torch.arange(4, dtype=torch.float32), route=t.staged)
    assert t.staged.spares == 0, "lent while in flight"
    assert torch.equal(first.wait(), torch.arange(4, dtype=torch.float32))
    assert t.staged.spares == 1, "given back once complete"
    host = first.pieces[0].bindings[0].host
    second = t.allreduce(torch.ones(3), route=t.staged)
    assert second.pieces[0].bindings[0].host.data_ptr() == host.data_ptr(), "not pinned again"
    second.wait()


def test_staged_output_waits_for_earlier_copies_on_the_side_stream(cuda):
    # MPI only writes an output, but the host memory may still be read by the copy back
    # of an earlier operation queued on the side stream: it gets a side-stream event too.
    t = transport(cuda)
    [binding] = t.staged.bind(torch.zeros(3), read=False, write=True, slot=0)
    assert binding.ready is not None
    assert ("record", binding.ready.name, "side") in cuda.log


def test_a_transfer_that_times_out_names_itself_and_stays_pending(cuda):
    from hpcddp.comm import HandleTimeout
    t = transport(cuda)
    transfer = t.allreduce(torch.ones(2), route=t.device, name="DDP bucket 7")
    with pytest.raises(HandleTimeout, match="DDP bucket 7 did not complete within 0.05 s"):
        transfer.wait(timeout=0.05)  # its producer's event never completes
    assert not transfer.done and t.pending() == 1
    transfer.ready.done = True
    assert torch.equal(transfer.wait(timeout=5), torch.ones(2))


class TimedEvent(FakeEvent):
    """Completes once ``seconds`` have passed, counting the queries until then."""

    def __init__(self, cuda, seconds):
        super().__init__(cuda)
        self.at, self.queries = time.monotonic() + seconds, 0

    def query(self):
        self.queries += 1
        return time.monotonic() >= self.at


def test_a_blocking_collective_is_issued_after_every_operation_started_before_it(cuda):
    # A sparse all_reduce (blocking) after a device all_reduce whose data is not ready
    # yet: issued first on a rank whose event is late and second on another, the two
    # would meet the wrong collectives.
    t = transport(cuda)
    transfer = t.allreduce(torch.ones(4), slot=0, route=t.device)
    transfer.ready = SlowEvent(cuda, 3, t)
    assert t.pending() == 1
    issued_before = t.blocking(lambda: t.collectives)
    assert issued_before == 1 and t.pending() == 0
    transfer.wait()
    assert torch.equal(transfer.result, torch.ones(4))


def test_waiting_for_a_late_event_pauses_between_polls(cuda):
    # 50 ms of waiting: back-to-back polling would query the event ~10^5 times and hold
    # the core and the GIL; with pauses growing to 1 ms it is under a few hundred.
    t = transport(cuda)
    transfer = t.allreduce(torch.ones(4), slot=0, route=t.device)
    event = transfer.ready = TimedEvent(cuda, 0.05)
    t.issue_all()
    assert t.pending() == 0 and 1 <= event.queries < 500, event.queries
    transfer.wait()


def test_staged_tensors_of_any_shape_travel_and_come_back_whole(cuda):
    # SyncBatchNorm gathers a rank's statistics into a (ranks, values) tensor: the staging
    # buffer is flat, so each piece must be a flat range of the tensor, not of its rows.
    t = transport(cuda)
    stats = torch.arange(7, dtype=torch.float64)
    gathered = torch.zeros((1, 7), dtype=torch.float64)
    transfer = t.submit("statistics", [(stats, True, False), (gathered, False, True)],
                        lambda src, dst: t.comm.Iallgather(src.buf, dst.buf), result=gathered)
    for event in cuda.events:
        event.done = True
    assert torch.equal(transfer.wait(), stats.view(1, 7))
    grid = torch.arange(24, dtype=torch.float32).view(2, 3, 4)
    t.chunk_bytes = 40  # pieces of 10 values: across rows
    pieces = t.allreduce(grid, slot=0, route=t.staged)
    for event in cuda.events:
        event.done = True
    assert len(pieces.pieces) == 3
    assert torch.equal(pieces.wait(), torch.arange(24, dtype=torch.float32).view(2, 3, 4))


def test_the_wait_for_every_issued_operation_is_one_the_watchdog_sees(cuda):
    # DDP's end of backward waits for all its buckets at once. A bucket that never
    # completes (a node lost mid-reduction) must show as a wait in its collective, or
    # the watchdog never times it out and the job hangs without a word.
    import threading

    from hpcddp.comm import activity, serial
    from hpcddp.transport.transfer import writes
    t = transport(cuda)
    received = torch.zeros(3)
    transfer = t.submit("DDP bucket 3", [writes(received)],
                        lambda b: MPI.COMM_SELF.Irecv(b.buf, source=0, tag=91))
    seen = []

    def watch():  # sees the wait, or gives up after 5 s; then lets it complete
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            seen.extend(w.as_dict() for w in activity.current_waits())
            time.sleep(0.005)
        serial.call(MPI.COMM_SELF.Send, torch.full((3,), 2.0).numpy(), dest=0, tag=91)
    watcher = threading.Thread(target=watch)
    watcher.start()
    t.complete_issued()
    watcher.join()
    assert [(w["what"], w["seq"]) for w in seen] == \
        [(f"DDP bucket 3 (collective {transfer.seq} on {t.channel.name})", transfer.seq)]
    transfer.wait(timeout=1)  # its piece is done: it only brings the result back
    assert torch.equal(received, torch.full((3,), 2.0))


def test_a_deferred_advance_goes_on_at_once_and_its_error_comes_back_later(cuda):
    # During DDP's backward a gradient hook posts its launch to the MPI thread and goes
    # on computing. What that launch meets (an MPI error) must not be lost: the next
    # call of the training thread raises it.
    import threading

    from hpcddp.comm import serial
    from hpcddp.comm.owner import OWNER
    from hpcddp.transport.transfer import writes
    if OWNER.thread is None:
        pytest.skip("MPI runs below MPI_THREAD_SERIALIZED here: hpcddp has no MPI thread")
    t = transport(cuda)
    t.begin_backward()
    caller_went_on = threading.Event()

    def issue(binding):  # on the MPI thread, held until the caller has gone on
        caller_went_on.wait(10)
        raise RuntimeError("MPI refused the bucket")
    t.submit("DDP bucket 0", [writes(torch.zeros(4))], issue)
    caller_went_on.set()
    for _ in range(2):  # the turn that made the posted advance has ended
        serial.call(lambda: None)
    t.end_backward()
    with pytest.raises(RuntimeError, match="MPI refused the bucket"):
        t.advance()
    t.advance()  # raised once, then gone
