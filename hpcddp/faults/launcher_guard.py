"""End a launcher that cannot finish an aborted job because a node is out of reach.

``MPI_Abort`` asks the launcher to kill every rank. Hydra's ``mpiexec`` then waits for
each node's proxy to hang up; a proxy behind a link that is down never can, and the
launcher waits until TCP gives up on it (about 15 minutes with Linux's default
``tcp_retries2``), long after every rank has ended (seen on the emulated cluster:
ranks gone, ``mpiexec`` still there). When the launcher runs on this node,
an ancestor of this rank (a batch script's ``mpiexec`` on the job's first node), a
detached helper started just before ``MPI_Abort`` ends it if it is still there after a
grace period, and says so. It asks first (SIGTERM), then kills.

It ends the launcher's own children with it: the ``ssh`` clients (or ``srun``) that
started its daemons on the other nodes. They share the launcher's output, and the one
to a node out of reach waits on its connection for as long as the launcher would have:
``mpirun ... | tee log`` or a harness reading the job's output would see no end until
they are gone. Open MPI's ``prterun`` is such a launcher; its ``prted`` on the lost node
outlives the ranks there. Standard library only.
"""

import os
import subprocess
import sys
from typing import Optional, Tuple

__all__ = ["LAUNCHERS", "launcher_ancestor", "end_launcher_later"]

LAUNCHERS = ("mpiexec", "mpiexec.hydra", "mpirun", "orterun", "prterun")
# How long a launcher has to end after SIGTERM before SIGKILL. SIGTERM lets it remove
# its session files: a killed ``prterun`` leaves ``$TMPDIR/ompi.PID``, and a later
# ``prterun`` given the same PID fails to start ("The PMIx server's listener thread
# failed to start", exit 213). PIDs come round again: Linux's default pid_max is 32768.
# One waiting on a daemon out of reach ignores SIGTERM; after SIGKILL the helper removes
# that directory itself (a directory named after the PID holding PMIx's files named
# after it too).
TERM_WAIT_SECONDS = 5.0

_HELPER = r"""
import glob, os, shutil, sys, time
pid, start, name = int(sys.argv[1]), sys.argv[2], sys.argv[3]
grace, term_wait = float(sys.argv[4]), float(sys.argv[5])

def stat(p):
    try:
        with open(f"/proc/{p}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]), fields[19]  # parent, start time
    except (OSError, IndexError, ValueError):
        return None

def alive(p, since):
    found = stat(p)
    return found is not None and found[1] == since

def children():
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = stat(entry)
            if info is not None and info[0] == pid:
                found.append((int(entry), info[1]))
    return found

def session_dirs():
    # $TMPDIR/NAME.PID holding PMIx's rendezvous files named after the PID (prterun's)
    tmp = "/tmp"
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"TMPDIR=") and len(item) > 7:
                    tmp = item[7:].decode(errors="replace")
        return [d for d in glob.glob(os.path.join(glob.escape(tmp), f"*.{pid}"))
                if glob.glob(os.path.join(glob.escape(d), f"pmix.*.{pid}"))]
    except OSError:
        return []

deadline = time.monotonic() + grace
while time.monotonic() < deadline:
    if not alive(pid, start):
        sys.exit(0)
    time.sleep(0.1)
def say(text):
    # Where the launcher's own messages go (the rank's stderr went with its proxy): a
    # batch log, a terminal, a pipe. Written through the launcher's own open file (Linux's
    # pidfd_getfd), the line lands at the launcher's offset and its later lines follow it.
    # Where that is not allowed, appended: a file reopened by its /proc path has an
    # offset of its own, and mode "w" would truncate the job's whole log.
    data = text.encode(errors="replace")
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        pidfd = os.pidfd_open(pid)
        try:
            fd = libc.syscall(438, pidfd, 2, 0)  # SYS_pidfd_getfd, the same on every arch
        finally:
            os.close(pidfd)
        if fd >= 0:
            try:
                os.write(fd, data)
                return
            finally:
                os.close(fd)
    except (OSError, AttributeError):
        pass
    try:
        with open(f"/proc/{pid}/fd/2", "ab") as out:
            out.write(data)
    except OSError:
        pass

if alive(pid, start):
    helpers = children()  # its ssh clients: they hold its output open
    say(f"hpcddp: {name} (pid {pid}) has not ended {grace:g} s after "
        f"MPI_Abort: a node it started is out of reach (a link or a node "
        f"is down), so its proxy there cannot answer; ending {name} and "
        f"the {len(helpers)} process{'es' * (len(helpers) != 1)} it "
        f"started on this node\n")
    os.kill(pid, 15)  # a launcher ended so removes its session files
    ends = time.monotonic() + term_wait
    while alive(pid, start) and time.monotonic() < ends:
        time.sleep(0.1)
    if alive(pid, start):
        left = session_dirs()
        os.kill(pid, 9)
        for path in left:  # what SIGTERM would have had it remove
            shutil.rmtree(path, ignore_errors=True)
    for child, since in helpers:
        if alive(child, since):
            try:
                os.kill(child, 9)
            except OSError:
                pass
"""


def _stat(pid: int) -> Optional[Tuple[str, int, str]]:
    """(command name, parent PID, start time) of ``pid`` from /proc, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    name = text[text.index("(") + 1:text.rindex(")")]
    fields = text.rsplit(")", 1)[1].split()
    return name, int(fields[1]), fields[19]


def launcher_ancestor(pid: Optional[int] = None) -> Optional[Tuple[int, str, str]]:
    """The nearest ancestor of ``pid`` (this process) that is an MPI launcher, as
    (PID, start time, name), or None when the launcher runs on another node."""
    current = os.getpid() if pid is None else pid
    for _ in range(64):
        info = _stat(current)
        if info is None or info[1] <= 1:
            return None
        parent = _stat(info[1])
        if parent is None:
            return None
        if parent[0] in LAUNCHERS:
            return info[1], parent[2], parent[0]
        current = info[1]
    return None


def end_launcher_later(grace: float, term_wait: float = TERM_WAIT_SECONDS) -> None:
    """Start a detached helper that ends this rank's launcher, if it runs on this node,
    should it still be running ``grace`` seconds from now: SIGTERM, then SIGKILL if it
    is still there ``term_wait`` seconds later. Never raises."""
    try:
        found = launcher_ancestor()
        if found is None:
            return
        pid, start, name = found
        subprocess.Popen([sys.executable, "-c", _HELPER, str(pid), start, name, str(grace),
                          str(term_wait)],
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except Exception:  # noqa: BLE001 - aborting must go on whatever happens here
        pass
