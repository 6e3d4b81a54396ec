"""The shared-memory control plane (hcomm.control.shm) across processes that share nothing but names.

Ranks are 'spawn' processes (not forked: they know the session string only, as Ray actors do).
"""
import multiprocessing as mp
import os
import random
import signal
import struct
import time

import pytest

from hcomm.memory import segments as shm
from hcomm.control.shm import ControlBlock, segment_name
from topologies.errors import HcclError

pytestmark = pytest.mark.local

CTX = mp.get_context("spawn")
SLOT = 256
# every bound on wall or CPU time below is multiplied by this: under emulation (qemu-user,
# experiments/aarch64_check.sh) a spawned rank takes tens of seconds to import what it needs
SLOW = float(os.environ.get("HCCL_SIM_TEST_SLOWDOWN", "1"))


def payload_for(rank, seq):
    """Distinct bytes per (rank, seq), of every length from 0 to SLOT."""
    n = (rank * 37 + seq * 11) % (SLOT + 1)
    return bytes((rank * 7 + seq + i) % 256 for i in range(n))


# ---- what the rank processes run -------------------------------------------------------------------

def _run(fn, session, rank, results, *args):
    try:
        results.put((rank, "ok", fn(session, rank, *args)))
    except HcclError as exc:
        results.put((rank, "error", exc.code, exc.reason, time.monotonic()))


def _many_ops(session, rank, ops, slow_rank):
    rng = random.Random(rank)
    with ControlBlock.attach(session, rank) as block:
        p = block.size
        for seq in range(ops):
            if rank == slow_rank and rng.random() < 0.3:
                time.sleep(rng.random() * 0.002)
            deadline = time.monotonic() + 20
            if seq % 5 == 4:
                block.barrier(seq, deadline)
                continue
            got = block.allgather(seq, payload_for(rank, seq), deadline)
            want = [payload_for(j, seq) for j in range(p)]
            if got != want:
                return f"collective #{seq}: wrong payloads from ranks {[j for j in range(p) if got[j] != want[j]]}"
    return "ok"


RECORD = struct.Struct("<4sq5s")


def record_for(rank, seq):
    return RECORD.pack(bytes([65 + (rank + seq) % 26]) * 4, seq * 1000 + rank, bytes((rank + seq + i) % 256 for i in range(5)))


def _records_ops(session, rank, ops):
    """Rounds of RECORD records read as columns, at both parities; every third round rank 0's
    payload is one byte longer, and every rank gets the plain list."""
    with ControlBlock.attach(session, rank) as block:
        p = block.size
        for seq in range(ops):
            odd = seq % 3 == 2 and p > 1
            mine = record_for(rank, seq) + (b"+" if odd and rank == 0 else b"")
            columns, raws = block.allgather_records(seq, mine, RECORD, time.monotonic() + 20)
            sent = [record_for(j, seq) + (b"+" if odd and j == 0 else b"") for j in range(p)]
            if odd:
                if columns is not None or raws != sent:
                    return f"round {seq}: {columns}, {raws} for payloads of two lengths"
            elif raws is not None or list(columns) != list(zip(*map(RECORD.unpack, sent))):
                return f"round {seq}: {columns}, {raws} for records {sent}"
    return "ok"


def _wait_forever(session, rank, ready):
    with ControlBlock.attach(session, rank) as block:
        ready.set()
        block.allgather(0, b"x", time.monotonic() + 30 * SLOW)
    return "returned"


def _attach_and_sleep(session, rank, ready):
    block = ControlBlock.attach(session, rank)
    ready.set()
    time.sleep(60)
    block.close()


def _create_own_session(results):
    session = shm.new_session()
    ControlBlock.create(session, 2)
    results.put(session)
    time.sleep(60)


def start(fn, session, ranks, *args):
    results = CTX.Queue()
    procs = [CTX.Process(target=_run, args=(fn, session, r, results) + args, daemon=True) for r in ranks]
    for proc in procs:
        proc.start()
    return procs, results


def collect(procs, results, timeout=30 * SLOW):
    try:
        got = {}
        for _ in procs:
            item = results.get(timeout=timeout)
            got[item[0]] = item[1:]
        for proc in procs:
            proc.join(timeout=10 * SLOW)
        return got
    finally:
        stop(procs)


def stop(procs):
    for proc in procs:
        if proc.is_alive():
            proc.kill()
        proc.join(timeout=10 * SLOW)


def wait_asleep(block, ranks, seq=0):
    """Until each of `ranks` has published collective #seq (status()) and has been seen asleep in
    its futex for it (its sleep word holds the seq + 1 it sleeps for): past every check, blocked."""
    from conftest import wait_until         # here: the spawned ranks import this module, light
    seen = set()

    def asleep():
        published = {r for r in ranks if block.status()[r][0] == seq + 1}
        seen.update(r for r in published if block.asleep_for(r) == seq + 1)
        return seen == set(ranks)
    wait_until(asleep, f"ranks {sorted(ranks)} asleep in their futex in collective #{seq}", timeout=20 * SLOW)


@pytest.fixture
def session():
    name = shm.new_session()
    yield name
    assert shm.leftovers(name) == [], "a control segment was left in /dev/shm"


# ---- tests -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [1, 2, 3, 5, 8])
def test_allgather_many_ops_uneven_speeds(session, p):
    with ControlBlock.create(session, p, slot_bytes=SLOT):
        procs, results = start(_many_ops, session, range(p), 150, p - 1)
        got = collect(procs, results)
    assert got == {r: ("ok", "ok") for r in range(p)}


@pytest.mark.parametrize("p", [1, 3, 8])
def test_records_are_read_as_columns_at_both_parities_and_other_lengths_as_the_list(session, p):
    with ControlBlock.create(session, p, slot_bytes=SLOT):
        procs, results = start(_records_ops, session, range(p), 12)
        got = collect(procs, results)
    assert got == {r: ("ok", "ok") for r in range(p)}


def test_payload_sizes_and_oversize_rejected(session):
    with ControlBlock.create(session, 1, slot_bytes=SLOT), ControlBlock.attach(session, 0) as block:
        for seq, n in enumerate([0, 1, SLOT - 1, SLOT]):
            assert block.allgather(seq, bytes(range(256))[:n], None) == [bytes(range(256))[:n]]
        with pytest.raises(HcclError, match=r"control payload of 257 bytes exceeds the slot \(256 bytes\)") as e:
            block.allgather(4, b"x" * (SLOT + 1), None)
        assert e.value.code == "E_PARA"
        assert block.allgather(4, b"after", None) == [b"after"]     # the rejected call published nothing
        with pytest.raises(HcclError, match="out of order") as e:
            block.allgather(7, b"", None)
        assert e.value.code == "E_INTERNAL"


def test_bad_names_sizes_and_ranks(session):
    with pytest.raises(HcclError, match="has no control block") as e:
        ControlBlock.attach(session, 0)
    assert e.value.code == "E_NOT_FOUND"
    for size, slot in [(0, 8), (True, 8), (2.0, 8), (2, -1), (2, 1 << 31)]:
        with pytest.raises(HcclError) as e:
            ControlBlock.create(session, size, slot)
        assert e.value.code == "E_PARA"
    with ControlBlock.create(session, 2):
        with pytest.raises(HcclError, match="already has a control block"):
            ControlBlock.create(session, 2)
        for rank in (-1, 2, "0", True):
            with pytest.raises(HcclError, match="the control block has ranks 0..1") as e:
                ControlBlock.attach(session, rank)
            assert e.value.code == "E_PARA"


def test_deadline_names_missing_ranks(session):
    with ControlBlock.create(session, 4), ControlBlock.attach(session, 0) as block:
        ready = CTX.Event()
        procs = [CTX.Process(target=_attach_and_sleep, args=(session, 1, ready), daemon=True)]
        procs[0].start()
        try:
            assert ready.wait(20 * SLOW)
            t0 = time.monotonic()
            with pytest.raises(HcclError) as e:
                block.allgather(0, b"hi", t0 + 0.3)
            waited = time.monotonic() - t0
        finally:
            stop(procs)
    assert e.value.code == "E_TIMEOUT" and e.value.rank == 0
    assert "ranks [1, 2, 3] have not arrived" in e.value.reason
    assert "(rank 1: none yet, rank 2: never attached, rank 3: never attached)" in e.value.reason
    assert 0.3 <= waited < 1.0 * SLOW


def test_abort_wakes_every_waiter(session):
    with ControlBlock.create(session, 5), ControlBlock.attach(session, 4) as block:
        ready = [CTX.Event() for _ in range(4)]
        results = CTX.Queue()
        procs = [CTX.Process(target=_run, args=(_wait_forever, session, r, results, ready[r]), daemon=True)
                 for r in range(4)]
        for proc in procs:
            proc.start()
        assert all(ev.wait(20 * SLOW) for ev in ready)
        wait_asleep(block, range(4))
        aborted_at = time.monotonic()
        with pytest.raises(HcclError, match="unknown HCCL result code 'E_BOGUS'"):
            block.abort("E_BOGUS", "never seen")
        block.abort("E_NOT_SUPPORT", "rank 4 gave up: unsupported dtype", seq=0)
        got = collect(procs, results)
        with pytest.raises(HcclError, match="aborted by rank 4 in collective #0") as e:      # later calls fail too
            block.allgather(0, b"", None)
    assert e.value.code == "E_NOT_SUPPORT"
    for r in range(4):
        status, code, reason, when = got[r]
        assert (status, code, reason) == ("error", "E_NOT_SUPPORT",
                                          "aborted by rank 4 in collective #0: rank 4 gave up: unsupported dtype")
        assert when - aborted_at < 0.5, f"rank {r} woke {when - aborted_at:.3f} s after the abort"


def test_driver_abort_and_reset_for_a_new_run(session):
    with ControlBlock.create(session, 2) as owner:
        ready = CTX.Event()             # held here: a child unpickles it after start() returns
        procs, results = start(_wait_forever, session, [1], ready)
        with ControlBlock.attach(session, 0) as block:
            assert ready.wait(20 * SLOW)
            wait_asleep(owner, [1])
            owner.abort("E_TIMEOUT", "run deadline passed")
            outcome = collect(procs, results)[1][:3]
            assert outcome == ("error", "E_TIMEOUT", "aborted by the driver: run deadline passed")
            owner.reset()
            procs, results = start(_many_ops, session, [1], 20, -1)
            for seq in range(20):
                if seq % 5 == 4:
                    block.barrier(seq, time.monotonic() + 20 * SLOW)
                else:
                    assert block.allgather(seq, payload_for(0, seq), time.monotonic() + 20 * SLOW)[1] == payload_for(1, seq)
            assert collect(procs, results) == {1: ("ok", "ok")}


def test_killed_peer_is_reported(session):
    with ControlBlock.create(session, 2), ControlBlock.attach(session, 0) as block:
        ready = CTX.Event()
        proc = CTX.Process(target=_attach_and_sleep, args=(session, 1, ready), daemon=True)
        proc.start()
        try:
            assert ready.wait(20 * SLOW)
            os.kill(proc.pid, signal.SIGKILL)       # not reaped yet: a zombie counts as dead
            t0 = time.monotonic()
            with pytest.raises(HcclError) as e:
                block.allgather(0, b"", t0 + 20 * SLOW)
            waited = time.monotonic() - t0
        finally:
            stop([proc])
    assert e.value.code == "E_REMOTE"
    assert e.value.reason == f"collective #0: rank 1 (pid {proc.pid}) died before arriving"
    assert waited < 1.0 * SLOW


def test_closed_peer_is_a_mismatch(session):
    with ControlBlock.create(session, 2), ControlBlock.attach(session, 0) as block:
        procs, results = start(_many_ops, session, [1], 3, -1)      # 3 ops, then closes
        for seq in range(3):
            block.allgather(seq, payload_for(0, seq), time.monotonic() + 20 * SLOW)
        assert collect(procs, results) == {1: ("ok", "ok")}
        t0 = time.monotonic()
        with pytest.raises(HcclError, match="rank 1 returned without calling it") as e:
            block.allgather(3, b"", t0 + 20 * SLOW)
        assert e.value.code == "E_PARA" and time.monotonic() - t0 < 0.5


def test_killed_creator_leaves_only_what_cleanup_removes():
    results = CTX.Queue()
    proc = CTX.Process(target=_create_own_session, args=(results,), daemon=True)
    proc.start()
    try:
        session = results.get(timeout=20 * SLOW)
        assert shm.leftovers(session) == [f"/dev/shm/{segment_name(session)}"]
    finally:
        proc.kill()
        proc.join(timeout=10 * SLOW)
    assert shm.sweep_orphans() >= 1             # its session names a driver pid that is gone
    assert shm.leftovers(session) == []


def test_left_rank_is_a_mismatch_until_reset(session):
    with ControlBlock.create(session, 2) as owner, ControlBlock.attach(session, 0) as a, \
            ControlBlock.attach(session, 1) as b:
        b.leave()
        with pytest.raises(HcclError, match="collective #0: rank 1 returned without calling it") as e:
            a.allgather(0, b"", time.monotonic() + 5)
        assert e.value.code == "E_PARA"
        owner.reset()
        assert [s[2] for s in owner.status()] == ["attached", "attached"]


def test_long_wait_leaves_the_cpu_to_others(session):
    with ControlBlock.create(session, 2), ControlBlock.attach(session, 0) as block:
        cpu, wall = time.process_time(), time.monotonic()
        with pytest.raises(HcclError, match="ranks \\[1\\] have not arrived"):
            block.allgather(0, b"", wall + 1.0)
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert wall >= 1.0 and cpu < 0.1 * SLOW, f"a 1 s wait used {cpu:.3f} s of CPU"
