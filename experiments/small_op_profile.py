"""Where an 8-byte AllReduce's time goes on the Ray engine, rank by rank, against MPICH in the same run.

8 Ray rank actors on one node (one 910B server; the control round is the shared-memory block, the
op is eager: every input travels in it). Each run measures, on every rank:
- back to back: the mean wall time per op of `--ops` ops issued in a row;
- barrier-separated: 180 ops, each timed after a barrier, the slowest rank's time per op (median);
- CPU per op: the rank's thread CPU time over the back-to-back ops, split into the control round
  (GroupRounds.allgather and allgather_records, which a repeated op's lean path makes: the
  payload written, the wait for the peers, every payload read) and
  the rest (the call's checks, the plan, the rank's own result, the record);
- with `perf` on the machine: per op and rank, the actors' CPU time (task-clock, every thread),
  context switches, sched_yield and futex calls, over two seconds of back-to-back ops.
MPICH (mpi4py Allreduce, 8 processes, same machine) runs between the Ray runs, both ways.
Once per invocation it also checks that waiting ranks do not starve the rank they wait for (a
waiting rank polls with sched_yield for up to hcomm.control.shm.YIELD_S before it sleeps): rank
0 times about 1 ms of numpy work while its 7 peers wait for it in an AllReduce, against the same
work while they sleep (time.sleep), 40 times each, medians.

    python experiments/small_op_profile.py              # 5 runs
    python experiments/small_op_profile.py --runs 3 --ops 3000

To compare two builds in the same runs, run it in turns from each build's tree (a `git worktree`
of the other commit, this file copied into its experiments/, run there with PYTHONPATH=<that
tree>): the ranks then import that build.
Prints one line per run and the medians; writes experiments/out/small_op_profile.json.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

import numpy as np

import hccl_sim

from local_vs_mpich import mpich_walls

OUT = Path(__file__).resolve().parent / "out"
PERF_EVENTS = "task-clock,context-switches,syscalls:sys_enter_sched_yield,syscalls:sys_enter_futex"


def rank_profile(comm, ops, seconds):
    """One rank: back-to-back wall and thread CPU per op (inside the control round and outside),
    then `seconds` more of back-to-back ops (perf watches those), then 180 barrier-separated ops."""
    from hcomm.control.rounds import GroupRounds
    inside = [0.0]
    plain = {name: getattr(GroupRounds, name) for name in ("allgather", "allgather_records")}

    def timer(fn):
        def timed(self, *a):
            t = time.thread_time()
            try:
                return fn(self, *a)
            finally:
                inside[0] += time.thread_time() - t
        return timed
    x = np.full(2, comm.rank + 1, np.float32)
    for _ in range(50):
        comm.all_reduce(x)
    comm.barrier()
    for name, fn in plain.items():
        setattr(GroupRounds, name, timer(fn))
    try:
        c0, t0 = time.thread_time(), time.perf_counter()
        for _ in range(ops):
            y = comm.all_reduce(x)
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    finally:
        for name, fn in plain.items():
            setattr(GroupRounds, name, fn)
    ok = bool(np.all(y == comm.size * (comm.size + 1) / 2))
    # a stretch of back-to-back ops for perf: rank 0 says when to stop (every rank calls the same ops)
    end = time.perf_counter() + seconds
    while True:
        for _ in range(100):
            comm.all_reduce(x)
        if comm.all_reduce(np.array([time.perf_counter() > end], np.int32))[0]:
            break
    walls = []
    for _ in range(180):
        comm.barrier()
        t0 = time.perf_counter()
        comm.all_reduce(x)
        walls.append(time.perf_counter() - t0)
    return {"pid": os.getpid(), "b2b_us": wall / ops * 1e6, "cpu_us": cpu / ops * 1e6,
            "round_us": inside[0] / ops * 1e6, "walls": walls, "correct": ok}


def starvation(comm, reps=40):
    """Rank 0's ~1 ms of numpy work: (median time while the peers sleep, median while they wait
    for it in an AllReduce); None on the other ranks."""
    a = np.random.default_rng(0).random((160, 160))

    def work():
        t0 = time.perf_counter()
        for _ in range(6):
            a @ a
        return time.perf_counter() - t0
    x = np.ones(2, np.float32)
    comm.all_reduce(x)
    comm.barrier()
    alone, waited = [], []
    for _ in range(reps):
        if comm.rank == 0:
            alone.append(work())
        else:
            time.sleep(0.005)
        comm.barrier()
        if comm.rank == 0:
            waited.append(work())
        comm.all_reduce(x)            # the peers are in it, waiting for rank 0, while it works
        comm.barrier()
    return (statistics.median(alone), statistics.median(waited)) if comm.rank == 0 else None


def perf_counts(pids, seconds):
    """perf stat over `pids` for `seconds`: {event: count} (task-clock in ms), or None."""
    if shutil.which("perf") is None:
        return None
    out = subprocess.run(["perf", "stat", "-x", ",", "-e", PERF_EVENTS, "-p", ",".join(map(str, pids)), "--",
                          "sleep", str(seconds)], capture_output=True, text=True)
    got = {}
    for line in out.stderr.splitlines():
        f = line.split(",")
        if len(f) > 3 and f[0].replace(".", "").isdigit():
            got[f[2].split(":")[-1]] = float(f[0])
    return got or None


def one_run(cluster, pids, ops, seconds):
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("res", cluster.run(rank_profile, args=(ops, seconds + 1.5))))
    th.start()
    counts = None
    if pids:
        time.sleep(1.0 + ops * 500e-6)            # past the timed ops, inside the perf stretch
        counts = perf_counts(pids, seconds)
    th.join()
    res = box["res"]
    walls = np.max([r["walls"] for r in res], axis=0)
    row = {"b2b_us": max(r["b2b_us"] for r in res), "barrier_us": float(np.median(walls)) * 1e6,
           "cpu_us": [r["cpu_us"] for r in res], "round_us": [r["round_us"] for r in res],
           "correct": all(r["correct"] for r in res)}
    if counts:
        n_ops = seconds / (row["b2b_us"] * 1e-6) * len(res)      # rank-ops in the perf window
        row["perf_per_rank_op"] = {"cpu_us": counts.get("task-clock", 0) * 1e3 / n_ops,
                                   "switches": counts.get("context-switches", 0) / n_ops,
                                   "sched_yield": counts.get("sys_enter_sched_yield", 0) / n_ops,
                                   "futex": counts.get("sys_enter_futex", 0) / n_ops}
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ops", type=int, default=2000, help="back-to-back ops timed per run")
    ap.add_argument("--perf-seconds", type=float, default=2.0)
    ap.add_argument("--out", default=str(OUT / "small_op_profile.json"))
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        with hccl_sim.Cluster(hccl_sim.topology("atlas800t-a2"), engine="ray") as cluster:
            pids = [r["pid"] for r in cluster.run(rank_profile, args=(10, 0.0))]
            alone, waited = cluster.run(starvation)[0]
            print(f"rank 0's numpy work: {alone * 1e3:.2f} ms while its peers sleep, {waited * 1e3:.2f} ms while "
                  f"they wait for it in an AllReduce ({waited / alone:.2f}x)", flush=True)
            if shutil.which("perf") is None:
                pids = []
            for k in range(args.runs):
                row = one_run(cluster, pids, args.ops, args.perf_seconds)
                b2b, _ = mpich_walls(8, 8, args.ops, 20, back_to_back=True)
                sep, _ = mpich_walls(8, 8, 180, 20)
                row["mpich_b2b_us"], row["mpich_barrier_us"] = b2b[0] * 1e6, statistics.median(sep) * 1e6
                rows.append(row)
                p = row.get("perf_per_rank_op")
                print(f"run {k}: back to back {row['b2b_us']:.0f} us (MPICH {row['mpich_b2b_us']:.0f}), "
                      f"barrier-separated {row['barrier_us']:.0f} us (MPICH {row['mpich_barrier_us']:.0f}); per rank "
                      f"and op: thread CPU {statistics.median(row['cpu_us']):.1f} us, of it in the control round "
                      f"{statistics.median(row['round_us']):.1f} us"
                      + (f"; perf: CPU {p['cpu_us']:.1f} us, {p['switches']:.2f} switches, {p['sched_yield']:.2f} "
                         f"sched_yield, {p['futex']:.2f} futex" if p else "") + f"; correct {row['correct']}",
                      flush=True)
    finally:
        ray.shutdown()
    med = {k: statistics.median(r[k] for r in rows) for k in ("b2b_us", "barrier_us", "mpich_b2b_us",
                                                               "mpich_barrier_us")}
    print(f"medians of {len(rows)} runs: back to back {med['b2b_us']:.0f} us (MPICH {med['mpich_b2b_us']:.0f}), "
          f"barrier-separated {med['barrier_us']:.0f} us (MPICH {med['mpich_barrier_us']:.0f})")
    print("per rank, median over runs of thread CPU per op (us): "
          + ", ".join(f"rank {j} {statistics.median(r['cpu_us'][j] for r in rows):.0f} "
                      f"({statistics.median(r['round_us'][j] for r in rows):.0f} in the round)" for j in range(8)))
    OUT.mkdir(exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "medians": med,
                                          "starvation_ms": [alone * 1e3, waited * 1e3]}, indent=1))


if __name__ == "__main__":
    main()
