"""Every collective x algorithm x rank count 1..16 x edge sizes on the local engine, against numpy,
bit for bit (integer-valued data), plus the full dtype x reduce-op matrix (a pair HCCL does not
reduce refused, its type still moved), inputs never modified,
ops larger than the communicator buffer, and both local data planes."""
import functools

import ml_dtypes
import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError
from hccl_sim.engines.local import run_local
from hccl_sim.config.env import Config
from hccl_sim.config.type_rules import RULES

UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.float16, np.float32, np.float64, ml_dtypes.bfloat16]


def make_input(rank, shape, dtype, op, seed=0):
    rng = np.random.default_rng([seed, rank])
    unsigned = np.dtype(dtype).kind == "u"
    if op == "prod":
        values = rng.choice([1, 2] if unsigned else [1, -1, 2], size=shape)
    else:
        values = rng.integers(0 if unsigned else -3, 7 if unsigned else 4, size=shape)
    return values.astype(dtype)


def reference(inputs, op):
    return functools.reduce(lambda a, b: UFUNC[op](a, b), inputs)


def all_collectives(comm, count, dtype, op, algo, root):
    p, r = comm.size, comm.rank
    x = make_input(r, (count,), dtype, op)
    blocks = make_input(r, (p * count,), dtype, op, seed=1)
    snapshot = (x.copy(), blocks.copy())
    out = {
        "allreduce": comm.all_reduce(x, op=op, algo=algo),
        "allgather": comm.all_gather(x, algo=algo),
        "reducescatter": comm.reduce_scatter(blocks, op=op, algo=algo),
        "broadcast": comm.broadcast(x, root=root, algo=algo),
        "reduce": comm.reduce(x, root=root, op=op, algo=algo),
        "alltoall": comm.all_to_all(blocks, algo=algo),
    }
    untouched = np.array_equal(snapshot[0], x) and np.array_equal(snapshot[1], blocks)
    return out, untouched


def check(results, p, count, dtype, op, root):
    xs = [make_input(r, (count,), dtype, op) for r in range(p)]
    bs = [make_input(r, (p * count,), dtype, op, seed=1) for r in range(p)]
    total = reference(xs, op)
    block_total = reference(bs, op)
    for r, (out, untouched) in enumerate(results):
        assert untouched, f"rank {r}: input was modified"
        assert out["allreduce"].dtype == np.dtype(dtype)
        assert np.array_equal(out["allreduce"], total), f"allreduce rank {r}"
        assert np.array_equal(out["allgather"], np.concatenate(xs)), f"allgather rank {r}"
        assert np.array_equal(out["reducescatter"], block_total[r * count:(r + 1) * count]), f"reducescatter rank {r}"
        assert np.array_equal(out["broadcast"], xs[root]), f"broadcast rank {r}"
        if r == root:
            assert np.array_equal(out["reduce"], total), f"reduce at root {r}"
        else:
            assert out["reduce"] is None
        want_a2a = np.concatenate([bs[j][r * count:(r + 1) * count] for j in range(p)])
        assert np.array_equal(out["alltoall"], want_a2a), f"alltoall rank {r}"


@pytest.mark.local
@pytest.mark.parametrize("algo", [None, "ring", "H-D_R"])
@pytest.mark.parametrize("p", range(1, 17))
def test_every_collective_every_rank_count(p, algo):
    topo = hccl_sim.topology("fullmesh", ranks=p)
    for count in (0, 1, p + 3, 4 * p):
        root = (count + p - 1) % p
        results = hccl_sim.run(all_collectives, topology=topo, args=(count, np.int32, "sum", algo, root))
        check(results, p, count, np.int32, "sum", root)


def refused_then_moved(comm, dtype, op):
    """Every reducing op refused (E_NOT_SUPPORT), the moving ones run: what a rank sees of a type
    HCCL does not reduce with `op`."""
    x = make_input(comm.rank, (comm.size,), dtype, "sum")
    codes = []
    for call in (lambda: comm.all_reduce(x, op=op), lambda: comm.reduce_scatter(x, op=op),
                 lambda: comm.reduce(x, root=0, op=op)):
        try:
            call()
        except HcclError as exc:
            codes.append(exc.code)
    return codes, comm.all_gather(x), comm.broadcast(x, root=0)


@pytest.mark.local
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_dtype_op_matrix(dtype, op):
    if RULES["synthetic"].refusal(np.dtype(dtype).name, "", op):     # uint8; prod of int16, bf16 (§9.3)
        results = hccl_sim.run(refused_then_moved, topology=hccl_sim.topology("fullmesh", ranks=3), args=(dtype, op))
        xs = [make_input(r, (3,), dtype, "sum") for r in range(3)]
        assert all(codes == ["E_NOT_SUPPORT"] * 3 and np.array_equal(gathered, np.concatenate(xs))
                   and np.array_equal(bcast, xs[0]) for codes, gathered, bcast in results)
        return
    for p, algo in ((5, "ring"), (6, "H-D_R"), (8, "H-D_R"), (3, None)):
        topo = hccl_sim.topology("fullmesh", ranks=p)
        results = hccl_sim.run(all_collectives, topology=topo, args=(2 * p + 1, dtype, op, algo, p - 1))
        check(results, p, 2 * p + 1, dtype, op, p - 1)


@pytest.mark.local
@pytest.mark.parametrize("p,algo", [(4, "ring"), (7, "H-D_R"), (8, "H-D_R"), (5, None)])
def test_larger_than_communicator_buffer(p, algo):
    """HCCL_BUFFSIZE=1 (MB): every op loops over buffer-sized chunks, results unchanged."""
    topo = hccl_sim.topology("atlas800t-a2")
    count = (1 << 20) // 4 * 3 // p + 13          # ~3 MB per rank for the block ops, not divisible
    results = hccl_sim.run(all_collectives, topology=topo, args=(count, np.float32, "sum", algo, 1),
                           env={"HCCL_BUFFSIZE": "1"})
    check(results, 8, count, np.float32, "sum", 1)
    big = hccl_sim.simulate("allreduce", 3 << 20, topology=topo, env={"HCCL_BUFFSIZE": "1"}, trace=True)[1]
    assert len(big.loops) == 3


@pytest.mark.local
@pytest.mark.parametrize("data_plane", ["central", "threads"])
def test_every_algorithm_flat_and_hierarchical_correct_on_data_plane(data_plane):
    """The threaded data plane executes each rank's schedule over the zero-copy transport (the
    per-rank executor every engine whose ranks share no memory uses): every algorithm, flat and
    on HCCL's hierarchy, including schedules whose steps copy and reduce into one slice."""
    for p in (1, 2, 3, 8, 11):
        topo = hccl_sim.topology("fullmesh", ranks=p)
        for algo in (None, "ring", "H-D_R", "NHR", "NB", "fullmesh"):
            results = run_local(all_collectives, topo, Config(), args=(3 * p + 2, np.int64, "max", algo, p // 2),
                                data_plane=data_plane)
            check(results, p, 3 * p + 2, np.int64, "max", p // 2)
    for name, kw in (("atlas800t-a2", {}), ("atlas800t-a2", {"servers": 2}), ("atlas800-910a", {"servers": 2})):
        topo = hccl_sim.topology(name, **kw)
        for count in (5, 67):
            results = run_local(all_collectives, topo, Config(), args=(count, np.int32, "min", None, 3),
                                data_plane=data_plane)
            check(results, topo.num_ranks, count, np.int32, "min", 3)


@pytest.mark.local
def test_threads_data_plane_at_128_ranks():
    """128 ranks of HCCL's hierarchy (16 Atlas 800T A2 servers) on the per-rank executor, one
    thread each: every collective gives its exact integer result (issue 37: such jobs gave no
    answer in 300 s). A few seconds; their time is experiments/per_rank_scale.py's."""
    topo = hccl_sim.topology("atlas800t-a2", servers=16)
    results = run_local(all_collectives, topo, Config(), args=(2, np.int32, "sum", None, 5), data_plane="threads")
    check(results, 128, 2, np.int32, "sum", 5)


@pytest.mark.local
def test_large_op_split_across_cores():
    """Ops above the parallel threshold move data on several threads; results stay exact."""
    p = 4
    topo = hccl_sim.topology("fullmesh", ranks=p)
    count = 3 << 20
    results = hccl_sim.run(all_collectives, topology=topo, args=(count // 8, np.float32, "sum", None, 2))
    check(results, p, count // 8, np.float32, "sum", 2)
    res = hccl_sim.run(lambda c: c.all_reduce(np.full(count, c.rank + 1, np.float32), algo="ring"), topology=topo)
    assert all(np.all(y == 10) for y in res)


@pytest.mark.local
def test_shapes_and_axis0():
    def fn(comm):
        x = np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * comm.rank
        return (comm.all_reduce(x), comm.all_gather(x), comm.reduce_scatter(np.ones((4, 2, 2)) * comm.rank),
                comm.all_reduce(np.float64(comm.rank)), comm.all_to_all(np.arange(8).reshape(4, 2) + comm.rank))
    res = hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=2))
    ar, ag, rs, scalar, a2a = res[1]
    assert ar.shape == (2, 3) and np.array_equal(ar, 2 * np.arange(6).reshape(2, 3) + 10)
    assert ag.shape == (4, 3) and np.array_equal(ag[2:], np.arange(6).reshape(2, 3) + 10)
    assert rs.shape == (2, 2, 2) and np.all(rs == 1)
    assert scalar.shape == () and scalar == 1
    assert np.array_equal(a2a, np.array([[4, 5], [6, 7], [5, 6], [7, 8]]))


@pytest.mark.local
def test_point_to_point_and_last_op():
    topo = hccl_sim.topology("fullmesh", ranks=3, bandwidth=1e9, latency=2e-6)

    def fn(comm):
        if comm.rank == 0:
            comm.send(np.arange(10, dtype=np.int16), dst=2, tag=5)
            comm.send(np.ones(3), dst=1)
            return comm.last_op
        if comm.rank == 1:
            return comm.recv(0), comm.last_op
        return comm.recv(0, tag=5), comm.last_op
    r0, (r1, op1), (r2, op2) = hccl_sim.run(fn, topology=topo)
    assert np.array_equal(r2, np.arange(10, dtype=np.int16)) and r2.dtype == np.int16
    assert np.array_equal(r1, np.ones(3))
    assert op2.name == "recv" and op2.end == 2000 + 20   # latency + 20 bytes at 1 B/ns
    assert r0.name == "send" and r0.end == op1.end


@pytest.mark.local
def test_cluster_keeps_running():
    with hccl_sim.Cluster(hccl_sim.topology("fullmesh", ranks=4)) as cluster:
        a = cluster.run(lambda c: c.all_reduce(np.array([c.rank])))
        b = cluster.run(lambda c, k: c.all_reduce(np.array([c.rank * k])), args=(3,))
    assert all(int(x[0]) == 6 for x in a) and all(int(x[0]) == 18 for x in b)


@pytest.mark.local
@pytest.mark.parametrize("p", [1, 3, 4, 7])
def test_registry_reference_matches_every_collective(p):
    """collectives.py is the one description of each collective: the Communicator's results equal
    each class's numpy reference, and its shapes, layouts and nccl-tests factors are what it says."""
    from hccl_sim import collectives
    topo = hccl_sim.topology("fullmesh", ranks=p)
    n = 3 * p

    def every(comm):
        x = (np.arange(n, dtype=np.int64) * (comm.rank + 3)) % 13
        return x, {name: getattr(comm, c.method)(x, **({"root": p - 1} if c.rooted else {}))
                   for name, c in collectives.COLLECTIVES.items() if name in collectives.DATA_COLLECTIVES}
    results = hccl_sim.run(every, topology=topo)
    inputs = [x for x, _ in results]
    for name in collectives.DATA_COLLECTIVES:
        coll = collectives.get(name)
        want = coll.reference(inputs, None, p - 1)
        for r, (_, got) in enumerate(results):
            if want[r] is None:
                assert got[name] is None
            else:
                assert np.array_equal(got[name], want[r]), (name, r)
                assert got[name].shape == coll.output_shape(inputs[r].shape, p)
    assert collectives.get("all_reduce").busbw_factor(4) == 1.5 and collectives.get("bcast").busbw_factor(4) == 1.0
    with pytest.raises(hccl_sim.HcclError, match="unknown collective"):
        collectives.get("gatherv")


@pytest.mark.local
@pytest.mark.parametrize("preset", ["atlas800t-a2", "atlas800-910a", "atlas900-a3"])
def test_one_rank_of_a_hardware_preset_copies_its_input(preset):
    """A one-rank communicator on a server preset (torchrun's world of one, a split of one):
    every collective, the variable-size ones too, is its input copied, as HCCL's memcpy for a
    rank size of 1 (the levels' programs have no step for one rank: broadcast, reduce and the
    reduce-scatters once left their output unwritten)."""
    from topologies.presets import filled
    x = np.arange(1, 9, dtype=np.int32).reshape(8, 1)

    def every(comm):
        got = [comm.all_reduce(x), comm.broadcast(x, root=0), comm.reduce(x, root=0), comm.all_gather(x),
               comm.reduce_scatter(x), comm.all_to_all(x), comm.scatter(x.reshape(1, 8), root=0),
               comm.all_to_all_v(x, [8], [8])]
        if preset != "atlas800-910a":           # HCCL has no AllGatherV / ReduceScatterV on 910A
            got += [comm.all_gather_v(x, [8]), comm.reduce_scatter_v(x, [8])]
        return got
    [got] = hccl_sim.run(every, topology=filled(preset, 1))
    assert [y.reshape(-1).tolist() for y in got] == [list(range(1, 9))] * len(got)


@pytest.mark.unit
@pytest.mark.parametrize("name,kw", [("fullmesh", {"ranks": 1}), ("fullmesh", {"ranks": 5}), ("fullmesh", {"ranks": 8}),
                                     ("atlas800t-a2", {"servers": 2}), ("atlas800-910a", {"servers": 3})])
def test_own_result_slices_equal_the_whole_program(name, kw):
    """A rank holding every rank's input computes only its own output (the Ray engine's eager small
    ops) from the backward slice of the op's moves: the same result as running every move, bit for
    bit also on floats (same operations, same order), both on numpy scalars (tiny moves) and by
    ufunc calls (longer ones)."""
    from hccl_sim import collectives
    from hccl_sim.plan import planner
    from hcomm.exec import OwnResult, own_result, run_share, with_scratch
    from hccl_sim.comm.rank_group import RankBuffers
    topo = hccl_sim.topology(name, **kw)
    p = topo.num_ranks
    rng = np.random.default_rng(p)
    scalar_paths = 0
    for cname in collectives.DATA_COLLECTIVES:
        coll = collectives.get(cname)
        for algo in (None, "ring", "H-D_R", "NHR"):
            for dtype, op, per in (("int64", "max", 2), ("float32", "sum", 2), ("float64", "prod", 1),
                                   ("float32", "sum", 40)):
                count = per * p + 1 if not coll.divisible else (per + 1) * p
                sig = planner.Signature(cname, (count,), dtype, op if coll.reducing else None,
                                        p - 1 if coll.rooted else None, algo)
                plan = planner.make_plan(sig, topo, Config(), [0] * p, np.dtype(dtype).itemsize)
                if dtype == "int64":
                    xs = [rng.integers(-50, 50, count) for _ in range(p)]
                else:
                    xs = [(rng.standard_normal(count) * 1e3).astype(dtype) for _ in range(p)]
                full = [with_scratch(plan.data, RankBuffers(x, np.zeros(coll.output_shape(x.shape, p), dtype), None))
                        for x in xs]
                run_share(plan.data, full)
                for r in range(p):
                    if coll.result(full[r].output, r, sig.root) is None:
                        continue
                    compiled = OwnResult(plan.data, r, xs[0].shape, coll.output_shape(xs[0].shape, p), dtype)
                    scalar_paths += compiled.scalar is not None
                    for _ in range(2):          # compiled once, run again on the same buffers
                        mine = np.full(coll.output_shape(xs[0].shape, p), -99, dtype=dtype)
                        compiled.run(np.stack(xs), mine)
                        assert np.array_equal(mine.view(np.uint8), full[r].output.view(np.uint8)), \
                            (cname, algo, dtype, op, per, r, plan.algo)
                    mine = np.full(coll.output_shape(xs[0].shape, p), -99, dtype=dtype)
                    own_result(plan.data, np.stack(xs), mine, r)
                    assert np.array_equal(mine, full[r].output), (cname, algo, r, plan.algo)
    assert scalar_paths > 0


@pytest.mark.unit
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float32", "prod"), ("float64", "sum"), ("float64", "prod")])
def test_own_results_python_floats_keep_the_dtypes_bits_at_its_edges(dtype, op):
    """A tiny sum or product runs on Python floats (a float32 one rounded through an array('f')):
    its bits are the whole program's numpy ones for signed zeros, subnormals, the largest finite
    values and their overflow, infinities and inf - inf's NaN, on 2, 3 and 8 ranks."""
    from hccl_sim.plan import planner
    from hcomm.exec import OwnResult, run_share, with_scratch
    from hccl_sim.comm.rank_group import RankBuffers
    rng = np.random.default_rng(7)
    edges = [0.0, -0.0, 1e-45, -1e-45, 1e-40, 1.17e-38, 3.4e38, -3.4e38, 1.0, 1.0000001, 1 / 3, 0.1, 1e30,
             -1e30, np.inf, -np.inf]
    if dtype == "float64":
        edges += [1e308, -1e308, 5e-324, 2.2e-308, 1.0000000000000002]
    pool = np.array(edges, dtype=dtype)
    compiled = 0
    for p in (2, 3, 8):
        topo = hccl_sim.topology("fullmesh", ranks=p)
        for count in (1, 2, 3):
            sig = planner.Signature("allreduce", (count,), dtype, op, None, None)
            plan = planner.make_plan(sig, topo, Config(), [0] * p, np.dtype(dtype).itemsize)
            owns = [OwnResult(plan.data, r, (count,), (count,), dtype) for r in range(p)]
            compiled += sum(c.scalar is not None for c in owns)
            for _ in range(12):
                xs = [rng.choice(pool, count) for _ in range(p)]
                full = [with_scratch(plan.data, RankBuffers(x, np.zeros(count, dtype), None)) for x in xs]
                with np.errstate(all="ignore"):
                    run_share(plan.data, full)
                for r, own in enumerate(owns):
                    mine = np.full(count, -99, dtype=dtype)
                    own.run(np.stack(xs), mine)
                    assert np.array_equal(mine.view(np.uint8), full[r].output.view(np.uint8)), (p, count, r, xs)
    assert compiled == 3 * (2 + 3 + 8)        # every rank's result took the Python-float path


@pytest.mark.local
@pytest.mark.parametrize("p", [1, 3, 8])
def test_out_arrays_and_in_place(p):
    """out= receives the result (and is what the call returns); out=x works in place."""
    topo = hccl_sim.topology("fullmesh", ranks=p)

    def fn(comm):
        r, n = comm.rank, comm.size
        x = np.arange(6 * n, dtype=np.int64) + r
        got = {}
        out = np.empty_like(x)
        got["ar"] = (comm.all_reduce(x, out=out) is out, out.copy())
        out = np.empty(6 * n * n, dtype=np.int64)
        got["ag"] = (comm.all_gather(x, out=out) is out, out.copy())
        out = np.empty(6, dtype=np.int64)
        got["rs"] = (comm.reduce_scatter(x, out=out) is out, out.copy())
        out = np.empty_like(x)
        got["a2a"] = (comm.all_to_all(x, out=out) is out, out.copy())
        y = x.copy()
        got["ar_inplace"] = (comm.all_reduce(y, out=y) is y, y.copy())
        z = x.copy()
        comm.broadcast(z, root=n - 1, out=z)
        got["bc_inplace"] = z
        w = x.copy()
        res = comm.reduce(w, root=0, out=w)
        got["reduce"] = (res is w) if r == 0 else res
        got["reduce_w"] = w
        return got
    res = hccl_sim.run(fn, topology=topo)
    xs = [np.arange(6 * p, dtype=np.int64) + r for r in range(p)]
    total = sum(xs)
    for r, got in enumerate(res):
        assert got["ar"][0] and np.array_equal(got["ar"][1], total)
        assert got["ag"][0] and np.array_equal(got["ag"][1], np.concatenate(xs))
        assert got["rs"][0] and np.array_equal(got["rs"][1], total[6 * r:6 * r + 6])
        assert got["a2a"][0] and np.array_equal(got["a2a"][1], np.concatenate([x[6 * r:6 * r + 6] for x in xs]))
        assert got["ar_inplace"][0] and np.array_equal(got["ar_inplace"][1], total)
        assert np.array_equal(got["bc_inplace"], xs[p - 1])
        if r == 0:
            assert got["reduce"] is True and np.array_equal(got["reduce_w"], total)
        else:
            assert got["reduce"] is None and np.array_equal(got["reduce_w"], xs[r])


@pytest.mark.local
@pytest.mark.parametrize("out,match", [
    (lambda x: np.empty(3, np.int64), r"out must have the result's shape \(8,\) and dtype int64"),
    (lambda x: np.empty(8, np.float32), "and dtype int64, got shape"),
    (lambda x: [0] * 8, "out must be a numpy array"),
    (lambda x: np.broadcast_to(np.int64(0), (8,)), "out is read-only"),
])
def test_bad_out_arrays(out, match):
    def fn(comm):
        x = np.arange(8, dtype=np.int64)
        comm.all_reduce(x, out=out(x))
    with pytest.raises(HcclError, match=match) as e:
        hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=2))
    assert e.value.code == "E_PARA"
