"""How close the local engine's AllReduce is to this machine's memory-traffic limit (issue 38's
third item), in one run: the engine's op, MPICH's, and numpy's copy and add rates measured beside
them.

The local engine runs an op's data program on every rank's arrays in place (threads of one
process, hcomm.exec.central): each move is a numpy copy (reads its bytes, writes them) or an add
(reads two operands, writes one). Two references, printed next to the measured op and MPICH's:
- its moves one by one at numpy's rates: the bytes its copies and adds touch, at the copy and add
  rates of the same slice size with as many threads as the machine has cores (the engine's
  workers), each move through memory; the executor's pieces (every move on a cache-sized piece
  before the next) beat it where moves meet in one place;
- the traffic floor: every input read once and every output written once, at the copy rate (no
  algorithm reads less; an 8-way sum in pairwise adds reads more).

    python experiments/local_memory_limit.py                  # 8 ranks, 64 MiB float32, 5 runs
    python experiments/local_memory_limit.py --runs 3 --bytes 16M
    python experiments/local_memory_limit.py --whole          # also the engine running whole shares

`--whole` times, in each run next to the default, the engine with its central shares run whole
(hcomm.exec.central.CHUNK_BYTES past the op's size): the executor before it ran shares a piece at a
time.
"""
import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

import hccl_sim
from hccl_sim.config.env import Config
from hccl_sim.plan.planner import Signature, make_plan
from hccl_sim.tools.bench import parse_size
from hcomm.exec import central

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_vs_mpich import busbw, local_walls, mpich_walls   # noqa: E402


def moved_bytes(topology: str, p: int, count: int, itemsize: int = 4):
    """(bytes copied, bytes of adds' operands and results) of the op's data program: a copy
    reads and writes its slice (2 x), an add reads two and writes one (3 x)."""
    topo = hccl_sim.topology(topology)
    sig = Signature("allreduce", (count,), "float32", "sum", None, None)
    plan = make_plan(sig, topo, Config(), [0] * p, itemsize)
    copied = added = 0
    for a, b, body in plan.data.loops:
        for s, sb, sl, sh, d, db, dl, dh, rb, rl, rh in body.moves:
            n = (dh - dl) * itemsize
            if rb < 0:
                copied += 2 * n
            else:
                added += 3 * n
    return copied, added, plan.algo


def rate(kind: str, piece: int, threads: int, span: int, reps: int = 3) -> float:
    """Bytes touched per second by `threads` threads each copying (2 x the bytes touched) or adding
    (3 x) slices of `piece` bytes, one after another through arrays of `span` bytes (as large as
    the op's own, so no cache holds them), median of `reps`."""
    n, k = piece // 4, max(span // piece, 1)
    arrays = [[np.ones(n * k, np.float32) for _ in range(3)] for _ in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def work(a, b, c):
        barrier.wait()
        for i in range(k):
            lo, hi = i * n, (i + 1) * n
            if kind == "copy":
                np.copyto(c[lo:hi], a[lo:hi])
            else:
                np.add(a[lo:hi], b[lo:hi], out=c[lo:hi])
        barrier.wait()
    walls = []
    for _ in range(reps):
        ts = [threading.Thread(target=work, args=arr) for arr in arrays]
        for t in ts:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        barrier.wait()
        walls.append(time.perf_counter() - t0)
        for t in ts:
            t.join()
    touched = (2 if kind == "copy" else 3) * n * 4 * k * threads
    return touched / statistics.median(walls)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--bytes", default="64M")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--topology", default="atlas800t-a2")
    ap.add_argument("--whole", action="store_true", help="also time the engine running whole shares")
    args = ap.parse_args()
    p, nbytes = args.ranks, parse_size(args.bytes)
    count = nbytes // 4
    cores = len(os.sched_getaffinity(0))
    copied, added, algo = moved_bytes(args.topology, p, count)
    piece = max(nbytes // p, 4)
    print(f"# {p} ranks, {nbytes:,} B float32 AllReduce ({algo}); {cores} cores; the engine's moves touch "
          f"{copied / 1e9:.2f} GB in copies and {added / 1e9:.2f} GB in adds a op")
    print(f"# {'run':>3} {'copy GB/s':>9} {'add GB/s':>9} {'moves ms':>14} {'floor ms':>16} "
          f"{'engine ms':>9} {'MPICH ms':>8} {'moves/engine':>12} {'floor/engine':>12} {'vs MPICH':>8}"
          + (f" {'whole ms':>8} {'whole vs MPICH':>14}" if args.whole else ""))
    for run in range(args.runs):
        span = p * nbytes // cores            # each thread through its share of the ranks' inputs
        copy_rate = rate("copy", piece, cores, span)
        add_rate = rate("add", piece, cores, span)
        moves_floor = copied / copy_rate + added / add_rate
        traffic_floor = 2 * p * nbytes / copy_rate
        walls, ok, _ = local_walls(p, nbytes, args.iters, 2, args.topology, None)
        mw, mok = mpich_walls(p, nbytes, args.iters, 2)
        eng, mpi = statistics.median(walls), statistics.median(mw)
        whole = ""
        if args.whole:
            pieces = central.CHUNK_BYTES
            central.CHUNK_BYTES = 1 << 62
            try:
                ww, wok, _ = local_walls(p, nbytes, args.iters, 2, args.topology, None)
            finally:
                central.CHUNK_BYTES = pieces
            ok = ok and wok
            w = statistics.median(ww)
            whole = f" {w * 1e3:8.1f} {busbw(nbytes, p, w) / busbw(nbytes, p, mpi):14.2f}"
        assert ok and mok, "a result was wrong"
        print(f"  {run:3d} {copy_rate / 1e9:9.2f} {add_rate / 1e9:9.2f} {moves_floor * 1e3:14.1f} "
              f"{traffic_floor * 1e3:16.1f} {eng * 1e3:9.1f} {mpi * 1e3:8.1f} {moves_floor / eng:12.2f} "
              f"{traffic_floor / eng:12.2f} {busbw(nbytes, p, eng) / busbw(nbytes, p, mpi):8.2f}{whole}", flush=True)


if __name__ == "__main__":
    main()
