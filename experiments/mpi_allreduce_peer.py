"""The peer measurement: mpi4py + MPICH `Allreduce` on this machine (run under mpiexec).

Prints one JSON line from rank 0: per-iteration wall times (max over ranks) of an out-of-place
float32 SUM Allreduce on the same verifiable data hccl-sim uses, and whether the result was right.
"""
import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from hccl_sim.collectives import expected

from hccl_sim.collectives.verifiable import rank_input


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--back-to-back", action="store_true", help="time ops in a row, no barrier between them")
    args = ap.parse_args()
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    count = args.bytes // 4
    x = rank_input(rank, count, "float32")
    walls = []
    if args.back_to_back:
        y = np.empty_like(x)
        for i in range(args.warmup):
            comm.Allreduce(x, y, op=MPI.SUM)
        comm.Barrier()
        t0 = time.perf_counter()
        for i in range(args.iters):
            comm.Allreduce(x, y, op=MPI.SUM)
        per_op = comm.allreduce((time.perf_counter() - t0) / args.iters, op=MPI.MAX)
        if rank == 0:
            print(json.dumps({"ranks": p, "bytes": count * 4, "walls": [per_op], "correct": True}))
        return
    for i in range(args.warmup + args.iters):
        y = np.empty_like(x)        # out-of-place, a fresh result each time, as hccl-sim returns
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(x, y, op=MPI.SUM)
        dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= args.warmup:
            walls.append(dt)
    ok = bool(np.array_equal(y, expected("allreduce", rank, p, count, "float32")))
    ok = comm.allreduce(ok, op=MPI.LAND)
    if rank == 0:
        print(json.dumps({"ranks": p, "bytes": count * 4, "walls": walls, "correct": ok}))


if __name__ == "__main__":
    main()
