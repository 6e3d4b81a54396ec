"""torch.distributed's all_reduce on the hccl_sim backend against gloo, in the same Ray rank actors.

8 or 16 Ray rank actors on one node (910B servers of 8 NPUs). In each run every actor first joins
the hccl_sim backend over its rank's Communicator (hccl_sim.torch.init_process_group) and times
`--iters` fp32 all_reduces of `--bytes`, each after a dist.barrier(); then it leaves that group,
joins a gloo group (a TCPStore on rank 0's address, its port broadcast by the Communicator) and
times the same. The time of an iteration is its slowest rank's; a run reports the median over its
iterations. Results are checked on every rank.

    python experiments/torch_ray_vs_gloo.py                     # 8 and 16 ranks, 8 B, 5 runs
    python experiments/torch_ray_vs_gloo.py --ranks 8 --runs 3
"""
import argparse
import json
import os
import socket
import statistics
import time
from pathlib import Path

import numpy as np

import hccl_sim
import torchrun_vs_gloo
from topologies import hardware
from torchrun_vs_gloo import timed_all_reduces

OUT = Path(__file__).resolve().parent / "out"


def both_backends(comm, nbytes, iters):
    """This rank's walls on the hccl_sim backend, then on gloo."""
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    try:
        ours, ok_ours = timed_all_reduces(nbytes, iters, 10)
    finally:
        ht.destroy_process_group()
    port = np.zeros(1, np.int64)
    if comm.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    port = int(comm.broadcast(port, root=0)[0])
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size)
    try:
        theirs, ok_theirs = timed_all_reduces(nbytes, iters, 10)
    finally:
        dist.destroy_process_group()
    return ours, theirs, ok_ours and ok_theirs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    import ray.cloudpickle
    ray.cloudpickle.register_pickle_by_value(torchrun_vs_gloo)    # the actors have no experiments/ to import
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    report = []
    try:
        for p in args.ranks:
            topo = hardware("atlas800t-a2", devices_per_server=[8] * (p // 8))
            with hccl_sim.Cluster(topo, engine="ray") as cluster:
                for k in range(args.runs):
                    res = cluster.run(both_backends, args=(args.bytes, args.iters))
                    ours = statistics.median(np.max([r[0] for r in res], axis=0)) * 1e3
                    theirs = statistics.median(np.max([r[1] for r in res], axis=0)) * 1e3
                    ok = all(r[2] for r in res)
                    report.append({"ranks": p, "run": k, "hccl_sim_ms": ours, "gloo_ms": theirs, "correct": ok})
                    print(f"{p} ranks, run {k}: {args.bytes} B all_reduce after a barrier: hccl_sim {ours:.3f} ms, "
                          f"gloo {theirs:.3f} ms (gloo / hccl_sim {theirs / ours:.2f}); correct {ok}", flush=True)
    finally:
        ray.shutdown()
    for p in args.ranks:
        mine = [r for r in report if r["ranks"] == p]
        print(f"{p} ranks: medians of {len(mine)} runs: hccl_sim {statistics.median(r['hccl_sim_ms'] for r in mine):.3f} "
              f"ms, gloo {statistics.median(r['gloo_ms'] for r in mine):.3f} ms")
    OUT.mkdir(exist_ok=True)
    (OUT / "torch_ray_vs_gloo.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
