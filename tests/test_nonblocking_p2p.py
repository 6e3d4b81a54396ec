"""comm.isend / comm.irecv: transfers issued in any order complete without a deadlock, receives on
one channel complete in issue order whatever order they are waited in, ANY_SOURCE names the
sender, the simulated clocks are send/recv's, a receive nobody sends to ends at its deadline,
and groups refuse them."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import ANY_SOURCE, HcclError

pytestmark = pytest.mark.local


@pytest.mark.parametrize("p", [2, 3, 5, 8])
def test_receives_before_sends_both_ways_and_one_channel_in_issue_order(p):
    def fn(comm):
        r = comm.rank
        nxt, prv = (r + 1) % p, (r - 1) % p
        a, b = comm.irecv(prv, tag=3), comm.irecv(nxt, tag=4)
        sends = [comm.isend(np.full(5, r), nxt, tag=3), comm.isend(np.full(2, 10 + r), prv, tag=4)]
        c1, c2 = comm.irecv(prv), comm.irecv(prv)
        sends += [comm.isend(np.array([1]), nxt), comm.isend(np.array([2]), nxt)]
        got = [c2.wait(), c1.wait(), b.wait(), a.wait()]         # waited in reverse
        for s in sends:
            s.wait()
        return got, [q.source for q in (a, b, c1, c2)], sends[0].record
    for r, (got, sources, rec) in enumerate(hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=p))):
        nxt, prv = (r + 1) % p, (r - 1) % p
        assert [g.tolist() for g in got] == [[2], [1], [10 + nxt] * 2, [prv] * 5]
        assert sources == [prv, nxt, prv, prv]
        assert rec.name == "isend" and rec.end > rec.start


def test_any_source_takes_every_sender_and_names_it():
    p = 6

    def fn(comm):
        if comm.rank == 0:
            reqs = [comm.irecv(ANY_SOURCE, tag=1) for _ in range(p - 1)]
            values = [int(q.wait()[0]) for q in reqs]
            return sorted(zip((q.source for q in reqs), values))
        comm.isend(np.array([100 + comm.rank]), 0, tag=1).wait()
        return None
    got = hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=p))
    assert got[0] == [(q, 100 + q) for q in range(1, p)]


def test_clocks_equal_blocking_send_and_recv():
    topo = hccl_sim.topology("atlas800t-a2", servers=1)

    def blocking(comm):
        if comm.rank == 0:
            comm.send(np.ones(1 << 16, np.float32), 1)
        elif comm.rank == 1:
            comm.recv(0)
        return comm.clock

    def nonblocking(comm):
        if comm.rank == 0:
            comm.isend(np.ones(1 << 16, np.float32), 1).wait()
        elif comm.rank == 1:
            comm.irecv(0).wait()
        return comm.clock
    assert hccl_sim.run(nonblocking, topology=topo) == hccl_sim.run(blocking, topology=topo)


def test_transfers_issued_at_a_time_start_then_and_leave_the_host_clock():
    """`at=`: a runtime's own timeline (the torch backend's streams) says when a transfer starts;
    it is priced as one issued at that clock, and the host clock stays where it was."""
    topo = hccl_sim.topology("atlas800t-a2", servers=1)
    at = 50_000

    def timed(comm):
        if comm.rank == 0:
            req = comm.isend(np.ones(1 << 16, np.float32), 1, at=at)
        elif comm.rank == 1:
            req = comm.irecv(0, at=at)
        else:
            return None
        req.wait()
        return comm.clock, req.record.start, req.record.end

    def from_the_clock(comm):
        comm.device.clock = at
        if comm.rank == 0:
            req = comm.isend(np.ones(1 << 16, np.float32), 1)
        elif comm.rank == 1:
            req = comm.irecv(0)
        else:
            return None
        req.wait()
        return comm.clock, req.record.start, req.record.end
    got, want = hccl_sim.run(timed, topology=topo)[:2], hccl_sim.run(from_the_clock, topology=topo)[:2]
    for (clock, start, end), (_, want_start, want_end) in zip(got, want):
        assert clock == 0 and (start, end) == (want_start, want_end) and start == at and end > at

    def bad(comm):
        with pytest.raises(HcclError, match="at must be a simulated time"):
            comm.irecv(0 if comm.rank else 1, at=-1)
        return True
    assert all(hccl_sim.run(bad, topology=hccl_sim.topology("fullmesh", ranks=2)))


def test_a_receive_nobody_sends_ends_at_its_deadline_and_groups_refuse_them():
    def fn(comm):
        if comm.rank == 1:
            with pytest.raises(HcclError, match="irecv from rank 0 .tag 5. did not complete within HCCL_EXEC_TIMEOUT"):
                comm.irecv(0, tag=5).wait()
            with comm.group():
                with pytest.raises(HcclError, match="E_NOT_SUPPORT"):
                    comm.isend(np.zeros(1), 0)
            with pytest.raises(HcclError, match="src must be a rank"):
                comm.irecv(7)
        return True
    assert hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=2), env={"HCCL_EXEC_TIMEOUT": "1"}) == \
        [True, True]
