"""Wall time of an AllReduce on hccl-sim's local engine against mpi4py + MPICH, same machine, same run.

For each size and rank count: run the op N times on the local engine (real data, verified) and
under `mpiexec -n P` with mpi4py's Allreduce on the same data, and report median wall time,
busbw (nccl-tests' 2(p-1)/p factor, GB = 1e9 B) and the ratio. Medians, because these machines
are noisy.

    python experiments/local_vs_mpich.py                 # 8 ranks, 64 MiB float32 (the issue's case)
    python experiments/local_vs_mpich.py --ranks 2 4 8 --sizes 8 1M 64M
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import hccl_sim
from hccl_sim.tools.bench import parse_size
from hccl_sim.collectives import expected
from hccl_sim.collectives.verifiable import rank_input

HERE = Path(__file__).resolve().parent


def local_walls(p, nbytes, iters, warmup, topology, algo):
    topo = hccl_sim.topology(topology, ranks=p) if topology in ("fullmesh", "ring") else hccl_sim.topology(topology)
    count = nbytes // 4

    def fn(comm):
        x = rank_input(comm.rank, count, "float32")
        walls = []
        for i in range(warmup + iters):
            comm.barrier()
            t0 = time.perf_counter()
            y = comm.all_reduce(x, algo=algo)
            walls.append(time.perf_counter() - t0)
        ok = np.array_equal(y, expected("allreduce", comm.rank, p, count, "float32"))
        return walls[warmup:], ok, comm.last_op
    res = hccl_sim.run(fn, topology=topo)
    walls = np.max([r[0] for r in res], axis=0).tolist()
    return walls, all(r[1] for r in res), res[0][2]


def mpich_walls(p, nbytes, iters, warmup, back_to_back=False):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = ["mpiexec", "-n", str(p), sys.executable, str(HERE / "mpi_allreduce_peer.py"),
           "--bytes", str(nbytes), "--iters", str(iters), "--warmup", str(warmup)]
    if back_to_back:
        cmd.append("--back-to-back")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"mpiexec failed: {out.stderr.strip()[-500:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data["walls"], data["correct"]


def busbw(nbytes, p, seconds):
    return nbytes / seconds / 1e9 * 2 * (p - 1) / p if seconds > 0 and p > 1 else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8])
    ap.add_argument("--sizes", nargs="+", default=["64M"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--topology", default="atlas800t-a2", help="local engine topology (8 ranks for atlas800t-a2)")
    ap.add_argument("--algo", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print(f"# {'ranks':>5} {'size(B)':>10} {'engine':>16} {'median(us)':>11} {'busbw(GB/s)':>11} {'correct':>7} "
          f"{'ratio':>6}")
    for p in args.ranks:
        topology = args.topology if p == 8 or args.topology in ("fullmesh", "ring") else "fullmesh"
        for size in args.sizes:
            nbytes = parse_size(size)
            lw, lok, op = local_walls(p, nbytes, args.iters, args.warmup, topology, args.algo)
            mw, mok = mpich_walls(p, nbytes, args.iters, args.warmup)
            lmed, mmed = statistics.median(lw), statistics.median(mw)
            ratio = mmed / lmed
            rows.append({"ranks": p, "bytes": nbytes, "topology": topology, "algo": op.algo,
                         "local_median_s": lmed, "mpich_median_s": mmed,
                         "local_busbw": busbw(nbytes, p, lmed), "mpich_busbw": busbw(nbytes, p, mmed),
                         "speedup": ratio, "local_correct": lok, "mpich_correct": mok,
                         "local_walls": lw, "mpich_walls": mw, "simulated_time_s": op.time})
            print(f"  {p:5d} {nbytes:10d} {'hccl-sim local':>16} {lmed * 1e6:11.1f} {busbw(nbytes, p, lmed):11.2f} "
                  f"{str(lok):>7} {ratio:6.2f}  ({op.algo}; simulated {op.time * 1e6:.1f} us on {topology})")
            print(f"  {p:5d} {nbytes:10d} {'mpi4py+MPICH':>16} {mmed * 1e6:11.1f} {busbw(nbytes, p, mmed):11.2f} "
                  f"{str(mok):>7}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
