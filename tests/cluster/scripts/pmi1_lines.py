"""Speak PMI-1 to Slurm's pmi2 plugin directly (no MPI): put values whose request lines
are just under and just over 1024 bytes, read them back, print one JSON line.

MPICH's own PMI client speaks PMI-1 under ``srun --mpi=pmi2`` (``cmd=init
pmi_version=1``), and Slurm's plugin takes each PMI-1 request in a single read() of at
most 1024 bytes (``handle_pmi1_cmd``, ``MAX_READLINE``); the rest of a longer line is
read as the next request. This script shows what that does to a value, with nothing of
MPI or hpcddp in the way.
"""

import json
import os
import socket

sock = socket.socket(fileno=int(os.environ["PMI_FD"]))
sock.settimeout(30)  # a reply that never comes fails the job, never hangs it
reader = sock.makefile("r")


def ask(line: str) -> str:
    sock.sendall(line.encode())
    return reader.readline().strip()


def field(reply: str, key: str) -> str:
    return dict(token.split("=", 1) for token in reply.split() if "=" in token).get(key, "")


ask("cmd=init pmi_version=1 pmi_subversion=1\n")
maxes = ask("cmd=get_maxes\n")
kvs = field(ask("cmd=get_my_kvsname\n"), "kvsname")
rank = int(os.environ["PMI_RANK"])
results = {"vallen_max": int(field(maxes, "vallen_max") or 0)}
# The long line's first 1024 bytes end inside its value, and what follows them is a
# request of its own (``cmd=get_maxes``): if the plugin cuts the line there, that request
# gets a reply of its own, and the requests after it cannot run into the cut-off tail
# (a tail read together with the next request took that request with it).
TAIL = "cmd=get_maxes"
for name in ("short", "long"):
    key = f"probe-{name}-{rank}"
    head = f"cmd=put kvsname={kvs} key={key} value="
    value = "AB" * ((1000 - len(head) - 1) // 2) if name == "short" else \
        "A" * (1024 - len(head)) + TAIL
    sock.sendall(f"{head}{value}\n".encode())
    put = reader.readline().strip()
    tail_reply = reader.readline().strip() if name == "long" else ""
    ask("cmd=barrier_in\n")
    back = field(ask(f"cmd=get kvsname={kvs} key={key}\n"), "value")
    results[name] = {"line": len(head) + len(value) + 1, "put": put, "tail_reply": tail_reply,
                     "sent": len(value), "read_back": len(back), "intact": back == value}
print(json.dumps(results), flush=True)
