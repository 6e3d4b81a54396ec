"""Which level1 algorithm each selection policy picks, and what HCCL's rule costs against the
fastest modelled choice, for sizes 8 B..4 GiB on 2..512 Atlas 800T A2 (910B) servers.

For every (collective, servers, size): the `hccl` policy's choice and simulated time (HCCL's
own rules: pipeline thresholds, then its 60 us / 20 GB/s cost comparison), the `model` policy's
choice and time (every candidate replayed on the timing model), and the loss of HCCL's rule,
(t_hccl - t_model) / t_model. Writes a table (stdout and CSV) and a plot of the chosen algorithm
and the loss over (servers, size).

    python experiments/algorithm_crossovers.py                  # full grid (a few minutes)
    python experiments/algorithm_crossovers.py --quick          # a small grid
"""
import argparse
import csv
import time
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt      # noqa: E402
import numpy as np                   # noqa: E402

import hccl_sim                      # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
ALGOS = ["ring", "H-D_R", "NHR", "NB", "pipeline"]
COLORS = {"ring": "#4c72b0", "H-D_R": "#dd8452", "NHR": "#55a868", "NB": "#c44e52", "pipeline": "#8172b3"}


def level1(label):
    return label.split("level1:")[-1] if "level1:" in label else label


def run(ops, servers_list, sizes):
    rows = []
    for op in ops:
        for m in servers_list:
            topo = hccl_sim.topology("atlas800t-a2", servers=m)
            for size in sizes:
                t0 = time.perf_counter()
                hccl = hccl_sim.simulate(op, size, topology=topo, policy="hccl")
                model = hccl_sim.simulate(op, size, topology=topo, policy="model")
                wall = time.perf_counter() - t0
                loss = (hccl.time - model.time) / model.time if model.time else 0.0
                rows.append({"op": op, "servers": m, "ranks": topo.num_ranks, "bytes": size,
                             "hccl_algo": level1(hccl.algo), "hccl_us": hccl.time * 1e6,
                             "model_algo": level1(model.algo), "model_us": model.time * 1e6,
                             "hccl_loss_pct": 100 * loss, "wall_s": wall})
                r = rows[-1]
                print(f"{op:10s} {m:4d} {size:11d}  hccl {r['hccl_algo']:8s} {r['hccl_us']:12.2f} us   "
                      f"model {r['model_algo']:8s} {r['model_us']:12.2f} us   loss {r['hccl_loss_pct']:6.1f}%  "
                      f"({wall:.2f} s)", flush=True)
    return rows


def plot(rows, ops, servers_list, sizes, path):
    fig, axes = plt.subplots(len(ops), 3, figsize=(17, 4.2 * len(ops)), squeeze=False)
    for i, op in enumerate(ops):
        sub = [r for r in rows if r["op"] == op]
        for j, (key, title) in enumerate((("hccl_algo", "hccl policy picks"), ("model_algo", "model policy picks"))):
            ax = axes[i][j]
            grid = np.full((len(servers_list), len(sizes)), np.nan)
            for r in sub:
                grid[servers_list.index(r["servers"]), sizes.index(r["bytes"])] = ALGOS.index(r[key])
            cmap = matplotlib.colors.ListedColormap([COLORS[a] for a in ALGOS])
            ax.imshow(grid, aspect="auto", origin="lower", cmap=cmap, vmin=-0.5, vmax=len(ALGOS) - 0.5)
            ax.set_title(f"{op}: {title}")
            _axes(ax, servers_list, sizes)
        ax = axes[i][2]
        loss = np.full((len(servers_list), len(sizes)), np.nan)
        for r in sub:
            loss[servers_list.index(r["servers"]), sizes.index(r["bytes"])] = r["hccl_loss_pct"]
        im = ax.imshow(loss, aspect="auto", origin="lower", cmap="Reds", vmin=0)
        ax.set_title(f"{op}: time HCCL's rule loses vs model (%)")
        _axes(ax, servers_list, sizes)
        fig.colorbar(im, ax=ax)
    handles = [matplotlib.patches.Patch(color=COLORS[a], label=a) for a in ALGOS]
    fig.legend(handles=handles, loc="upper center", ncol=len(ALGOS))
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=110)


def _axes(ax, servers_list, sizes):
    ax.set_yticks(range(len(servers_list)), [str(s) for s in servers_list])
    ax.set_xticks(range(len(sizes)), [_fmt(s) for s in sizes], rotation=60)
    ax.set_ylabel("servers (x8 NPUs)")
    ax.set_xlabel("size")


def _fmt(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--ops", nargs="+", default=["allreduce", "allgather"])
    args = ap.parse_args()
    if args.quick:
        servers_list, sizes = [2, 3, 8, 33], [8, 64 << 10, 16 << 20, 1 << 30]
    else:
        servers_list = [2, 3, 4, 5, 8, 12, 16, 32, 64, 100, 128, 256, 512]
        sizes = [8 << (3 * k) for k in range(10)] + [4 << 30]       # 8 B, 64 B, ..., 1 GiB, 4 GiB
    OUT.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    rows = run(args.ops, servers_list, sizes)
    with open(OUT / "algorithm_crossovers.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.ops, servers_list, sizes, OUT / "algorithm_crossovers.png")
    for op in args.ops:
        sub = [r for r in rows if r["op"] == op]
        worse = [r for r in sub if r["hccl_loss_pct"] > 0.5]
        print(f"# {op}: HCCL's rule within 0.5% of the model's choice in {len(sub) - len(worse)}/{len(sub)} cases; "
              f"median loss {np.median([r['hccl_loss_pct'] for r in sub]):.1f}%, "
              f"max {max(r['hccl_loss_pct'] for r in sub):.1f}%")
    print(f"# total wall time {time.perf_counter() - t0:.1f} s; table {OUT / 'algorithm_crossovers.csv'}; "
          f"plot {OUT / 'algorithm_crossovers.png'}")


if __name__ == "__main__":
    main()
