"""Wall time and memory of the payload-free timing engine as the rank count grows to 131,072.

Each case runs in a fresh process (so peak RSS is the case's own) and reports the wall time of
`hccl_sim.simulate` (topology construction separately), the process's peak resident memory, and
the op's transfers (every transfer of every step of every buffer loop) per second of wall time:
- a 1 GiB AllReduce with HCCL's own choice on N/8 Atlas 800T A2 servers (HCCL's hierarchy);
- a 1 GiB flat ring AllReduce on a synthetic ring of N ranks;
- the same ring at 10^9 bytes, whose chunks do not divide evenly (`--uneven`, on by default).

    python experiments/timing_scale.py                       # 1,024 .. 131,072 ranks
    python experiments/timing_scale.py --ranks 1024 16384
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"

CASE = r"""
import json, resource, sys, time
import hccl_sim
kind, ranks, nbytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t0 = time.perf_counter()
if kind == "hierarchy":
    topo = hccl_sim.topology("atlas800t-a2", servers=ranks // 8)
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
from hccl_sim import collectives, planner
from hccl_sim.env import Config
shape = collectives.get("allreduce").input_shape_for_bytes(nbytes, ranks, 4)
plan = planner.make_plan(planner.Signature("allreduce", shape, "float32", "sum", None, algo), topo,
                         Config.from_env(None, None), [0] * ranks, 4)
from hcomm.program import counts
# a compacted timing view's entries stand for counts() transfers each
per_program = {n: sum(len(v.t_src) if counts(v) is None else int(counts(v).sum()) for v in (st.timing() for st in prog))
               for n, prog in plan.programs.items()}
transfers = sum(per_program[b - a] for a, b in plan.loops)
print(json.dumps({"kind": kind, "ranks": ranks, "bytes": nbytes, "algo": est.algo, "sim_time_s": est.time,
                  "busbw": est.busbw, "topology_s": t1 - t0, "simulate_s": t2 - t1, "peak_rss_mb": rss,
                  "transfers": transfers, "transfers_per_s": transfers / (t2 - t1)}))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072])
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--uneven", type=int, default=10 ** 9, help="bytes of the uneven flat-ring case (0: skip)")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    rows = []
    print(f"# {'kind':10s} {'ranks':>6s} {'bytes':>10s} {'algo':28s} {'simulated':>12s} {'busbw':>7s} {'topology':>9s} "
          f"{'simulate':>9s} {'peak RSS':>9s} {'transfers/s':>11s}")
    cases = [("hierarchy", args.bytes), ("flat-ring", args.bytes)] + ([("flat-ring", args.uneven)] if args.uneven else [])
    for kind, nbytes in cases:
        for ranks in args.ranks:
            out = subprocess.run([sys.executable, "-c", CASE, kind, str(ranks), str(nbytes)],
                                 capture_output=True, text=True, timeout=1800)
            if out.returncode:
                print(f"  {kind:10s} {ranks:6d} failed: {out.stderr.strip()[-300:]}")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"  {kind:10s} {ranks:6d} {nbytes:10d} {r['algo']:28s} {r['sim_time_s'] * 1e3:10.3f}ms "
                  f"{r['busbw']:7.2f} {r['topology_s']:8.2f}s {r['simulate_s']:8.2f}s {r['peak_rss_mb']:7.0f}MB "
                  f"{r['transfers_per_s'] / 1e6:9.1f} M", flush=True)
    (OUT / "timing_scale.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
