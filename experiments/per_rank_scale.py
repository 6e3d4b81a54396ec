"""Wall time of the local engine's two data planes as ranks grow: "central" (the default, the
central data program) against "threads" (the per-rank executor over the in-process transport,
one thread per rank, the executor every engine whose ranks share no memory uses).

Each cell runs one job of REPS back-to-back calls of one op on a small int32 input (the
per-step hand-offs dominate, not the bytes) and times the calls on rank 0 after a warm-up
call; the job is repeated --runs times and we report the median per-call wall time. With
`--measure job`, each job is one call and we report the median wall time of the whole
`hccl_sim.run` (threads started, communicators made, the op planned and run), as a user who
times one op meets it. Every result is checked against its exact integer value. Ops: ReduceScatter, AllReduce, AllGather,
AlltoAll and an all-pairs BatchSendRecv (every rank sends to and receives from every other).
Topologies: HCCL's shapes, Atlas 800T A2 servers of 8 NPUs (16-256 ranks) or Atlas 900 A3
servers of 16 dies (--preset atlas900-a3).

    cd <worktree> && PYTHONPATH=$PWD python experiments/per_rank_scale.py
    python experiments/per_rank_scale.py --ranks 64 128 --ops reduce_scatter --planes threads --runs 3
"""
import argparse
import statistics
import time

import numpy as np

import hccl_sim

OPS = ("reduce_scatter", "all_reduce", "all_gather", "all_to_all", "batch_send_recv")
PER_RANK = {"atlas800t-a2": 8, "atlas900-a3": 16}


def one_call(comm, op: str, count: int):
    """One call of `op` on a verifiable int32 input; raises AssertionError on a wrong result."""
    p, r = comm.size, comm.rank
    if op == "batch_send_recv":
        items = [("send", peer, np.full(count, r * p + peer, np.int32)) for peer in range(p) if peer != r]
        items += [("recv", peer, ((count,), np.int32)) for peer in range(p) if peer != r]
        got = comm.batch_send_recv(items)
        assert all(np.all(g == peer * p + r) for g, peer in zip(got, (q for q in range(p) if q != r)))
        return
    block = count // p or 1
    n = block * p
    x = np.arange(n, dtype=np.int32) + r
    if op == "reduce_scatter":
        y = comm.reduce_scatter(x, op="sum")
        want = p * np.arange(r * block, (r + 1) * block, dtype=np.int32) + p * (p - 1) // 2
    elif op == "all_reduce":
        y = comm.all_reduce(x, op="sum")
        want = p * np.arange(n, dtype=np.int32) + p * (p - 1) // 2
    elif op == "all_gather":
        y = comm.all_gather(x[:block])
        want = (np.arange(block, dtype=np.int32)[None, :] + np.arange(p, dtype=np.int32)[:, None]).reshape(-1)
    else:                                                  # all_to_all: block j of rank i holds i*n + j
        y = comm.all_to_all(np.repeat(np.arange(p, dtype=np.int32) + r * p, block))
        want = np.repeat(np.arange(p, dtype=np.int32) * p + r, block)
    assert np.array_equal(y, want), f"{op}: wrong result on rank {r}"


def job(comm, op: str, count: int, reps: int):
    """A warm-up call, then `reps` timed calls; rank 0's seconds per call."""
    one_call(comm, op, count)
    t0 = time.perf_counter()
    for _ in range(reps):
        one_call(comm, op, count)
    return (time.perf_counter() - t0) / reps


def one_op_job(comm, op: str, count: int):
    one_call(comm, op, count)


def cell(preset: str, ranks: int, op: str, plane: str, count: int, reps: int, runs: int, timeout_s: int,
         measure: str):
    """Median seconds per call (or per one-call job) over `runs` jobs (None: a job failed; its
    error is printed)."""
    topo = hccl_sim.topology(preset, servers=ranks // PER_RANK[preset])
    env = {"HCCL_EXEC_TIMEOUT": str(timeout_s)}
    times = []
    for _ in range(runs):
        try:
            if measure == "job":
                t0 = time.perf_counter()
                hccl_sim.run(one_op_job, topology=topo, args=(op, count), env=env, data_plane=plane)
                times.append(time.perf_counter() - t0)
            else:
                times.append(hccl_sim.run(job, topology=topo, args=(op, count, reps), env=env, data_plane=plane)[0])
        except hccl_sim.HcclError as exc:
            print(f"  {op} {ranks} ranks on {plane}: {exc.code}: {str(exc)[:200]}", flush=True)
            return None
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="atlas800t-a2", choices=sorted(PER_RANK))
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 128, 256])
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--planes", nargs="+", default=["central", "threads"], choices=["central", "threads"])
    ap.add_argument("--count", type=int, default=200, help="elements per rank's input (per peer: BatchSendRecv)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per job")
    ap.add_argument("--runs", type=int, default=3, help="jobs per cell (the median is reported)")
    ap.add_argument("--timeout", type=int, default=120, help="HCCL_EXEC_TIMEOUT of each job, s")
    ap.add_argument("--measure", default="call", choices=["call", "job"],
                    help="call: ms per call in a job of --reps calls; job: ms of a whole one-call job")
    args = ap.parse_args()
    calls = f"{args.reps} calls per job" if args.measure == "call" else "one call per job, the job's wall time"
    print(f"preset {args.preset}, {args.count} int32 per rank, {calls}, median of {args.runs} jobs")
    header = "| ranks | op | " + " | ".join(f"{p} (ms/{args.measure})" for p in args.planes)
    header += " | threads / central |" if len(args.planes) == 2 else " |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for ranks in args.ranks:
        for op in args.ops:
            got = [cell(args.preset, ranks, op, plane, args.count, args.reps, args.runs, args.timeout, args.measure)
                   for plane in args.planes]
            row = [f"{t * 1e3:.1f}" if t is not None else "failed" for t in got]
            if len(got) == 2:
                row.append(f"{got[1] / got[0]:.1f}x" if None not in got else "")
            print(f"| {ranks} | {op} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
