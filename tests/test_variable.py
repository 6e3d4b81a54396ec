"""Variable-size collectives (AlltoAllV, AlltoAllVC): integer data against numpy for every rank
count and count pattern, HCCL's checks, the programs' moves and hazards, the timing engines, and
simulate() against the uniform AlltoAll."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError, collectives
from hccl_sim.collectives.variable import VCounts
from hccl_sim.config.env import Config
from hccl_sim.plan.loop_programs import build_variable
from hccl_sim.plan.planner import Signature, choose
from hcomm import program as prog
from hcomm.timing import replay
from hcomm.vtiming import program_times

A2AV = ("alltoallv", "alltoallvc")      # the AlltoAll variants (AllGatherV, ReduceScatterV: test_gather_v.py)
TOPOLOGIES = [("fullmesh", {"ranks": 7}), ("ring", {"ranks": 4}), ("atlas800t-a2", {"servers": 1}),
              ("atlas800t-a2", {"servers": 2}), ("atlas800-910a", {"servers": 2}), ("atlas900-a3", {"servers": 1}),
              ("atlas900-a3", {"superpods": 2, "servers": 1})]


def patterns(p, rng):
    """Count matrices (rows rank i sends rank j): uneven, all zero, one sender, one receiver, uniform."""
    uneven = rng.integers(0, 5, (p, p))
    one_sender = np.zeros((p, p), dtype=np.int64)
    one_sender[p // 2] = rng.integers(1, 4, p)
    one_receiver = np.zeros((p, p), dtype=np.int64)
    one_receiver[:, p - 1] = rng.integers(0, 4, p)
    return {"uneven": uneven, "zero": np.zeros((p, p), dtype=np.int64), "one sender": one_sender,
            "one receiver": one_receiver, "uniform": np.full((p, p), 2)}


def inputs_for(C, cols=3):
    """Rank r's input: its send rows, every value unique to (rank, element)."""
    return [(np.arange(int(C[r].sum()) * cols, dtype=np.int64).reshape(-1, cols) + 10_000 * r) for r in range(len(C))]


def expected(C, xs):
    p = len(C)
    return [np.concatenate([np.split(xs[i], np.cumsum(C[i])[:-1])[j] for i in range(p)], axis=0) for j in range(p)]


def _alltoallv(comm, C, xs, vc):
    r = comm.rank
    y = comm.all_to_all_vc(xs[r], C) if vc else comm.all_to_all_v(xs[r], C[r], C[:, r])
    return y, comm.last_op


@pytest.mark.local
@pytest.mark.parametrize("p", list(range(1, 17)))
def test_alltoallv_equals_numpy_for_every_rank_count_and_pattern(p):
    rng = np.random.default_rng(p)
    topo = hccl_sim.topology("fullmesh", ranks=p)
    for label, C in patterns(p, rng).items():
        xs = inputs_for(C)
        for vc in (False, True):
            got = hccl_sim.run(_alltoallv, topology=topo, args=(C, xs, vc))
            for j, ((y, _), want) in enumerate(zip(got, expected(C, xs))):
                assert y.shape == want.shape and np.array_equal(y, want), f"p={p} {label} vc={vc} rank {j}"


@pytest.mark.local
@pytest.mark.parametrize("name,params", TOPOLOGIES, ids=lambda v: str(v))
def test_alltoallv_on_every_preset_with_its_algorithm_and_buffer_loops(name, params):
    """HCCL's AlltoAll choice runs the V op too (mesh, staged hierarchy, grouped full mesh), with
    more than one CCL-buffer loop where a block outgrows HCCL_BUFFSIZE / p."""
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    rng = np.random.default_rng(p)
    C = rng.integers(0, 6, (p, p))
    C[0, p - 1] = 9000                         # 9000 rows x 3 int64 = 216 KB: over 1 MB / p on the larger presets
    xs = inputs_for(C)
    for env in ({}, {"HCCL_BUFFSIZE": "1"}):
        got = hccl_sim.run(_alltoallv, topology=topo, args=(C, xs, False), env=env)
        for j, ((y, _), want) in enumerate(zip(got, expected(C, xs))):
            assert np.array_equal(y, want), f"{name} {params} {env} rank {j}"
        uniform = hccl_sim.simulate("alltoall", p * 4, topology=topo)
        assert got[0][1].algo == uniform.algo


@pytest.mark.local
def test_displacements_place_blocks_and_out_keeps_the_rest():
    p = 3

    def fn(comm):
        r = comm.rank
        x = np.arange(6, dtype=np.int32) + 10 * r            # rows: two per peer, reversed by displacement
        y = comm.all_to_all_v(x, [2, 2, 2], [2, 2, 2], send_displs=[4, 2, 0], recv_displs=[5, 0, 2])
        out = np.full(9, -1, dtype=np.int32)
        comm.all_to_all_v(x, [2, 2, 2], [2, 2, 2], send_displs=[4, 2, 0], recv_displs=[6, 0, 3], out=out)
        return y, out
    got = hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=p))
    for j, (y, out) in enumerate(got):
        blocks = {i: (np.arange(6, dtype=np.int32) + 10 * i)[[4, 2, 0][j]:[4, 2, 0][j] + 2] for i in range(p)}
        assert np.array_equal(y, np.concatenate([blocks[1], blocks[2], [0], blocks[0]]))     # a gap: zero
        assert np.array_equal(out, np.concatenate([blocks[1], [-1], blocks[2], [-1], blocks[0], [-1]]))


@pytest.mark.local
@pytest.mark.parametrize("case,match", [
    ("mismatch", r"rank 1 sends 3 rows to rank 2, which expects 2 rows from rank 1"),
    ("negative", r"send_counts\[1\] = -1 is negative"),
    ("short", r"send_counts must be 4 integers"),
    ("overlap", r"send_displs: the block for rank 1 \(send_displs\[1\] = 1\) overlaps the block for rank 0"),
    ("range", r"send_displs\[3\] \+ send_counts\[3\] = 9 rows is past the input's 8 rows"),
    ("recv overlap", r"recv_displs: the block for rank 2 .* overlaps"),
    ("matrix", r"count_matrix must be 4 x 4 integers"),
    ("matrices differ", r"mismatched collective calls across ranks"),
    ("in place", r"cannot run in place"),
])
def test_bad_counts_fail_on_every_rank_without_a_hang(case, match):
    def fn(comm):
        r = comm.rank
        x = np.arange(8, dtype=np.int32).reshape(8, 1)
        sc, rc, sd, rd = [2, 2, 2, 2], [2, 2, 2, 2], None, None
        if case == "mismatch" and r == 1:
            sc = [2, 2, 3, 1]
        if case == "negative" and r == 3:
            sc = [2, -1, 2, 2]
        if case == "short" and r == 0:
            sc = [2, 2, 2]
        if case == "overlap" and r == 0:
            sd = [0, 1, 4, 6]
        if case == "range" and r == 2:
            sd = [0, 2, 4, 7]
        if case == "recv overlap" and r == 1:
            rd = [0, 2, 3, 6]
        if case == "matrix":
            return comm.all_to_all_vc(x, [[2] * 4] * 3)
        if case == "matrices differ":
            return comm.all_to_all_vc(x, np.full((4, 4), 2 if r else 1))
        if case == "in place":
            return comm.all_to_all_v(x, sc, rc, out=x)
        return comm.all_to_all_v(x, sc, rc, send_displs=sd, recv_displs=rd)
    with pytest.raises(HcclError, match=match) as info:
        hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=4), env={"HCCL_EXEC_TIMEOUT": "30"})
    assert info.value.code == "E_PARA"


def _program(topo, C, a=0, b=None, env=None):
    v = VCounts.contiguous(C)
    sig = Signature("alltoallv", (), "int32", None, None, None, False, v)
    choice = choose(sig, topo, Config.from_env(env or {}), 4)
    return build_variable("alltoallv", choice, topo, v, a, int(C.max()) if b is None else b, 4), v, choice


@pytest.mark.unit
@pytest.mark.parametrize("name,params", TOPOLOGIES, ids=lambda v: str(v))
def test_programs_move_every_element_once_without_hazards_and_price_alike_in_both_engines(name, params):
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    rng = np.random.default_rng(2 * p)
    for label, C in patterns(p, rng).items():
        program, v, choice = _program(topo, C)
        ins = [np.arange(int(v.input_elements()[r]), dtype=np.int64) + 100_000 * r for r in range(p)]
        outs = [np.full(int(v.output_elements()[r]), -1, dtype=np.int64) for r in range(p)]
        scratch = [np.full(1 << 12, -1, dtype=np.int64) for _ in range(p)]
        prog.execute(prog.data_moves(program), [[x, o, s] for x, o, s in zip(ins, outs, scratch)], None)
        want = expected(C, [x.reshape(-1, 1) for x in ins])
        for j in range(p):
            assert np.array_equal(outs[j], want[j].reshape(-1)), f"{name} {label} rank {j}"
        assert prog.hazards(program) == [], f"{name} {label}: zero-copy hazard"
        for entry in (np.zeros(p, dtype=np.int64), rng.integers(0, 50_000, p)):
            want_t = replay(list(prog.rank_steps(program, p)), list(entry), topo, dtype="int32", redop="sum")
            assert list(program_times(program, entry, topo, "int32", "sum")) == list(want_t), f"{name} {label}"


@pytest.mark.unit
@pytest.mark.parametrize("name,params", TOPOLOGIES + [("atlas800t-a2", {"servers": 3})], ids=lambda v: str(v))
def test_simulate_with_equal_counts_is_the_alltoall_to_the_ns(name, params):
    """One CCL-buffer loop: the V ops' programs with equal counts are AlltoAll's, step for step;
    AlltoAllV's call costs its count exchange more where the preset has one (910B, 910A), AlltoAllVC's
    exactly AlltoAll's."""
    from hccl_sim.plan.loop_programs import op_overhead_ns
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    dm = topo.device_model
    for op in A2AV:
        extra = (op_overhead_ns(dm, op) - op_overhead_ns(dm, "alltoall")) / 1e9
        assert (extra > 0) == (op == "alltoallv" and topo.device in ("910B", "910A"))
        for block in (0, 1, 1000, 1 << 18):
            est = hccl_sim.simulate(op, counts=np.full((p, p), block), topology=topo)
            uniform = hccl_sim.simulate("alltoall", p * block * 4, topology=topo)
            assert est.algo == uniform.algo and est.nbytes == p * block * 4
            assert np.allclose(np.subtract(est.times, uniform.times), extra, rtol=0, atol=1e-12), \
                f"{name} {params} {op} block={block}"


@pytest.mark.unit
def test_uneven_counts_are_priced_per_pair_on_the_closed_form():
    """Pairwise on the synthetic full mesh, each block at its own size: in step k rank i's block
    for i+k costs a + n(i, i+k) b once both have posted, and a rank moves on when its send and its
    receive are done. Bounded by HCCL's (p-1) a + b sum_k max_i n(i, i+k) (docs/references.md,
    pairwise), which assumes every step waits for the largest block."""
    from topologies.model import transfer_ns
    p, bw, lat = 5, 1e9, 1e-6
    topo = hccl_sim.topology("fullmesh", ranks=p, bandwidth=bw, latency=lat)
    rng = np.random.default_rng(7)
    C = rng.integers(1, 20_000, (p, p))
    est = hccl_sim.simulate("alltoallv", counts=C, topology=topo)
    t = [0] * p
    for k in range(1, p):
        done = [max(t[i], t[(i + k) % p]) + 1000 + transfer_ns(int(C[i, (i + k) % p]) * 4, bw) for i in range(p)]
        t = [max(done[i], done[(i - k) % p]) for i in range(p)]
    bound = sum(1000 + max(transfer_ns(int(C[i, (i + k) % p]) * 4, bw) for i in range(p)) for k in range(1, p))
    assert est.algo == "pairwise"
    assert [round(x * 1e9) for x in est.times] == t
    assert max(t) <= bound


@pytest.mark.unit
def test_simulate_counts_are_checked():
    topo = hccl_sim.topology("fullmesh", ranks=3)
    with pytest.raises(HcclError, match="counts must be a 3 x 3 matrix"):
        hccl_sim.simulate("alltoallv", counts=[[1, 2]], topology=topo)
    with pytest.raises(HcclError, match="give counts="):
        hccl_sim.simulate("alltoallv", 1024, counts=np.ones((3, 3), dtype=int), topology=topo)
    with pytest.raises(HcclError, match="counts= is for the variable-size ops"):
        hccl_sim.simulate("alltoall", counts=np.ones((3, 3), dtype=int), topology=topo)
    assert collectives.get("all_to_all_v").name == "alltoallv"
    big = hccl_sim.topology("fullmesh", ranks=hccl_sim.MAX_ALLTOALL_RANKS + 1)
    with pytest.raises(HcclError, match="over the limit of 2048"):
        hccl_sim.simulate("alltoallv", counts=np.ones((big.num_ranks,) * 2, dtype=int), topology=big)


@pytest.mark.unit
def test_count_distributions_split_each_send_buffer_exactly(tmp_path):
    from hccl_sim.collectives.splits import parse
    for text in ("uniform", "zipf:1.2", "zipf:0.5"):
        m = parse(text).matrix(6, 1001)
        assert m.shape == (6, 6) and (m >= 0).all() and (m.sum(axis=1) == 1001).all(), text
        assert np.array_equal(m, parse(text).matrix(6, 1001))                     # seeded: the same every run
    hot = parse("zipf:1.2").matrix(8, 100_000).sum(axis=0)
    assert hot.max() > 3 * hot.min()                                               # a few experts take most
    f = tmp_path / "w.json"
    f.write_text('{"counts": [[0, 1, 1], [2, 0, 0], [1, 1, 1]]}')
    m = parse(str(f)).matrix(3, 10)
    assert m.tolist() == [[0, 5, 5], [10, 0, 0], [4, 3, 3]]
    for bad, match in (("zipf:0", "exponent must be > 0"), ("zipf", "expected zipf:S"), ("lognormal", "expected uniform"),
                       (str(tmp_path / "none.json"), "No such file")):
        with pytest.raises(HcclError, match=match):
            parse(bad)
    with pytest.raises(HcclError, match="a 3 x 3 matrix for 4 ranks"):
        parse(str(f)).matrix(4, 10)


@pytest.mark.local
@pytest.mark.parametrize("op", ["alltoallv", "alltoallvc"])
def test_bench_alltoallv_zipf_on_real_data_equals_the_timing_engine(capsys, op):
    from hccl_sim.tools.cli import main
    args = ["bench", "--op", op, "--counts", "zipf:1.2", "-b", "4K", "-e", "1M", "-f", "16", "--servers", "2", "-n", "2"]
    assert main(args) == 0
    real = [line.split() for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    assert main(args + ["--engine", "timing"]) == 0
    timed = [line.split() for line in capsys.readouterr().out.splitlines() if line and not line.startswith("#")]
    assert [r[:8] + r[10:] for r in real] == [r[:8] + r[10:] for r in timed]   # all but #wrong and wall time
    assert all(r[8] == "0" for r in real) and all(r[8] == "N/A" for r in timed)
    assert main(["bench", "--op", "allreduce", "--counts", "uniform"]) == 2
    assert "--counts is for the variable-size ops" in capsys.readouterr().err


@pytest.mark.local
@pytest.mark.parametrize("build", [lambda f: f.corrupt(0, 8), lambda f: f.link_slow(1, 10, factor=0.25),
                                   lambda f: f.straggler(3, delay=2e-5)], ids=["corrupt", "slow", "straggler"])
def test_alltoallv_under_faults_moves_every_row_at_simulates_time(build):
    """A corrupted transfer (retransmitted), a slowed link, a straggler: the rows are numpy's and
    every rank's time is simulate()'s under the same plan."""
    from hccl_sim import FaultPlan
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    p = topo.num_ranks
    C = np.random.default_rng(5).integers(0, 40, (p, p))
    xs = inputs_for(C)
    plan = build(FaultPlan())
    got = hccl_sim.run(_alltoallv, topology=topo, args=(C, xs, False), faults=plan)
    for j, ((y, rec), want) in enumerate(zip(got, expected(C, xs))):
        assert np.array_equal(y, want), j
    est = hccl_sim.simulate("alltoallv", counts=C * 3, topology=topo, dtype="int64", faults=build(FaultPlan()))
    assert [rec.end - rec.start for _, rec in got] == [round(t * 1e9) for t in est.times]
    clean = hccl_sim.simulate("alltoallv", counts=C * 3, topology=topo, dtype="int64")
    assert est.time > clean.time                  # the fault costs time


@pytest.mark.local
def test_a_rank_crash_in_alltoallv_is_an_error_on_every_survivor():
    from hccl_sim import FaultPlan
    topo = hccl_sim.topology("fullmesh", ranks=4)
    C = np.full((4, 4), 3)
    with pytest.raises(HcclError) as info:
        hccl_sim.run(_alltoallv, topology=topo, args=(C, inputs_for(C), False), faults=FaultPlan().rank_crash(2, at_op=0))
    assert "rank 2" in str(info.value)


@pytest.mark.local
def test_chaos_draws_the_variable_size_ops_and_their_scenarios_end_right():
    """The campaign's draw holds AlltoAllV/VC calls (skewed counts, empty pairs, buffer loops), and
    a few of them under faults end recovered or in a clean error, never WRONG, HANG or LEAK."""
    from hccl_sim.chaos.scenarios import count_matrix
    from hccl_sim.chaos.runners import run_scenario, runner_for
    from hccl_sim.chaos.scenarios import generate, space_for
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    space = space_for(topo)
    drawn = [sc for sc in generate(11, 120, topo, space) if sc.call.op in A2AV]
    assert {sc.call.op for sc in drawn} == set(A2AV)
    for sc in drawn:
        m = count_matrix(sc.call, topo.num_ranks)
        assert (m.sum(axis=1) == sc.call.count).all() and sc.call.out != "inplace"
    runner = runner_for("local", topo)
    try:
        outcomes = {run_scenario(sc, runner).verdict.outcome for sc in drawn[:6]}
    finally:
        assert runner.close() == []
    assert outcomes <= {"recovered", "clean error"}, outcomes


@pytest.mark.unit
def test_hccl_algo_alltoall_setting_applies_to_the_v_ops():
    """As HCCL's parser (SetSpecificAlgType): `alltoall=` in HCCL_ALGO sets AlltoAllV and VC too."""
    topo = hccl_sim.topology("fullmesh", ranks=5)
    m = np.full((5, 5), 100)
    for op in A2AV:
        assert hccl_sim.simulate(op, counts=m, topology=topo).algo == "pairwise"
        assert hccl_sim.simulate(op, counts=m, topology=topo,
                                 env={"HCCL_ALGO": "alltoall=level0:NA;level1:fullmesh"}).algo == "fullmesh"
        assert hccl_sim.simulate(op, counts=m, topology=topo,
                                 env={"HCCL_ALGO": "allreduce=level0:NA;level1:fullmesh"}).algo == "pairwise"
        assert hccl_sim.simulate(op, counts=m, topology=topo, algo="fullmesh").algo == "fullmesh"


@pytest.mark.local
def test_alltoallv_on_a_sub_communicator_and_a_stream():
    def fn(comm):
        sub = comm.split(comm.rank % 2)
        q, r = sub.size, sub.rank
        C = (np.arange(q * q).reshape(q, q) % 3) + 1
        xs = [np.arange(C[i].sum(), dtype=np.int32) + 100 * i for i in range(q)]
        want = np.concatenate([np.split(xs[i], np.cumsum(C[i])[:-1])[r] for i in range(q)])
        y = sub.all_to_all_v(xs[r], C[r], C[:, r])
        work = sub.all_to_all_vc(xs[r], C, stream=comm.device.stream())
        work.wait()
        return np.array_equal(y, want) and np.array_equal(work.result, want), sub.last_op.algo
    got = hccl_sim.run(fn, topology=hccl_sim.topology("atlas800t-a2", servers=2))
    assert all(ok for ok, _ in got) and {algo for _, algo in got} == {"level0:fullmesh;level1:pairwise"}
