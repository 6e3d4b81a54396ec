"""AllGatherV and ReduceScatterV: integer data against numpy for every rank count, count pattern and
layout, HCCL's checks and where it runs them, the programs' moves, hazards and timing engines,
HCCL's CCL-buffer loops, its selection, and simulate, bench, faults and chaos with them."""
import json

import numpy as np
import pytest

import hccl_sim
from hccl_sim import FaultPlan, HcclError, collectives
from hccl_sim.collectives.gather_v import shared_levels
from hccl_sim.config.env import Config
from hccl_sim.plan.loop_programs import build_variable
from hccl_sim.plan.planner import Signature, choose
from hcomm import program as prog
from hcomm.timing import replay
from hcomm.vtiming import program_times

OPS = ("allgatherv", "reducescatterv")
PRESETS = [("fullmesh", {"ranks": 7}), ("ring", {"ranks": 4}), ("atlas800t-a2", {"servers": 1}),
           ("atlas800t-a2", {"servers": 2}), ("atlas900-a3", {"servers": 1}), ("atlas900-a3", {"servers": 2}),
           ("atlas900-a3", {"superpods": 2, "servers": 1}), ("atlas950", {"servers": 2})]
COLS = 3


def patterns(p, rng):
    """Block counts (rows): uneven, all zero, one non-empty block, uniform."""
    one = np.zeros(p, dtype=np.int64)
    one[p // 2] = 4
    return {"uneven": rng.integers(0, 5, p), "zero": np.zeros(p, dtype=np.int64), "one block": one,
            "uniform": np.full(p, 2)}


def gapped(c, rng):
    """Displacements in a shuffled block order with a row left free after each block."""
    d, pos = np.zeros(len(c), dtype=np.int64), 0
    for i in rng.permutation(len(c)):
        d[i], pos = pos, pos + int(c[i]) + 1
    return d


def placed(c, d):
    """(rows of the layout, each block's first row)."""
    d = np.concatenate(([0], np.cumsum(c)[:-1])) if d is None else np.asarray(d)
    return max([int(d[i] + c[i]) for i in range(len(c)) if c[i]] + [0]), d


def _run(comm, op, c, d, xs, dtype):
    r = comm.rank
    if op == "allgatherv":
        y = comm.all_gather_v(xs[r], c, d)
    else:
        y = comm.reduce_scatter_v(xs[r], c, "sum", d)
    return y, comm.last_op


def check(topo, op, c, d=None, env=None, dtype=np.int32):
    """Run `op` on every rank and compare with numpy; the records."""
    p = topo.num_ranks
    rows, at = placed(c, d)
    if op == "allgatherv":
        xs = [(np.arange(int(c[r]) * COLS).reshape(-1, COLS) + 10_000 * r).astype(dtype) for r in range(p)]
        want = np.zeros((rows, COLS), dtype=dtype)
        for i in range(p):
            want[at[i]:at[i] + c[i]] = xs[i]
        wants = [want] * p
    else:
        xs = [(np.arange(rows * COLS).reshape(-1, COLS) * (r + 1)).astype(dtype) for r in range(p)]
        total = sum(xs)
        wants = [total[at[j]:at[j] + c[j]] for j in range(p)]
    got = hccl_sim.run(_run, topology=topo, args=(op, c, d, xs, dtype), env=env)
    for j, ((y, _), want) in enumerate(zip(got, wants)):
        assert y.dtype == dtype and np.array_equal(y, want), f"{topo.name} {op} rank {j}"
    return [rec for _, rec in got]


@pytest.mark.local
@pytest.mark.parametrize("p", list(range(1, 17)))
def test_equal_numpy_for_every_rank_count_pattern_and_layout(p):
    rng = np.random.default_rng(p)
    topo = hccl_sim.topology("fullmesh", ranks=p)
    for label, c in patterns(p, rng).items():
        for d in (None, gapped(c, rng)):
            for op in OPS:
                check(topo, op, c, d)


@pytest.mark.local
@pytest.mark.parametrize("name,params", PRESETS, ids=lambda v: str(v))
def test_every_preset_runs_hccls_choice_with_its_buffer_loops(name, params):
    """910B's mesh and level1, A3's ring, the flat algorithms: every layout, and more than one
    CCL-buffer loop where blocks outgrow HCCL_BUFFSIZE (shared by every block across servers)."""
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    rng = np.random.default_rng(3 * p)
    c = rng.integers(0, 6, p)
    c[p - 1] = 60_000                            # 60,000 rows x 3 int32 = 720 KB: loops at HCCL_BUFFSIZE=1
    for op in OPS:
        for d in (None, gapped(c, rng)):
            for env in ({}, {"HCCL_BUFFSIZE": "1"}):
                recs = check(topo, op, c, d, env)
                assert recs[0].algo == hccl_sim.simulate(op, counts=c * COLS, topology=topo, dtype="int32",
                                                         env=env).algo


@pytest.mark.local
def test_out_keeps_the_rows_no_block_writes_and_a_sub_communicator_and_stream_run_them():
    def fn(comm):
        sub = comm.split(comm.rank % 2)
        q, r = sub.size, sub.rank
        c = np.arange(q) % 3 + 1
        xs = [np.full((c[i], 2), i + 1, dtype=np.int32) for i in range(q)]
        out = np.full((int(c.sum()) + 4, 2), -1, dtype=np.int32)
        sub.all_gather_v(xs[r], c, np.concatenate(([0], np.cumsum(c)[:-1])) + 2, out=out)
        work = sub.reduce_scatter_v(np.ones((int(c.sum()), 2), dtype=np.int32), c, stream=comm.device.stream())
        work.wait()
        return out, work.result
    for r, (out, y) in enumerate(hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=6))):
        q = 3
        c = np.arange(q) % 3 + 1
        want = np.concatenate([np.full((2, 2), -1)] + [np.full((c[i], 2), i + 1) for i in range(q)]
                              + [np.full((2, 2), -1)])
        assert np.array_equal(out, want)
        assert np.array_equal(y, np.full((c[r // 2], 2), q))


@pytest.mark.local
@pytest.mark.parametrize("case,match", [
    ("counts differ", r"rank 2 gives recv_counts\[1\] = 3, rank 0 gives 2"),
    ("displs differ", r"rank 1 gives send_displs\[3\] = 7, rank 0 gives 6"),
    ("own rows", r"x has 2 rows but recv_counts\[3\] = 1"),
    ("negative", r"recv_counts\[2\] = -2 is negative"),
    ("overlap", r"recv_displs: the block for rank 1 .* overlaps the block for rank 0"),
    ("range", r"send_displs\[3\] \+ send_counts\[3\] = 9 rows is past the input's 8 rows"),
    ("short", r"send_counts must be 4 integers"),
])
def test_bad_counts_fail_on_every_rank_without_a_hang(case, match):
    def fn(comm):
        r = comm.rank
        x = np.arange(8, dtype=np.int32).reshape(8, 1)
        c, d = [2, 2, 2, 2], None
        if case == "counts differ":
            return comm.all_gather_v(x[:2], [2, 3, 2, 2] if r == 2 else c)
        if case == "own rows":
            return comm.all_gather_v(x[:2], [2, 2, 2, 1])
        if case == "negative":
            return comm.all_gather_v(x[:2], [2, 2, -2, 2])
        if case == "overlap":
            return comm.all_gather_v(x[:2], c, [0, 1, 4, 6])
        if case == "displs differ":
            x = np.arange(10, dtype=np.int32).reshape(10, 1)
            d = [0, 2, 4, 7] if r == 1 else [0, 2, 4, 6]
        if case == "range":
            d = [0, 2, 4, 7]
        if case == "short":
            c = [2, 2, 2]
        return comm.reduce_scatter_v(x, c, "sum", d)
    with pytest.raises(HcclError, match=match) as info:
        hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=4), env={"HCCL_EXEC_TIMEOUT": "30"})
    assert info.value.code == "E_PARA"


@pytest.mark.unit
def test_where_hccl_does_not_run_them_is_e_not_support():
    """Not on 910A (HCCL: A3, A2 and 310P only); ReduceScatterV only with an inline reduction."""
    a = hccl_sim.topology("atlas800-910a", servers=1)
    for op in OPS:
        with pytest.raises(HcclError, match="does not run on 910A") as info:
            hccl_sim.simulate(op, counts=np.full(a.num_ranks, 4), topology=a)
        assert info.value.code == "E_NOT_SUPPORT"
    b = hccl_sim.topology("atlas800t-a2", servers=1)
    for dtype, redop in (("int64", "sum"), ("float32", "prod")):
        with pytest.raises(HcclError, match="only supports inline reduction"):
            hccl_sim.simulate("reducescatterv", counts=np.full(8, 4), topology=b, dtype=dtype, redop=redop)
    assert hccl_sim.simulate("allgatherv", counts=np.full(8, 4), topology=b, dtype="int64").algo


def _program(topo, op, c, a=0, b=None):
    coll = collectives.of(op)
    v = coll.vcounts_of(np.asarray(c))
    sig = Signature(op, (), "int32", "sum" if coll.reducing else None, None, None, False, v)
    choice = choose(sig, topo, Config(), 4)
    return build_variable(op, choice, topo, v, a, int(max(c)) if b is None else b, 4), v


@pytest.mark.unit
@pytest.mark.parametrize("name,params", PRESETS, ids=lambda v: str(v))
def test_programs_move_every_element_once_without_hazards_and_price_alike_in_both_engines(name, params):
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    rng = np.random.default_rng(5 * p)
    for label, c in patterns(p, rng).items():
        for op in OPS:
            program, v = _program(topo, op, c)
            n_in, n_out = v.input_elements(), v.output_elements()
            ins = [np.arange(int(n_in[r]), dtype=np.int64) * (r + 1) for r in range(p)]
            outs = [np.full(int(n_out[r]), -1, dtype=np.int64) for r in range(p)]
            scratch = [np.full(1 << 12, -1, dtype=np.int64) for _ in range(p)]
            prog.execute(prog.data_moves(program), [[x, o, s] for x, o, s in zip(ins, outs, scratch)], np.add)
            want = collectives.of(op).reference_v([x.reshape(-1, 1) for x in ins], v, list(n_out), (1,))
            for j in range(p):
                assert np.array_equal(outs[j], want[j].reshape(-1)), f"{name} {op} {label} rank {j}"
            assert prog.hazards(program) == [], f"{name} {op} {label}: zero-copy hazard"
            for entry in (np.zeros(p, dtype=np.int64), rng.integers(0, 50_000, p)):
                want_t = replay(list(prog.rank_steps(program, p)), list(entry), topo, dtype="int32", redop="sum")
                assert list(program_times(program, entry, topo, "int32", "sum")) == list(want_t), \
                    f"{name} {op} {label}"


@pytest.mark.unit
@pytest.mark.parametrize("name,params", [("fullmesh", {"ranks": 7}), ("fullmesh", {"ranks": 8}), ("ring", {"ranks": 5})],
                         ids=lambda v: str(v))
def test_equal_counts_price_as_allgather_and_reducescatter_on_the_synthetic_presets(name, params):
    """Blocks end to end, one loop: the same algorithm and the same steps as AllGather's and
    ReduceScatter's, so their closed forms (tests/test_closed_forms.py) hold to the ns."""
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    for n in (1, 1000, 1 << 16):
        for op, base in (("allgatherv", "allgather"), ("reducescatterv", "reducescatter")):
            est = hccl_sim.simulate(op, counts=np.full(p, n), topology=topo)
            fixed = hccl_sim.simulate(base, p * n * 4, topology=topo)
            assert est.algo == fixed.algo and est.nbytes == fixed.nbytes and est.times == fixed.times, (op, n)


@pytest.mark.unit
def test_uneven_blocks_on_the_ring_cost_the_largest_block_per_step():
    """Flat ring AllGatherV on the synthetic full mesh: in step s rank r forwards block r - s, so
    a step ends when its largest block has crossed: (p - 1) a + b sum_s max_r n(r - s) once all
    blocks are the same size; with one large block every step waits for it once it is moving."""
    from topologies.model import transfer_ns
    p, bw, lat = 5, 1e9, 1e-6
    topo = hccl_sim.topology("fullmesh", ranks=p, bandwidth=bw, latency=lat)
    c = np.full(p, 1000)
    c[2] = 50_000
    est = hccl_sim.simulate("allgatherv", counts=c, topology=topo, algo="ring")
    copy = hccl_sim.simulate("allgatherv", counts=np.zeros(p, dtype=int), topology=topo, algo="ring")
    assert est.algo == "ring"
    # the large block crosses p - 1 links one after another; nothing else is on its path's critical chain
    floor = (p - 1) * (1000 + transfer_ns(50_000 * 4, bw)) / 1e9
    assert est.time >= floor and est.time <= floor + (p - 1) * (1000 + transfer_ns(1000 * 4, bw)) / 1e9 + 1e-4
    assert est.time > copy.time


def _hccl_multi_module_loops(counts, total):
    """HCCL's RunLoop with CalcCurCountsAndCurDisplsMultiModule, line by line: each loop's counts."""
    left, loops = [int(c) for c in counts], []
    while True:
        cur, room = [0] * len(left), total
        finished = False
        while room > 0:
            busy = sum(1 for c in left if c)
            if busy == 0:
                finished = True
                break
            share = room // busy
            if share == 0:
                break
            for i in range(len(left)):
                take = min(left[i], share)
                room -= take
                cur[i] += take
                left[i] -= take
        if not finished and not any(left):
            finished = True
        loops.append(cur)
        if finished:
            return loops


@pytest.mark.unit
def test_shared_buffer_loops_are_hccls_even_fill():
    rng = np.random.default_rng(11)
    for _ in range(200):
        p = int(rng.integers(1, 12))
        counts = rng.integers(0, 3000, p) * (rng.random(p) > 0.2)
        total = int(rng.integers(p, 4000))
        loops = shared_levels(counts, total)
        got = [np.clip(counts - a, 0, b - a).tolist() for a, b in loops]
        want = [c for c in _hccl_multi_module_loops(counts, total) if any(c)]
        assert got == want, (counts.tolist(), total)
        assert sum(np.clip(counts - a, 0, b - a).sum() for a, b in loops) == counts.sum()


@pytest.mark.unit
def test_selection_follows_allgather_and_reducescatter_with_hccls_level1_rules():
    """HCCL_ALGO's allgather / reducescatter settings apply; a level1 HCCL's V executors do not
    run (H-D_R) is NHR, said in the label; 910B picks pipeline as for the fixed op."""
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    c = np.full(16, 4096)
    for op, key in (("allgatherv", "allgather"), ("reducescatterv", "reducescatter")):
        nb = hccl_sim.simulate(op, counts=c, topology=topo, env={"HCCL_ALGO": f"{key}=level0:NA;level1:NB"})
        assert nb.algo == "level0:fullmesh;level1:NB"
        other = "reducescatter" if key == "allgather" else "allgather"
        assert hccl_sim.simulate(op, counts=c, topology=topo,
                                 env={"HCCL_ALGO": f"{other}=level0:NA;level1:NB"}).algo != nb.algo
        hd = hccl_sim.simulate(op, counts=c, topology=topo, algo="H-D_R")
        assert hd.algo.startswith("level0:fullmesh;level1:NHR") and "runs level1 H-D_R as NHR" in hd.algo
        assert hccl_sim.simulate(op, counts=c * 64, topology=topo).algo == "level0:fullmesh;level1:pipeline"
    a3 = hccl_sim.topology("atlas900-a3", servers=2)
    assert hccl_sim.simulate("allgatherv", counts=np.full(a3.num_ranks, 64), topology=a3, algo="H-D_R").algo == \
        "level0:ring;level1:NHR (HCCL's A3 V executor runs level1 H-D_R as NHR)"


@pytest.mark.unit
def test_simulate_counts_are_checked():
    topo = hccl_sim.topology("fullmesh", ranks=3)
    with pytest.raises(HcclError, match="counts must be 3 non-negative integers"):
        hccl_sim.simulate("allgatherv", counts=np.ones((3, 3), dtype=int), topology=topo)
    with pytest.raises(HcclError, match="counts must be 3 non-negative integers"):
        hccl_sim.simulate("reducescatterv", counts=[1, -1, 2], topology=topo)
    assert collectives.get("all_gather_v").name == "allgatherv"
    assert collectives.get("reduce-scatter-v").name == "reducescatterv"
    assert hccl_sim.simulate("allgatherv", counts=[3, 0, 5], topology=topo).nbytes == 32


@pytest.mark.local
@pytest.mark.parametrize("op", OPS)
def test_bench_on_real_data_equals_the_timing_engine(capsys, tmp_path, op):
    from hccl_sim.tools.cli import main
    f = tmp_path / "w.json"
    f.write_text(json.dumps(list(range(1, 17))))
    for counts in ("zipf:1.2", str(f)):
        args = ["bench", "--op", op, "--counts", counts, "-b", "4K", "-e", "1M", "-f", "16", "--servers", "2",
                "-n", "2", "-d", "int32"]
        assert main(args) == 0
        real = [line.split() for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
        assert main(args + ["--engine", "timing"]) == 0
        timed = [line.split() for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
        assert len(real) == 3 and [r[:8] + r[10:] for r in real] == [r[:8] + r[10:] for r in timed]
        assert all(r[8] == "0" for r in real)
    f.write_text("[[1, 2], [3, 4]]")
    assert main(["bench", "--op", op, "--counts", str(f), "--servers", "1"]) == 2
    assert "it must be a list of 8 weights" in capsys.readouterr().err


@pytest.mark.unit
def test_count_vectors_split_the_op_exactly():
    from hccl_sim.collectives.splits import parse
    for text in ("uniform", "zipf:1.2"):
        v = parse(text).vector(6, 1001)
        assert v.shape == (6,) and (v >= 0).all() and v.sum() == 1001
        assert np.array_equal(v, parse(text).vector(6, 1001))
    assert parse("zipf:1.2").vector(8, 100_000).max() > 3 * parse("zipf:1.2").vector(8, 100_000).min()


@pytest.mark.local
@pytest.mark.parametrize("build", [lambda f: f.corrupt(0, 8), lambda f: f.link_slow(1, 10, factor=0.25),
                                   lambda f: f.straggler(3, delay=2e-5)], ids=["corrupt", "slow", "straggler"])
def test_faults_leave_the_rows_numpys_at_simulates_time(build):
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    p = topo.num_ranks
    c = np.random.default_rng(9).integers(0, 40, p)
    for op in OPS:
        rows, _ = placed(c, None)
        xs = ([np.full((c[r], 1), r, dtype=np.int32) for r in range(p)] if op == "allgatherv"
              else [np.arange(rows, dtype=np.int32).reshape(-1, 1) + r for r in range(p)])
        got = hccl_sim.run(_run, topology=topo, args=(op, c, None, xs, np.int32), faults=build(FaultPlan()))
        want = collectives.of(op).reference_v(xs, collectives.of(op).vcounts_of(c), [
            collectives.of(op).output_rows(c, r) for r in range(p)], (1,))
        for j, ((y, _), w) in enumerate(zip(got, want)):
            assert np.array_equal(y, w), (op, j)
        est = hccl_sim.simulate(op, counts=c, topology=topo, dtype="int32", faults=build(FaultPlan()))
        assert [rec.end - rec.start for _, rec in got] == [round(t * 1e9) for t in est.times]
        assert est.time > hccl_sim.simulate(op, counts=c, topology=topo, dtype="int32").time


@pytest.mark.local
def test_a_rank_crash_is_an_error_on_every_survivor():
    topo = hccl_sim.topology("fullmesh", ranks=4)
    c = np.full(4, 3)
    xs = [np.zeros((3, 1), dtype=np.int32)] * 4
    with pytest.raises(HcclError, match="rank 2"):
        hccl_sim.run(_run, topology=topo, args=("allgatherv", c, None, xs, np.int32),
                     faults=FaultPlan().rank_crash(2, at_op=0))


@pytest.mark.local
def test_chaos_draws_them_and_their_scenarios_end_right():
    from hccl_sim.chaos.runners import run_scenario, runner_for
    from hccl_sim.chaos.scenarios import count_matrix, generate, space_for
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    space = space_for(topo)
    drawn = [sc for sc in generate(5, 150, topo, space) if sc.call.op in OPS]
    assert {sc.call.op for sc in drawn} == set(OPS)
    for sc in drawn:
        c = count_matrix(sc.call, topo.num_ranks)
        assert c.shape == (topo.num_ranks,) and c.sum() == sc.call.count
    runner = runner_for("local", topo)
    try:
        outcomes = {run_scenario(sc, runner).verdict.outcome for sc in drawn[:6]}
    finally:
        assert runner.close() == []
    assert outcomes <= {"recovered", "clean error"}, outcomes
    assert "allgatherv" not in space_for(hccl_sim.topology("atlas800-910a", servers=1)).algos
