"""comm.batch_send_recv (HCCL's BatchSendRecv): pipeline-parallel exchanges and any-to-any batches
against numpy, HCCL's pairwise order, its checks without a hang, the streams' timing, and faults."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import FaultPlan, HcclError
from hccl_sim.comm.p2p import Item, pairwise_order


def _ring(comm, n):
    """Each rank sends its block to the next stage and receives the previous stage's (as a
    pipeline's forward and backward passes: both directions in one batch)."""
    r, p = comm.rank, comm.size
    x = np.arange(n, dtype=np.int32) + 1000 * r
    items = [("send", (r + 1) % p, x), ("recv", (r - 1) % p, ((n,), "int32")),
             ("send", (r - 1) % p, -x), ("recv", (r + 1) % p, np.empty(n, dtype=np.int32))]
    fwd, bwd = comm.batch_send_recv(items)
    return fwd, bwd, comm.last_op


@pytest.mark.local
@pytest.mark.parametrize("p", list(range(1, 10)))
def test_pipeline_exchange_equals_numpy_for_every_rank_count(p):
    topo = hccl_sim.topology("fullmesh", ranks=p)
    for n in (0, 1, 1000):
        for r, (fwd, bwd, rec) in enumerate(hccl_sim.run(_ring, topology=topo, args=(n,))):
            assert np.array_equal(fwd, np.arange(n, dtype=np.int32) + 1000 * ((r - 1) % p))
            assert np.array_equal(bwd, -(np.arange(n, dtype=np.int32) + 1000 * ((r + 1) % p)))
            assert rec.name == "batch_send_recv" and rec.end >= rec.start + (p > 1)


@pytest.mark.local
def test_any_to_any_batches_with_several_items_per_peer_keep_their_order():
    def fn(comm):
        r, p = comm.rank, comm.size
        items = []
        for q in range(p):                     # two messages to every peer (itself too), then the receives
            items += [("send", q, np.full(q + 1, 10 * r + k, dtype=np.int64)) for k in range(2)]
        items += [("recv", q, ((r + 1,), np.int64)) for q in reversed(range(p)) for _ in range(2)]
        return comm.batch_send_recv(items)
    p = 5
    for r, got in enumerate(hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=p))):
        want = [np.full(r + 1, 10 * q + k) for q in reversed(range(p)) for k in range(2)]
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), r


@pytest.mark.unit
def test_hccls_pairwise_order():
    """Sends to the nearest rank at or below first, going down the ring; receives from the
    nearest at or above first, going up; stable within a peer."""
    def items(pairs):
        return [Item.of(k, kind, peer, np.zeros(1)) for k, (kind, peer) in enumerate(pairs)]
    sends, recvs, own = pairwise_order(items([("send", 0), ("send", 5), ("recv", 0), ("send", 1), ("recv", 2),
                                              ("recv", 5), ("send", 5), ("recv", 4), ("send", 2), ("recv", 2)]), 3, 6)
    assert [(i.peer, i.index) for i in sends] == [(2, 8), (1, 3), (0, 0), (5, 1), (5, 6)]
    assert [(i.peer, i.index) for i in recvs] == [(4, 7), (5, 5), (0, 2), (2, 4), (2, 9)]
    assert own == []
    sends, recvs, own = pairwise_order(items([("send", 2), ("send", 0), ("recv", 2)]), 2, 6)
    assert [(s.index, r.index) for s, r in own] == [(0, 2)] and [i.index for i in sends] == [1] and recvs == []


@pytest.mark.local
@pytest.mark.parametrize("case,match", [
    ("count", r"rank 1 receives 4 elements of int32 from rank 0 \(items\[0\]\), which sends 3 of int32"),
    ("dtype", r"receives 3 elements of int64 from rank 0 .* which sends 3 of int32"),
    ("self", r"SendTask and Recv Task to rank itself do not match"),
    ("kind", r"items\[1\] must be \(\"send\" or \"recv\", peer, array\)"),
    ("peer", r"items\[0\]: peer must be a rank in \[0, 3\), got 3"),
    ("shape", r"a receive's \(shape, dtype\) must name an array"),
])
def test_bad_batches_fail_on_the_ranks_involved_without_a_hang(case, match):
    def fn(comm):
        r = comm.rank
        x = np.zeros(3, dtype=np.int32)
        if case == "kind" and r == 2:
            return comm.batch_send_recv([("send", 0, x), ("put", 1, x)])
        if case == "peer" and r == 2:
            return comm.batch_send_recv([("send", 3, x)])
        if case == "shape" and r == 2:
            return comm.batch_send_recv([("recv", 0, ((-1,), "int32"))])
        if case == "self":
            return comm.batch_send_recv([("send", r, x), ("recv", r, ((4,), "int32"))])
        if case in ("kind", "peer", "shape"):
            return None
        if r == 0:
            return comm.batch_send_recv([("send", 1, x)])
        if r == 1:
            want = {"count": ((4,), "int32"), "dtype": ((3,), "int64")}[case]
            return comm.batch_send_recv([("recv", 0, want)])
        return None
    with pytest.raises(HcclError, match=match) as info:
        hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=3), env={"HCCL_EXEC_TIMEOUT": "20"})
    assert info.value.code == "E_PARA"


@pytest.mark.local
def test_an_empty_batch_returns_nothing():
    got = hccl_sim.run(lambda comm: comm.batch_send_recv([]), topology=hccl_sim.topology("fullmesh", ranks=2))
    assert got == [[], []]


@pytest.mark.local
def test_sends_and_receives_run_on_their_own_streams():
    """A pair exchanging in one batch takes one transfer's time plus the batch's one launch, where
    a send then a receive take two; a rank's sends to two peers run one after another, in HCCL's
    order (from rank 0: rank 2, then rank 1)."""
    topo = hccl_sim.topology("fullmesh", ranks=3, bandwidth=1e9, latency=1e-6)
    n = 250_000                                      # 1 MB: 1 ms on the wire

    def fn(comm, mode):
        r = comm.rank
        x = np.zeros(n, dtype=np.int32)
        if mode == "batch" and r < 2:
            comm.batch_send_recv([("send", 1 - r, x), ("recv", 1 - r, ((n,), "int32"))])
        elif mode == "pair" and r < 2:
            if r == 0:
                comm.send(x, 1)
                comm.recv(1)
            else:
                comm.recv(0)
                comm.send(x, 0)
        elif mode == "fan" and r == 0:
            comm.batch_send_recv([("send", 1, x), ("send", 2, x)])
        elif mode == "fan":
            comm.batch_send_recv([("recv", 0, ((n,), "int32"))])
        return comm.clock
    batch, pair, fan = (hccl_sim.run(fn, topology=topo, args=(m,)) for m in ("batch", "pair", "fan"))
    assert 1.0e6 < batch[0] < 1.1e6 and 2.0e6 < pair[0] < 2.2e6
    assert fan[2] < 1.1e6 and 2.0e6 < fan[1] < 2.2e6 and fan[0] == fan[1]      # HCCL order: rank 2 first


@pytest.mark.local
def test_a_slowed_link_slows_the_batch_and_a_dead_one_fails_both_ends():
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    clean = hccl_sim.run(_ring, topology=topo, args=(100_000,))
    slow = hccl_sim.run(_ring, topology=topo, args=(100_000,), faults=FaultPlan().link_slow(7, 8, factor=0.1))
    assert max(r[2].end for r in slow) > max(r[2].end for r in clean)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(clean, slow))
    with pytest.raises(HcclError) as info:
        hccl_sim.run(_ring, topology=topo, args=(100_000,), faults=FaultPlan().link_down(7, 8, at=0.0),
                     env={"HCCL_RDMA_RETRY_CNT": "1", "HCCL_RDMA_TIMEOUT": "5"})
    assert info.value.code == "E_REMOTE" and "no op retry for send/recv" in str(info.value)
