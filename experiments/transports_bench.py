"""busbw of hcomm's transports: a float32 ring AllReduce run by the per-rank executor, ranks apart.

Planes: `socket` (8 spawned processes, direct TCP between ranks), `ray` (8 Ray actors on a two-node
Ray cluster made with ray.cluster_utils.Cluster, half the ranks on each node, payloads through the
object store), `ray-socket` (the same actors, payloads over direct sockets between them), `inprocess` (8 threads, zero-copy; for scale) and `mpich` (mpi4py's Allreduce under
mpiexec on the same data; for scale). Each rank runs a warm-up and then ITERS repetitions back to
back and times each; a repetition's op time is its slowest rank's; we report the median and
busbw = 2(p-1)/p * bytes / time (GB = 1e9 B). Every result is checked (all ranks hold p(p+1)/2).

    cd <worktree> && PYTHONPATH=$PWD python experiments/transports_bench.py
    python experiments/transports_bench.py --planes socket ray --ranks 8 --mib 64 --iters 5
"""
import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

from hccl_sim.algorithms import flat_program
from hcomm.exec import run_schedule as execute
from hcomm.program import rank_steps
from hcomm.transports import InProcessTransport
from hcomm.transports.socket import SocketTransport

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 300


def ring_steps(p, n):
    return rank_steps(flat_program("allreduce", "ring", p, n, 4), p)


def one_rank(transport, rank, p, n, reps, steps):
    """Run `reps` AllReduces on one rank; returns (seconds of each, result correct)."""
    x = np.full(n, rank + 1, dtype=np.float32)
    out = np.empty_like(x)
    transport.register(rank, "input", x)
    transport.register(rank, "output", out)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        execute(steps, rank, transport, "bench", np.add, transport.deadline(), "allreduce")
        times.append(time.perf_counter() - t0)
    return times, bool(np.all(out == p * (p + 1) // 2))


def socket_rank(rank, p, n, reps, conn):
    tr = SocketTransport(rank, p, timeout_s=TIMEOUT_S, connect_timeout_s=60)
    try:
        conn.send(tr.address)
        tr.start(conn.recv())
        conn.send(one_rank(tr, rank, p, n, reps, ring_steps(p, n)[rank]))
    except BaseException as exc:
        conn.send(exc)
    finally:
        tr.close()


def run_socket(p, n, reps):
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    conns, procs = [], []
    for rank in range(p):
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=socket_rank, args=(rank, p, n, reps, theirs))
        proc.start()
        theirs.close()
        conns.append(mine)
        procs.append(proc)
    try:
        peers = {rank: conn.recv() for rank, conn in enumerate(conns)}
        for conn in conns:
            conn.send(peers)
        results = [conn.recv() for conn in conns]
    finally:
        for proc in procs:
            proc.join(60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    bad = [r for r in results if isinstance(r, BaseException)]
    if bad:
        raise bad[0]
    return results, "8 processes, one host" if p == 8 else f"{p} processes"


def run_inprocess(p, n, reps):
    tr = InProcessTransport(p, TIMEOUT_S)
    steps = ring_steps(p, n)
    results = [None] * p
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(r, one_rank(tr, r, p, n, reps, steps[r])))
               for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, f"{p} threads"


class SocketRunner:
    """A Ray actor body hosting a socket endpoint (the socket plane between Ray nodes)."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size
        self.transport = SocketTransport(rank, size, timeout_s=TIMEOUT_S, connect_timeout_s=60, host="0.0.0.0")

    def address(self):
        import ray
        return ray.util.get_node_ip_address(), self.transport.address[1]

    def start(self, peers):
        import ray
        self.transport.start(peers)
        return ray.get_runtime_context().get_node_id()

    def run(self, reps):
        return one_rank(self.transport, self.rank, self.size, self.n, reps, ring_steps(self.size, self.n)[self.rank])

    def set_count(self, n):
        self.n = n

    def close(self):
        self.transport.close()


def ray_ranks(p, n, reps, over_sockets):
    """p rank actors on a two-node Ray cluster (ranks [0, p/2) on node0), moving payloads through
    Ray's object store or over direct sockets between the actors."""
    import ray
    from ray.cluster_utils import Cluster
    import cloudpickle
    sys.path.insert(0, str(HERE.parent / "tests"))
    import ray_runner                       # the test suite's bare rank actor, sent to Ray by value
    cloudpickle.register_pickle_by_value(ray_runner)
    ScheduleRunner = ray_runner.ScheduleRunner
    cluster = Cluster()
    try:
        for k in range(2):
            cluster.add_node(num_cpus=0, resources={f"node{k}": 64}, object_store_memory=1 << 30,
                             include_dashboard=False)
        ray.init(address=cluster.address, log_to_driver=False)
        place = [dict(num_cpus=0, max_concurrency=4, resources={f"node{(2 * r) // p}": 1}) for r in range(p)]
        if over_sockets:
            actors = [ray.remote(SocketRunner).options(**place[r]).remote(r, p) for r in range(p)]
            peers = dict(enumerate(ray.get([a.address.remote() for a in actors])))
            nodes = ray.get([a.start.remote(peers) for a in actors] + [a.set_count.remote(n) for a in actors])[:p]
            results = ray.get([a.run.remote(reps) for a in actors])
        else:
            actors = [ray.remote(ScheduleRunner).options(**place[r]).remote(r, p, TIMEOUT_S) for r in range(p)]
            nodes = ray.get([a.start.remote(actors) for a in actors])
            steps = ring_steps(p, n)
            outs = ray.get([a.run.remote(steps[r], {"input": lambda r=r: np.full(n, r + 1, dtype=np.float32),
                                                     "output": lambda: np.empty(n, dtype=np.float32)},
                                         "bench", np.add, "allreduce", reps) for r, a in enumerate(actors)])
            results = [(times, bool(np.all(bufs["output"] == p * (p + 1) // 2))) for bufs, times in outs]
        ray.get([a.close.remote() for a in actors])
        return results, f"{p} actors on {len(set(nodes))} Ray nodes"
    finally:
        ray.shutdown()
        cluster.shutdown()


def run_ray(p, n, reps):
    return ray_ranks(p, n, reps, over_sockets=False)


def run_ray_socket(p, n, reps):
    return ray_ranks(p, n, reps, over_sockets=True)


def run_mpich(p, n, reps):
    sys.path.insert(0, str(HERE))
    from local_vs_mpich import mpich_walls
    walls, correct = mpich_walls(p, 4 * n, reps - 1, 1)
    return [([0.0] + list(walls), correct)], f"mpiexec -n {p}, mpi4py Allreduce"


PLANES = {"socket": run_socket, "ray": run_ray, "ray-socket": run_ray_socket, "inprocess": run_inprocess,
          "mpich": run_mpich}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--planes", nargs="+", default=["socket", "ray", "ray-socket", "inprocess", "mpich"], choices=list(PLANES))
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--iters", type=int, default=5)
    args = ap.parse_args()
    p, nbytes = args.ranks, args.mib << 20
    n = nbytes // 4
    print(f"# {p} ranks, {args.mib} MiB float32 ring AllReduce, per-rank executor, median of {args.iters} after 1 warm-up")
    print(f"# {'plane':>10} {'median(ms)':>10} {'busbw(GB/s)':>11} {'runs(ms)':>34} {'ok':>3}  placement")
    for plane in args.planes:
        results, where = PLANES[plane](p, n, args.iters + 1)
        per_rep = np.max([times for times, _ in results], axis=0)[1:]      # slowest rank, warm-up dropped
        med = statistics.median(per_rep)
        busbw = 2 * (p - 1) / p * nbytes / med / 1e9
        runs = " ".join(f"{1e3 * t:.0f}" for t in per_rep)
        ok = all(good for _, good in results)
        print(f"  {plane:>10} {1e3 * med:10.1f} {busbw:11.3f} {runs:>34} {'yes' if ok else 'NO':>3}  {where}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()
