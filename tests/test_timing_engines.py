"""simulate() equals run() to the nanosecond; times are deterministic; clocks follow late ranks;
the transport is zero-copy and every wait has a deadline."""
import threading
import time

import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError
from hccl_sim.engines.local import run_local
from hccl_sim import collectives
from hccl_sim.collectives.verifiable import rank_input
from hccl_sim.config.env import Config
from hccl_sim.collectives import splits as counts
from hcomm.transports.inprocess import InProcessTransport

from conftest import wait_until, waiting_ranks

OPS = {"allreduce": lambda c, x, a: c.all_reduce(x, algo=a),
       "allgather": lambda c, x, a: c.all_gather(x, algo=a),
       "reducescatter": lambda c, x, a: c.reduce_scatter(x, algo=a),
       "broadcast": lambda c, x, a: c.broadcast(x, root=1, algo=a),
       "reduce": lambda c, x, a: c.reduce(x, root=1, algo=a),
       "alltoall": lambda c, x, a: c.all_to_all(x, algo=a)}

TOPOLOGIES = [("fullmesh", {"ranks": 6}), ("ring", {"ranks": 5}), ("atlas800t-a2", {"servers": 2}),
              ("atlas800-910a", {"servers": 1})]


@pytest.mark.local
@pytest.mark.parametrize("name,params", TOPOLOGIES)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("algo", [None, "ring", "H-D_R"])
def test_simulate_rank_durations_algo_and_bytes_equal_on_the_local_engine_to_the_ns(name, params, op, algo):
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    count = p * 1000
    env = {"HCCL_BUFFSIZE": "1"}

    def fn(comm):
        x = np.ones(count // p if op == "allgather" else count, dtype=np.float32)
        OPS[op](comm, x, algo)
        return comm.last_op
    records = hccl_sim.run(fn, topology=topo, env=env)
    est = hccl_sim.simulate(op, count * 4, topology=topo, algo=algo, root=1, env=env)
    assert [r.end - r.start for r in records] == [round(t * 1e9) for t in est.times]
    assert {r.algo for r in records} == {est.algo}
    assert records[0].nbytes == est.nbytes


def _every_collective():
    """(topology, op) for every data-carrying collective of the registry on every topology that runs
    it (HCCL refuses AllGatherV and ReduceScatterV on 910A: tests/test_gather_v.py checks that): a
    new collective is covered without being listed."""
    out = []
    for name, params in [("fullmesh", {"ranks": 5}), ("atlas800t-a2", {"servers": 2}), ("atlas800-910a", {"servers": 1})]:
        model = hccl_sim.topology(name, **params).device_model
        for op, c in collectives.COLLECTIVES.items():
            if c.carries_data and (model.gather_v or not (c.variable and c.counts_ndim == 1)):
                out.append((name, params, op))
    return out


@pytest.mark.local
@pytest.mark.parametrize("name,params,op", _every_collective())
def test_every_collective_times_equal_on_the_local_engine_and_in_simulate(name, params, op):
    """Per rank, to the nanosecond: each collective the registry holds, its variable-size forms on
    skewed counts (zipf), rooted ones at a root other than 0, with a small CCL buffer so ops loop."""
    topo = hccl_sim.topology(name, **params)
    coll = collectives.get(op)
    p = topo.num_ranks
    env = {"HCCL_BUFFSIZE": "1"}
    root = p - 1
    itemsize = 4
    kwargs = {}
    if coll.reducing:
        kwargs["op"] = "sum"
    if coll.rooted:
        kwargs["root"] = root
    if coll.variable:
        size = counts.parse("zipf:1.2")
        matrix = size.matrix(p, 3000) if coll.counts_ndim == 2 else size.vector(p, 3000 * p)
        est = hccl_sim.simulate(op, counts=matrix, topology=topo, env=env, dtype="int32")
    else:
        nbytes = 3000 * p * itemsize
        est = hccl_sim.simulate(op, nbytes, topology=topo, root=root, env=env, dtype="int32")

    def fn(comm):
        method = getattr(comm, coll.method)
        if coll.variable:
            x = rank_input(comm.rank, coll.input_rows(matrix, comm.rank), "int32")
            method(x, *coll.call_counts(matrix, comm.rank), **kwargs)
        else:
            x = rank_input(comm.rank, coll.input_shape_for_bytes(nbytes, p, itemsize)[0], "int32")
            method(x, **kwargs)
        return comm.last_op
    records = hccl_sim.run(fn, topology=topo, env=env)
    assert [r.end - r.start for r in records] == [round(t * 1e9) for t in est.times]
    assert {r.algo for r in records} == {est.algo}


@pytest.mark.local
def test_exit_clocks_equal_over_repeated_runs_and_central_and_threads_data_planes():
    topo = hccl_sim.topology("atlas800t-a2", servers=2)

    def fn(comm):
        comm.all_reduce(np.ones(1 << 16, np.float32))
        comm.all_gather(np.ones(100, np.int8))
        comm.broadcast(np.ones(10), root=3)
        return comm.clock
    runs = [run_local(fn, topo, Config(), data_plane=d) for d in ("central", "threads", "central")]
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.local
def test_late_rank_delays_the_collective():
    topo = hccl_sim.topology("fullmesh", ranks=4, bandwidth=1e9, latency=1e-6)

    def fn(comm):
        if comm.rank == 2:
            comm.send(np.ones(1000, np.uint8), dst=3)     # 1 us + 1000 ns of simulated work first
        if comm.rank == 3:
            comm.recv(2)
        start = comm.clock
        comm.all_reduce(np.ones(4, np.float32), algo="ring")
        return start, comm.clock
    res = hccl_sim.run(fn, topology=topo)
    assert res[0][0] == 0 and res[2][0] == 2000
    ends = [e for _, e in res]
    assert min(ends) >= 2000 + 6 * 1000          # nobody finishes before the late rank's data went round
    quiet = hccl_sim.simulate("allreduce", 16, topology=topo, algo="ring").time
    assert max(ends) - 2000 >= round(quiet * 1e9)


@pytest.mark.local
def test_transport_is_zero_copy_with_deadlines():
    tr = InProcessTransport(2, timeout_s=0.2)
    buf = np.arange(10.0)
    tr.register(0, "output", buf)
    msg = tr.post(0, 1, "t", "output", 2, 6)
    got = tr.take(0, 1, "t", tr.deadline())
    assert np.shares_memory(got.data, buf) and np.array_equal(got.data, [2, 3, 4, 5])
    got.consumed(reply=42)
    assert tr.wait_consumed(msg, tr.deadline()) == 42
    t0 = time.monotonic()
    with pytest.raises(HcclError, match="no data from rank 0") as info:
        tr.take(0, 1, "t", tr.deadline(), op="all_reduce")
    assert info.value.code == "E_TIMEOUT" and time.monotonic() - t0 < 2
    pending = tr.post_view(1, 0, "t", buf[:1])
    with pytest.raises(HcclError, match="did not consume"):
        tr.wait_consumed(pending, tr.deadline())


@pytest.mark.local
def test_transport_abort_wakes_waiters():
    tr = InProcessTransport(2, timeout_s=None)
    caught = []

    def waiter():
        try:
            tr.take(0, 1, "x")
        except HcclError as exc:
            caught.append(exc)
    t = threading.Thread(target=waiter)
    t.start()
    wait_until(lambda: waiting_ranks(tr.watch) == {1}, "rank 1 waiting for data from rank 0")
    tr.abort("E_REMOTE", "rank 0 failed")
    t.join(5)
    assert not t.is_alive() and caught and caught[0].code == "E_REMOTE"


@pytest.mark.unit
def test_trace_events_cover_transfers():
    topo = hccl_sim.topology("fullmesh", ranks=4)
    est, plan = hccl_sim.simulate("allreduce", 4096, topology=topo, algo="ring", trace=True)
    sends = [e for e in plan.events if e[1].startswith("send")]
    assert len(sends) == 4 * 2 * 3      # ranks x (RS + AG) x (p - 1)
    assert max(e[3] for e in plan.events) == round(est.time * 1e9)


@pytest.mark.unit
def test_buffer_loops_priced_in_closed_form_equal_loop_by_loop():
    """Identical CCL-buffer loops are priced once their shift pattern repeats (timing is
    shift-invariant): equal to pricing every loop, and a 2^50-byte op is two numbers, not millions."""
    import numpy as np
    from hcomm.cost import CostModel
    from hcomm.vtiming import program_times
    from hccl_sim.plan import planner
    from hccl_sim.config.env import Config
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    config = Config.from_env({"HCCL_BUFFSIZE": "1"})
    for name, count in (("allreduce", (37 << 18) + 5), ("allgather", (9 << 16) + 3), ("broadcast", 3 << 20)):
        sig = planner.Signature(name, (count,), "float32", "sum" if name == "allreduce" else None,
                                3 if name == "broadcast" else None, None)
        entry = list(np.random.default_rng(1).integers(0, 40_000, topo.num_ranks))
        plan = planner.make_plan(sig, topo, config, entry, 4)
        assert len(plan.loops) > 5
        dm = topo.device_model
        clock = np.asarray(entry, dtype=np.int64) + dm.op_overhead_ns[name]         # once per op
        for k, (_, program) in enumerate(plan.loop_programs()):
            clock = program_times(program, clock + (dm.loop_overhead_ns if k else 0), CostModel.of(topo),
                                  "float32", "sum")
        assert list(clock) == plan.exits, name
    huge = hccl_sim.simulate("allreduce", 1 << 50, topology=topo)
    assert huge.time > 1e4 and huge.algo.endswith("pipeline")
    with pytest.raises(hccl_sim.HcclError, match="larger than this emulator can price") as e:
        hccl_sim.simulate("allreduce", 1 << 70, topology=topo)
    assert e.value.code == "E_PARA"


@pytest.mark.unit
@pytest.mark.parametrize("count", [24 * 6 + 10, 24 * 6 + 1, 24 * 7])
def test_rotated_ring_steps_equal_the_event_driven_reference(count, monkeypatch):
    """A large flat ring's steps are lazy rotations of one chunk pattern (hcomm.program.RolledView),
    priced by rotating the pattern's prices; uneven chunks of 24 and 28 bytes take 1 and 2 ns.
    Forced lazy on 24 ranks, the vectorised engine equals the event-driven replay and the eager
    steps' pricing, from even and uneven entry clocks."""
    from hcomm import program as prog
    from hcomm.cost import CostModel
    from hcomm.timing import replay
    from hcomm.vtiming import program_times
    from hccl_sim.algorithms import ring
    topo = hccl_sim.topology("ring", ranks=24, bandwidth=25e9, latency=5e-6, reduce_bandwidth=10e9)
    eager = ring.allreduce(24, count, 4)
    monkeypatch.setattr(ring, "_EAGER_TRANSFERS", 0)
    program = ring.allreduce(24, count, 4)
    assert isinstance(program[0], prog.LazyStep) and isinstance(program[0].timing(), prog.RolledView)
    for entry in ([0] * 24, list(np.random.default_rng(count).integers(0, 3_000, 24))):
        fast = program_times(program, entry, CostModel.of(topo), "float32", "sum")
        ref = replay(prog.rank_steps(program, 24), entry, CostModel.of(topo), "float32", "sum")
        assert list(fast) == list(ref) == list(program_times(eager, entry, CostModel.of(topo), "float32", "sum"))


def _plain(st):
    """A step's transfer list as an eager step without a compacted view."""
    from hcomm import program as prog
    full = st.full()
    out = prog.GlobalStep()
    for name in prog.ARRAYS:
        setattr(out, name, getattr(full, name))
    return out


def _block_programs(n):
    from hccl_sim.algorithms import nb, nhr
    from hccl_sim.algorithms.common import bounds
    rows = np.arange(n + 1) * 3
    smap = np.asarray(nhr.slice_map(n))
    mixed = np.concatenate([[0], np.cumsum(np.random.default_rng(n).integers(1, 4, n))])    # three sizes
    return {"nhr-ag": nhr.allgather(n, rows, 4), "nhr-ag-uneven": nhr.allgather(n, bounds(7 * n + 3, n), 4),
            "nhr-ag-mixed": nhr.allgather(n, mixed, 4), "nhr-rs-mixed": nhr.reducescatter(n, mixed, 4),
            "nhr-ag-smap": nhr.allgather(n, rows, 4, smap=smap), "nhr-rs": nhr.reducescatter(n, rows, 4),
            "nb-rs": nb.reducescatter(n, rows, 4), "nb-rs-uneven": nb.reducescatter(n, bounds(5 * n - 1, n), 4),
            "nhr-rs-smap": nhr.reducescatter(n, rows, 4, smap=smap), "nb-ag": nb.allgather(n, rows, 4)}


@pytest.mark.unit
@pytest.mark.parametrize("n", list(range(2, 40)) + [63, 64, 65, 100, 127, 129])
def test_block_steps_timing_views_are_their_transfer_lists_compacted(n, monkeypatch):
    """NHR/NB steps of many blocks per peer carry compacted timing views (built without the
    transfer list when the builder knows them); vtiming compacts the others. Either way what it
    prices is exactly hcomm.program.compact_timing of the step's transfer list, and the data
    program is the one built eagerly."""
    from hcomm import program as prog
    from hccl_sim.algorithms import nhr
    eager = _block_programs(n)
    monkeypatch.setattr(nhr, "LAZY_PIECES", 0)
    lazy = _block_programs(n)
    for name, program in lazy.items():
        assert len(program) == len(eager[name])
        for st, ref in zip(program, eager[name]):
            full, want = st.full(), _plain(ref)
            for a in prog.ARRAYS:
                assert np.array_equal(getattr(full, a), getattr(want, a)), (name, a)
            got, exp = prog.compact_timing(st.timing()), prog.compact_timing(want)     # what vtiming prices
            assert np.array_equal(prog.expand_timing(exp).t_bytes, want.t_bytes)
            if getattr(got, "expand", None) is not None:
                # grouped by size: the same transfers per pair, pairs in the same order
                assert np.array_equal(prog.expand_timing(got).t_bytes, want.t_bytes)
                def key(v):
                    total = {}
                    c = prog.counts(v) if prog.counts(v) is not None else np.ones(len(v.t_src), dtype=np.int64)
                    for s, d, b, c, f in zip(v.t_src, v.t_dst, v.t_bytes, c, np.asarray(v.t_rbuf) >= 0):
                        k = (int(s), int(d), int(b), bool(f))
                        total[k] = total.get(k, 0) + int(c)
                    return total
                assert key(got) == key(exp), name
                firsts = lambda v: [int(x) for i, x in enumerate(v.t_src) if i == 0 or v.t_src[i - 1] != x]  # noqa
                assert firsts(got) == firsts(exp), name
                continue
            for a in ("t_src", "t_dst", "t_bytes"):
                assert np.array_equal(getattr(got, a), getattr(exp, a)), (name, a)
            assert np.array_equal(np.asarray(got.t_rbuf) >= 0, np.asarray(exp.t_rbuf) >= 0), name
            gc, ec = prog.counts(got), prog.counts(exp)
            assert (gc is None and ec is None) or np.array_equal(gc, ec), name


@pytest.mark.unit
@pytest.mark.parametrize("n", [16, 24, 37])
def test_compacted_steps_equal_the_event_driven_reference(n, monkeypatch):
    """Priced from compacted views (multiplicities), from the expanded transfer list where two
    programs' pairs interleave, and from the plain steps, the vectorised engine equals the
    event-driven replay on contended Atlas 800T A2 NICs."""
    from hcomm import program as prog
    from hcomm.cost import CostModel
    from hcomm.timing import replay
    from hcomm.vtiming import program_times
    from hccl_sim.algorithms import nhr
    monkeypatch.setattr(nhr, "LAZY_PIECES", 0)
    topo = hccl_sim.topology("atlas800t-a2", servers=(n + 7) // 8)
    p = topo.num_ranks
    progs = _block_programs(n)
    twice = prog.merge_parallel([progs["nhr-ag"], progs["nhr-ag-uneven"]])     # same pairs, interleaved
    mixed = prog.merge_parallel([progs["nhr-ag-mixed"], progs["nhr-ag-uneven"]])
    for program in list(progs.values()) + [twice, mixed]:
        for entry in ([0] * p, list(np.random.default_rng(n).integers(0, 30_000, p))):
            ref = replay(prog.rank_steps(program, p), entry, CostModel.of(topo), "float32", "sum")
            fast = program_times(program, entry, CostModel.of(topo), "float32", "sum")
            plain = program_times([_plain(st) for st in program], entry, CostModel.of(topo), "float32", "sum")
            assert list(fast) == list(ref) == list(plain)



@pytest.mark.unit
@pytest.mark.parametrize("n", list(range(1, 70)) + [100, 127, 128, 129, 257])
def test_nb_allgather_steps_built_run_by_run_equal_those_built_from_the_block_matrix(n, monkeypatch):
    """NB's AllGather steps built run by run equal those built from the block matrix by `_add`."""
    from hcomm import program as prog
    from hccl_sim.algorithms import nb
    from hccl_sim.algorithms.common import bounds
    rng = np.random.default_rng(n)
    uneven = 7 + np.concatenate([[0], np.cumsum(rng.integers(1, 9, n))])
    for offs in (np.arange(n + 1) * 5, bounds(3 * n + 1, n), uneven):
        fast = nb.allgather(n, offs, 4, prog.OUTPUT)
        monkeypatch.setattr(nb, "RUN_BY_RUN", False)
        ref = nb.allgather(n, offs, 4, prog.OUTPUT)
        monkeypatch.setattr(nb, "RUN_BY_RUN", True)
        assert len(fast) == len(ref)
        for a, b in zip(fast, ref):
            for name in prog.ARRAYS:
                assert np.array_equal(getattr(a, name), getattr(b, name)), name
