"""Latency of the shared-memory control plane (hcomm.control.shm) against mpi4py + MPICH, same run.

Each op, on p spawned processes: a barrier, then an 8-byte float32 AllReduce done as an allgather of
the 8 bytes plus a local sum (what the Ray engine will do for tiny ops). Per op the slowest rank's
time of the AllReduce (after the barrier), medians of --iters ops; MPICH runs the same pattern
(experiments/mpi_allreduce_peer.py: Barrier, then Allreduce, max over ranks). Also printed: the CPU
time all ranks spent per barrier + AllReduce, and the machine's load average (the machine is
shared: compare figures of one run, not across runs).

    python experiments/shm_control_bench.py                      # 2/4/8/16 processes
    python experiments/shm_control_bench.py --ranks 8 --yield-s 0 --spins 0   # wait variants
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from local_vs_mpich import mpich_walls  # noqa: E402

from hcomm.memory import segments as shm  # noqa: E402
from hcomm.control import shm as shm_control  # noqa: E402


def rank_main(session, rank, iters, warmup, spins, yield_s, results):
    if spins is not None:
        shm_control.SPINS = spins
    if yield_s is not None:
        shm_control.YIELD_S = yield_s
    block = shm_control.ControlBlock.attach(session, rank)
    x = np.full(2, rank + 1, dtype=np.float32)
    walls, totals = [], []
    seq = 0
    try:
        for i in range(warmup + iters):
            if i == warmup:
                cpu0 = time.process_time()
            deadline = time.monotonic() + 30
            t_barrier = time.perf_counter()
            block.barrier(seq, deadline)
            t0 = time.perf_counter()
            parts = block.allgather(seq + 1, x.tobytes(), deadline)
            y = np.frombuffer(b"".join(parts), dtype=np.float32).reshape(len(parts), -1).sum(axis=0)
            t1 = time.perf_counter()
            seq += 2
            walls.append(t1 - t0)
            totals.append(t1 - t_barrier)
        p = block.size
        ok = bool(np.array_equal(y, np.full(2, p * (p + 1) / 2, dtype=np.float32)))
        results.put((rank, walls[warmup:], totals[warmup:], ok, (time.process_time() - cpu0) / iters))
    finally:
        block.close()


def shm_walls(p, iters, warmup, spins=None, yield_s=None):
    """Per-op slowest-rank AllReduce times and barrier+AllReduce times of p processes."""
    ctx = mp.get_context("spawn")
    session = shm.new_session()
    owner = shm_control.ControlBlock.create(session, p, slot_bytes=64)
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(session, r, iters, warmup, spins, yield_s, results))
             for r in range(p)]
    try:
        for proc in procs:
            proc.start()
        got = {}
        for _ in procs:
            rank, walls, totals, ok, cpu = results.get(timeout=120)
            got[rank] = (walls, totals, ok, cpu)
        for proc in procs:
            proc.join(timeout=30)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        owner.close()
        shm.cleanup(session)
    walls = [max(got[r][0][i] for r in range(p)) for i in range(iters)]
    totals = [max(got[r][1][i] for r in range(p)) for i in range(iters)]
    return walls, totals, all(g[2] for g in got.values()), sum(g[3] for g in got.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--spins", type=int, default=None, help=f"sched_yield polls first (default {shm_control.SPINS})")
    ap.add_argument("--yield-s", type=float, default=None,
                    help=f"keep polling with sched_yield until a wait is this old (default {shm_control.YIELD_S})")
    ap.add_argument("--no-mpich", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    rows = []
    print(f"# load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# {'ranks':>5} {'shm allreduce(us)':>17} {'barrier+op(us)':>14} {'cpu/op(us)':>10} {'mpich(us)':>10} "
          f"{'ratio':>6} ok")
    for p in args.ranks:
        walls, totals, ok, cpu = shm_walls(p, args.iters, args.warmup, args.spins, args.yield_s)
        ours = statistics.median(walls) * 1e6
        row = {"ranks": p, "shm_us": ours, "shm_barrier_op_us": statistics.median(totals) * 1e6, "correct": ok,
               "cpu_us_per_op": cpu * 1e6}
        if not args.no_mpich:
            mwalls, mok = mpich_walls(p, 8, args.iters, args.warmup)
            row["mpich_us"] = statistics.median(mwalls) * 1e6
            row["ratio"] = ours / row["mpich_us"]
            row["correct"] = ok and mok
        rows.append(row)
        print(f"  {p:>5} {ours:>17.1f} {row['shm_barrier_op_us']:>14.1f} {cpu * 1e6:>10.1f} "
              f"{row.get('mpich_us', float('nan')):>10.1f} "
              f"{row.get('ratio', float('nan')):>6.2f} {row['correct']}", flush=True)
    print(f"# load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
