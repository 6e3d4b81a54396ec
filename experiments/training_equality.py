"""Data-parallel training against single-process training, and what bucketing buys.

1. `hccl-sim train`'s model on 1..8 ranks of one 910B server (and 6 ranks of a flat cluster for each
   AllReduce algorithm, with and without HCCL_DETERMINISTIC): the largest difference of the loss
   curve and of the final parameters from single-process training on the whole batch, and
   whether the parameters are bit-identical on every rank.
2. The simulated step time with DDP's buckets and with one bucket after backward (no overlap).

    python experiments/training_equality.py [--steps 10] [--out experiments/out]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np                                 # noqa: E402
from threadpoolctl import threadpool_limits        # noqa: E402

import hccl_sim                                    # noqa: E402
import topologies                                  # noqa: E402
from hccl_sim.training import TrainConfig, report, train_rank, train_reference   # noqa: E402


def compare(cfg, topo, ref, env=None):
    with threadpool_limits(limits=1, user_api="blas"):
        res = hccl_sim.run(train_rank, topology=topo, args=(cfg,), env=env or {})
    rows = report.step_rows(res)
    dloss = max(abs(r["loss"] - ref["losses"][r["step"]]) for r in rows)
    dparam = max(float(np.abs(res[0].params[k] - v).max()) for k, v in ref["params"].items())
    return dloss, dparam, len({r.digest for r in res}) == 1


def steady(cfg, topo):
    with threadpool_limits(limits=1, user_api="blas"):
        rows = report.step_rows(hccl_sim.run(train_rank, topology=topo, args=(cfg,)))[1:]
    return {k: sum(r[k] for r in rows) / len(rows) for k in ("step_ns", "compute_ns", "comm_ns", "exposed_ns",
                                                             "overlap")}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))
    args = ap.parse_args(argv)
    cfg = TrainConfig(steps=args.steps, keep_params=True)
    ref = train_reference(cfg)
    lines = [f"{args.steps} steps of `hccl-sim train`'s default model (64-1024-1024-10, 2 x SyncBatchNorm, "
             "global batch 256) against one process on the whole batch:", "",
             "| cluster | ranks | algorithm | HCCL_DETERMINISTIC | max loss difference | max parameter difference "
             "| parameters bit-identical on every rank |", "|---|---|---|---|---|---|---|"]
    for p in range(1, 9):
        d = compare(cfg, topologies.hardware("atlas800t-a2", devices_per_server=[p]), ref)
        lines.append(f"| 910B server | {p} | selected | off | {d[0]:.2e} | {d[1]:.2e} | {'yes' if d[2] else 'NO'} |")
        print(lines[-1], flush=True)
    flat = hccl_sim.topology("fullmesh", ranks=6, bandwidth=25e9, latency=5e-6)
    for algo in ("ring", "H-D_R", "NHR", "NB", "fullmesh"):
        for det in ("false", "true"):
            d = compare(TrainConfig(steps=args.steps, keep_params=True, algo=algo), flat, ref,
                        {"HCCL_DETERMINISTIC": det})
            lines.append(f"| fullmesh | 6 | {algo} | {det} | {d[0]:.2e} | {d[1]:.2e} | {'yes' if d[2] else 'NO'} |")
            print(lines[-1], flush=True)
    lines += ["", "Bucketing (steady-state step, simulated, 2 x 8 910B):", "",
              "| model | buckets | step (us) | compute (us) | communication (us) | exposed (us) | overlap |",
              "|---|---|---|---|---|---|---|"]
    two = hccl_sim.topology("atlas800t-a2", servers=2)
    for label, base in (("64-1024-1024-10, batch 256", dict(steps=4)),
                        ("64-2048x4-10, batch 1024", dict(steps=4, hidden=2048, depth=4, batch=1024))):
        for bucket, name in ((25.0, "DDP (cap 25 MiB, first 1 MiB)"), (None, "one, after backward")):
            s = steady(TrainConfig(**base, bucket_mb=bucket), two)
            lines.append(f"| {label} | {name} | {s['step_ns'] / 1e3:.2f} | {s['compute_ns'] / 1e3:.2f} | "
                         f"{s['comm_ns'] / 1e3:.2f} | {s['exposed_ns'] / 1e3:.2f} | {100 * s['overlap']:.1f} % |")
            print(lines[-1], flush=True)
    lines += ["", f"Regenerate: `python experiments/training_equality.py --steps {args.steps}`"]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "training_equality.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
