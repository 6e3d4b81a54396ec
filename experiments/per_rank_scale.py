"""Wall time of the local engine's two data planes as ranks grow: "central" (the default, the
central data program) against "threads" (the per-rank executor over the in-process transport,
one thread per rank, the executor every engine whose ranks share no memory uses).

Ops, on int32 inputs whose every result is checked against its exact value: ReduceScatter,
AllReduce, AllGather, AlltoAll and an all-pairs BatchSendRecv (every rank sends to and receives
from every other). `--count` is HCCL's count: AllReduce's vector, ReduceScatter's and AllGather's
block per rank, AlltoAll's and BatchSendRecv's block per peer. Topologies: HCCL's shapes, Atlas
800T A2 servers of 8 NPUs or (--preset atlas900-a3) Atlas 900 A3 servers of 16 dies.

Two measures:
- `job` (the default): one call per job, each job a fresh process, and the wall time of its whole
  `hccl_sim.run` (threads started, communicators made, the op planned and run, the ranks gone),
  as a user who times one op meets it; nothing is cached from an earlier job;
- `call`: one job of a warm-up call and --reps timed calls, timed on rank 0: the steady state.
Each cell is the median of --runs jobs.

    cd <worktree> && PYTHONPATH=$PWD python experiments/per_rank_scale.py
    python experiments/per_rank_scale.py --ranks 64 128 --ops reduce_scatter --measure call --runs 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

import hccl_sim

OPS = ("reduce_scatter", "all_reduce", "all_gather", "all_to_all", "batch_send_recv")
PER_SERVER = {"atlas800t-a2": 8, "atlas900-a3": 16}


def one_call(comm, op: str, count: int):
    """One call of `op` on a verifiable int32 input; raises AssertionError on a wrong result."""
    p, r = comm.size, comm.rank
    if op == "batch_send_recv":
        peers = [q for q in range(p) if q != r]
        items = [("send", q, np.full(count, r * p + q, np.int32)) for q in peers]
        got = comm.batch_send_recv(items + [("recv", q, ((count,), np.int32)) for q in peers])
        assert all(g[0] == q * p + r and g[-1] == q * p + r for g, q in zip(got, peers)), f"{op}: rank {r}"
        return
    if op == "reduce_scatter":
        y = comm.reduce_scatter(np.arange(count * p, dtype=np.int32) + r, op="sum")
        want = p * np.arange(r * count, (r + 1) * count, dtype=np.int32) + p * (p - 1) // 2
    elif op == "all_reduce":
        y = comm.all_reduce(np.arange(count, dtype=np.int32) + r, op="sum")
        want = p * np.arange(count, dtype=np.int32) + p * (p - 1) // 2
    elif op == "all_gather":
        y = comm.all_gather(np.arange(count, dtype=np.int32) + r)
        want = (np.arange(count, dtype=np.int32)[None, :] + np.arange(p, dtype=np.int32)[:, None]).reshape(-1)
    else:                                                  # all_to_all: block j of rank i holds i*p + j
        y = comm.all_to_all(np.repeat(np.arange(p, dtype=np.int32) + r * p, count))
        want = np.repeat(np.arange(p, dtype=np.int32) * p + r, count)
    assert np.array_equal(y, want), f"{op}: wrong result on rank {r}"


def timed_calls(comm, op: str, count: int, reps: int):
    """A warm-up call, then `reps` timed calls; rank 0's seconds per call."""
    one_call(comm, op, count)
    t0 = time.perf_counter()
    for _ in range(reps):
        one_call(comm, op, count)
    return (time.perf_counter() - t0) / reps


def topology(preset: str, ranks: int):
    return hccl_sim.topology(preset, servers=ranks // PER_SERVER[preset])


def one_job(spec: dict) -> float:
    """The wall seconds of one hccl_sim.run of one call (run in a fresh process: see `job`)."""
    topo = topology(spec["preset"], spec["ranks"])
    t0 = time.perf_counter()
    hccl_sim.run(one_call, topology=topo, args=(spec["op"], spec["count"]), env=spec["env"],
                 data_plane=spec["plane"])
    return time.perf_counter() - t0


def job(spec: dict) -> float:
    """one_job in a fresh process, so that no program, schedule or cost is cached from before."""
    got = subprocess.run([sys.executable, __file__, "--one-job", json.dumps(spec)], capture_output=True, text=True,
                         env=dict(os.environ), timeout=spec["wall_limit"])
    if got.returncode:
        raise RuntimeError(got.stderr.strip().splitlines()[-1] if got.stderr.strip() else f"exit {got.returncode}")
    return float(got.stdout.split()[-1])


def cell(args, ranks: int, op: str, plane: str):
    """Median seconds (per call, or per job) over --runs jobs; None when a job failed or ran past
    --wall-limit (printed)."""
    env = {"HCCL_EXEC_TIMEOUT": str(args.timeout)}
    spec = dict(preset=args.preset, ranks=ranks, op=op, plane=plane, count=args.count, env=env,
                wall_limit=args.wall_limit)
    times = []
    for _ in range(args.runs):
        try:
            if args.measure == "job":
                times.append(job(spec))
            else:
                times.append(hccl_sim.run(timed_calls, topology=topology(args.preset, ranks),
                                          args=(op, args.count, args.reps), env=env, data_plane=plane)[0])
        except subprocess.TimeoutExpired:
            print(f"  {op} {ranks} ranks on {plane}: no answer within {args.wall_limit} s", flush=True)
            return None
        except (hccl_sim.HcclError, RuntimeError) as exc:
            print(f"  {op} {ranks} ranks on {plane}: {str(exc)[:200]}", flush=True)
            return None
    return statistics.median(times)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--one-job":
        print(one_job(json.loads(sys.argv[2])))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="atlas800t-a2", choices=sorted(PER_SERVER))
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 128, 256])
    ap.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    ap.add_argument("--planes", nargs="+", default=["central", "threads"], choices=["central", "threads"])
    ap.add_argument("--count", type=int, default=200, help="HCCL's count (see the module docstring)")
    ap.add_argument("--measure", default="job", choices=["job", "call"])
    ap.add_argument("--reps", type=int, default=3, help="timed calls per job (--measure call)")
    ap.add_argument("--runs", type=int, default=3, help="jobs per cell (the median is reported)")
    ap.add_argument("--timeout", type=int, default=120, help="HCCL_EXEC_TIMEOUT of each job, s")
    ap.add_argument("--wall-limit", type=float, default=300, help="a one-call job still running after this is "
                    "reported as no answer, s (--measure job)")
    args = ap.parse_args()
    what = "wall of a one-call job in a fresh process" if args.measure == "job" else f"per call, {args.reps} per job"
    print(f"preset {args.preset}, count {args.count} int32, {what}, median of {args.runs} jobs")
    unit = "ms/job" if args.measure == "job" else "ms/call"
    header = "| ranks | op | " + " | ".join(f"{p} ({unit})" for p in args.planes)
    header += " | threads / central |" if len(args.planes) == 2 else " |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for ranks in args.ranks:
        for op in args.ops:
            got = [cell(args, ranks, op, plane) for plane in args.planes]
            row = [f"{t * 1e3:.1f}" if t is not None else "no answer" for t in got]
            if len(got) == 2:
                row.append(f"{got[1] / got[0]:.1f}x" if None not in got else "")
            print(f"| {ranks} | {op} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
