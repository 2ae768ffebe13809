"""Bring up an emulated cluster on this machine, or take it down (needs root).

Each node is a network namespace with its own hostname, joined to a bridge by a link
that ``--rate`` shapes (1gbit, 2.5gbit; none: unshaped, which measures the CPU rather
than a network). Ranks are started on the nodes by MPICH's ``mpiexec`` with the
arguments ``hpcddp cluster args`` prints::

    hpcddp cluster up --nodes 2 --rate 1gbit
    mpiexec $(hpcddp cluster args --ranks-per-node 2) python train.py
    hpcddp cluster down

``down`` also kills whatever still runs inside the nodes.
"""

import shlex
import sys

from hpcddp.cli import command_parser
from hpcddp.emulated.cluster import EmulatedCluster, Unavailable

__all__ = ["main"]


def _parser():
    parser = command_parser("cluster", __doc__)
    parser.add_argument("action", choices=("up", "down", "args"))
    parser.add_argument("--name", default="hpcddp",
                        help="what the nodes are named after (default: hpcddp)")
    parser.add_argument("--nodes", type=int, default=2, help="nodes to build (up; default 2)")
    parser.add_argument("--rate", default=None,
                        help="every link's rate, e.g. 1gbit or 2.5gbit (up; default unshaped)")
    parser.add_argument("--ranks-per-node", type=int, default=1,
                        help="ranks mpiexec places on each node (args; default 1)")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.action == "up":
            cluster = EmulatedCluster.up(nodes=args.nodes, rate=args.rate, name=args.name)
            nodes = ", ".join(f"{n} ({a})" for n, a in zip(cluster.nodes, cluster.addresses))
            print(f"emulated cluster {cluster.name!r} is up: {nodes}; links "
                  f"{cluster.rate or 'unshaped'}; bridge {cluster.bridge} "
                  f"({cluster.bridge_address})\nstart ranks on it with:\n  mpiexec "
                  f"$(hpcddp cluster args --name {cluster.name} --ranks-per-node 1) "
                  f"python train.py\ntake it down with: hpcddp cluster down --name "
                  f"{cluster.name}")
        elif args.action == "down":
            gone = EmulatedCluster.down_by_name(args.name)
            print(f"emulated cluster {args.name!r} " + ("removed" if gone else "was not up"))
        else:
            cluster = EmulatedCluster.attach(args.name)
            print(shlex.join(cluster.mpiexec_args(args.ranks_per_node)))
    except (Unavailable, FileNotFoundError, ValueError) as why:
        print(f"hpcddp cluster {args.action}: {why}", file=sys.stderr)
        return 1
    return 0
