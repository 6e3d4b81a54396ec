"""hcomm.memory and the shared-memory data plane, below any engine: the result pool's reuse rule,
the segment provider, and the plane's "places unchanged" fast path (ranks are threads here, each
with its own segments, and the control plane a barrier)."""
import os
import threading

import numpy as np
import pytest

import hccl_sim
from hccl_sim.config.env import Config
from hccl_sim.plan import planner
from hcomm.control.rounds import GroupRounds
from hcomm.exec.shared_plane import UNCHANGED, SharedPlane
from hcomm.memory import segments
from hcomm.memory.pool import ResultPool, is_free
from hcomm.memory.segment_provider import SegmentProvider

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def _host_pool(spare, refit=None):
    made = []

    def alloc(nbytes, shape, dtype):
        made.append(nbytes)
        return len(made), np.empty(shape, dtype=dtype)
    return ResultPool(spare, alloc, refit), made


def test_pool_reuses_an_array_only_once_user_code_dropped_it_and_every_view_of_it():
    pool, made = _host_pool(4)
    a = pool.get((8,), np.float32)
    b = pool.get((8,), np.float32)
    assert b is not a and len(made) == 2                 # a is held: a second one
    view, a_id, b_id = a[2:], id(a), id(b)
    del a, b                                             # b is free; a's view still holds a
    c = pool.get((8,), np.float32)
    assert id(c) == b_id and len(made) == 2
    del c, view
    assert {id(pool.get((8,), np.float32)), id(pool.get((8,), np.float32))} >= {a_id} and len(made) == 2


def test_pool_is_bounded_reuses_the_least_recently_used_free_entry_and_refuses_when_all_are_held():
    pool, made = _host_pool(3)
    held = [pool.get((n,), np.int32) for n in (1, 2, 3)]
    assert pool.get((4,), np.int32) is None              # every one held: the caller makes a plain array
    assert len(pool) == 3
    del held[0]                                          # shape (1,) is free now
    x = pool.get((4,), np.int32)
    assert x is not None and x.shape == (4,) and len(pool) == 3 and len(made) == 4
    assert sorted(h for h in pool.handles()) == [2, 3, 4]
    assert sorted(pool.handles(held_only=True)) == [2, 3, 4]
    del x
    assert sorted(pool.handles(held_only=True)) == [2, 3]


def test_pool_refits_a_free_entry_at_least_as_large_for_another_shape():
    refits = []

    def refit(handle, shape, dtype):
        refits.append(handle)
        return np.empty(shape, dtype=dtype)
    pool, made = _host_pool(2, refit)
    a = pool.get((100,), np.float64)
    del a
    b = pool.get((10, 5), np.float32)                    # 200 B fit in 800 B: no new memory
    assert b.shape == (10, 5) and refits == [1] and len(made) == 1
    del b
    c = pool.get((1000,), np.float32)                    # too large: new memory
    assert c.shape == (1000,) and len(made) == 2


def test_is_free_counts_only_the_pool_entry():
    entry = [8, np.zeros(2), None]
    assert is_free(entry)
    keep = entry[1]
    assert not is_free(entry)
    del keep
    assert is_free(entry)


@pytest.fixture
def session():
    name = segments.new_session()
    yield name
    assert segments.cleanup(name) == 0, "a segment outlived its provider"


def test_segment_provider_places_views_and_pooled_results_and_leaves_nothing(session):
    a, b = SegmentProvider(session, 0), SegmentProvider(session, 1)
    try:
        res = a.result(0, (4,), np.int64)
        assert a.locate(res) is not None and a.locate(res.copy()) is None
        res[:] = [1, 2, 3, 4]
        seen = b.view(a.locate(res), (4,), np.int64)     # another rank maps it by its place
        assert seen.tolist() == [1, 2, 3, 4]
        seen[0] = 9
        assert res[0] == 9                                # the same bytes
        place = a.stage(0, "input", 100)
        assert a.stage(0, "input", 50) == place          # reused while big enough
        assert a.stage(0, "input", 200) != place         # grown by replacement
        dev = a.device_storage(0, (3,), np.float32)
        assert a.locate(dev) is not None
        del seen
        b.forget(set())
    finally:
        b.close()
        a.close()
    del res, dev


class _BarrierControl:
    """A control plane for threads: every rank's payload of round `seq`, by a barrier."""
    max_payload = 1 << 20

    def __init__(self, size):
        self.size, self.rounds, self.lock = size, {}, threading.Lock()
        self.barrier = threading.Barrier(size, timeout=20)
        self.sent = []                                   # every payload, in order

    def view(self, rank):
        parent = self

        class View:
            max_payload = parent.max_payload

            def allgather(self, seq, payload, deadline, op=None):
                with parent.lock:
                    parent.rounds.setdefault(seq, [None] * parent.size)[rank] = payload
                    parent.sent.append(payload)
                parent.barrier.wait()
                got = list(parent.rounds[seq])
                parent.barrier.wait()
                return got
        return View()


def test_shared_plane_sends_unchanged_places_after_the_first_op_and_full_ones_when_they_move(session):
    """An AllReduce on 5 ranks, three times on the same pooled arrays (a training loop): the first
    op's places round carries every rank's places, the next ones a one-byte UNCHANGED each, and
    every result is right; a new shape sends full places again."""
    p, n = 5, 40_000
    topo = hccl_sim.topology("fullmesh", ranks=p, bandwidth=25e9, latency=5e-6)
    control = _BarrierControl(p)
    providers = [SegmentProvider(session, r) for r in range(p)]
    errors = []

    def plan_of(count):
        sig = planner.Signature("allreduce", (count,), "int32", "sum", None, None)
        return planner.make_plan(sig, topo, Config(), [0] * p, 4).data

    datas = {count: plan_of(count) for count in (n, n + 8)}

    def rank(r):
        try:
            plane = SharedPlane(GroupRounds(control.view(r), 20), providers[r], r, p)
            x = providers[r].result(0, (n,), np.int32)
            for it in range(3):
                x[:] = np.arange(n, dtype=np.int32) + r + it
                out = providers[r].result(0, (n,), np.int32)
                plane.run(it, datas[n], (x, out, None))
                want = p * np.arange(n, dtype=np.int32) + sum(range(p)) + p * it
                assert (out == want).all(), (r, it)
                del out
            y = np.full(n + 8, r, np.int32)                  # a host array, a new shape: staged
            out = np.empty(n + 8, np.int32)
            plane.run(3, datas[n + 8], (y, out, None))
            assert (out == sum(range(p))).all()
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append((r, exc))
            control.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for prov in providers:
        prov.close()
    assert not errors, errors
    places = [control.sent[i * p:(i + 1) * p] for i in range(0, len(control.sent) // p, 2)]  # every other: places
    assert len(places) == 4
    assert all(raw != UNCHANGED for raw in places[0])       # the first op: every rank's places
    assert all(raw == UNCHANGED for op in places[1:3] for raw in op)
    assert all(raw != UNCHANGED for raw in places[3])       # a new shape


def test_pool_slot_stages_in_a_free_entry_or_a_new_one_that_the_next_get_hands_out():
    pool, made = _host_pool(2, refit=lambda handle, shape, dtype: np.empty(shape, dtype=dtype))
    h = pool.slot(400)                                   # no entry yet: a new one
    assert h == 1 and len(pool) == 1
    got = pool.get((100,), np.float32)                   # that entry, refitted
    assert got.shape == (100,) and len(made) == 1
    assert pool.slot(400) == 2                           # the first is held: a second entry
    other = pool.get((100,), np.float32)
    assert not pool.all_held() or len(pool) == 2
    assert pool.all_held() and pool.slot(400) is None    # full, every one held
    del got
    assert pool.slot(100) == 1 and len(made) == 2        # the free one, large enough
    del other


def test_segments_never_reach_the_resource_tracker(session, monkeypatch):
    """Ranks spawned from one parent share its resource tracker; a segment one rank registered
    and another unregistered made it print a KeyError at exit (issue 40). Owned, private and
    attached segments register nothing with it, and are still removed from /dev/shm."""
    from multiprocessing import resource_tracker
    calls = []
    monkeypatch.setattr(resource_tracker, "register", lambda *a: calls.append(("register", a)))
    monkeypatch.setattr(resource_tracker, "unregister", lambda *a: calls.append(("unregister", a)))
    owned = segments.OwnedSegments(session, 0)
    name, arr = owned.array("input", (4,), np.int32)
    arr[:] = 7
    peer = segments.AttachedSegments()
    assert peer.array(name, (4,), np.int32).tolist() == [7] * 4
    private_name, private = segments.PrivateSegment.array(session, 0, "result", (2,), np.int8)
    assert calls == []
    del private
    peer.close()
    owned.close()
    assert not [n for n in os.listdir("/dev/shm") if n in (name, private_name)]
