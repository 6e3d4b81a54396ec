"""hccl-sim's Ray engine across Ray nodes against torch's gloo over the same loopback TCP, same run.

Two Ray nodes made on this machine (ray.cluster_utils), the ranks as two 910B servers, one per
node, so every op crosses nodes; gloo runs in the same number of Ray actors placed the same way
(4 per node for 8 ranks), each a torch.distributed gloo process (TCP rendezvous). Both time an
fp32 AllReduce of each size after a barrier, slowest rank, median over the iterations; the runs
alternate (hccl-sim, gloo, hccl-sim, ...) so the machine's noise falls on both.

    python experiments/socket_vs_gloo.py                     # 8 ranks, 8 B and 64 MiB, 5 runs
    python experiments/socket_vs_gloo.py --ranks 16 --runs 3 --sizes 8 1K 64K 1M 16M 64M
    ray start --head --num-cpus 1 --port 6390 && ray start --address 127.0.0.1:6390 --num-cpus 1
    python experiments/socket_vs_gloo.py --address 127.0.0.1:6390 --ranks 16   # two raylets

Writes experiments/out/socket_vs_gloo_N[_raylets].{md,json,png}.
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
from hccl_sim.tools.bench import parse_size

OUT = Path(__file__).resolve().parent / "out"


def busbw(nbytes, p, seconds):
    return nbytes / seconds / 1e9 * 2 * (p - 1) / p if seconds > 0 and p > 1 else 0.0


def hccl_walls(comm, nbytes, iters, warmup):
    """This rank's wall time of each AllReduce (after a barrier), and whether the result is right."""
    count = max(1, nbytes // 4)
    x = rank_input(comm.rank, count, "float32")
    walls, y = [], None
    for _ in range(warmup + iters):
        comm.barrier()
        t0 = time.perf_counter()
        y = comm.all_reduce(x)
        walls.append(time.perf_counter() - t0)
    return walls[warmup:], bool(np.array_equal(y, expected("allreduce", comm.rank, comm.size, count, "float32"))), \
        comm.last_op.algo


class GlooRank:
    """One torch.distributed gloo process in a Ray actor."""

    def init(self, rank, world, address):
        import torch.distributed as dist
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        dist.init_process_group("gloo", init_method=f"tcp://{address}", rank=rank, world_size=world)
        return True

    def walls(self, nbytes, iters, warmup):
        import torch
        import torch.distributed as dist
        rank, world = dist.get_rank(), dist.get_world_size()
        count = max(1, nbytes // 4)
        x = torch.from_numpy(rank_input(rank, count, "float32"))
        walls, y = [], None
        for _ in range(warmup + iters):
            y = x.clone()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(y)
            walls.append(time.perf_counter() - t0)
        want = expected("allreduce", rank, world, count, "float32")
        return walls[warmup:], bool(np.array_equal(y.numpy(), want))

    def close(self):
        import torch.distributed as dist
        dist.destroy_process_group()
        return True


def gloo_ranks(ray, world, nodes):
    """`world` gloo actors, as many on each Ray node as hccl-sim puts there (servers in order)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    per = -(-world // len(nodes))
    actor = ray.remote(num_cpus=0)(GlooRank)
    ranks = [actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[r // per], soft=False)).remote()
             for r in range(world)]
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray.get([a.init.remote(r, world, f"127.0.0.1:{port}") for r, a in enumerate(ranks)], timeout=300)
    return ranks


def slowest_median(per_rank):
    return statistics.median(np.max(np.array(per_rank), axis=0).tolist())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--sizes", nargs="+", default=["8", "64M"])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iters", type=int, default=None, help="per size and run (default: 5 at 64 MiB, more when small)")
    ap.add_argument("--address", help="a running Ray cluster of two nodes (two `ray start` raylets) instead of "
                    "ray.cluster_utils")
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray.cluster_utils import Cluster
    from topologies.presets import hardware
    sizes = [parse_size(s) for s in args.sizes]
    half = args.ranks // 2
    topo = hardware("atlas800t-a2", devices_per_server=[half, args.ranks - half])
    nodes = None
    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:
        nodes = Cluster()
        for _ in range(2):
            nodes.add_node(num_cpus=1, include_dashboard=False)
        ray.init(address=nodes.address, log_to_driver=False)
    rows = []
    try:
        cluster = hccl_sim.Cluster(topo, engine="ray")
        plane = cluster._ray.data_plane
        node_ids = [cluster._ray.node_of[0], cluster._ray.node_of[args.ranks - 1]]
        gloo = gloo_ranks(ray, args.ranks, node_ids)
        for run in range(args.runs):
            for nbytes in sizes:
                iters = args.iters or (5 if nbytes >= 16 << 20 else 20 if nbytes >= 1 << 20 else 100)
                res = cluster.run(hccl_walls, args=(nbytes, iters, 2))
                ours = slowest_median([r[0] for r in res])
                got = ray.get([a.walls.remote(nbytes, iters, 2) for a in gloo], timeout=900)
                theirs = slowest_median([g[0] for g in got])
                rows.append({"run": run, "bytes": nbytes, "hccl_sim_s": ours, "gloo_s": theirs,
                             "algo": res[0][2], "correct": all(r[1] for r in res) and all(g[1] for g in got)})
                r = rows[-1]
                print(f"  run {run} {nbytes:>10d} B: hccl-sim {ours * 1e3:9.3f} ms ({r['algo']}), gloo "
                      f"{theirs * 1e3:9.3f} ms, busbw ratio {theirs / ours:5.2f}x, correct {r['correct']}", flush=True)
        ray.get([a.close.remote() for a in gloo], timeout=60)
        cluster.close()
    finally:
        ray.shutdown()
        if nodes is not None:
            nodes.shutdown()
    write(rows, args.ranks, plane, "two raylets" if args.address else "ray.cluster_utils")


def write(rows, ranks, plane, how):
    OUT.mkdir(exist_ok=True)
    stem = OUT / (f"socket_vs_gloo_{ranks}" + ("_raylets" if how == "two raylets" else ""))
    lines = [f"# AllReduce fp32, {ranks} ranks on 2 Ray nodes ({how}; hccl-sim data plane: {plane}) against gloo, "
             "same run",
             "", "| size (B) | run | hccl-sim (ms) | busbw (GB/s) | gloo (ms) | busbw (GB/s) | gloo time / hccl-sim time |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['bytes']} | {r['run']} | {r['hccl_sim_s'] * 1e3:.3f} | {busbw(r['bytes'], ranks, r['hccl_sim_s']):.3f} "
                     f"| {r['gloo_s'] * 1e3:.3f} | {busbw(r['bytes'], ranks, r['gloo_s']):.3f} | {r['gloo_s'] / r['hccl_sim_s']:.2f} |")
    lines += ["", "| size (B) | hccl-sim median (ms) | gloo median (ms) | ratios per run (gloo / hccl-sim) |", "|---|---|---|---|"]
    by = {}
    for r in rows:
        by.setdefault(r["bytes"], []).append(r)
    for nbytes, rs in by.items():
        lines.append(f"| {nbytes} | {statistics.median(r['hccl_sim_s'] for r in rs) * 1e3:.3f} | "
                     f"{statistics.median(r['gloo_s'] for r in rs) * 1e3:.3f} | "
                     f"{', '.join(format(r['gloo_s'] / r['hccl_sim_s'], '.2f') for r in rs)} |")
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    stem.with_suffix(".json").write_text(json.dumps({"ranks": ranks, "plane": plane, "rows": rows}, indent=2))
    print("\n".join(lines))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = sorted(by)
    for key, label in (("hccl_sim_s", "hccl-sim (Ray, 2 nodes)"), ("gloo_s", "gloo (Ray actors, 2 nodes)")):
        ax.plot(xs, [statistics.median(r[key] for r in by[x]) * 1e3 for x in xs], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("AllReduce size (bytes)")
    ax.set_ylabel("wall time per op (ms, median, slowest rank)")
    ax.set_title(f"{ranks} ranks over 2 Ray nodes")
    ax.legend()
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
