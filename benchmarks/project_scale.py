"""The model of scale (``hpcddp.commands.scale_model``, behind ``hpcddp predict``) beyond
the test bed: a model, never a measurement.

    python benchmarks/project_scale.py          # a second; no MPI, no cluster

Two parts, each with its assumptions written into the results:

1. **Set beside published figures.** Horovod's benchmark (128 servers of 4 Pascal GPUs,
   RoCE at 25 Gbit/s; TensorFlow's tf_cnn_benchmarks, batch 64 per GPU) published the
   scaling efficiency of Inception V3, ResNet-101 and VGG-16 at 128 and 512 GPUs. The
   model is given that fabric and those workloads (gradient bytes from the parameter
   counts; one GPU's step from TensorFlow's published P100 rates at batch 64) and
   predicts the same efficiency for a ring of all GPUs, which is what Horovod ran, and
   for the reduction hpcddp's ``auto`` would choose on GPU buffers (MPI's own; the
   model prices it as MPICH's reduce, allreduce among nodes, broadcast). PyTorch's DDP paper (VLDB 2020)
   reports "near-linear scalability using 256 GPUs" for ResNet-50 and BERT; its figures
   are plots, so only that sentence is set beside the model.
2. **Projected** to 16-1,024 GPUs on a typical fabric of today (8 GPUs per node joined
   by NVLink, 200 Gbit/s per node between nodes) for those workloads and BERT-large.

Efficiency is one GPU's step with no communication over the step at N GPUs, the batch
per GPU fixed (Horovod's definition: images per second at N over N times one GPU's).
Writes results/projection.json.
"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from hpcddp.commands.predict import bucket_bytes  # noqa: E402
from hpcddp.commands.scale_model import Fabric, Link, Workload, ddp_step_seconds  # noqa: E402
from hpcddp.transport.allreduce.policy import DEVICE, WorldFacts, for_world  # noqa: E402

MIB = 1 << 20
HOROVOD_SOURCE = ("Horovod's docs/benchmarks.rst: 128 servers with 4 Pascal GPUs each, "
                  "RoCE-capable 25 Gbit/s network; its README at release 0.9: 32 such "
                  "servers")
# Published scaling efficiency, by GPUs (Horovod's benchmark pages).
HOROVOD_PUBLISHED = {"inception_v3": {128: 0.90, 512: 0.90},
                     "resnet101": {128: 0.90, 512: 0.90},
                     "vgg16": {128: 0.79, 512: 0.68}}
TORCH_PAPER = ("Li et al., PyTorch Distributed: Experiences on Accelerating Data Parallel "
               "Training, VLDB 2020: 'near-linear scalability using 256 GPUs' (ResNet-50, "
               "BERT)")

# Workloads: parameters (fp32 gradients, 4 bytes each), and one GPU's step (forward,
# backward, optimizer; no communication). The P100 steps are batch 64 over TensorFlow's
# published P100 rates (images/s, synthetic data): Inception V3 142, VGG-16 154; it
# published none for ResNet-101, whose step is interpolated by FLOPs between ResNet-50
# (219 images/s, 4.1 GFLOPs) and ResNet-152 (91.8, 11.5): 125 images/s at 7.8 GFLOPs.
P100_WORKLOADS = {
    "inception_v3": {"parameters": 23.8e6, "step_s": 64 / 142},
    "resnet101": {"parameters": 44.5e6, "step_s": 64 / 125},
    "vgg16": {"parameters": 138.4e6, "step_s": 64 / 154},
}
# On the typical fabric, a GPU of today: steps assumed, not measured anywhere.
MODERN_WORKLOADS = {
    "resnet50": {"parameters": 25.6e6, "step_s": 0.100,
                 "assumed": "batch 128 per GPU in mixed precision, 1,280 images/s"},
    "vgg16": {"parameters": 138.4e6, "step_s": 0.080,
              "assumed": "batch 64 per GPU in mixed precision, 800 images/s"},
    "bert_large": {"parameters": 340e6, "step_s": 0.300,
                   "assumed": "batch 32 sequences of 512 per GPU in mixed precision"},
}
# Fabrics: (latency s, bytes/s) per path; a GPU sums and copies at memory speed.
HOROVOD_FABRIC = {
    "between": (5e-6, 25e9 / 8), "within": (10e-6, 12e9),
    "sum_bytes_per_s": 200e9, "copy_bytes_per_s": 300e9, "gpus_per_node": 4,
    "assumed": "RoCE 25 Gbit/s, 5 us; PCIe 3 x16 inside a server, 12 GB/s, 10 us; a P100 "
               "sums 200 GB/s of input and copies 300 GB/s",
}
TYPICAL_FABRIC = {
    "between": (3e-6, 200e9 / 8), "within": (5e-6, 150e9),
    "sum_bytes_per_s": 1000e9, "copy_bytes_per_s": 1500e9, "gpus_per_node": 8,
    "assumed": "200 Gbit/s per node (InfiniBand HDR or 200 GbE), 3 us; NVLink inside a node, "
               "150 GB/s, 5 us; a GPU sums 1 TB/s of input and copies 1.5 TB/s; a "
               "full-bisection fabric",
}
BUCKET_MB = 25     # torch's default bucket_cap_mb, hpcddp's too
HOROVOD_FUSION_MB = 64  # Horovod's tensor fusion buffer


def _fabric(spec):
    return Fabric(Link(*spec["between"]), Link(*spec["within"]), spec["sum_bytes_per_s"],
                  spec["copy_bytes_per_s"])


def _work(spec, bucket_mb):
    grad = int(spec["parameters"] * 4)
    return Workload(spec["step_s"], tuple(bucket_bytes(grad, bucket_mb * MIB)))


def _efficiency(fabric, nodes, per_node, work, reduction):
    return work.compute_s / ddp_step_seconds(fabric, nodes, per_node, work, reduction)["step"]


def _auto(nodes, per_node):
    """What ``HPCDDP_REDUCE=auto`` runs on GPU buffers with a CUDA-aware MPI that passed
    its self-test: MPI's own allreduce (the node-aware one runs on host buffers only)."""
    return for_world("auto", WorldFacts(nodes, per_node, True, DEVICE)).name


def beside_horovod():
    fabric, per_node = _fabric(HOROVOD_FABRIC), HOROVOD_FABRIC["gpus_per_node"]
    rows = []
    for name, spec in P100_WORKLOADS.items():
        work = _work(spec, HOROVOD_FUSION_MB)
        for gpus, published in HOROVOD_PUBLISHED[name].items():
            nodes = gpus // per_node
            auto = _auto(nodes, per_node)
            ring = _efficiency(fabric, nodes, per_node, work, "ring")
            rows.append({"workload": name, "gpus": gpus, "published": published,
                         "model_ring": round(ring, 3), "model_auto_reduction": auto,
                         "model_auto": round(_efficiency(fabric, nodes, per_node, work, auto), 3),
                         "model_minus_published": round(ring - published, 3)})
    return rows


def projected():
    fabric, per_node = _fabric(TYPICAL_FABRIC), TYPICAL_FABRIC["gpus_per_node"]
    rows = []
    for name, spec in MODERN_WORKLOADS.items():
        work = _work(spec, BUCKET_MB)
        for gpus in (16, 32, 64, 128, 256, 512, 1024):
            nodes = gpus // per_node
            auto = _auto(nodes, per_node)
            rows.append({"workload": name, "gpus": gpus, "nodes": nodes, "auto": auto,
                         **{f"efficiency_{r}": round(_efficiency(fabric, nodes, per_node,
                                                                 work, r), 3)
                            for r in ("ring", "node", "mpi")}})
    return rows


def main():
    result = {
        "what": "a model (hpcddp.commands.scale_model), never a measurement",
        "efficiency": "one GPU's step with no communication / the step at N GPUs, batch "
                      "per GPU fixed",
        "horovod": {"source": HOROVOD_SOURCE, "fabric": HOROVOD_FABRIC,
                    "workloads": P100_WORKLOADS, "fusion_mb": HOROVOD_FUSION_MB,
                    "rows": beside_horovod()},
        "torch_ddp_paper": TORCH_PAPER,
        "typical": {"fabric": TYPICAL_FABRIC, "workloads": MODERN_WORKLOADS,
                    "bucket_mb": BUCKET_MB, "rows": projected()},
    }
    print("beside Horovod's published efficiency (a model; ring of all GPUs, as Horovod):")
    for row in result["horovod"]["rows"]:
        print(f"  {row['workload']:<13} {row['gpus']:>5} GPUs  published {row['published']:.2f}"
              f"  model {row['model_ring']:.2f}  ({row['model_auto_reduction']}: "
              f"{row['model_auto']:.2f})")
    print("projected, 8 GPUs per node, 200 Gbit/s (a model):")
    for row in result["typical"]["rows"]:
        print(f"  {row['workload']:<11} {row['gpus']:>5} GPUs  auto={row['auto']:<5} "
              f"ring {row['efficiency_ring']:.2f}  node {row['efficiency_node']:.2f}  "
              f"mpi {row['efficiency_mpi']:.2f}")
    out = HERE / "results" / "projection.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
