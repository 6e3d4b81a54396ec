"""What the torch layer costs per op: dist.all_reduce on the hccl_sim backend against the same
AllReduce called on the rank's Communicator directly, in the same Ray actors, same data.

For 8 B and 64 MiB of float32, on 8 Ray ranks (one 910B server): the median wall time per op of
each way over `--iters` ops (after a warm-up), the slowest rank's median; and the difference, the
torch layer's overhead (its worker thread, the Work and future, the tensor views). Repeats the
whole measurement `--repeats` times and prints every repeat (the machine is noisy).

    python experiments/torch_overhead.py [--ranks 8] [--iters 50] [--repeats 3]
"""
import argparse
import time

import numpy as np

import hccl_sim
from topologies import hardware

SIZES = (8, 64 << 20)


def measure(comm, iters):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    out = {}
    try:
        for nbytes in SIZES:
            n = max(1, nbytes // 4)
            iters_here = iters if nbytes <= 1 << 20 else max(3, iters // 10)
            x = np.ones(n, np.float32)
            t = torch.ones(n)
            for way, op in (("comm", lambda: comm.all_reduce(x, out=x)), ("torch", lambda: dist.all_reduce(t))):
                op()                                   # warm-up: buffers, the first rendezvous
                comm.barrier()
                walls = []
                for _ in range(iters_here):
                    t0 = time.perf_counter()
                    op()
                    walls.append(time.perf_counter() - t0)
                out[(nbytes, way)] = float(np.median(walls))
    finally:
        ht.destroy_process_group()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"AllReduce float32 on {args.ranks} Ray ranks (one 910B server): median wall per op, slowest rank")
    print(f"{'repeat':>6} {'size':>9} {'Communicator':>13} {'torch layer':>12} {'overhead':>10}")
    with hccl_sim.Cluster(hardware("atlas800t-a2", devices_per_server=[args.ranks]), engine="ray") as cluster:
        for k in range(args.repeats):
            res = cluster.run(measure, args=(args.iters,))
            for nbytes in SIZES:
                direct = max(r[(nbytes, "comm")] for r in res)
                layered = max(r[(nbytes, "torch")] for r in res)
                size = f"{nbytes} B" if nbytes < 1 << 20 else f"{nbytes >> 20} MiB"
                print(f"{k:>6} {size:>9} {direct * 1e3:>10.3f} ms {layered * 1e3:>9.3f} ms "
                      f"{(layered - direct) * 1e3:>7.3f} ms")


if __name__ == "__main__":
    main()
