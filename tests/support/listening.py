"""The TCP ports this process listens on, from the kernel's tables (/proc/net/tcp*) and
this process's open sockets: what another host could connect to."""

import ipaddress
import os
from typing import List, Tuple


def _address(hex_address: str) -> str:
    raw = bytes.fromhex(hex_address)
    # The kernel writes each 32-bit word of the address in host (little-endian) order.
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def listening_ports(pid="self") -> List[Tuple[str, int]]:
    """(address, port) of every listening TCP socket that process ``pid`` holds open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # TCP_LISTEN
                address, port = local.split(":")
                found.append((_address(address), int(port, 16)))
    return sorted(found)
