"""Wall time and memory of the payload-free timing engine as the rank count grows from 8 to 1,048,576.

Each case runs in a fresh process (so peak RSS is the case's own) and reports the wall time of
`hccl_sim.simulate` (topology construction separately), the process's peak resident memory, and
the op's transfers (every transfer of every step of every buffer loop) per second of wall time:
- `hierarchy`: a 1 GiB AllReduce with HCCL's own choice on N/8 Atlas 800T A2 servers (HCCL's
  hierarchy);
- `flat-ring`: a 1 GiB flat ring AllReduce on a synthetic ring of N ranks, and the same ring at
  10^9 bytes, whose chunks do not divide evenly (`--uneven`, on by default);
- `a3`: a 1 GiB AllReduce with HCCL's own choice on N Atlas 900 A3 dies, `--superpods` superpods
  (64 by default: the shape of the Ascend 950 SuperCluster's 64 SuperPoDs, 8,192 NPUs each at
  524,288) of N / 16 / superpods servers each (HCCL's three levels).
`--kinds` picks them (hierarchy and flat-ring by default).

Writes experiments/out/timing_scale.md (table), .png (wall, peak RSS and transfers per second
against ranks) and .json, and prints the command that regenerates them. Peak RSS includes the
interpreter with numpy, networkx and hccl_sim imported (~60 MB before any topology).

    python experiments/timing_scale.py                       # 8 .. 131,072 ranks (a few minutes)
    python experiments/timing_scale.py --ranks 1024 16384 --uneven 0
    python experiments/timing_scale.py --ranks 131072 524288 1048576 --kinds hierarchy a3 --uneven 0
"""
import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"

CASE = r"""
import json, resource, sys, time
import hccl_sim
kind, ranks, nbytes, superpods = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
if kind == "hierarchy":
    topo = hccl_sim.topology("atlas800t-a2", servers=ranks // 8)
    algo = None
elif kind == "a3":
    topo = hccl_sim.topology("atlas900-a3", superpods=superpods, servers=ranks // 16 // superpods)
    algo = None
else:
    topo = hccl_sim.topology("ring", ranks=ranks, bandwidth=25e9, latency=5e-6)
    algo = "ring"
t1 = time.perf_counter()
est = hccl_sim.simulate("allreduce", nbytes, topology=topo, algo=algo)
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
# transfers the op prices: every step of every buffer loop, counted after the clock stopped from
# the same plan (served from the cost model's caches)
from hccl_sim import collectives
from hccl_sim.plan import planner
from hccl_sim.config.env import Config
shape = collectives.get("allreduce").input_shape_for_bytes(nbytes, ranks, 4)
plan = planner.make_plan(planner.Signature("allreduce", shape, "float32", "sum", None, algo), topo,
                         Config.from_env(None, None), [0] * ranks, 4)
from hcomm.program import counts


def transfers_of(st):
    # a step placed on groups is its base step's transfers in every group; a compacted timing
    # view's entries stand for counts() transfers each
    if st.groups:
        return sum(len(part.ranks) * transfers_of(part.base) for part in st.groups)
    v = st.timing()
    return len(v.t_src) if counts(v) is None else int(counts(v).sum())


per_program = {n: sum(transfers_of(st) for st in prog) for n, prog in plan.programs.items()}
transfers = sum(per_program[b - a] for a, b in plan.loops)
print(json.dumps({"kind": kind, "ranks": ranks, "bytes": nbytes, "algo": est.algo, "sim_time_s": est.time,
                  "busbw": est.busbw, "topology_s": t1 - t0, "simulate_s": t2 - t1, "peak_rss_mb": rss,
                  "transfers": transfers, "transfers_per_s": transfers / (t2 - t1)}))
"""


KINDS = {"hierarchy": "HCCL's choice, 910B servers", "flat-ring": "flat ring, synthetic ring",
         "a3": "HCCL's choice, A3 superpods"}


def human(nbytes):
    if nbytes % (1 << 30) == 0:
        return f"{nbytes >> 30} GiB"
    return f"{nbytes:.0e} B".replace("+0", "").replace("+", "")


def rate(per_s):
    return f"{per_s / 1e6:.1f} M" if per_s >= 1e6 else f"{per_s / 1e3:.0f} k"


def table(rows):
    lines = ["| case | ranks | algorithm | simulated (ms) | topology (s) | simulate (s) | peak RSS (MB) "
             "| transfers | transfers priced / s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {KINDS[r['kind']]}, {human(r['bytes'])} | {r['ranks']:,} | {r['algo']} | "
                     f"{r['sim_time_s'] * 1e3:.3f} | {r['topology_s']:.2f} | {r['simulate_s']:.2f} | "
                     f"{r['peak_rss_mb']:.0f} | {r['transfers']:,} | {rate(r['transfers_per_s'])} |")
    return lines


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    cases = sorted({(r["kind"], r["bytes"]) for r in rows}, key=lambda c: (list(KINDS).index(c[0]), c[1]))
    for kind, nbytes in cases:
        sub = sorted((r for r in rows if (r["kind"], r["bytes"]) == (kind, nbytes)), key=lambda r: r["ranks"])
        x = [r["ranks"] for r in sub]
        label = f"{KINDS[kind]}, {human(nbytes)}"
        axes[0].plot(x, [r["simulate_s"] for r in sub], "o-", ms=3, label=label)
        axes[1].plot(x, [r["peak_rss_mb"] for r in sub], "o-", ms=3, label=label)
        axes[2].plot(x, [r["transfers_per_s"] for r in sub], "o-", ms=3, label=label)
    for ax, ylabel in zip(axes, ("wall of simulate (s)", "peak RSS of the process (MB)",
                                 "transfers priced per second of wall")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({r["ranks"] for r in rows})
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks], rotation=45, fontsize=7)
        ax.set_xlabel("ranks")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("payload-free timing engine (hccl_sim.simulate, AllReduce), one fresh process per point")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128, 512, 2048, 8192, 32768, 131072])
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--kinds", nargs="+", choices=list(KINDS), default=["hierarchy", "flat-ring"])
    ap.add_argument("--superpods", type=int, default=64, help="superpods of the a3 case")
    ap.add_argument("--uneven", type=int, default=10 ** 9, help="bytes of the uneven flat-ring case (0: skip)")
    ap.add_argument("--out", default=str(OUT / "timing_scale"), help="path without extension (.md, .png, .json)")
    args = ap.parse_args()
    bad = [r for r in args.ranks if r < 8 or r % 8]
    if bad and "hierarchy" in args.kinds:
        raise SystemExit(f"--ranks {bad}: the hierarchy case needs whole 910B servers (multiples of 8)")
    per_pod = 16 * args.superpods
    bad = [r for r in args.ranks if r % per_pod]
    if bad and "a3" in args.kinds:
        raise SystemExit(f"--ranks {bad}: the a3 case needs whole 16-die servers in each of {args.superpods} "
                         f"superpods (multiples of {per_pod})")
    command = "python experiments/timing_scale.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"# {'kind':10s} {'ranks':>6s} {'bytes':>10s} {'algo':28s} {'simulated':>12s} {'busbw':>7s} {'topology':>9s} "
          f"{'simulate':>9s} {'peak RSS':>9s} {'transfers/s':>11s}")
    cases = [(kind, nbytes) for kind in KINDS if kind in args.kinds
             for nbytes in [args.bytes] + ([args.uneven] if kind == "flat-ring" and args.uneven else [])]
    t0 = time.perf_counter()
    for kind, nbytes in cases:
        for ranks in args.ranks:
            out = subprocess.run([sys.executable, "-c", CASE, kind, str(ranks), str(nbytes), str(args.superpods)],
                                 capture_output=True, text=True, timeout=1800)
            if out.returncode:
                raise RuntimeError(f"{kind} {ranks} ranks failed: {out.stderr.strip()[-800:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"  {kind:10s} {ranks:6d} {nbytes:10d} {r['algo']:28s} {r['sim_time_s'] * 1e3:10.3f}ms "
                  f"{r['busbw']:7.2f} {r['topology_s']:8.2f}s {r['simulate_s']:8.2f}s {r['peak_rss_mb']:7.0f}MB "
                  f"{r['transfers_per_s'] / 1e6:9.1f} M", flush=True)
    lines = [f"# The timing engine from {min(args.ranks):,} to {max(args.ranks):,} ranks (AllReduce, fresh process "
             "per point)", ""] + table(rows)
    lines += ["", f"Total wall {time.perf_counter() - t0:.0f} s. Regenerate: `{command.strip()}`", ""]
    out_path.with_suffix(".json").write_text(json.dumps(rows, indent=2))
    out_path.with_suffix(".md").write_text("\n".join(lines))
    plot(rows, out_path.with_suffix(".png"))
    print("\n".join(lines))
    print(f"wrote {out_path.with_suffix('.md')} and {out_path.with_suffix('.png')}\nregenerate with: {command.strip()}")


if __name__ == "__main__":
    main()
