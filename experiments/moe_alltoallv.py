"""Mixture-of-experts dispatch as HCCL runs it: AlltoAllV of tokens to experts with zipf-skewed
loads, one expert per rank.

Tokens are 7168 bf16 each (a DeepSeek-V3 hidden size), 4,096 per rank; each rank routes its tokens
to the experts by zipf popularity (hccl_sim.collectives.splits, `zipf:S`, seeded). Prints, on 8 x 910B
(one server) and on 2 and 16 servers: the simulated time and busbw of the dispatch (HCCL's choice),
against the same bytes sent uniformly, and on one and two servers the wall time the local engine
takes to move the real tokens (median of repeats).

    python experiments/moe_alltoallv.py [--zipf 1.2] [--repeats 3]
"""
import argparse
import time

import numpy as np

import hccl_sim
from hccl_sim.collectives.splits import parse

HIDDEN = 7168
TOKENS = 4096
ITEMSIZE = 2                       # bf16


def dispatch(comm, rows):
    r = comm.rank
    x = np.zeros((int(rows[r].sum()), HIDDEN), dtype=np.float16)        # bf16's bytes: the data are not read
    x[:, 0] = r
    walls = []
    for _ in range(REPEATS):
        comm.barrier()
        t0 = time.perf_counter()
        y = comm.all_to_all_v(x, rows[r], rows[:, r])
        walls.append(time.perf_counter() - t0)
    want = np.repeat(np.arange(len(rows)), rows[:, r])
    assert np.array_equal(y[:, 0], want), "tokens landed at the wrong place"
    return comm.last_op.end - comm.last_op.start, float(np.median(walls))


def main():
    global REPEATS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zipf", type=float, default=1.2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    REPEATS = args.repeats
    skew = parse(f"zipf:{args.zipf}")
    print(f"MoE dispatch: {TOKENS} tokens x {HIDDEN} bf16 per rank ({TOKENS * HIDDEN * ITEMSIZE / 1e6:.1f} MB), "
          f"zipf:{args.zipf} expert loads, HCCL's AlltoAllV selection")
    print(f"{'servers':>7s} {'ranks':>5s} {'hottest expert':>14s} {'algo':32s} {'zipf us':>9s} {'busbw':>7s} "
          f"{'uniform us':>10s} {'busbw':>7s} {'local wall s':>12s}")
    for servers in (1, 2, 16):
        topo = hccl_sim.topology("atlas800t-a2", servers=servers)
        p = topo.num_ranks
        rows = skew.matrix(p, TOKENS)
        flat = parse("uniform").matrix(p, TOKENS)
        est = hccl_sim.simulate("alltoallv", counts=rows * HIDDEN, topology=topo, dtype="bfloat16")
        uni = hccl_sim.simulate("alltoallv", counts=flat * HIDDEN, topology=topo, dtype="bfloat16")
        wall = "-"
        if servers <= 2:
            got = hccl_sim.run(dispatch, topology=topo, args=(rows,))
            sim_ns = max(t for t, _ in got)
            assert abs(sim_ns - est.time * 1e9) <= 1, (sim_ns, est.time)
            wall = f"{max(w for _, w in got):.3f}"
        print(f"{servers:7d} {p:5d} {int(rows.sum(axis=0).max()):>8d} tok. {est.algo[:32]:32s} {est.time * 1e6:9.1f} "
              f"{est.busbw:7.2f} {uni.time * 1e6:10.1f} {uni.busbw:7.2f} {wall:>12s}")


if __name__ == "__main__":
    main()
