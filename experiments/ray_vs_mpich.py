"""The Ray engine against mpi4py + MPICH on this machine, in the same run.

- 8-rank 64 MiB float32 AllReduce: median wall time and busbw on the Ray engine (host arrays,
  and device arrays whose memory is already shared) against MPICH `Allreduce` on 8 processes.
- 8-byte AllReduce latency on 8 ranks, both.
- Ray actor start-up time and memory per rank.
- With --nodes 2: the 8 ranks as two 4-card servers on a two-node Ray cluster made on this machine
  (ray.cluster_utils), one server per node, so the op crosses Ray nodes on the peer-to-peer plane.

    python experiments/ray_vs_mpich.py            # one node: shared-memory control and data planes
    python experiments/ray_vs_mpich.py --nodes 2  # two Ray nodes: per-rank schedules over sockets
"""
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

import hccl_sim
from hccl_sim.collectives import expected
from hccl_sim.collectives.verifiable import rank_input

from local_vs_mpich import busbw, mpich_walls

OUT = Path(__file__).resolve().parent / "out"


def ray_back_to_back(comm, nbytes, iters, warmup):
    """Mean time per op of ops issued in a row (a latency test), this rank's view."""
    x = rank_input(comm.rank, nbytes // 4, "float32")
    for _ in range(warmup):
        comm.all_reduce(x)
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        y = comm.all_reduce(x)
    return (time.perf_counter() - t0) / iters, bool(np.array_equal(y, expected("allreduce", comm.rank, comm.size,
                                                                                 nbytes // 4, "float32")))


def ray_walls(comm, nbytes, iters, warmup, device):
    count = nbytes // 4
    x = rank_input(comm.rank, count, "float32")
    d = None
    if device:
        d = comm.device.empty((count,), np.float32)
        d.data[:] = x
        x = d.data
    walls = []
    y = None
    for i in range(warmup + iters):
        comm.barrier()
        t0 = time.perf_counter()
        y = comm.all_reduce(x)
        walls.append(time.perf_counter() - t0)
    ok = bool(np.array_equal(y, expected("allreduce", comm.rank, comm.size, count, "float32")))
    if d is not None:
        comm.device.free(d)
    return walls[warmup:], ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--small-iters", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=1, choices=(1, 2))
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    nodes = None
    if args.nodes == 2:
        from topologies.presets import hardware
        topo = hardware("atlas800t-a2", devices_per_server=[args.ranks // 2, args.ranks - args.ranks // 2])
    elif args.ranks == 8:
        topo = hccl_sim.topology("atlas800t-a2")
    else:
        topo = hccl_sim.topology("fullmesh", ranks=args.ranks)
    t0 = time.perf_counter()
    if args.nodes == 2:
        from ray.cluster_utils import Cluster
        nodes = Cluster()
        for k in range(2):
            nodes.add_node(num_cpus=1, include_dashboard=False)
        ray.init(address=nodes.address, log_to_driver=False)
    else:
        ray.init(address="local", include_dashboard=False, log_to_driver=False)
    t_ray = time.perf_counter() - t0
    t0 = time.perf_counter()
    cluster = hccl_sim.Cluster(topo, engine="ray")
    t_actors = time.perf_counter() - t0
    infos = ray.get([a.info.remote() for a in cluster._ray.actors])
    report = {"ranks": args.ranks, "nodes": len(cluster._ray.nodes), "plane": cluster._ray.data_plane,
              "ray_init_s": t_ray, "actor_startup_s": t_actors, "actor_rss_mb": [i.rss_mb for i in infos]}
    print(f"# ray.init {t_ray:.2f} s; {args.ranks} rank actors up in {t_actors:.2f} s on {report['nodes']} Ray "
          f"node(s), data plane {report['plane']}; peak RSS per actor "
          f"{statistics.median(report['actor_rss_mb']):.0f} MB (median)")
    rows = []
    try:
        res = cluster.run(ray_back_to_back, args=(8, args.small_iters, 20))
        rows.append({"engine": "hccl-sim ray, back to back", "bytes": 8, "median_s": max(r[0] for r in res),
                     "correct": all(r[1] for r in res)})
        mw, mok = mpich_walls(args.ranks, 8, args.small_iters, 20, back_to_back=True)
        rows.append({"engine": "mpi4py+MPICH, back to back", "bytes": 8, "median_s": mw[0], "correct": mok})
        for nbytes, iters in ((8, args.small_iters), (64 << 20, args.iters)):
            for device in (False, True):
                res = cluster.run(ray_walls, args=(nbytes, iters, 2, device))
                walls = np.max([r[0] for r in res], axis=0).tolist()
                rows.append({"engine": "hccl-sim ray" + (" (device arrays)" if device else ""), "bytes": nbytes,
                             "median_s": statistics.median(walls), "correct": all(r[1] for r in res)})
                if nbytes == 8:
                    break             # 8-byte ops travel in the control plane either way
            mw, mok = mpich_walls(args.ranks, nbytes, iters, 2)
            rows.append({"engine": "mpi4py+MPICH", "bytes": nbytes, "median_s": statistics.median(mw), "correct": mok})
    finally:
        cluster.close()
        ray.shutdown()
        if nodes is not None:
            nodes.shutdown()
    print("# time per op: 'back to back' = mean over ops issued in a row; otherwise the median of ops each "
          "timed after a barrier (slowest rank)")
    print(f"# {'engine':32s} {'size(B)':>10s} {'time(us)':>11s} {'busbw(GB/s)':>11s} {'correct':>7s}")
    for r in rows:
        r["busbw"] = busbw(r["bytes"], args.ranks, r["median_s"])
        print(f"  {r['engine']:32s} {r['bytes']:10d} {r['median_s'] * 1e6:11.1f} {r['busbw']:11.2f} {str(r['correct']):>7s}")
    ours = min(r["median_s"] for r in rows if r["bytes"] == 64 << 20 and r["engine"].startswith("hccl"))
    peer = next(r["median_s"] for r in rows if r["bytes"] == 64 << 20 and r["engine"] == "mpi4py+MPICH")
    print(f"# 64 MiB AllReduce: hccl-sim ray is {peer / ours:.2f}x MPICH's busbw")
    report["rows"] = rows
    OUT.mkdir(exist_ok=True)
    (OUT / f"ray_vs_mpich{'_2nodes' if args.nodes == 2 else ''}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
