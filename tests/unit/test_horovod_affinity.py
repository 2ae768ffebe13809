"""Where Horovod's engine thread runs: its nice value from ``HPCDDP_HOROVOD_NICE`` and the
rank's cores, its core from ``HOROVOD_THREAD_AFFINITY``; applied to a real thread and
read back from the kernel."""

import os
import threading
from types import SimpleNamespace

import pytest

from hpcddp.env import ConfigError
from hpcddp.horovod.affinity import nice_for, pinned_core, place


def test_auto_lowers_the_priority_only_where_torch_takes_every_core():
    assert nice_for("auto", torch_threads=1, cores=1) == 19
    assert nice_for("", torch_threads=8, cores=8) == 19
    assert nice_for("auto", torch_threads=7, cores=8) == 0
    assert nice_for("0", torch_threads=1, cores=1) == 0
    with pytest.raises(ConfigError, match="HPCDDP_HOROVOD_NICE='20'"):
        nice_for("20", 1, 1)
    with pytest.raises(ConfigError, match="HPCDDP_HOROVOD_NICE='low'"):
        nice_for("low", 1, 1)


def test_thread_affinity_takes_this_local_ranks_core():
    assert pinned_core("3, 5", 1) == 5
    with pytest.raises(ValueError, match="local rank 2 needs one"):
        pinned_core("3,5", 2)
    with pytest.raises(ValueError, match="HOROVOD_THREAD_AFFINITY='a,b'"):
        pinned_core("a,b", 0)


def _on_a_thread(environ, world):
    """Place a real thread, and read its nice value and cores back from the kernel."""
    seen, go = {}, threading.Event()

    def body():
        go.wait(10)
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        seen["cores"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=body)
    thread.start()
    place(thread, world, environ)
    go.set()
    thread.join(10)
    return seen


def test_place_renices_and_pins_the_thread_and_not_the_caller():
    world = SimpleNamespace(num_threads=1, cores=1, local_rank=0)
    caller = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    core = min(os.sched_getaffinity(0))
    seen = _on_a_thread({"HOROVOD_THREAD_AFFINITY": str(core)}, world)
    assert seen == {"nice": 19, "cores": {core}}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == caller
    seen = _on_a_thread({"HPCDDP_HOROVOD_NICE": "0"}, world)
    assert seen["nice"] == caller and seen["cores"] == os.sched_getaffinity(0)
