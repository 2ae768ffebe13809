"""What a launcher runs in place of ssh to reach an emulated node: the shim, and the
relay that stands in for an ssh client's hold on the remote command's output. Standard
library only."""

import stat
import sys
from pathlib import Path

__all__ = ["SHIM", "RELAY", "write_launch_scripts"]

# A launcher's ssh agent (hydra's, Intel MPI's, Open MPI's prte) runs ``SHIM [ssh options]
# HOST COMMAND...``; ssh would join COMMAND with spaces and hand it to the remote shell,
# and so does this, inside HOST's network namespace and a UTS namespace that carries
# HOST's name. A plain command (hydra's proxy) replaces the shell, as over ssh. prte's
# is a shell line (``PRTE_PREFIX=...;export PRTE_PREFIX;...prted ...``), which the shell
# runs behind the relay (``RELAY``): ``prted`` outlives its ranks on a node cut off from
# ``prterun``, and over ssh the local client, not the daemon, holds the launcher's output.
# With a fabric, a mount namespace of its own shows the node's interfaces in /sys (UCX
# lists network devices there; otherwise it sees the machine's, and not ``eth1``).
SHIM = """#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -[oplijFEJLRDWbcemw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1; shift
case "$*" in
  *";"*) exec {relay} nsenter --net=/run/netns/"$host" {unshare} \\
           sh -c '{sysfs}hostname "$0" && eval "$*"' "$host" "$@" ;;
  *) exec nsenter --net=/run/netns/"$host" {unshare} sh -c "{sysfs}hostname $host && exec $*" ;;
esac
"""

# What an ssh client does with the remote command's output: copies it to its own, so
# that ending the client ends the launcher's output whatever the remote side does.
RELAY = """#!{python} -IS
import os, subprocess, sys, threading

def copy(source, target):
    for chunk in iter(lambda: os.read(source, 65536), b""):
        os.write(target, chunk)

remote = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
errors = threading.Thread(target=copy, args=(remote.stderr.fileno(), 2))
errors.start()
copy(remote.stdout.fileno(), 1)
errors.join()
code = remote.wait()
sys.exit(code if code >= 0 else 128 - code)
"""


def write_launch_scripts(shim: Path, relay: Path, unshare: str, sysfs: str) -> None:
    """Write the shim and its relay, executable. ``unshare``: the command that gives a
    node's processes their own namespaces besides its network (``unshare --uts``);
    ``sysfs``: shell run first inside them (empty, or the remount of /sys)."""
    relay.write_text(RELAY.format(python=sys.executable))
    shim.write_text(SHIM.format(relay=relay, unshare=unshare, sysfs=sysfs))
    for script in (relay, shim):
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
