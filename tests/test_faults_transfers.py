"""Faults on single transfers: `corrupt` (the nth transfer a -> b of the job fails its CRC and costs
one retransmission interval, counted over ops, loops and sends), and point-to-point send/recv
under link faults (a flap absorbed, a down link E_REMOTE on both sides, a slowed link slower),
the same to the nanosecond on the local engine and in simulate."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import FaultPlan, HcclError
from hccl_sim.engines import rendezvous as rdv
from hccl_sim.comm.rank_group import Call
from hccl_sim.config.env import Config
from hccl_sim.plan.faulted import with_faults
from hccl_sim.plan.planner import Signature

DELTA = round(4.096e-6 * 2 ** 5 * 1e9)          # HCCL_RDMA_TIMEOUT=5: one retransmission interval, ns
FAST = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1"}
N = 1 << 17                                      # int64 elements: 1 MiB


def pair():
    """Two ranks, one link of 1 GB/s and 1 us, no fixed costs."""
    return hccl_sim.topology("fullmesh", ranks=2, bandwidth=1e9, latency=1e-6)


def sim(plan, env=None, nbytes=N * 8, topo=None, trace=False):
    return hccl_sim.simulate("allreduce", nbytes, topology=topo or pair(), algo="ring", dtype="int64", faults=plan,
                             env={**FAST, **(env or {})}, trace=trace)


def data(rank, n=N):
    return (np.arange(n, dtype=np.int64) * (rank + 3)) % 1009


def allreduces(comm, ops=3, n=N):
    out = []
    for _ in range(ops):
        y = comm.all_reduce(data(comm.rank, n), algo="ring")
        rec = comm.last_op
        out.append((y, rec.start, rec.end, rec.retries))
    return out


@pytest.mark.local
def test_corrupt_costs_exactly_one_interval_in_simulate_and_on_the_local_engine():
    """A 2-rank ring AllReduce sends 0 -> 1 twice (reduce-scatter, all-gather): either corrupted
    delays the op by one retransmission interval, nothing else changes; the transfers 1 -> 0 are
    another pair's."""
    clean = sim(None)
    for nth in (0, 1):
        got = sim(FaultPlan().corrupt(0, 1, nth=nth))
        assert got.retries == 0 and [round((t - c) * 1e9) for t, c in zip(got.times, clean.times)] == [DELTA] * 2
    assert sim(FaultPlan().corrupt(0, 1, nth=2)).times == clean.times          # the op has only two
    assert sim(FaultPlan().corrupt(1, 0, nth=1)).time == sim(FaultPlan().corrupt(0, 1, nth=1)).time
    plan = FaultPlan().corrupt(0, 1, nth=1)
    results = hccl_sim.run(allreduces, topology=pair(), faults=plan, env=FAST, args=(1,))
    want = data(0) + data(1)
    est = sim(plan)
    for r, [(y, start, end, retries)] in enumerate(results):
        assert np.array_equal(y, want) and retries == 0
        assert end - start == round(est.times[r] * 1e9)                   # the same to the ns


@pytest.mark.local
def test_nth_counts_across_ops_and_loops_and_the_trace_shows_the_lost_attempt():
    """Three ops of 2 transfers 0 -> 1 each: nth=3 is the second op's second. With HCCL_BUFFSIZE=1
    (1 MiB) a 3 MiB op runs 3 loops, 2 transfers each: nth=3 is the second loop's second."""
    base = hccl_sim.run(allreduces, topology=pair(), env=FAST)
    got = hccl_sim.run(allreduces, topology=pair(), faults=FaultPlan().corrupt(0, 1, nth=3), env=FAST)
    again = hccl_sim.run(allreduces, topology=pair(), faults=FaultPlan().corrupt(0, 1, nth=3), env=FAST)
    for r in range(2):
        b, g = base[r], got[r]
        assert [e - s for _, s, e, _ in g] == [b[0][2] - b[0][1], b[1][2] - b[1][1] + DELTA, b[2][2] - b[2][1]]
        assert all(np.array_equal(x[0], y[0]) for x, y in zip(b, g))       # bit-identical results
        assert [x[1:] for x in g] == [x[1:] for x in again[r]]             # deterministic
    env = {"HCCL_BUFFSIZE": "1"}
    clean = sim(None, env=env, nbytes=3 * N * 8)
    for nth, loop in ((0, 0), (3, 1), (5, 2)):
        est, plan = sim(FaultPlan().corrupt(0, 1, nth=nth), env=env, nbytes=3 * N * 8, trace=True)
        assert round((est.time - clean.time) * 1e9) == DELTA and est.retries == 0
        lost = [e for e in plan.events if "lost" in e[1]]
        assert len(lost) == 1 and lost[0][:2] == (0, "send->1 lost (CRC error)")
        assert lost[0][3] - lost[0][2] == DELTA and "corrupt 0-1" in lost[0][4]["why"]
        loop_ends = sorted({e[3] for e in plan.events if e[1] == "recv<-0"})
        assert (loop_ends[2 * loop - 1] if loop else 0) <= lost[0][2] < loop_ends[2 * loop + 1]
    assert sim(FaultPlan().corrupt(0, 1, nth=6), env=env, nbytes=3 * N * 8).time == clean.time


@pytest.mark.unit
def test_corrupt_on_a_down_link_counts_against_the_retransmission_budget():
    """RETRY_CNT=1: a corrupted transfer on a link flapping for one interval loses both of its
    attempts (the first to the link, the second to its CRC): an error CQE, E_REMOTE."""
    plan = FaultPlan().link_flap(0, 1, at=0, duration=DELTA / 1e9)
    assert sim(plan).retries == 0
    with pytest.raises(HcclError, match=r"failed after 2 attempts \(fault plan entry 1 \(corrupt 0-1\)\)") as e:
        sim(FaultPlan().link_flap(0, 1, at=0, duration=DELTA / 1e9).corrupt(0, 1))
    assert e.value.code == "E_REMOTE"


@pytest.mark.local
def test_a_cached_plan_is_never_served_for_an_op_holding_a_corrupt_transfer():
    """PlanCache (every rank planning for itself, the Ray engine) counts transfers like the local
    engine's single planner: the same op is planned fresh while a corrupt entry is pending and
    cached again once it has passed, and the corrupted op's plan is the local engine's."""
    topo = pair()
    config = with_faults(topo, Config.from_env(FAST), FaultPlan().corrupt(0, 1, nth=3))
    cache = rdv.PlanCache(topo, config)
    sig = Signature("allreduce", (N,), "int64", "sum", None, "ring")
    exits = [cache.agreed(sig, 8, [0, 0], [(0,), (0,)]).exits for _ in range(3)]
    assert exits[0] == exits[2] and exits[1] == [t + DELTA for t in exits[0]]
    assert cache.progress.collective == {(0, 1): 4} and len(cache) == 1    # counted while an entry is due
    local = hccl_sim.run(allreduces, topology=topo, faults=FaultPlan().corrupt(0, 1, nth=3), env=FAST)
    assert [e - s for _, s, e, _ in local[0]] == [x[0] for x in exits]
    # a rank's sends on the pair (carried by its Call) come first: one send and nth=3 is the second op's first
    progress = rdv.PlanCache(topo, config).progress
    calls = [Call(0, sig, 0, 8, sent=s) for s in ((1,), (0,))]
    plan = rdv.plan_calls(calls, topo, config, progress)
    assert plan.corrupt is None and progress.collective == {(0, 1): 2}
    assert rdv.plan_calls(calls, topo, config, progress).corrupt == {(0, 1, 0): "fault plan entry 0 (corrupt 0-1)"}


def _p2p(comm, n=1000):
    try:
        if comm.rank == 0:
            comm.send(np.arange(n, dtype=np.int64), dst=1)
            return "sent", comm.last_op.end
        y = comm.recv(0)
        return int(y.sum()), comm.last_op.end
    except HcclError as e:
        return e.code, str(e), comm.clock


@pytest.mark.local
def test_send_recv_under_a_flap_a_slowed_link_and_corruption():
    """8000 bytes over 1 GB/s and 1 us: 9000 ns. A flap of one interval costs one interval; half
    bandwidth doubles the wire time; a corrupt entry on the send costs one interval; both ends agree."""
    clean = hccl_sim.run(_p2p, topology=pair(), env=FAST)
    assert clean == [("sent", 9000), (499500, 9000)]
    for plan, end in ((FaultPlan().link_flap(0, 1, at=0, duration=DELTA / 1e9), 9000 + DELTA),
                      (FaultPlan().link_slow(0, 1, factor=0.5), 1000 + 16000),
                      (FaultPlan().corrupt(0, 1), 9000 + DELTA), (FaultPlan().corrupt(1, 0), 9000),
                      (FaultPlan().link_flap(0, 1, at=1.0, duration=1.0), 9000)):
        assert hccl_sim.run(_p2p, topology=pair(), faults=plan, env=FAST) == [("sent", end), (499500, end)], plan.entries


@pytest.mark.local
def test_send_recv_over_a_down_link_fail_on_both_sides_without_op_retry():
    env = {**FAST, "HCCL_OP_RETRY_ENABLE": "L0:1"}       # retry on: still none for send/recv
    got = hccl_sim.run(_p2p, topology=pair(), faults=FaultPlan().link_down(0, 1), env=env)
    for (code, msg, clock), side in zip(got, ("send", "recv")):
        assert code == "E_REMOTE" and clock == 2 * DELTA
        assert f"[rank {0 if side == 'send' else 1}, {side}] Cluster Exception Location[link 0 -> 1 (L0)]" in msg
        assert "error CQE, rank 0 -> rank 1 failed after 2 attempts (fault plan entry 0 (link_down 0-1))" in msg
        assert msg.endswith("HCCL has no op retry for send/recv")
    # between servers: the route's hops and level L1, and the next op still runs
    a2 = hccl_sim.topology("atlas800t-a2", servers=2)

    def fn(comm):
        out = None
        if comm.rank in (1, 9):
            try:
                if comm.rank == 1:
                    comm.send(np.ones(4096, np.float32), dst=9)
                else:
                    comm.recv(1)
            except HcclError as e:
                out = (e.code, str(e))
        comm.barrier()
        return out
    res = hccl_sim.run(fn, topology=a2, faults=FaultPlan().nic_down(9, at=0.0, duration=3 * DELTA / 1e9),
                       env=FAST)
    assert res[1][0] == res[9][0] == "E_REMOTE" and "link 1 -> roce -> 9 (L1)" in res[9][1]
    assert all(r is None for k, r in enumerate(res) if k not in (1, 9))


@pytest.mark.local
def test_corrupt_counts_sends_and_collectives_together():
    """Send 0 -> 1 (transfer 0), then two 2-rank AllReduces (1-2 and 3-4): nth=0 hits the send,
    nth=3 the second op; after the op a send is transfer 5 (nth=5 hits it). Same on every run."""
    def fn(comm):
        ends = []
        if comm.rank == 0:
            comm.send(np.arange(10, dtype=np.int64), dst=1)
        else:
            comm.recv(0)
        ends.append(comm.last_op.end - comm.last_op.start)
        for y, s, e, _ in allreduces(comm, ops=2, n=1000):
            ends.append(e - s)
        if comm.rank == 0:
            comm.send(np.arange(10, dtype=np.int64), dst=1)
        else:
            comm.recv(0)
        ends.append(comm.last_op.end - comm.last_op.start)
        return ends
    base = hccl_sim.run(fn, topology=pair(), env=FAST)[0]
    for nth, hit in ((0, 0), (3, 2), (5, 3), (1, 1)):
        got = hccl_sim.run(fn, topology=pair(), faults=FaultPlan().corrupt(0, 1, nth=nth), env=FAST)
        assert got[0] == [t + (DELTA if k == hit else 0) for k, t in enumerate(base)], nth
        assert got == hccl_sim.run(fn, topology=pair(), faults=FaultPlan().corrupt(0, 1, nth=nth), env=FAST)
