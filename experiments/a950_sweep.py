"""The Ascend 950 presets' simulated busbw and HCCL's choices: AllReduce, AllGather and AlltoAll on
one server (8 NPUs), one Atlas 950 SuperPoD (1,024 servers = 8,192 NPUs) and the SuperCluster (64
SuperPoDs = 524,288 NPUs), UNVALIDATED (no published 950 measurement; docs/references.md §3.5).

Each case runs `hccl_sim.simulate` in a fresh process with a wall-clock limit; a case that does
not finish in it is reported as such (AlltoAll's every-pair mesh grows as the square of the rank
count). `--modes` runs each case under those HCCL_OP_EXPANSION_MODE values (the CCU and AIV
engines, docs/references.md §6.14). Writes experiments/out/a950_sweep.md and .json (`--out`: another
name in experiments/out).

    python experiments/a950_sweep.py
    python experiments/a950_sweep.py --scales server superpod --sizes 1048576 --limit 120
    python experiments/a950_sweep.py --scales server servers2 --modes AICPU_TS CCU_MS CCU_SCHED AIV \
        --sizes 65536 1048576 16777216 --out a950_engines
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
SCALES = {"server": ("atlas950", {"servers": 1}), "servers2": ("atlas950", {"servers": 2}),
          "superpod": ("atlas950-superpod", {}), "supercluster": ("atlas950-supercluster", {})}
OPS = ("allreduce", "allgather", "alltoall")
SIZES = (1 << 20, 64 << 20, 1 << 30)

CASE = r"""
import json, resource, sys, time, warnings
warnings.simplefilter("ignore")
import logging; logging.disable(logging.WARNING)
import hccl_sim
preset, params, op, nbytes = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
env = {"HCCL_OP_EXPANSION_MODE": sys.argv[5]} if len(sys.argv) > 5 else None
topo = hccl_sim.topology(preset, **params)
t0 = time.perf_counter()
est = hccl_sim.simulate(op, nbytes, topology=topo, env=env)
wall = time.perf_counter() - t0
print(json.dumps({"ranks": topo.num_ranks, "algo": est.algo, "time_us": est.time * 1e6, "busbw": est.busbw,
                  "wall_s": wall, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(scale, op, nbytes, limit, mode=None):
    preset, params = SCALES[scale]
    t0 = time.perf_counter()
    case = {"scale": scale, "op": op, "bytes": nbytes, "mode": mode}
    try:
        out = subprocess.run([sys.executable, "-c", CASE, preset, json.dumps(params), op, str(nbytes)]
                             + ([mode] if mode else []), capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {**case, "error": f"no answer in {limit} s"}
    if out.returncode != 0:
        return {**case, "error": out.stderr.strip().splitlines()[-1]}
    row = json.loads(out.stdout.strip().splitlines()[-1])
    row.update(case, process_s=time.perf_counter() - t0)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", nargs="+", default=list(SCALES), choices=list(SCALES))
    ap.add_argument("--ops", nargs="+", default=list(OPS))
    ap.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    ap.add_argument("--limit", type=float, default=300.0, help="wall-clock seconds per case")
    ap.add_argument("--modes", nargs="+", default=[None], help="HCCL_OP_EXPANSION_MODE values (default: unset)")
    ap.add_argument("--out", default="a950_sweep", help="the output files' name in experiments/out")
    args = ap.parse_args(argv)
    rows = []
    for scale in args.scales:
        for op in args.ops:
            for nbytes in args.sizes:
                for mode in args.modes:
                    row = run(scale, op, nbytes, args.limit, mode)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / f"{args.out}.json").write_text(json.dumps(rows, indent=1))
    lines = ["| scale | ranks | op | bytes | mode | simulated | busbw (GB/s) | HCCL's choice | wall |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mode = r["mode"] or "(default)"
        if "error" in r:
            lines.append(f"| {r['scale']} | | {r['op']} | {r['bytes']} | {mode} | {r['error']} | | | |")
        else:
            lines.append(f"| {r['scale']} | {r['ranks']:,} | {r['op']} | {r['bytes']:,} | {mode} | {r['time_us']:.1f} us | "
                         f"{r['busbw']:.1f} | {r['algo']} | {r['wall_s']:.2f} s, {r['peak_rss_mb']:.0f} MB |")
    (OUT / f"{args.out}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nregenerate: python experiments/a950_sweep.py {' '.join(argv or sys.argv[1:])}")


if __name__ == "__main__":
    main()
