"""The 910B and A3 presets against published measurements, and what each calibrated constant implies.

The points and their sources are experiments/calibration_points.yaml; the comparison is
experiments/calibration.py's. Goals (stated there): large-message points within 0.9-1.1 of the
published figure, small-message floors within +-25 %.
"""
import dataclasses
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import hccl_sim
from hcomm.cost import CostModel
from topologies.presets import hardware

pytestmark = pytest.mark.unit

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _calibration():
    spec = importlib.util.spec_from_file_location("calibration", EXPERIMENTS / "calibration.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CAL = _calibration()
POINTS = CAL.load()


def test_every_point_says_where_it_comes_from():
    assert len(POINTS) >= 30
    ids = [p["id"] for p in POINTS]
    assert len(set(ids)) == len(ids)
    for p in POINTS:
        assert p["regime"] in ("large", "small", "mid") and p["confidence"] in ("high", "medium", "low"), p["id"]
        assert p["meaning"] in ("duration", "algbw") and p["unit"] in ("ms", "us", "GB/s"), p["id"]
        assert all(p["source"].get(k) for k in ("repo", "commit", "path", "where")), p["id"]
        if p.get("preset", "atlas800t-a2") == "atlas900-a3":
            assert p["measure"] in ("bench", "kernel") and p["path"] in ("AIV", "AI CPU"), p["id"]
            assert p["bytes"] == p["per_rank_bytes"] * (p["npus"] if p["op"] in ("allgather", "reducescatter") else 1)
    assert {p["op"] for p in POINTS} >= {"allreduce", "allgather", "reducescatter", "broadcast", "reduce",
                                          "alltoall", "send", "local_copy"}


@pytest.mark.parametrize("point", [p for p in POINTS if p["regime"] in CAL.GOALS], ids=lambda p: p["id"])
def test_point_within_its_goal(point):
    row = CAL.compare(point)
    lo, hi = CAL.GOALS[point["regime"]]
    assert lo <= row["ratio"] <= hi, (point["id"], row["simulated"], point["figure"], row["ratio"])


def _without(topo, **fields):
    """The same topology with some device-model constants replaced (a fresh cost model)."""
    twin = hardware("atlas800t-a2", devices_per_server=[topo.num_ranks])
    twin.device_model = dataclasses.replace(twin.device_model, **fields)
    return twin


@pytest.mark.parametrize("op", ["allreduce", "allgather", "reducescatter", "broadcast", "reduce", "alltoall"])
def test_op_overhead_delays_every_rank_by_exactly_its_constant(op):
    topo = hardware("atlas800t-a2", devices_per_server=[4])
    dm = topo.device_model
    colls = hccl_sim.collectives
    assert set(dm.op_overhead_ns) == {n for n, c in colls.COLLECTIVES.items() if not c.variable} | {"alltoallv"}
    from hccl_sim.plan.loop_programs import op_overhead_ns
    assert op_overhead_ns(dm, "alltoallvc") == dm.op_overhead_ns["alltoall"]       # no count exchange
    with_it = hccl_sim.simulate(op, 4 << 20, topology=topo).times
    without = hccl_sim.simulate(op, 4 << 20, topology=_without(topo, op_overhead_ns={})).times
    assert np.allclose(np.subtract(with_it, without), dm.op_overhead_ns[op] / 1e9, atol=1e-12, rtol=0)


def test_loop_overhead_charged_once_per_loop_after_the_first():
    topo = hardware("atlas800t-a2", devices_per_server=[4])
    env = {"HCCL_BUFFSIZE": "1"}                          # 1 MB loops: a 13 MiB + 5 B op makes 14
    n = (13 << 20) + 4
    with_it = hccl_sim.simulate("broadcast", n, topology=topo, env=env).times
    without = hccl_sim.simulate("broadcast", n, topology=_without(topo, loop_overhead_ns=0), env=env).times
    loops = -(-n // (1 << 20))
    expect = (loops - 1) * topo.device_model.loop_overhead_ns / 1e9
    assert np.allclose(np.subtract(with_it, without), expect, atol=1e-12, rtol=0)


def test_send_call_cost_on_each_side():
    topo = hardware("atlas800t-a2", devices_per_server=[2])
    call = topo.device_model.p2p_overhead_ns
    with_it = CostModel.of(topo).p2p_ns(0, 1, 4096, 0, 0)
    without = CostModel.of(_without(topo, p2p_overhead_ns=0)).p2p_ns(0, 1, 4096, 0, 0)
    assert np.subtract(with_it, without).tolist() == [call, call]
    # a receiver that posts late: the sender's call cost and copy-in are hidden behind its call
    late = CostModel.of(topo).p2p_ns(0, 1, 4096, 0, 10 * call)
    assert late[0] - with_it[0] == 10 * call - topo.device_model.copy_ns(4096)


def test_local_copy_rate_is_the_measured_one():
    dm = hardware("atlas800t-a2").device_model
    assert dm.copy_bandwidth == 668e9
    assert dm.copy_ns(1 << 30) == 1500 + -(-(1 << 30) * 10**9 // int(668e9))


def test_inline_reduce_runs_at_its_own_rate():
    """2 NPUs, ReduceScatter: one step, each NPU reduces the other's half inline as it arrives, at
    the measured Reduce_Inline rate; plain copies (an AllGather) keep the link's rate."""
    from topologies.model import transfer_ns
    topo = hardware("atlas800t-a2", devices_per_server=[2])
    dm = topo.device_model
    n = 64 << 20
    with_it = hccl_sim.simulate("reducescatter", n, topology=topo).time
    without = hccl_sim.simulate("reducescatter", n, topology=_without(topo, inline_reduce_bandwidth=float("inf"))).time
    half = n // 2
    assert round((with_it - without) * 1e9) == transfer_ns(half, dm.inline_reduce_bandwidth) - transfer_ns(half, 19.5e9)
    gather = hccl_sim.simulate("allgather", n, topology=topo).time
    assert gather == hccl_sim.simulate("allgather", n, topology=_without(topo, inline_reduce_bandwidth=float("inf"))).time


def test_a3_dispatch_delays_a_ring_op_by_its_constant_per_step():
    """A3's per-step dispatch (AI CPU expansion) is charged once per ring step: an AllGather on 8
    dies (the double ring's 7 steps, both rings at once) ends 7 dispatches later on every rank."""
    topo = hardware("atlas900-a3", devices_per_server=[8])
    dm = topo.device_model
    assert dm.dispatch_ns > 0
    twin = hardware("atlas900-a3", devices_per_server=[8])
    twin.device_model = dataclasses.replace(dm, dispatch_ns=0)
    for nbytes in (8 << 20, 24 << 20):
        with_it = hccl_sim.simulate("allgather", nbytes, topology=topo, dtype="bfloat16").times
        without = hccl_sim.simulate("allgather", nbytes, topology=twin, dtype="bfloat16").times
        assert np.allclose(np.subtract(with_it, without), 7 * dm.dispatch_ns / 1e9, atol=1e-12, rtol=0)


def test_a3_double_ring_is_as_fast_as_ub_not_sio():
    """The double ring runs each ring at its slower hop: UB (125.3 GB/s per ring) is the limit, so
    an infinitely fast SIO changes nothing, and a slower UB slows the op."""
    import copy
    from topologies import presets
    data = copy.deepcopy(presets.preset_data("atlas900-a3"))
    base = hccl_sim.simulate("allgather", 16 << 24, topology=hardware("atlas900-a3", devices_per_server=[16]),
                             dtype="bfloat16").times[0]
    saved = presets.preset_data("atlas900-a3")
    try:
        saved["intra_server"]["bandwidth"] = 1e15
        fast_sio = hccl_sim.simulate("allgather", 16 << 24, topology=hardware("atlas900-a3", devices_per_server=[16]),
                                     dtype="bfloat16").times[0]
        saved["superpod"]["bandwidth"] = float(data["superpod"]["bandwidth"]) / 2
        slow_ub = hccl_sim.simulate("allgather", 16 << 24, topology=hardware("atlas900-a3", devices_per_server=[16]),
                                    dtype="bfloat16").times[0]
    finally:
        saved.clear()
        saved.update(data)
    assert fast_sio == base
    assert slow_ub > 1.7 * base             # the link time doubles; fixed costs and staging copies do not


AIV = {"HCCL_OP_EXPANSION_MODE": "AIV"}


def _a3_algo(op, nbytes, npus=8, env=AIV, dtype="bfloat16", **kw):
    return hccl_sim.simulate(op, nbytes, topology=hardware("atlas900-a3", devices_per_server=[npus]), env=env,
                             dtype=dtype, **kw).algo


def test_a3_aiv_kernels_run_within_hccls_entry_sizes_on_one_server_only():
    """HCCL_OP_EXPANSION_MODE=AIV: AllGather up to 512 KiB per rank, ReduceScatter up to 1 MiB per
    rank, AllReduce up to 1 MiB per die run as one AIV mesh kernel; one byte more (a bf16 element),
    two servers, an algorithm asked for or prod run the AI CPU's executors."""
    assert _a3_algo("allgather", 8 * (512 << 10)) == "fullmesh [AIV]"
    assert _a3_algo("allgather", 8 * ((512 << 10) + 2)) == "level0:double_ring"
    assert _a3_algo("reducescatter", 8 * (1 << 20)) == "fullmesh [AIV]"
    assert _a3_algo("reducescatter", 8 * ((1 << 20) + 2)) == "level0:double_ring"
    assert _a3_algo("allreduce", 8 * (1 << 20)) == "fullmesh [AIV]"
    assert _a3_algo("allreduce", 8 * ((1 << 20) + 2)) == "level0:double_ring"
    assert "AIV" not in _a3_algo("allgather", 1024, env=None)
    assert "AIV" not in _a3_algo("allgather", 1024, env={"HCCL_OP_EXPANSION_MODE": "AI_CPU"})
    # (fp16: HCCL multiplies no bf16 on A3, CheckReduceDataType)
    assert _a3_algo("allreduce", 1024, redop="prod", dtype="float16").startswith("level0:double_ring")
    assert "AIV" not in _a3_algo("allgather", 1024, algo="ring")
    two = hccl_sim.simulate("allgather", 1024, topology=hardware("atlas900-a3", devices_per_server=[16, 16]),
                            env=AIV).algo
    assert "AIV" not in two


def test_a3_aiv_call_costs_its_constant_and_no_dispatch():
    """An AIV kernel's fixed part is its preset constant alone: the AI CPU's per-step dispatch does
    not enter it, and taking the constant away takes exactly that much off every rank."""
    topo = hardware("atlas900-a3", devices_per_server=[8])
    dm = topo.device_model
    twin = hardware("atlas900-a3", devices_per_server=[8])
    aiv = {**dm.kernels["AIV"], "op_overhead_ns": {**dm.aiv_op_overhead_ns, "allgather": 0}}
    twin.device_model = dataclasses.replace(dm, kernels={**dm.kernels, "AIV": aiv}, dispatch_ns=dm.dispatch_ns * 3)
    with_it = hccl_sim.simulate("allgather", 8 * 4096, topology=topo, env=AIV).times
    without = hccl_sim.simulate("allgather", 8 * 4096, topology=twin, env=AIV).times
    assert np.allclose(np.subtract(with_it, without), dm.aiv_op_overhead_ns["allgather"] / 1e9, atol=1e-12, rtol=0)


def test_expansion_mode_is_checked_and_said_where_it_is_not_modelled():
    from hccl_sim.config.env import Config
    from topologies.errors import HcclError
    assert Config.from_env({"HCCL_OP_EXPANSION_MODE": "AIV"}).expansion == "AIV"
    with pytest.raises(HcclError, match="HCCL_OP_EXPANSION_MODE"):
        Config.from_env({"HCCL_OP_EXPANSION_MODE": "GPU"})
    with pytest.warns(UserWarning, match="HCCL_OP_EXPANSION_MODE=AIV is not modelled on atlas800t-a2"):
        hccl_sim.simulate("allreduce", 1024, topology=hardware("atlas800t-a2", devices_per_server=[3]), env=AIV)


def test_a3_small_counts_without_aiv_run_hccls_small_count_mesh_on_the_ai_cpu():
    """The default expansion (AI CPU): AllGather up to 512 KiB per rank and AllReduce up to 512 KiB
    per die of one server run HCCL's small-count mesh, with the AI CPU's per-step dispatch; larger
    ones, ReduceScatter, and two servers run the double ring and its levels."""
    mesh = "fullmesh (small count: HCCL's "
    assert _a3_algo("allgather", 8 * (512 << 10), env=None) == mesh + "AllGatherSmallCount)"
    assert _a3_algo("allgather", 8 * ((512 << 10) + 2), env=None) == "level0:double_ring"
    assert _a3_algo("allreduce", 8 * (512 << 10), env=None) == mesh + "AllReduceMeshSmallCount)"
    assert _a3_algo("allreduce", 8 * ((512 << 10) + 2), env=None) == "level0:double_ring"
    assert _a3_algo("reducescatter", 8 * 1024, env=None) == "level0:double_ring"
    two = hccl_sim.simulate("allgather", 1024, topology=hardware("atlas900-a3", devices_per_server=[16, 16])).algo
    assert "small count" not in two
    topo = hardware("atlas900-a3", devices_per_server=[8])
    twin = hardware("atlas900-a3", devices_per_server=[8])
    twin.device_model = dataclasses.replace(topo.device_model, dispatch_ns=0)
    one_step = np.subtract(hccl_sim.simulate("allgather", 8 * 1024, topology=topo).times,
                           hccl_sim.simulate("allgather", 8 * 1024, topology=twin).times)
    assert np.allclose(one_step, topo.device_model.dispatch_ns / 1e9, atol=1e-12, rtol=0)   # one mesh step
