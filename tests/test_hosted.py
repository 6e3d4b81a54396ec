"""The hosted executor (hcomm.exec.hosted): ranks of one host read each other's slices in place and keep
their steps in order by step words in shared memory, while peers on other hosts get messages over
TCP; every collective's results equal the central program's, bit for bit."""
import threading
import time

import numpy as np
import pytest

from hccl_sim import collectives
from hccl_sim.config.env import Config
from hccl_sim.comm.rank_group import RankBuffers
from hccl_sim.plan import planner
from hcomm.exec import run_rank_in, run_share, with_scratch
from hcomm.exec.hosted import run_hosted
from topologies.errors import Cause, HcclError
from topologies.presets import hardware

from conftest import SocketHosts, ranks_as_threads, wait_until

pytestmark = [pytest.mark.local, pytest.mark.timeout(180), pytest.mark.usefixtures("no_transport_leaks")]


def servers(sizes):
    """The ranks of each server of a 910B cluster with `sizes` cards per server."""
    out, at = [], 0
    for n in sizes:
        out.append(list(range(at, at + n)))
        at += n
    return out


def calls(topo, counts):
    """(collective, plan's data program, every rank's input) for every data collective at each count
    (integers, so every order of reduction gives the same sums)."""
    p = topo.num_ranks
    rng = np.random.default_rng(p)
    out = []
    for count in counts:
        for cname in collectives.DATA_COLLECTIVES:
            coll = collectives.get(cname)
            n = count * p if coll.divisible else count
            sig = planner.Signature(cname, (n,), "int64", "sum" if coll.reducing else None,
                                    p - 1 if coll.rooted else None, None)
            data = planner.make_plan(sig, topo, Config(), [0] * p, 8).data
            out.append((coll, data, [rng.integers(-1000, 1000, n) for _ in range(p)]))
    return out


def central(coll, data, xs):
    p = len(xs)
    full = [with_scratch(data, RankBuffers(x, np.zeros(coll.output_shape(x.shape, p), x.dtype), None)) for x in xs]
    run_share(data, full)
    return [b.output for b in full]


@pytest.mark.parametrize("sizes", [(4, 3), (2, 3, 2), (1, 4), (5,)], ids=["4+3", "2+3+2", "1+4", "one-host"])
def test_collectives_on_step_words_across_hosts(sizes):
    """Every data collective, three sizes each (one element per rank, an odd size, 12k elements),
    back to back on one set of transports, on 910B servers of `sizes` cards, a server per host: every
    output equals the central program's, host peers' slices were read in place (no message between
    them), and only peers on other hosts got messages."""
    topo = hardware("atlas800t-a2", devices_per_server=list(sizes))
    p = topo.num_ranks
    groups = servers(sizes)
    ops = calls(topo, (1, 37, 12_000))
    want = [central(coll, data, xs) for coll, data, xs in ops]
    hosts = SocketHosts(p, groups)

    def body(rank):
        tr, mem = hosts.tr[rank], hosts.memory[rank]
        got = []
        for seq, (coll, data, xs) in enumerate(ops):
            out = np.full(coll.output_shape(xs[rank].shape, p), -7, np.int64)
            run_rank_in(mem, data, rank, RankBuffers(xs[rank], out, None), tr, seq)
            got.append(out)
        steps = tr.host_steps
        return got, tr.sent_by_place, 0 if steps is None else steps.read_in_place
    try:
        results = ranks_as_threads(p, body)
    finally:
        hosts.close()
    for i, (coll, data, _) in enumerate(ops):
        for rank in range(p):
            if coll.result(want[i][rank], rank, p - 1 if coll.rooted else None) is not None:
                assert np.array_equal(results[rank][0][i], want[i][rank]), (coll.name, data.name, rank)
    for rank, (_, by_message, in_place) in enumerate(results):
        alone = any(g == [rank] for g in groups)
        assert by_message == 0 and (in_place == 0) == alone, (rank, by_message, in_place)


def test_a_sender_whose_buffers_are_not_shared_sends_messages_for_the_op():
    """One rank of the host runs an op on plain arrays (not in its segments): it publishes no places,
    sends its host peers messages, and they take its slices as messages while reading the others'
    in place; the next op, staged, is on step words again. Every output is right."""
    topo = hardware("atlas800t-a2", devices_per_server=[4])
    p = 4
    (coll, data, xs), = [c for c in calls(topo, (3000,)) if c[0].name == "allreduce"]
    want = central(coll, data, xs)
    hosts = SocketHosts(p, range(p))

    def body(rank):
        tr, mem = hosts.tr[rank], hosts.memory[rank]
        out = np.zeros_like(xs[rank])
        if rank == 1:                        # buffers as they are, nothing in shared memory
            run_hosted(data, rank, with_scratch(data, RankBuffers(xs[rank], out, None)), tr, tr.host_steps, 0)
        else:
            run_rank_in(mem, data, rank, RankBuffers(xs[rank], out, None), tr, 0)
        first = (out.copy(), tr.sent_by_place, tr.host_steps.read_in_place)
        out[:] = 0
        run_rank_in(mem, data, rank, RankBuffers(xs[rank], out, None), tr, 1)
        return first, (out, tr.sent_by_place, tr.host_steps.read_in_place)
    try:
        results = ranks_as_threads(p, body)
    finally:
        hosts.close()
    for rank, ((out0, by_message0, read0), (out1, by_message1, read1)) in enumerate(results):
        assert np.array_equal(out0, want[rank]) and np.array_equal(out1, want[rank]), rank
        assert by_message0 == by_message1 == 0, rank
        # the first op: rank 1 read every peer in place, the others took rank 1's slices as messages
        assert (read0 == read1 - read0) if rank == 1 else (0 < read0 < read1 - read0), (rank, read0, read1)


def test_a_rank_that_returns_mid_op_fails_the_host_peers_waiting_on_its_words():
    """A rank runs two steps of an AllReduce and closes its transport (its goodbye): the host peers
    waiting on its step words fail at once with E_PARA naming it, not at the deadline."""
    p = 4
    topo = hardware("atlas800t-a2", devices_per_server=[p])
    (coll, data, xs), = [c for c in calls(topo, (2000,)) if c[0].name == "allreduce"]
    hosts = SocketHosts(p, range(p), timeout_s=60)

    def body(rank):
        tr, mem = hosts.tr[rank], hosts.memory[rank]
        out = np.zeros_like(xs[rank])
        if rank == 2:
            run_rank_in(mem, data, rank, RankBuffers(xs[rank], out, None), tr, 0, steps=1)
            tr.close()
            return None
        t0 = time.monotonic()
        try:
            run_rank_in(mem, data, rank, RankBuffers(xs[rank], out, None), tr, 0)
        except HcclError as exc:
            return exc, time.monotonic() - t0
        return "completed", time.monotonic() - t0
    try:
        results = ranks_as_threads(p, body)
    finally:
        hosts.close()
    for rank in (0, 1, 3):
        exc, took = results[rank]
        assert isinstance(exc, HcclError) and took < 20, (rank, exc, took)
    named = [results[r][0] for r in (0, 1, 3) if results[r][0].peers == (2,)]
    assert named and all(e.code == "E_PARA" and e.cause == Cause.PEER_RETURNED for e in named)


def test_an_abort_wakes_a_rank_asleep_on_a_peers_words():
    """A rank waits for a host peer that never comes: an abort of its transport wakes it at once."""
    p = 2
    topo = hardware("atlas800t-a2", devices_per_server=[p])
    (coll, data, xs), = [c for c in calls(topo, (500,)) if c[0].name == "allgather"]
    hosts = SocketHosts(p, range(p), timeout_s=60)
    got = []

    def rank0():
        out = np.zeros(coll.output_shape(xs[0].shape, p), np.int64)
        try:
            run_rank_in(hosts.memory[0], data, 0, RankBuffers(xs[0], out, None), hosts.tr[0], 0)
        except HcclError as exc:
            got.append((exc, time.monotonic()))
    t = threading.Thread(target=rank0)
    try:
        t.start()
        wait_until(lambda: hosts.tr[0].asleep_on_doorbell() > 0, "rank 0 asleep on its doorbell")
        at = time.monotonic()
        hosts.tr[0].abort("E_INTERNAL", "test abort")
        t.join(10)
        assert got and "aborted: test abort" in str(got[0][0]) and got[0][1] - at < 5
    finally:
        t.join(10)
        hosts.close()


def test_a_host_peer_whose_process_dies_is_found_by_its_pid():
    """Rank 0 waits on a host peer's step words; the peer, another process with no TCP connection to
    rank 0 (nothing was ever sent between them), is killed: rank 0 fails within seconds, E_REMOTE
    naming it, from the process id its segment records."""
    from hcomm.memory import segments as shm
    from hcomm.memory.segment_provider import SegmentProvider
    from hcomm.transports.socket import SocketTransport
    from transport_cases import SPAWN, host_rank
    p = 2
    topo = hardware("atlas800t-a2", devices_per_server=[p])
    (coll, data, xs), = [c for c in calls(topo, (500,)) if c[0].name == "allreduce"]
    session = shm.new_session()
    mine, theirs = SPAWN.Pipe()
    proc = SPAWN.Process(target=host_rank, args=(1, p, session, theirs))
    proc.start()
    tr = SocketTransport(0, p, timeout_s=60, connect_timeout_s=30)
    memory = SegmentProvider(session, 0)
    try:
        assert mine.poll(60)
        peers = {0: tr.address, 1: mine.recv()}
        mine.send(peers)
        tr.start(peers, eager=False)
        tr.share_host(memory, range(p))
        assert mine.poll(60) and mine.recv() == "ready"
        got = []

        def rank0():
            try:
                run_rank_in(memory, data, 0, RankBuffers(xs[0], np.zeros_like(xs[0]), None), tr, 0)
            except HcclError as exc:
                got.append((exc, time.monotonic()))
        t = threading.Thread(target=rank0)
        t.start()
        wait_until(lambda: tr.asleep_on_doorbell() > 0, "rank 0 asleep on its doorbell, waiting for rank 1")
        at = time.monotonic()
        proc.kill()
        t.join(20)
        assert got, "rank 0 still waits"
        exc, when = got[0]
        assert exc.code == "E_REMOTE" and exc.peers == (1,) and "is gone" in str(exc) and when - at < 5, exc
    finally:
        proc.join(10)
        tr.close()
        memory.close()
        shm.cleanup(session)
        mine.close()
