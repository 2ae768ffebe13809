"""Draw the benchmark figures of the docs from ``benchmarks/results/*.json``.

Run: ``python benchmarks/plot.py`` (needs matplotlib: ``pip install 'hpcddp[bench]'``).
Writes ``docs/images/summary.png``, and ``network.png`` from ``network.json``
(``bench_network.py``).
"""

import json
from pathlib import Path

from hpcddp.timeline.plot import pyplot

plt = pyplot()  # or a SystemExit that says to install matplotlib

RESULTS = Path(__file__).resolve().parent / "results"
FIGURES = Path(__file__).resolve().parents[1] / "docs" / "images"


def load(name):
    return json.loads((RESULTS / f"{name}.json").read_text())


def main():
    fig, axes = plt.subplots(2, 3, figsize=(18, 8))

    ddp = {r["model"]: r for r in load("ddp")["results"]}
    ax = axes[0][0]
    keys = ["no_communication", "torch_ddp_gloo", "hpcddp", "hpcddp_no_solo"]
    width = 0.2
    for i, key in enumerate(keys):
        values = [ddp[m]["step_ms"][key] / ddp[m]["step_ms"]["no_communication"] for m in ddp]
        ax.bar([x + i * width for x in range(len(ddp))], values, width, label=key)
    ax.set_xticks([x + 1.5 * width for x in range(len(ddp))], list(ddp))
    ax.set_ylabel("step time / no-communication step")
    ax.set_title("DDP step, 2 ranks (lower is better)")
    ax.legend(fontsize=8)

    rows = load("allreduce")["rows"]
    ax = axes[0][1]
    sizes = [r["bytes"] for r in rows]
    for key in ("hpcddp_ms", "gloo_ms", "mpi4py_ms"):
        ax.loglog(sizes, [r[key] for r in rows], marker="o", label=key[:-3])
    ax.set_xlabel("message bytes")
    ax.set_ylabel("ms")
    ax.set_title("torch.distributed all_reduce, 2 ranks")
    ax.legend(fontsize=8)

    loader = load("loader")["results"]
    ax = axes[1][0]
    share = loader["sequential"]["share_of_raw_same_rows"]
    ax.barh(list(share), [v["median"] for v in share.values()],
            xerr=[[v["median"] - v["min"] for v in share.values()],
                  [v["max"] - v["median"] for v in share.values()]])
    ax.axvline(0.9, color="grey", linestyle=":")
    ax.set_xlabel("share of a raw read of the same rows (median and range of 5 runs)")
    ax.set_title("sequential epoch of 1 GiB, 2 ranks (higher is better)")
    ax.tick_params(axis="y", labelsize=8)

    ck = load("checkpoint")["ms"]
    ax = axes[1][1]
    names = ["hpcddp_save", "torch_save_fsync", "hpcddp_load", "torch_load"]
    ax.bar(names, [ck[n] for n in names], color=["C0", "C1", "C0", "C1"])
    ax.set_ylabel("ms")
    ax.set_title("checkpoint of 72 MiB (MLP + Adam), 2 ranks")
    ax.tick_params(axis="x", labelsize=8)

    ax = axes[0][2]
    runs = {"MPICH": "ddp_cuda_mpich", "Open MPI, ring": "ddp_cuda_openmpi_ring",
            "Open MPI": "ddp_cuda_openmpi_bindnone"}
    keys = ["no_communication", "torch_ddp_gloo", "hpcddp", "hpcddp_staged_whole"]
    for i, key in enumerate(keys):
        values = [next(r for r in load(f)["results"] if r["model"] == "mlp")["step_ms"][key]
                  for f in runs.values()]
        ax.bar([x + i * width for x in range(len(runs))], values, width, label=key)
    ax.set_xticks([x + 1.5 * width for x in range(len(runs))], list(runs))
    ax.set_ylabel("ms")
    ax.set_title("DDP step, MLP, 2 ranks on one H100 (lower is better)")
    ax.legend(fontsize=8)

    ax = axes[1][2]
    for name, f in (("MPICH", "staging_cuda_mpich"),
                    ("Open MPI, ring", "staging_cuda_openmpi_ring")):
        rows = load(f)["rows"]
        sizes = [r["bytes"] for r in rows]
        ax.loglog(sizes, [r["staged_trip_ms"] for r in rows], marker="o", label=f"staged, {name}")
        ax.loglog(sizes, [r["gloo_cuda_ms"] for r in rows], marker="x", ls="--",
                  label=f"gloo, {name}")
    ax.set_xlabel("bucket bytes")
    ax.set_ylabel("ms")
    ax.set_title("one bucket's allreduce from the GPU")
    ax.legend(fontsize=8)

    fig.tight_layout()
    out = FIGURES / "summary.png"
    fig.savefig(out, dpi=90)
    print(f"wrote {out}")
    if (RESULTS / "network.json").exists():
        network()


NETWORK_VARIANTS = ["hpcddp_auto", "hpcddp_ring", "hpcddp_node", "mpi_allreduce",
                    "mpi_iallreduce", "gloo"]
DDP_VARIANTS = ["no_communication", "hpcddp", "torch_ddp_gloo", "hpcddp_fp16",
                "torch_ddp_gloo_fp16_hook", "hpcddp_powerSGD_rank4",
                "torch_ddp_gloo_powerSGD_rank4"]


def network():
    """Allreduce bus bandwidth as a share of the link, per layout and rate; DDP steps."""
    runs = load("network")["runs"]
    rates = sorted({r["rate"] for r in runs}, key=lambda r: float(r.rstrip("gbit")))
    layouts = sorted({(r["nodes"], r["ranks_per_node"]) for r in runs if r["what"] == "allreduce"})
    fig, axes = plt.subplots(len(rates), len(layouts) + 1,
                             figsize=(5 * (len(layouts) + 1), 4 * len(rates)), squeeze=False)
    for i, rate in enumerate(rates):
        for j, (nodes, per_node) in enumerate(layouts):
            ax = axes[i][j]
            run = next(r for r in runs if r["what"] == "allreduce" and r["rate"] == rate
                       and (r["nodes"], r["ranks_per_node"]) == (nodes, per_node))
            sizes = [row["bytes"] / 2**20 for row in run["rows"]]
            for key in NETWORK_VARIANTS:
                if key in run["rows"][0]:
                    ax.semilogx(sizes, [row[key]["link_share"] for row in run["rows"]],
                                marker="o", label=key, color=f"C{NETWORK_VARIANTS.index(key)}")
            ax.axhline(1.0, color="grey", lw=0.5)
            ax.set_ylim(0, 1.2)
            ax.set_xlabel("MiB")
            ax.set_ylabel("bus bandwidth / link rate")
            ax.set_title(f"allreduce, {nodes} nodes x {per_node}, {rate}")
            ax.legend(fontsize=7)
        ddp = next(r for r in runs if r["what"] == "ddp" and r["rate"] == rate)
        ax = axes[i][-1]
        values = [ddp["steps"][k]["median_ms"] for k in DDP_VARIANTS]
        ax.barh(DDP_VARIANTS, values)
        ax.axvline(ddp["perfect_overlap_ms"], color="red", lw=1, label="perfect overlap")
        ax.set_xlabel("ms per step")
        ax.set_title(f"DDP step, MLP, 2 nodes x 1, {rate}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    out = FIGURES / "network.png"
    fig.savefig(out, dpi=80)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
