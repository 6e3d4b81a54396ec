"""Ranks of one host on the socket transport: places and acknowledgements through shared-memory
rings, read by the waiting rank's own thread, with frames by TCP kept in their order; and the
hierarchical control plane (a control block per host, one leader per host across)."""
import threading
import time

import numpy as np
import pytest

from hcomm.control.nodes import BUDGET_BYTES, HostLayout, NodeControl
from hcomm.control.shm import ControlBlock
from hcomm.exec import run_schedule as execute
from hcomm.memory import segments as shm
from hcomm.transports.host_rings import SLOTS
from hcomm.transports.socket import SocketTransport
from topologies.errors import HcclError

from conftest import SocketHosts as Host, ranks_as_threads, wait_until
from transport_cases import CASES, case_buffers, case_expected, case_steps

pytestmark = [pytest.mark.local, pytest.mark.timeout(120), pytest.mark.usefixtures("no_transport_leaks")]


@pytest.mark.parametrize("p", [2, 3, 5])
def test_programs_between_ranks_of_one_host_go_by_the_rings(p):
    """Every case (ring, H-D_R, NHR; AllReduce and AllGather) with every buffer in the ranks'
    segments: results equal numpy's, and every place went by the rings, none over TCP."""
    host = Host(p, range(p))

    def body(rank):
        tr, mem = host.tr[rank], host.memory[rank]
        out = {}
        for i, (coll, algo) in enumerate(CASES):
            for name, array in case_buffers(coll, p, rank).items():
                _, seg = mem.owned.array(f"{name}{i}", array.shape, array.dtype)
                seg[...] = array
                tr.register(rank, name, seg)
            execute(case_steps(coll, algo, p)[rank], rank, tr, ("case", i), np.add, tr.deadline(), coll)
            out[(coll, algo)] = tr.region(rank, "output").copy()
        return out, tr.sent_by_place, tr.sent_by_ring
    try:
        results = ranks_as_threads(p, body)
    finally:
        host.close()
    for coll, algo in CASES:
        for rank in range(p):
            assert np.array_equal(results[rank][0][(coll, algo)], case_expected(coll, p)), (coll, algo, rank)
    assert all(by_place > 0 and by_ring == by_place for _, by_place, by_ring in results)


def test_frames_of_one_tag_keep_their_order_across_the_rings_and_tcp():
    """Rank 0 sends rank 1 150 frames of one tag before rank 1 takes any: slices in its
    segments (by the rings until the ring is full, then their places over TCP) and host arrays
    (bytes over TCP) interleaved. Rank 1 takes them in the order they were sent, every value right,
    and every send is acknowledged."""
    host = Host(2, (0, 1))
    tr0, tr1 = host.tr
    _, seg = host.memory[0].owned.array("src", (150, 4), np.int64)
    seg[...] = np.arange(600).reshape(150, 4)
    plain = np.arange(600, dtype=np.int64).reshape(150, 4)
    try:
        handles = [tr0.post_view(0, 1, "t", seg[i] if i % 3 else plain[i]) for i in range(150)]
        assert tr0.sent_by_ring == SLOTS < tr0.sent_by_place == 100        # the ring filled, then TCP
        for i in range(150):
            msg = tr1.take(0, 1, "t", time.monotonic() + 10)
            assert np.array_equal(msg.data, plain[i]), i
            msg.consumed()
        for h in handles:
            tr0.wait_consumed(h, time.monotonic() + 10)
    finally:
        host.close()


def test_a_waiting_rank_hears_tcp_frames_and_aborts_while_asleep_on_its_doorbell():
    """A rank of the host sleeps on its doorbell waiting for a peer on another host (bytes over
    TCP): the socket thread's delivery wakes it at once; so does an abort."""
    host = Host(3, (0, 1))             # rank 2 is on another host
    tr0, tr2 = host.tr[0], host.tr[2]
    try:
        got = []
        t = threading.Thread(target=lambda: got.append(tr0.take(2, 0, "x", time.monotonic() + 20)))
        t.start()
        wait_until(lambda: tr0.asleep_on_doorbell() > 0, "rank 0 asleep on its doorbell")
        t0 = time.monotonic()
        h = tr2.post_view(2, 0, "x", np.arange(5))
        t.join(10)
        assert got and np.array_equal(got[0].data, np.arange(5)) and time.monotonic() - t0 < 5
        got[0].consumed()
        tr2.wait_consumed(h, time.monotonic() + 10)
        errors = []

        def wait():
            try:
                tr0.take(1, 0, "never", time.monotonic() + 20)
            except HcclError as exc:
                errors.append(exc)
        t = threading.Thread(target=wait)
        t.start()
        wait_until(lambda: tr0.asleep_on_doorbell() > 0, "rank 0 asleep on its doorbell")
        tr0.abort("E_REMOTE", "told to stop")
        t.join(10)
        assert errors and errors[0].code == "E_REMOTE" and "told to stop" in errors[0].reason
    finally:
        host.close()


# ---- the control plane of ranks on several hosts ---------------------------------------------------------

HOSTS = ["a", "a", "b", "b", "b", "c"]      # a host of two, one of three, one alone


class Hosts:
    """The ranks of HOSTS as threads: a socket transport each, a control block per host of several."""

    def __init__(self, timeout_s=30):
        self.layout = HostLayout(HOSTS)
        self.session = shm.new_session()
        self.owners = {k: ControlBlock.create(f"{self.session}_node{k}", len(rs), self.layout.slot_bytes())
                       for k, rs in enumerate(self.layout.hosts) if len(rs) > 1}
        p = len(HOSTS)
        self.tr = [SocketTransport(r, p, timeout_s=timeout_s, connect_timeout_s=30) for r in range(p)]
        peers = {r: t.address for r, t in enumerate(self.tr)}
        for t in self.tr:
            t.start(peers, eager=False)
        self.control = []
        for r in range(p):
            k = self.layout.host_index[r]
            block = ControlBlock.attach(f"{self.session}_node{k}", self.layout.local_index[r]) \
                if k in self.owners else None
            self.control.append(NodeControl(block, self.tr[r], r, self.layout))

    def close(self):
        for c in self.control:
            c.close()
        for t in self.tr:
            t.close()
        for o in self.owners.values():
            o.close()
        shm.cleanup(self.session)


def test_host_layout_and_payload_limit():
    layout = HostLayout(HOSTS)
    assert layout.hosts == [(0, 1), (2, 3, 4), (5,)] and layout.leaders == (0, 2, 5)
    assert layout.local_index == [0, 1, 0, 1, 2, 0] and layout.host_index == [0, 0, 1, 1, 1, 2]
    assert layout.payload_bytes() == 68 << 10
    assert layout.slot_bytes() >= 5 * (68 << 10)          # a lone host's leader publishes five payloads
    big = HostLayout([r // 8 for r in range(1024)])         # 128 hosts: the slot within its budget
    assert big.slot_bytes() <= BUDGET_BYTES + 128 * 64 and 4096 < big.payload_bytes() < 68 << 10
    huge = HostLayout([r // 8 for r in range(8192)])        # past it, payloads of 4 KiB still fit
    assert huge.payload_bytes() == 4096 and huge.slot_bytes() >= (8192 - 8) * 4096


def test_allgather_across_hosts_through_their_blocks_and_leaders():
    """Rounds of payloads of every size up to the limit, different on every rank: every rank gets
    every payload in rank order."""
    hosts = Hosts()
    sizes = [0, 1, 700, 9000, 68 << 10]

    def body(rank):
        c, got = hosts.control[rank], []
        for seq in range(12):
            n = sizes[(seq + rank) % len(sizes)]
            got.append(c.allgather(seq, bytes([rank + seq & 255]) * n, time.monotonic() + 20, "op"))
        return got
    try:
        results = ranks_as_threads(len(HOSTS), body)
    finally:
        hosts.close()
    for seq in range(12):
        want = [bytes([r + seq & 255]) * sizes[(seq + r) % len(sizes)] for r in range(len(HOSTS))]
        assert all(res[seq] == want for res in results), seq


def test_a_failed_rank_fails_every_host_at_once():
    """Rank 3 (not its host's leader) fails and aborts its control plane, then closes its
    transport, as a failing rank's engine does: its host's ranks raise its abort, the other hosts
    hear it through their leaders (published in their blocks), and every rank raises within
    seconds, not at the deadline."""
    hosts = Hosts(timeout_s=60)

    def body(rank):
        c = hosts.control[rank]
        c.allgather(0, b"x", time.monotonic() + 20, "op")
        if rank == 3:
            c.abort("E_REMOTE", "rank 3 failed: boom")
            c.leave()
            hosts.tr[3].close()
            return "failed"
        t0 = time.monotonic()
        try:
            c.allgather(1, b"y", time.monotonic() + 60, "op")
        except HcclError as exc:
            if rank != 3 and hosts.layout.leaders[hosts.layout.host_index[rank]] == rank:
                c.leave()
                hosts.tr[rank].close()          # a leader that failed: its engine closes it
            return exc.code, exc.reason, time.monotonic() - t0
        return "completed"
    try:
        results = ranks_as_threads(len(HOSTS), body)
    finally:
        hosts.close()
    assert results[3] == "failed"
    for r in (0, 1, 2, 4, 5):
        code, reason, took = results[r]
        assert took < 15, (r, reason)
    assert "boom" in results[2][1] and "boom" in results[4][1]       # rank 3's own host: its abort
