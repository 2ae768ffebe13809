"""What a fault soak run sees on this machine beside its job's output
(``bench_faults.py``): the MPIs' shared-memory files, the ranks' PIDs, the kernel's
record of a rank dead of a fault signal, and other MPI jobs running meanwhile. Standard
library only; the emulated nodes share this machine's PID space and ``/dev/shm``."""

import os
import re
import subprocess
import threading
from pathlib import Path

__all__ = ["segments", "rank_pids", "kernel_faults", "OthersWatch", "cmdline"]

# The shared-memory files of each MPI: MPICH's node segment, Open MPI's sm BTL segment,
# Intel MPI's.
_SEGMENTS = ("mpich_shm_*", "sm_segment.*", "Intel_MPI_*")


def segments():
    shm = Path("/dev/shm")
    return {p.name: p.stat().st_size for pattern in _SEGMENTS for p in shm.glob(pattern)
            if p.is_file()}


def rank_pids(script: str):
    """The PIDs of the processes that run ``script`` (a file name) on this machine, and
    the IDs of their threads: the kernel names the thread that faulted, not its process
    (a rank's MPI thread, for one)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and script in cmdline(entry.name):
            found.add(int(entry.name))
            try:
                found.update(int(task.name) for task in (entry / "task").iterdir())
            except OSError:
                pass  # it ended meanwhile
    return found


# The kernel's line for a process dead of a fault signal: ``python[1234]: segfault at 110
# ip ... in libmpi.so.12[...]``. A rank cut off from its launcher dies unseen by it.
_KERNEL_FAULT = re.compile(r"\b\S+\[(\d+)\]: (segfault at|general protection|trap )")


def kernel_faults(pids):
    """The kernel log's lines of a fault signal in any of ``pids``, as a set."""
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout.splitlines()
    return {line for line in log
            if (found := _KERNEL_FAULT.search(line)) and int(found.group(1)) in pids}


class OthersWatch:
    """Notes MPI jobs other than this run's (another launcher on the machine) while it
    runs: their MPICH segments pass through the shared ``/dev/shm`` too, so a run that
    saw one cannot say which segments its own end left (counted apart)."""

    LAUNCHERS = re.compile(
        r"(^|/)(mpiexec|mpirun|mpiexec\.hydra|hydra_pmi_proxy|prterun|prted)\x00")

    def __init__(self, ours: int):
        self.ours, self.seen, self._stop = ours, False, threading.Event()
        self._mine = set()  # this run's launchers, still known as its own once orphaned
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stop.wait(0.5):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or not self.LAUNCHERS.search(cmdline(entry.name)):
                    continue
                pid = int(entry.name)
                try:
                    if pid in self._mine:
                        continue
                    if os.getsid(pid) == self.ours or descends_from(pid, self.ours):
                        self._mine.add(pid)  # a proxy cut off from mpiexec outlives it
                    else:
                        self.seen = True
                except OSError:
                    pass

    def stop(self) -> bool:
        self._stop.set()
        self._thread.join()
        return self.seen


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether ``ancestor`` started ``pid``, directly or not: the run's own launcher proxies
    lead sessions of their own on the emulated nodes, under the run's ``mpiexec``."""
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # the parent, after the name
    return False


def cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
