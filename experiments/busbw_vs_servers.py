"""Simulated busbw against the number of servers (1..512) for every level1 algorithm, on the 910B
(atlas800t-a2), 910A (atlas800-910a) and A3 (atlas900-a3) presets.

Payload-free (`hccl_sim.simulate`): for each preset, servers in 1, 2, 4, ..., 512 and each
algorithm the algorithm registry lists for level1 (ring, H-D_R, NHR, NB, pipeline), the op is
priced with that algorithm at level1 and HCCL's own choice is priced beside it. Where HCCL runs
something else for the requested token (pipeline on 910A -> H-D_R; H-D_R on A3 -> NHR) the cell
names what ran and the curve leaves the point out; where HCCL refuses (pipeline on A3) the cell
says so. One server has no level1: that point is level0 alone, the same for every algorithm.
A3: one superpod of N servers (16 dies each), so level1 spans every server; a real superpod has
at most 48 servers (CloudMatrix384), so points past 48 are what the model says of a larger UB
domain. Writes experiments/out/busbw_vs_servers.md and .png and prints the regenerating command.

    python experiments/busbw_vs_servers.py                      # AllReduce, 64 MiB
    python experiments/busbw_vs_servers.py --bytes 1M 1G --op allgather --max-servers 64
"""
import argparse
import shlex
import sys
import time
from pathlib import Path

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt      # noqa: E402

import hccl_sim                      # noqa: E402
from hccl_sim.algorithms import registry   # noqa: E402
from hccl_sim.tools.bench import parse_size      # noqa: E402
from topologies.errors import HcclError    # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
PRESETS = {"atlas800t-a2": "910B (Atlas 800T A2)", "atlas800-910a": "910A (Atlas 800)",
           "atlas900-a3": "A3 (Atlas 900 A3 SuperPoD, 1 superpod)"}
COLORS = {"ring": "#4c72b0", "H-D_R": "#dd8452", "NHR": "#55a868", "NB": "#c44e52", "pipeline": "#8172b3"}
# H-D_R, NHR and NB often coincide (NHR is H-D on a power of two): markers and dashes keep each visible
STYLES = {"ring": ("o", "-", 4), "H-D_R": ("s", "-", 7), "NHR": ("^", "--", 5), "NB": ("x", ":", 6),
          "pipeline": ("D", "-", 4)}


def level1(label: str):
    """The level1 token of an Estimate's .algo ("level0:fullmesh;level1:NHR (note)" -> "NHR")."""
    if "level1:" not in label:
        return None
    return label.split("level1:")[1].split(";")[0].split(" ")[0]


def human(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def sweep(preset, op, nbytes, servers_list, algos):
    """One row per server count: {algo: (busbw, ran) or (None, reason)}, HCCL's choice, wall."""
    rows = []
    for m in servers_list:
        topo = hccl_sim.topology(preset, servers=m)
        t0 = time.perf_counter()
        cells = {}
        for a in algos:
            try:
                est = hccl_sim.simulate(op, nbytes, topology=topo, algo=a)
            except HcclError as exc:
                if exc.code != "E_NOT_SUPPORT":
                    raise
                cells[a] = (None, "not run by HCCL")
                continue
            ran = level1(est.algo)
            cells[a] = (est.busbw, a if m == 1 else ran, est.time)
        best = hccl_sim.simulate(op, nbytes, topology=topo)
        rows.append({"servers": m, "ranks": topo.num_ranks, "cells": cells, "hccl": (best.busbw, level1(best.algo) or
                                                                                   best.algo, best.time),
                     "wall": time.perf_counter() - t0})
        print(f"  {preset} {human(nbytes)} {m:4d} servers: "
              + "  ".join(f"{a} {c[0]:.2f}" if c[0] is not None else f"{a} -" for a, c in cells.items())
              + f"  | hccl {rows[-1]['hccl'][1]} {best.busbw:.2f} GB/s ({rows[-1]['wall']:.2f} s)", flush=True)
    return rows


def table(preset, op, nbytes, rows, algos):
    lines = [f"### {PRESETS[preset]}: {op} {human(nbytes)}, simulated busbw (GB/s) by level1 algorithm", "",
             "| servers | ranks | " + " | ".join(algos) + " | HCCL's choice | wall (s) |",
             "|---|---|" + "---|" * len(algos) + "---|---|"]
    for r in rows:
        cells = []
        for a in algos:
            c = r["cells"][a]
            if c[0] is None:
                cells.append(c[1])
            elif r["servers"] == 1:
                cells.append(f"{c[0]:.2f}")
            elif c[1] != a:
                cells.append(f"{c[0]:.2f} (ran {c[1]})")
            else:
                cells.append(f"{c[0]:.2f}")
        h = r["hccl"]
        choice = f"level0 only ({h[1]}) {h[0]:.2f}" if r["servers"] == 1 else f"{h[1]} {h[0]:.2f}"
        lines.append(f"| {r['servers']} | {r['ranks']} | " + " | ".join(cells) + f" | {choice} | {r['wall']:.2f} |")
    return lines


def plot(results, op, sizes, algos, presets, path):
    fig, axes = plt.subplots(len(sizes), len(presets), figsize=(5.6 * len(presets), 4.2 * len(sizes)),
                             squeeze=False)
    for i, nbytes in enumerate(sizes):
        for j, preset in enumerate(presets):
            ax = axes[i][j]
            rows = results[(preset, nbytes)]
            for a in algos:
                pts = [(r["servers"], r["cells"][a][0]) for r in rows
                       if r["cells"][a][0] is not None and (r["servers"] == 1 or r["cells"][a][1] == a)]
                if len(pts) > 1:
                    marker, line, size = STYLES.get(a, ("o", "-", 4))
                    ax.plot(*zip(*pts), marker=marker, ls=line, ms=size, color=COLORS.get(a), label=a,
                            mfc="none" if marker in "s^" else None)
            ax.plot([r["servers"] for r in rows], [r["hccl"][0] for r in rows], "k--", lw=1, label="HCCL's choice")
            ax.set_xscale("log", base=2)
            ax.set_xticks([r["servers"] for r in rows], [str(r["servers"]) for r in rows])
            ax.set_xlabel("servers")
            ax.set_ylabel("simulated busbw (GB/s)")
            ax.set_title(f"{PRESETS[preset]}\n{op} {human(nbytes)}", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", default="allreduce", choices=["allreduce", "allgather", "reducescatter"])
    ap.add_argument("--bytes", nargs="+", default=["64M"], help="sizes as nccl-tests counts them (K/M/G)")
    ap.add_argument("--max-servers", type=int, default=512, help="servers 1, 2, 4, ... up to this")
    ap.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    ap.add_argument("--out", default=str(OUT / "busbw_vs_servers"), help="path without extension (.md, .png)")
    args = ap.parse_args(argv)
    if args.max_servers < 1:
        raise SystemExit("--max-servers must be >= 1")
    sizes = [parse_size(s) for s in args.bytes]
    servers_list = [1 << k for k in range(args.max_servers.bit_length()) if 1 << k <= args.max_servers]
    algos = registry.supporting(args.op, "level1")
    command = "python experiments/busbw_vs_servers.py " + " ".join(shlex.quote(a) for a in
                                                                  (sys.argv[1:] if argv is None else argv))
    t0 = time.perf_counter()
    results, lines = {}, [f"# Simulated busbw vs servers, every level1 algorithm ({', '.join(algos)})", ""]
    for nbytes in sizes:
        for preset in args.presets:
            results[(preset, nbytes)] = sweep(preset, args.op, nbytes, servers_list, algos)
            lines += table(preset, args.op, nbytes, results[(preset, nbytes)], algos) + [""]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(results, args.op, sizes, algos, args.presets, out.with_suffix(".png"))
    lines += [f"busbw uses nccl-tests' factors; total wall {time.perf_counter() - t0:.1f} s.", "",
              f"Regenerate: `{command.strip()}`", ""]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out.with_suffix('.md')} and {out.with_suffix('.png')}\nregenerate with: {command.strip()}")
    return results


if __name__ == "__main__":
    main()
