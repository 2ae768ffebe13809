"""``hpcddp doctor``: what every rank sees, whether it agrees, and how fast MPI is.

Rank 0 prints one row per rank, grouped by node, then the allreduce bus bandwidth over
a range of message sizes. The exit status is non-zero, on every rank, when something is
wrong: a singleton launch, or ranks that disagree on versions.
"""

import os
import platform
import sys
import time
from typing import Dict, List

import numpy as np

from hpcddp.comm.ranks import by_value, ranks_text
from hpcddp.commands.parser import command_parser
from hpcddp.startup.mpi_library import (library_version_line, mpich_network_module, rdma_devices,
                                     ucx_on_tcp_advice)

__all__ = ["main", "rank_report", "find_problems", "find_advice", "allreduce_bandwidth"]

# Fields that must agree across ranks, or ranks may compute or communicate differently.
_MUST_AGREE = ("hpcddp", "torch", "mpi4py", "mpi_library", "python")


def _mpi_library() -> str:
    return " ".join(library_version_line().split(",")[0].split())


def _netmod_reason() -> str:
    from hpcddp.env.netmod import applied

    choice = applied()
    return choice.reason if choice is not None else "MPI was started before hpcddp.init()"


def rank_report(world) -> Dict[str, object]:
    """Return what this rank sees, as plain values."""
    import h5py
    import mpi4py
    import torch
    from mpi4py import MPI

    import hpcddp

    return {
        "host": world.hostname, "rank": world.rank, "local_rank": world.local_rank,
        "node_rank": world.node_rank, "device": str(world.device),
        "threads": world.num_threads, "threads_reason": world.threads_reason,
        "oversubscribed": world.oversubscribed, "yields": world.yields,
        "mpi_library": _mpi_library(), "network_module": mpich_network_module(),
        "rdma_devices": rdma_devices(), "network_reason": _netmod_reason(),
        "mpi_standard": "%d.%d" % MPI.Get_version(), "launcher": world.launcher,
        "thread_level": world.thread_level,
        "cuda_aware": world.cuda_aware, "cuda_aware_reason": world.cuda_aware_reason,
        "reduction": world.reduction, "reduction_reason": world.reduction_reason,
        "h5py": h5py.__version__, "h5py_mpi": bool(h5py.get_config().mpi),
        "hpcddp": hpcddp.__version__, "torch": torch.__version__,
        "mpi4py": mpi4py.__version__, "python": platform.python_version(),
    }


def find_problems(reports: List[Dict[str, object]]) -> List[str]:
    """Return one line per field on which the ranks disagree."""
    problems = []
    for field in _MUST_AGREE:
        values = by_value(report[field] for report in reports)
        if len(values) > 1:
            said = "; ".join(f"{v} on ranks {ranks_text(r)}" for v, r in values)
            problems.append(f"ranks disagree on {field}: {said}. Install the same "
                            f"environment on every node (one venv on a shared file system).")
    return problems


def find_advice(reports: List[Dict[str, object]], environ=os.environ) -> List[str]:
    """Return notes on settings that cost speed here; they do not fail the doctor."""
    # Here, not at the top: importing hpcddp.transport starts MPI, which init() must
    # start (its time bound, the network module it chooses before MPI_Init).
    from hpcddp.transport.allreduce.policy import OMPI_MCA_ALLREDUCE

    advice = []
    library = str(reports[0]["mpi_library"])
    nodes = len({report.get("host") for report in reports})
    if (library.startswith("Open MPI v4") and len(reports) < 4
            and OMPI_MCA_ALLREDUCE not in environ):
        advice.append(
            "Open MPI 4's non-blocking allreduce (libnbc) uses a binomial tree on fewer than "
            "4 ranks whatever the message size: 1.7x its blocking Allreduce at 24 MiB on 2 "
            f"ranks. export {OMPI_MCA_ALLREDUCE}=1 (ring) before "
            "launching; with 4 or more ranks libnbc picks the ring for large messages itself.")
    if library.startswith("Open MPI v5") and nodes > 1 and OMPI_MCA_ALLREDUCE not in environ:
        advice.append(
            "Open MPI 5's allreduce, blocking and non-blocking, used each link one way at a "
            "time between nodes: 16 MiB moved 0.48 of a 1 Gbit/s link on 2 nodes x 1 rank "
            f"and 0.29 on 4 (emulated nodes, TCP). export {OMPI_MCA_ALLREDUCE}=1 (ring) "
            "before launching: 0.96 and 0.84. Until then hpcddp reduces with its own ring on "
            "2 nodes x 1 rank, as it does on more nodes.")
    on_tcp = sorted({str(r.get("host")) for r in reports
                     if r.get("network_module") == "ucx" and r.get("rdma_devices") == 0})
    if nodes > 1 and on_tcp:
        advice.append(ucx_on_tcp_advice(on_tcp))
    staged = [r["rank"] for r in reports
              if str(r["device"]).startswith("cuda") and not r["cuda_aware"]]
    if staged:
        advice.append(
            f"ranks {ranks_text(staged)} compute on a GPU but MPI is not CUDA-aware "
            f"({reports[staged[0]]['cuda_aware_reason']}): gradients are staged through "
            f"pinned host memory. A CUDA-aware site MPI (Open MPI with UCX, MVAPICH2-GDR, "
            f"Cray MPICH) with mpi4py built against it hands device buffers to MPI directly.")
    return advice


def allreduce_bandwidth(comm, sizes, min_seconds=0.2, max_iters=50):
    """Measure ``Allreduce`` of float32 buffers; return ``(bytes, seconds, bus GB/s)`` rows.

    The time of an iteration is the slowest rank's; the bus bandwidth is the data each
    rank moves in a ring allreduce, ``2 (n-1)/n * bytes``, per second.
    """
    from mpi4py import MPI

    rows = []
    for nbytes in sizes:
        send = np.ones(nbytes // 4, dtype=np.float32)
        recv = np.empty_like(send)
        comm.Allreduce(send, recv)  # warm-up: connection set-up, buffer registration
        times, spent = [], 0.0
        while len(times) < 3 or (spent < min_seconds and len(times) < max_iters):
            comm.Barrier()
            start = time.perf_counter()
            comm.Allreduce(send, recv)
            elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX)
            times.append(elapsed)
            spent += elapsed
        seconds = float(np.median(times))
        factor = 2.0 * (comm.size - 1) / comm.size
        rows.append((nbytes, seconds, factor * nbytes / seconds / 1e9))
    return rows


def _fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:g} {unit}"
        n /= 1024


def _print_table(reports, out):
    columns = [("host", "host"), ("rank", "rank"), ("local", "local_rank"),
               ("device", "device"), ("threads", "threads"), ("MPI", "mpi_library"),
               ("std", "mpi_standard"), ("launcher", "launcher"),
               ("thread level", "thread_level"), ("CUDA-aware", "cuda_aware"),
               ("why", "cuda_aware_reason"), ("allreduce", "reduction"),
               ("h5py", "h5py"), ("h5py MPI", "h5py_mpi")]
    table = [[str(r[key]) for _, key in columns] for r in reports]
    widths = [max(len(h), *(len(row[i]) for row in table)) for i, (h, _) in enumerate(columns)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    nodes = sorted({r["node_rank"] for r in reports})
    print(f"hpcddp {reports[0]['hpcddp']}, torch {reports[0]['torch']}, mpi4py "
          f"{reports[0]['mpi4py']}: {len(reports)} ranks on {len(nodes)} node(s)", file=out)
    for node in nodes:
        members = [i for i, r in enumerate(reports) if r["node_rank"] == node]
        print(f"\nnode {node} ({reports[members[0]]['host']}), {len(members)} ranks", file=out)
        print(line([h for h, _ in columns]), file=out)
        for i in members:
            print(line(table[i]), file=out)
    decided = {}
    for rank, report in enumerate(reports):
        decided.setdefault(report["threads_reason"], []).append(rank)
    for reason, ranks in decided.items():
        print(f"\ntorch threads: {reason} (ranks {ranks_text(ranks)})", file=out)
    networks = {}
    for rank, report in enumerate(reports):
        if report.get("network_module"):
            key = (report["network_module"], report.get("network_reason"))
            networks.setdefault(key, []).append(rank)
    for (module, reason), ranks in networks.items():
        print(f"MPICH network module: {module} ({reason}) (ranks {ranks_text(ranks)})", file=out)
    _print_yields(reports, out)


def _print_yields(reports, out) -> None:
    """Which ranks' waits for MPI sleep from their first poll, and why."""
    said = {}
    for rank, report in enumerate(reports):
        crowded, yields = report["oversubscribed"], report["yields"]
        if crowded and yields:
            why = "more ranks than cores share them: their waits for MPI sleep from the " \
                  "first poll (one rank per core is faster)"
        elif yields:
            why = "HPCDDP_YIELD=1: their waits for MPI sleep from the first poll"
        elif crowded:
            why = "more ranks than cores share them, but HPCDDP_YIELD=0 keeps their " \
                  "waits for MPI spinning"
        else:
            continue
        said.setdefault(why, []).append(rank)
    for why, ranks in said.items():
        print(f"ranks {ranks_text(ranks)}: {why}", file=out)


def _horovod_settings() -> List[str]:
    """What each ``HOROVOD_*`` variable of this job does under hpcddp.horovod."""
    from hpcddp.horovod.settings import describe

    return describe(os.environ)


def main(argv=None) -> int:
    """Run the doctor on every rank; return the exit status."""
    parser = command_parser("doctor", __doc__)
    parser.add_argument("--max-bytes", type=int, default=64 << 20,
                        help="largest allreduce message (default 64 MiB)")
    parser.add_argument("--no-bandwidth", action="store_true", help="skip the bandwidth test")
    args = parser.parse_args(argv)

    from hpcddp.env import ConfigError, SingletonLaunchError
    from hpcddp.runtime import init

    try:
        world = init(torch_group=False)
    except (SingletonLaunchError, ConfigError) as error:
        print(f"hpcddp doctor: PROBLEM: {error}", file=sys.stderr)
        return 2
    reports = sorted(world.comm.allgather(rank_report(world)), key=lambda r: r["rank"])
    problems = find_problems(reports)
    sizes = [] if args.no_bandwidth or world.size < 2 else \
        [s for s in (4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20) if s <= args.max_bytes]
    bandwidth = allreduce_bandwidth(world.comm, sizes)
    if world.is_main:
        _print_table(reports, sys.stdout)
        settings = {k: v for k, v in os.environ.items() if k.startswith("HPCDDP_")}
        if settings:
            print("\nsettings: " + " ".join(f"{k}={v}" for k, v in sorted(settings.items())))
        horovod = _horovod_settings()
        if horovod:
            print("\nHorovod settings (hpcddp.horovod):")
            for line in horovod:
                print(f"  {line}")
        if bandwidth:
            print(f"\nallreduce (float32, {world.size} ranks): size, time, bus bandwidth")
            for nbytes, seconds, busbw in bandwidth:
                print(f"  {_fmt_bytes(nbytes):>9}  {seconds * 1e3:9.3f} ms  {busbw:8.2f} GB/s")
        elif world.size < 2:
            print("\nallreduce bandwidth: skipped, world size is 1")
        print(f"\nallreduce: {reports[0]['reduction_reason']}")
        verdict = world.device_verdict
        print("device-buffer self-test: " + (
            verdict.describe() if verdict is not None else
            "not run (MPI reports no CUDA support, no GPU, or HPCDDP_CUDA_AWARE is set)"))
        for note in find_advice(reports):
            print(f"NOTE: {note}")
        for problem in problems:
            print(f"PROBLEM: {problem}")
        print("\nhpcddp doctor: " + ("FAILED" if problems else "OK"))
        sys.stdout.flush()
    return 1 if problems else 0
