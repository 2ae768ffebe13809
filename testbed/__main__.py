"""Bring up an emulated cluster on this machine, or take it down (needs root).

Each node is a network namespace with its own hostname, joined to a bridge by a link
that --rate shapes (1gbit, 2.5gbit; none: unshaped, which measures the CPU rather than
a network). Ranks are started on the nodes by the MPI's own launcher with the arguments
that `args` prints. From the repository's root:

    python -m testbed up --nodes 2 --rate 1gbit
    python -m testbed up --nodes 3 --fabric     # MPI on a second network, eth1
    mpiexec $(python -m testbed args --ranks-per-node 2) python train.py
    mpirun $(python -m testbed args --ranks-per-node 2 --flavour openmpi) python train.py
    python -m testbed down

`down` also kills whatever still runs inside the nodes.
"""

import argparse
import shlex
import sys

from testbed.errors import Unavailable
from testbed.nodes import EmulatedCluster

PROG = "python -m testbed"


def _parser():
    head, _, rest = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(prog=PROG, description=head, epilog=rest,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("up", "down", "args"))
    parser.add_argument("--name", default="hpcddp",
                        help="what the nodes are named after (default: hpcddp)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes to build (up; default 2)")
    parser.add_argument("--rate", default=None,
                        help="every link's rate, e.g. 1gbit or 2.5gbit (up; default unshaped)")
    parser.add_argument("--fabric", action="store_true",
                        help="a second network for MPI's traffic, apart from the management "
                             "network that the hostnames (and Slurm) use (up)")
    parser.add_argument("--ranks-per-node", type=int, default=1,
                        help="ranks mpiexec places on each node (args; default 1)")
    parser.add_argument("--flavour", choices=("mpich", "openmpi", "impi"), default="mpich",
                        help="whose launcher the arguments are for (args; default mpich: "
                             "hydra's mpiexec; openmpi: mpirun; impi: Intel MPI's mpiexec)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "up":
            cluster = EmulatedCluster.up(nodes=args.nodes, rate=args.rate, name=args.name,
                                         fabric=args.fabric)
            nodes = ", ".join(f"{n} ({a})" for n, a in zip(cluster.nodes, cluster.addresses))
            print(f"emulated cluster {cluster.name!r} is up: {nodes}; links "
                  f"{cluster.rate or 'unshaped'}; bridge {cluster.bridge} "
                  f"({cluster.bridge_address})"
                  + (f"; fabric {cluster.fabric['bridge']} on eth1"
                     if cluster.fabric else "") + "\nstart ranks on it with:\n  mpiexec "
                  f"$({PROG} args --name {cluster.name} --ranks-per-node 1) "
                  f"python train.py\ntake it down with: {PROG} down --name {cluster.name}")
        elif args.action == "down":
            gone = EmulatedCluster.down_by_name(args.name)
            print(f"emulated cluster {args.name!r} " + ("removed" if gone else "was not up"))
        else:
            cluster = EmulatedCluster.attach(args.name)
            print(shlex.join(cluster.mpiexec_args(args.ranks_per_node, flavour=args.flavour)))
    except (Unavailable, FileNotFoundError, ValueError) as why:
        print(f"{PROG} {args.action}: {why}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
