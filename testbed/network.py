"""The network of an emulated cluster: namespaces, veth pairs, bridges, shaped links.

Each node is a network namespace joined to a bridge by a veth pair; its side of the pair
is ``eth0``. A second bridge (a fabric beside the management network) joins each node's
``eth1`` the same way (``add_interface``). A bridge holds the only address of its subnet
in the root namespace, and no node has a route beyond its bridges' subnets, so nothing a
node sends leaves the machine. Standard library only: this drives ``ip`` and ``tc``
(iproute2).
"""

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
import zlib
from typing import List, Optional, Sequence

__all__ = ["NetworkError", "check_can_build", "choose_subnet", "add_node", "add_interface",
           "add_bridge",
           "remove_node", "remove_bridge", "shape", "set_link", "node_pids", "kill_node",
           "namespace_exists", "link_exists", "parse_rate", "tbf_burst"]

# tbf holds at most this long a queue; the same as the settings measured in the issue.
_TBF_LATENCY = "10ms"
_TIMER_HZ = 250      # the kernel's timer ticks per second that tbf's bucket must cover
_FRAME_BYTES = 1514  # an Ethernet frame of a 1500-byte MTU, the largest tbf must pass


class NetworkError(RuntimeError):
    """An ``ip`` or ``tc`` command failed; the message quotes it and its error."""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(args)} failed: {done.stderr.strip()}")
    return done


def check_can_build() -> Optional[str]:
    """Return why no emulated cluster can be built here, or None when one can."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "tc", "nsenter", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (iproute2, util-linux)"
    probe = "hpcddp-probe"
    done = _run("ip", "netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"ip netns add failed: {done.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _subnets_in_use() -> List[ipaddress.IPv4Network]:
    text = _run("ip", "-4", "-o", "addr").stdout + _run("ip", "-4", "route").stdout
    nets = []
    for cidr in re.findall(r"(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", text):
        try:
            nets.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            pass
    return nets


def choose_subnet(name: str, avoid: Sequence[ipaddress.IPv4Network] = ()
                  ) -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/13 derived from the cluster's name, overlapping nothing here
    nor ``avoid`` (subnets chosen but not yet given to a bridge).

    The name decides it, so ``python -m testbed down`` finds the same one; a clash with an
    address or route of this machine moves to the next /24.
    """
    used = _subnets_in_use() + list(avoid)
    start = zlib.crc32(name.encode()) % 2048
    for step in range(2048):
        index = (start + step) % 2048
        net = ipaddress.ip_network(f"10.{200 + index // 256}.{index % 256}.0/24")
        if not any(net.overlaps(other) for other in used):
            return net
    raise NetworkError("no free /24 in 10.200.0.0/13 for the emulated cluster")


def add_bridge(bridge: str, address: str) -> None:
    """Create ``bridge`` with ``address`` (CIDR) in the root namespace, up."""
    _run("ip", "link", "add", bridge, "type", "bridge")
    _run("ip", "addr", "add", address, "dev", bridge)
    _run("ip", "link", "set", bridge, "up")


def remove_bridge(bridge: str) -> None:
    if link_exists(bridge):
        _run("ip", "link", "del", bridge, check=False)


def add_node(node: str, host_if: str, bridge: str, address: str) -> None:
    """Create namespace ``node`` whose ``eth0`` (``address``, CIDR) is on ``bridge``.

    Only the subnet's own route exists inside: no default route, no NAT.
    """
    _run("ip", "netns", "add", node)
    _run("ip", "-n", node, "link", "set", "lo", "up")
    add_interface(node, host_if, bridge, address, "eth0")


def add_interface(node: str, host_if: str, bridge: str, address: str,
                  device: str = "eth1") -> None:
    """Give namespace ``node`` an interface ``device`` (``address``, CIDR) on ``bridge``,
    through a veth pair whose other end, ``host_if``, is the bridge's port; only the
    subnet's own route comes with it."""
    peer = f"{host_if}p"
    _run("ip", "link", "add", host_if, "type", "veth", "peer", "name", peer)
    _run("ip", "link", "set", peer, "netns", node)
    inside = ("ip", "-n", node)
    _run(*inside, "link", "set", peer, "name", device)
    _run(*inside, "addr", "add", address, "dev", device)
    _run(*inside, "link", "set", device, "up")
    _run("ip", "link", "set", host_if, "master", bridge)
    _run("ip", "link", "set", host_if, "up")


def namespace_exists(node: str) -> bool:
    return node in _run("ip", "netns", "list", check=False).stdout.split()


def link_exists(name: str) -> bool:
    return _run("ip", "link", "show", name, check=False).returncode == 0


def node_pids(node: str) -> List[int]:
    """Every process whose network namespace is ``node``'s."""
    out = _run("ip", "netns", "pids", node, check=False).stdout
    return [int(pid) for pid in out.split()]


def _command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def kill_node(node: str, spare: Sequence[str] = ()) -> List[int]:
    """SIGKILL every process inside ``node`` but those whose command name is in
    ``spare``; return the PIDs killed."""
    pids = [pid for pid in node_pids(node) if _command_name(pid) not in spare]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return pids


def signal_node(node: str, signum: int) -> List[int]:
    """Send ``signum`` to every process inside ``node`` (SIGSTOP: the node freezes, its
    launcher's daemon too; SIGCONT: it wakes); return the PIDs signalled."""
    pids = node_pids(node)
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    return pids


def remove_node(node: str, host_if: str) -> None:
    """Kill what runs inside ``node`` and delete it (its veth pair goes with it)."""
    if namespace_exists(node):
        kill_node(node)
        _run("ip", "netns", "del", node, check=False)
    if link_exists(host_if):
        _run("ip", "link", "del", host_if, check=False)


_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)$")
_BITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def parse_rate(rate: str) -> float:
    """``"2.5gbit"`` -> bits per second; raises ValueError naming the value and the form."""
    match = _RATE.match(str(rate).strip().lower())
    if not match:
        raise ValueError(f"link rate {rate!r} is not of the form 100mbit, 1gbit, 2.5gbit")
    return float(match.group(1)) * _BITS[match.group(2)]


def shape(node: str, host_if: str, rate: Optional[str], device: str = "eth0") -> None:
    """Limit ``node``'s link (its ``device``, whose pair's other end is ``host_if``) to
    ``rate`` both ways (a token bucket on each end of the veth pair), or take the limit
    off when ``rate`` is None.

    Both ends: a node that receives from several others is limited at its port as a
    switch would limit it, not only by each sender's own link.
    """
    ends = [("tc", "-n", node), ("tc",)]
    devices = [device, host_if]
    for prefix, dev in zip(ends, devices):
        if rate is None:
            _run(*prefix, "qdisc", "del", "dev", dev, "root", check=False)
            continue
        _run(*prefix, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate,
             "burst", str(tbf_burst(parse_rate(rate))), "latency", _TBF_LATENCY)


def tbf_burst(bits: float) -> int:
    """The bytes a link shaped to ``bits`` per second may send at full speed after an
    idle spell (tbf's bucket): at least one timer tick's worth at that rate and two full
    frames; 256 KB (a switch port's buffer) where a quarter of a second at the rate holds
    that much, and less on a slower link. A link shaped to a crawl (8 kbit/s) given
    256 KB would carry four minutes of its rate at full speed first, so training went on
    for a few steps after the fault, by a different amount each time."""
    tick = int(bits / 8 / _TIMER_HZ)
    return max(tick, 2 * _FRAME_BYTES, min(256 * 1024, int(bits / 8 / 4)))


def flush_neighbours(device: str) -> None:
    """Forget the root namespace's neighbour entries on ``device`` (the bridge)."""
    _run("ip", "neigh", "flush", "dev", device, check=False)


def set_link(host_if: str, up: bool, node: Optional[str] = None) -> None:
    """Take a node's link down (as a failed switch port) or bring it back up.

    Brought up, the link is usable when this returns: its carrier is up, and ``node``'s
    neighbour entries, failed while it was down, are flushed (otherwise the node's first
    connections fail with "No route to host" until they expire).
    """
    _run("ip", "link", "set", host_if, "up" if up else "down")
    if not up:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/sys/class/net/{host_if}/operstate") as state:
                if state.read().strip() == "up":
                    break
        except OSError:
            break
        time.sleep(0.05)
    if node is not None:
        _run("ip", "-n", node, "neigh", "flush", "all", check=False)
