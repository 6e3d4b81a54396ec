"""On the synthetic fullmesh preset each algorithm's simulated time equals HCCL's alpha-beta-gamma
closed form (docs/references.md §6.2), for powers of two and not.

alpha = 1 us link latency, beta = 1 ns/B (1 GB/s), gamma = 0.5 ns/B (2 GB/s reduce); sizes are
chosen so every chunk divides evenly and the formulas are exact in integer nanoseconds.
"""
import math

import pytest

import hccl_sim

A, B, G = 1000, 1.0, 0.5
LCM = 720720          # lcm(1..16): every chunk split divides evenly
ITEM = 4


def makespan(op, nbytes, p, algo, root=0):
    topo = hccl_sim.topology("fullmesh", ranks=p, bandwidth=1e9, latency=1e-6, reduce_bandwidth=2e9)
    est, plan = hccl_sim.simulate(op, nbytes, topology=topo, algo=algo, root=root, trace=True)
    assert est.algo == algo
    return max(e - s for s, e in zip(plan.entry, plan.exits))


def log2(p):
    return int(math.log2(p))


RANKS = list(range(2, 17))


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
def test_ring_allreduce(p):
    n = LCM * ITEM
    assert makespan("allreduce", n, p, "ring") == 2 * (p - 1) * A + 2 * (p - 1) * n // p * B + (p - 1) * n // p * G


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
def test_ring_reducescatter_allgather(p):
    n = LCM * ITEM   # whole input / whole output
    assert makespan("reducescatter", n, p, "ring") == (p - 1) * A + (p - 1) * n // p * (B + G)
    assert makespan("allgather", n, p, "ring") == (p - 1) * A + (p - 1) * n // p * B


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
def test_ring_broadcast_reduce(p):
    n = 4096 * ITEM
    assert makespan("broadcast", n, p, "ring", root=p - 1) == (p - 1) * (A + n * B)
    assert makespan("reduce", n, p, "ring", root=p // 2) == (p - 1) * (A + n * B + n * G)


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
def test_hd_allreduce(p):
    n = LCM * ITEM
    k = log2(p)
    if 2 ** k == p:
        want = 2 * k * A + 2 * (p - 1) * n // p * B + (p - 1) * n // p * G
    else:
        q = 2 ** k
        want = (2 * k + 2) * A + (2 * (q - 1) * n // q + 2 * n) * B + ((q - 1) * n // q + n) * G
    assert makespan("allreduce", n, p, "H-D_R") == want


@pytest.mark.unit
@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_hd_reducescatter_allgather_powers_of_two(p):
    n = LCM * ITEM
    k = log2(p)
    assert makespan("reducescatter", n, p, "H-D_R") == k * A + (p - 1) * n // p * (B + G)
    assert makespan("allgather", n, p, "H-D_R") == k * A + (p - 1) * n // p * B


@pytest.mark.unit
@pytest.mark.parametrize("p", [3, 5, 6, 7, 12])
def test_hd_reducescatter_allgather_folded(p):
    """Fold: the odd rank's whole buffer in, HD over 2^k virtual ranks whose blocks are the
    rank blocks they own, the result out; the makespan follows the largest virtual block."""
    n = LCM * ITEM
    blk = n // p
    q = 2 ** log2(p)
    r = p - q
    start = [2 * v if v < r else v + r for v in range(q)] + [p]   # first rank block of each virtual rank
    # every HD step is paced by its largest transfer; all virtual ranks move in lockstep
    rs_steps = []
    lo_all = [(0, q)] * q
    for d in [q >> i for i in range(1, log2(q) + 1)]:
        biggest = 0
        new = []
        for vv in range(q):
            lo, hi = lo_all[vv]
            mid = (lo + hi) // 2
            keep, send = ((mid, hi), (lo, mid)) if vv & d else ((lo, mid), (mid, hi))
            biggest = max(biggest, start[send[1]] - start[send[0]], start[keep[1]] - start[keep[0]])
            new.append(keep)
        lo_all = new
        rs_steps.append(biggest)
    want_rs = (A + n * (B + G)) + sum(A + s * blk * (B + G) for s in rs_steps) + (A + blk * B)
    assert makespan("reducescatter", n, p, "H-D_R") == want_rs
    ag_steps = []
    ranges = [(v, v + 1) for v in range(q)]
    d = 1
    while d < q:
        biggest = 0
        new = []
        for vv in range(q):
            lo, hi = ranges[vv]
            plo, phi = (lo - (hi - lo), lo) if vv & d else (hi, hi + (hi - lo))
            biggest = max(biggest, start[hi] - start[lo], start[phi] - start[plo])
            new.append((min(lo, plo), max(hi, phi)))
        ranges = new
        ag_steps.append(biggest)
        d *= 2
    want_ag = (A + blk * B) + sum(A + s * blk * B for s in ag_steps) + (A + n * B)
    assert makespan("allgather", n, p, "H-D_R") == want_ag


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
def test_pairwise_alltoall(p):
    n = LCM * ITEM   # whole send buffer
    assert makespan("alltoall", n, p, "pairwise") == (p - 1) * (A + n // p * B)


@pytest.mark.local
@pytest.mark.parametrize("p", RANKS)
def test_barrier(p):
    topo = hccl_sim.topology("fullmesh", ranks=p, bandwidth=1e9, latency=1e-6)
    res = hccl_sim.run(lambda c: (c.barrier(), c.last_op)[1], topology=topo)
    assert {r.end - r.start for r in res} == {math.ceil(math.log2(p)) * A}


def clog2(p):
    return math.ceil(math.log2(p))


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
@pytest.mark.parametrize("algo", ["NHR", "NB"])
def test_nhr_nb_allreduce_reducescatter_allgather(p, algo):
    n = LCM * ITEM                      # > 256 KiB: NHR's ReduceScatter + AllGather form
    k = clog2(p)
    assert makespan("allreduce", n, p, algo) == 2 * k * A + 2 * (p - 1) * n // p * B + (p - 1) * n // p * G
    assert makespan("reducescatter", n, p, algo) == k * A + (p - 1) * n // p * (B + G)
    assert makespan("allgather", n, p, algo) == k * A + (p - 1) * n // p * B


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
def test_nhr_small_data_one_shot_tree(p):
    n = 1024 * ITEM                     # <= 256 KiB: binomial reduce + tree broadcast, whole buffer
    k = clog2(p)
    assert makespan("allreduce", n, p, "NHR") == k * (2 * A + 2 * n * B + n * G)
    assert makespan("broadcast", n, p, "NHR", root=p - 1) == k * (A + n * B)


@pytest.mark.unit
@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_nhr_broadcast_scatter_allgather(p):
    n = (8 << 20) // p * p              # > 2 MiB: NHR Scatter + NHR AllGather
    k = clog2(p)
    assert makespan("broadcast", n, p, "NHR", root=1) == 2 * k * A + 2 * (p - 1) * n // p * B


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
def test_mesh(p):
    n = LCM * ITEM
    assert makespan("allreduce", n, p, "fullmesh") == 2 * A + 2 * n // p * B + (p - 1) * n // p * G
    assert makespan("reducescatter", n, p, "fullmesh") == A + n // p * B + (p - 1) * n // p * G
    assert makespan("allgather", n, p, "fullmesh") == A + n // p * B
    assert makespan("alltoall", n, p, "fullmesh") == A + n // p * B


@pytest.mark.unit
@pytest.mark.parametrize("p", RANKS)
def test_hd_broadcast_reduce_binomial(p):
    n = 4096 * ITEM
    k = clog2(p)
    assert makespan("broadcast", n, p, "H-D_R", root=p // 3) == k * (A + n * B)
    assert makespan("reduce", n, p, "H-D_R", root=p // 3) == k * (A + n * B + n * G)


@pytest.mark.unit
def test_mesh_step_takes_one_links_time_not_seven():
    """910B: every HCCS peer link has ports of its own, so an 8-NPU mesh AllGather step (seven
    blocks out and seven in per NPU, at once) takes what a 2-NPU one (one block each way) takes."""
    block = 183 << 10
    from topologies.presets import hardware
    t8 = hccl_sim.simulate("allgather", 8 * block, topology=hardware("atlas800t-a2", devices_per_server=[8]))
    t2 = hccl_sim.simulate("allgather", 2 * block, topology=hardware("atlas800t-a2", devices_per_server=[2]))
    assert set(t8.times) == set(t2.times) and len(set(t8.times)) == 1
    link_ns = -(-block * 10**9 // int(19.5e9))
    body = round(t2.time * 1e9) - hardware("atlas800t-a2").device_model.op_overhead_ns["allgather"]
    assert link_ns < body < 2 * link_ns          # one link's time plus copies and notifies


@pytest.mark.unit
def test_incast_into_one_port_takes_what_the_port_needs():
    """Two 910B servers, AlltoAll: each NPU's eight blocks for the other server leave by its one
    RoCE port (the NIC), served one after another: no rank finishes before eight block times."""
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    n = 16 * (183 << 10)                          # sixteen blocks of 183 KiB
    est, plan = hccl_sim.simulate("alltoall", n, topology=topo, trace=True)
    block_ns = -(-(n // 16) * 10**9 // int(topo.route(0, 8).bandwidth))
    assert min(e - s for s, e in zip(plan.entry, plan.exits)) >= 8 * block_ns
