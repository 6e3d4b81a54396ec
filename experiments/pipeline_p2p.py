"""Pipeline-parallel exchanges three ways, and HCCL's Scatter against Broadcast.

A pipeline stage sends its activations to the next stage and its gradients to the previous one in
every step. hccl-sim runs that exchange (each rank: two sends, two receives of the same size) as
one HcclBatchSendRecv (`comm.batch_send_recv`), as the same four calls inside `comm.group()`
(HcclGroupStart/End: launched as one batch), and as four separate HcclSend/HcclRecv calls in an
order that cannot deadlock (even ranks send first). Prints the simulated time of the exchange (the
slowest rank's, from a barrier's end) on one 8-NPU 910B server and on 2 servers (the ring of
stages crosses servers twice), with the wall time of the local engine moving the real data; then
Scatter's and Broadcast's simulated times on 1, 2 and 16 servers.

    python experiments/pipeline_p2p.py [--mib 16] [--repeats 3]
"""
import argparse
import time

import numpy as np

import hccl_sim


def _items(comm, x, y):
    r, p = comm.rank, comm.size
    return [("send", (r + 1) % p, x), ("recv", (r - 1) % p, (x.shape, x.dtype)),
            ("send", (r - 1) % p, y), ("recv", (r + 1) % p, (y.shape, y.dtype))]


def _batched(comm, x, y):
    return comm.batch_send_recv(_items(comm, x, y))


def _grouped(comm, x, y):
    r, p = comm.rank, comm.size
    with comm.group():
        comm.send(x, (r + 1) % p)
        a = comm.recv((r - 1) % p)
        comm.send(y, (r - 1) % p)
        b = comm.recv((r + 1) % p)
    return [a.result, b.result]


def _separate(comm, x, y):
    r, p = comm.rank, comm.size
    got = {}
    for peer, data in (((r + 1) % p, x), ((r - 1) % p, y)):
        src = (r - 1) % p if peer == (r + 1) % p else (r + 1) % p
        if r % 2 == 0:
            comm.send(data, peer)
            got[src] = comm.recv(src)
        else:
            got[src] = comm.recv(src)
            comm.send(data, peer)
    return [got[(r - 1) % p], got[(r + 1) % p]]


WAYS = {"batch_send_recv": _batched, "group": _grouped, "separate send/recv": _separate}


def exchange(comm, way, n, repeats):
    r, p = comm.rank, comm.size
    x = np.full(n, r, dtype=np.float16)          # bf16's bytes: activations forward
    y = np.full(n, -r, dtype=np.float16)         # gradients backward
    walls, spans = [], []
    for _ in range(repeats):
        comm.barrier()
        t0, c0 = time.perf_counter(), comm.clock
        fwd, bwd = WAYS[way](comm, x, y)
        walls.append(time.perf_counter() - t0)
        spans.append(comm.clock - c0)
    assert fwd[0] == (r - 1) % p and bwd[0] == -((r + 1) % p), "a stage got another stage's data"
    return spans[-1], float(np.median(walls))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=16, help="MiB per message (default 16)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n = (args.mib << 20) // 2
    print(f"pipeline exchange: {args.mib} MiB bf16 to the next stage and {args.mib} MiB back to the previous, "
          "every rank")
    print(f"{'servers':>7s} {'ranks':>5s} {'way':20s} {'simulated us':>12s} {'local wall s':>12s}")
    for servers in (1, 2):
        topo = hccl_sim.topology("atlas800t-a2", servers=servers)
        hccl_sim.run(exchange, topology=topo, args=("group", n, 1))      # warm-up: the first run's allocations
        for way in WAYS:
            got = hccl_sim.run(exchange, topology=topo, args=(way, n, args.repeats))
            span = max(s for s, _ in got)
            wall = float(np.median([w for _, w in got]))
            print(f"{servers:7d} {topo.num_ranks:5d} {way:20s} {span / 1e3:12.1f} {wall:12.3f}")
    print()
    print("Scatter of 64 MiB bf16 (the root's whole buffer) against Broadcast of 64 MiB, HCCL's choices")
    print(f"{'servers':>7s} {'scatter us':>10s} {'algo':30s} {'broadcast us':>12s} {'algo':30s}")
    for servers in (1, 2, 16):
        topo = hccl_sim.topology("atlas800t-a2", servers=servers)
        sc = hccl_sim.simulate("scatter", 64 << 20, topology=topo, dtype="bfloat16")
        bc = hccl_sim.simulate("broadcast", 64 << 20, topology=topo, dtype="bfloat16")
        print(f"{servers:7d} {max(sc.times) * 1e6:10.1f} {sc.algo:30s} {max(bc.times) * 1e6:12.1f} {bc.algo:30s}")


if __name__ == "__main__":
    main()
