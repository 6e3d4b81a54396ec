"""HCCL_BIRS_ENABLE=TRUE: A3's batch-invariant ReduceScatter (algorithms.birs, selection.birs).
Its programs checked symbolically on one and several servers (4-, 6-, 8- and 16-die servers), its
two timing engines equal, integer data bit-identical to numpy on the local engine, float data
bit-identical whatever the count (the fixed summation order), HCCL's gates and refusals."""
import warnings

import numpy as np
import pytest

import hccl_sim
import topologies
from hccl_sim import HcclError
from hccl_sim.algorithms import birs
from hccl_sim.algorithms.common import side_by_side
from hccl_sim.config.env import Config
from hccl_sim.plan.loop_programs import build_parts, loop_program
from hccl_sim.plan.planner import Signature, choose
from hcomm.cost import as_cost
from hcomm.vtiming import program_times
from test_schedules import L, des_times, verify

ON = {"HCCL_BIRS_ENABLE": "TRUE"}


def a3(*dies):
    """A3 servers of the given die counts in one superpod."""
    return topologies.hardware("atlas900-a3", devices_per_server=list(dies))


def birs_program(topo, length=L):
    p = topo.num_ranks
    s = Signature("reducescatter", (p * length,), "float32", "sum", None, None)
    choice = choose(s, topo, Config(birs=True), 4)
    assert choice.label == birs.NAME
    parts = build_parts("reducescatter", choice, topo, length, 4, None)
    return side_by_side(*[prog for _, _, prog in parts])


@pytest.mark.unit
@pytest.mark.parametrize("dies", [(4,), (16,), (8, 8), (16, 16), (6, 6, 6)], ids=str)
def test_programs_verify_and_both_timing_engines_agree(dies):
    topo = a3(*dies)
    p = topo.num_ranks
    program = birs_program(topo)
    verify(program, "reducescatter", p, 0, 0, f"BIRS {dies}")
    entry = np.random.default_rng(p).integers(0, 20_000, p)
    assert list(program_times(program, entry, topo, "float32", "sum")) == list(des_times(program, entry, topo))


@pytest.mark.unit
def test_tree_is_hccls_fixed_order_for_any_count():
    assert birs.tree_pairs(4) == [[(1, 0), (3, 2)], [(2, 0)]]       # (IM0 + IM1) + (IM2 + IM3)
    assert birs.tree_pairs(3) == [[(1, 0)], [(2, 0)]]
    assert birs.tree_pairs(1) == []


@pytest.mark.unit
def test_gates_and_refusals():
    big = 64 << 20
    topo = a3(16)
    default = hccl_sim.simulate("reducescatter", big, topology=topo)
    est = hccl_sim.simulate("reducescatter", big, topology=topo, env=ON)
    assert est.algo == "ReduceScatterBIRSExecutor" and est.time > 0 and est.time != default.time
    with pytest.warns(UserWarning, match="exactly 'TRUE'"):
        assert hccl_sim.simulate("reducescatter", big, topology=topo, env={"HCCL_BIRS_ENABLE": "true"}).algo \
            == default.algo
    # the BIRS path decides before HCCL_ALGO, AIV and the other collectives are untouched
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert hccl_sim.simulate("reducescatter", big, topology=topo,
                                 env=dict(ON, HCCL_ALGO="level0:NA;level1:NB")).algo.startswith(birs.NAME + " (")
    assert hccl_sim.simulate("reducescatter", 1024, topology=topo, env=dict(ON, HCCL_OP_EXPANSION_MODE="AIV")).algo \
        == birs.NAME
    assert hccl_sim.simulate("allreduce", big, topology=topo, env=ON).algo \
        == hccl_sim.simulate("allreduce", big, topology=topo).algo
    assert "BIRS" not in hccl_sim.simulate("reducescatterv", counts=[100] * 16, topology=topo, env=ON).algo
    assert "BIRS" not in hccl_sim.simulate("reducescatter", 0, topology=topo, env=ON).algo   # a zero count succeeds
    refused = [((a3(5),), "E_PARA", r"Fail to find executor for algName\[\]"),
               ((hccl_sim.topology("atlas800t-a2"),), "E_PARA", r"910B device, not A3.*algName\[\]"),
               ((a3(2, 2),), "E_PARA", r"userRankSize\[4\] / serverNum\[2\] < 4"),
               ((a3(1),), "E_INTERNAL", "kRejectRankSizeOne"),
               ((a3(5, 5),), "E_INTERNAL", r"intraRankSize_\[5\] is not evenly divisible"),
               ((a3(4, 4, 6),), "E_NOT_SUPPORT", "do not divide 14 ranks")]
    for (t,), code, text in refused:
        with pytest.raises(HcclError, match=text) as err:
            hccl_sim.simulate("reducescatter", 1 << 20, topology=t, env=ON)
        assert err.value.code == code
    with pytest.raises(HcclError, match="does not run reducescatter at A3 level1"):
        hccl_sim.simulate("reducescatter", big, topology=a3(4, 4), algo=birs.NAME)      # no token asks for it


@pytest.mark.unit
def test_reads_and_writes_the_users_buffers_without_staging():
    topo = a3(8)
    cost = as_cost(topo)
    s = Signature("reducescatter", (8 * 64,), "float32", "sum", None, None)
    program = loop_program(cost, "reducescatter", choose(s, topo, Config(birs=True), 4), 64, 4, None)
    assert not any(len(st.full().g_rank) for st in program)


def _run(topo, env, m, dtype, values):
    p = topo.num_ranks

    def fn(comm):
        return comm.reduce_scatter(values(comm.rank, p * m).astype(dtype)), comm.last_op.algo
    return hccl_sim.run(fn, topology=topo, env=env)


@pytest.mark.local
@pytest.mark.parametrize("dies", [(8,), (4, 4)], ids=str)
def test_integer_data_equals_numpy(dies):
    topo = a3(*dies)
    p = topo.num_ranks

    def values(r, n):
        return (np.arange(n) * (r + 3) + r) % 997
    for m, env in ((1, ON), (37, ON), (40_000, dict(ON, HCCL_BUFFSIZE="1"))):     # the last: two buffer loops
        got = _run(topo, env, m, np.int64, values)
        want = sum(values(r, p * m) for r in range(p)).reshape(p, m)
        for r, (out, algo) in enumerate(got):
            assert algo == birs.NAME and np.array_equal(out, want[r]), f"{dies} m={m} rank {r}"


@pytest.mark.local
def test_float_results_are_bit_identical_whatever_the_count():
    """Every element of every block sums the same eight values: BIRS gives one result, the fixed
    tree over the package pair sums, for any count; the double ring's two directions and ring
    starts sum them in orders that depend on where the element lies."""
    v = np.float32([3.0e7, 1.25, -3.0e7, 0.3, 7.1, -2.2e-3, 1.0e-4, 5.5])
    pairs = [v[2 * i] + v[2 * i + 1] for i in range(4)]
    tree = (pairs[0] + pairs[1]) + (pairs[2] + pairs[3])
    topo = a3(8)

    def values(r, n):
        return np.full(n, v[r])
    for m in (1, 37, 1000):
        got = {float(x) for out, _ in _run(topo, ON, m, np.float32, values) for x in np.unique(out)}
        assert got == {float(tree)}, m
    assert len({float(x) for out, _ in _run(topo, {}, 37, np.float32, values) for x in np.unique(out)}) > 1
