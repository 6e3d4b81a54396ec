"""HCCL_OP_EXPANSION_MODE=CCU_MS, CCU_SCHED and AIV on the Ascend 950: HCCL's CCU and AIV selectors
(hccl_sim.selection.hccl_950_kernels) as the open-source code has them, their fall back to the AI
CPU, the kernels' costs (topologies.presets.with_kernel), and their programs verified symbolically
and on real integer data."""
import dataclasses
import types

import pytest

import hccl_sim
import topologies
from hccl_sim import collectives
from hccl_sim.config.env import Config
from hccl_sim.plan.loop_programs import build_parts
from hccl_sim.plan.planner import Signature, choose
from hccl_sim.selection.hccl_950_gates import mesh_type
from test_schedules import L, verify
from test_superpod import _run_all
from topologies.subset import subset

MiB, KiB = 1 << 20, 1 << 10
MODES = ("CCU_MS", "CCU_SCHED", "AIV")


def a5(servers=1, superpods=None, per_server=None):
    if per_server is None:
        return hccl_sim.topology("atlas950", servers=servers, superpods=superpods)
    return topologies.hardware("atlas950", devices_per_server=[per_server] * servers)


def name(op, nbytes, topo, mode, **kw):
    env = {"HCCL_OP_EXPANSION_MODE": mode, **kw.pop("env", {})}
    return hccl_sim.simulate(op, nbytes, topology=topo, env=env, **kw).algo.split(":")[0]


@pytest.mark.unit
def test_one_servers_ccu_and_aiv_choices_and_their_fall_back():
    one = a5()
    assert name("allreduce", 256 * KiB, one, "CCU_MS") == "CcuMSAllReduceSoleMesh2Die"
    assert name("allreduce", 4 * MiB, one, "CCU_MS") == "CcuMSAllReduceSequenceMesh2Die"
    assert name("allreduce", 256 * KiB, one, "CCU_SCHED") == "CcuSchedAllReduceSoleMesh2Die"
    assert name("allreduce", 64 * MiB, one, "CCU_SCHED") == "CcuSchedAllReduceSequenceMesh2Die"
    # d x 8 / n^2 past 8 MiB: CCU_SCHED takes nothing, the AI CPU does (its two-shot)
    assert name("allreduce", 64 * MiB + 4, one, "CCU_SCHED") == "AicpuAllReduceSoleMeshTwoShot"
    for dtype, redop in (("int8", "sum"), ("int64", "sum"), ("float32", "prod")):
        assert name("allreduce", MiB, one, "CCU_MS", dtype=dtype, redop=redop).startswith("AicpuAllReduce")
    assert name("allreduce", MiB, one, "AIV", dtype="int64") == "AivAllReduceSoleMeshTwoShot"
    assert name("allreduce", 64 * KiB, one, "AIV") == "AivAllReduceSoleMeshOneShot"       # under 128 KiB in a board
    assert name("allreduce", MiB, one, "AIV", dtype="uint64") == "AicpuAllReduceSoleMeshOneShot"
    assert name("allreduce", MiB, one, "CCU_MS", env={"HCCL_DETERMINISTIC": "strict"}).startswith("Aicpu")
    assert name("allgather", 8 * MiB, one, "CCU_MS") == "CcuMSAllGatherSoleMesh2Die"
    assert name("reducescatter", 8 * MiB, one, "CCU_SCHED") == "CcuSchedReduceScatterSoleMesh2Die"
    assert name("reducescatter", 64 * MiB, one, "CCU_SCHED") == "AicpuReduceScatterSoleMesh"   # d x 8/n = 8 MiB
    assert name("alltoall", MiB, one, "CCU_MS") == "CcuSchedAllToAllSoleMesh2Die"     # CCU_MS has none: CCU_SCHED
    # a whole server is a two-die full mesh: no CCU Broadcast, Reduce or Scatter
    for op in ("broadcast", "reduce", "scatter"):
        assert name(op, MiB, one, "CCU_MS").startswith("Aicpu")
    for op in ("broadcast", "reduce", "scatter", "alltoall", "allgather", "reducescatter"):
        assert name(op, 8 * MiB, one, "AIV").startswith("Aiv")
    # AIV's limit: 8 MiB per rank, and 16 CCL buffers
    assert name("allgather", 8 * 8 * MiB, one, "AIV") == "AicpuAllGatherSoleMesh"
    assert name("allgather", 8 * 8 * MiB - 8, one, "AIV") == "AivAllGatherSoleMesh"
    assert name("allgather", 8 * 8 * MiB - 8, one, "AIV", env={"HCCL_BUFFSIZE": "1"}) == "AicpuAllGatherSoleMesh"
    est = hccl_sim.simulate("broadcast", MiB, topology=one, env={"HCCL_OP_EXPANSION_MODE": "CCU_SCHED"})
    assert "HCCL_OP_EXPANSION_MODE=CCU_SCHED: HCCL's CCU selectors take no Broadcast of this call; it falls back " \
           "to the AI CPU" in est.algo
    assert hccl_sim.simulate("allgather", MiB, topology=one, env={"HCCL_OP_EXPANSION_MODE": "AIV"}).algo == \
        "AivAllGatherSoleMesh: fullmesh [AIV]"


@pytest.mark.unit
def test_an_in_place_call_stays_off_the_ccu():
    one = a5()
    for inplace, want in ((False, "CcuMSAllReduceSequenceMesh2Die"), (True, "AicpuAllReduceSoleMeshOneShot")):
        sig = Signature("allreduce", (MiB,), "float32", "sum", None, None, inplace)
        assert choose(sig, one, Config(expansion="CCU_MS"), 4).executor == want


@pytest.mark.unit
def test_superpod_and_supercluster_choices():
    pod, four, cluster = a5(2), a5(4), a5(2, 2)
    # a server of the SuperPoD is a two-die full mesh: CCU_SCHED's AllReduce and AllGather refuse it
    assert name("allreduce", MiB, four, "CCU_MS") == "AicpuAllReduceSoleNHR"
    assert name("allgather", 64 * MiB, four, "CCU_SCHED") == "AicpuAllGatherParallelMeshNHR"
    # ReduceScatter has no such refusal: 2 x 8 ranks with 4-16 MiB in all, HCCL's "2*8p" Mesh2Die
    assert name("reducescatter", 8 * MiB, pod, "CCU_SCHED") == "CcuSchedReduceScatterSoleMesh2Die"
    assert name("reducescatter", 256 * KiB, four, "CCU_SCHED") == "CcuSchedReduceScatterSoleMesh"
    assert hccl_sim.simulate("reducescatter", 8 * MiB, topology=four, env={"HCCL_OP_EXPANSION_MODE": "CCU_SCHED"}
                             ).algo == "CcuSchedReduceScatterSequenceMeshMesh: level0:fullmesh;level1:fullmesh [CCU]"
    assert name("reducescatter", 32 * 32 * MiB, four, "CCU_SCHED") == "AicpuReduceScatterParallelMeshNHR"
    assert name("alltoall", MiB, four, "CCU_SCHED") == "CcuSchedAllToAllSoleMeshMultiLink"
    assert name("alltoall", MiB, a5(9), "CCU_SCHED") == "AicpuAllToAllSoleMeshSingleChannel"     # over 64 ranks
    assert name("allreduce", MiB, four, "AIV") == "AivAllReduceSoleMeshTwoShot"                  # flat, 32 ranks
    for mode in MODES:                   # three levels: no CCU or AIV selector serves them
        for op in ("allreduce", "allgather", "alltoall", "broadcast"):
            assert name(op, MiB, cluster, mode).startswith(("Aicpu", "Ins")), (mode, op)
    # two NPUs per server (one die's links each): CCU_SCHED's rules by size
    twos = a5(3, per_server=2)
    assert name("allreduce", 256 * KiB, twos, "CCU_SCHED") == "CcuSchedAllReduceSoleMesh"
    assert hccl_sim.simulate("allreduce", MiB, topology=twos, env={"HCCL_OP_EXPANSION_MODE": "CCU_SCHED"}).algo == \
        "CcuSchedAllReduceSequenceMeshMesh: level0:fullmesh;level1:fullmesh [CCU]"
    assert name("allgather", 6 * 512 * KiB, twos, "CCU_SCHED") == "CcuSchedAllGatherSoleMesh"
    assert name("allgather", 6 * 2 * MiB, twos, "CCU_SCHED") == "CcuSchedAllGatherParallelMeshNHR"
    assert name("broadcast", MiB, twos, "CCU_MS") == "CcuSchedBroadcastSoleNHR"       # CCU_MS: one level only
    ones = a5(4, per_server=1)
    assert name("allreduce", MiB, ones, "CCU_MS") == "CcuSchedAllReduceSoleNHR"


@pytest.mark.unit
def test_v_ops_select_by_their_own_selectors():
    one, pod = a5(), a5(2)
    counts = [1000 * (1 + r % 3) for r in range(16)]
    assert hccl_sim.simulate("allgatherv", counts=counts, topology=pod).algo == "AicpuAllGatherVSoleMesh: fullmesh"
    assert hccl_sim.simulate("reducescatterv", counts=counts, topology=pod).algo == \
        "AicpuReduceScatterVSoleMesh: fullmesh"
    ccu = {"HCCL_OP_EXPANSION_MODE": "CCU_SCHED"}
    assert hccl_sim.simulate("allgatherv", counts=counts[:8], topology=one, env=ccu).algo.startswith(
        "CcuSchedAllGatherVSoleMesh")
    assert hccl_sim.simulate("allgatherv", counts=counts, topology=pod, env=ccu).algo.startswith(
        "AicpuAllGatherVSoleMesh")
    # ReduceScatterV's CCU_SCHED refuses a two-die full mesh; four NPUs of one die take it
    assert hccl_sim.simulate("reducescatterv", counts=counts[:8], topology=one, env=ccu).algo.startswith("Aicpu")
    half = subset(one, [0, 1, 2, 3])
    assert hccl_sim.simulate("reducescatterv", counts=counts[:4], topology=half, env=ccu).algo.startswith(
        "CcuSchedReduceScatterVSoleMesh")
    with pytest.raises(hccl_sim.HcclError, match="takes no UINT64 or FP64"):
        hccl_sim.simulate("reducescatterv", counts=counts, topology=pod, dtype="uint64")


@pytest.mark.unit
@pytest.mark.parametrize("members,want", [
    (range(8), ("TWO_DIE_REGULAR", True)), ([0, 1, 2, 3], ("SINGLE_DIE", False)),
    ([0, 1, 4, 5], ("TWO_DIE_REGULAR", True)), ([0, 1, 4, 5, 6, 7], ("TWO_DIE_NOT_REGULAR", True)),
    ([0, 1], ("SINGLE_DIE", False)), ([0, 4, 5], ("SINGLE_DIE", False))], ids=str)
def test_a_comms_level0_mesh_type_by_the_dies_of_its_links(members, want):
    topo = subset(a5(), list(members))
    assert mesh_type(types.SimpleNamespace(topo=topo)) == want


@pytest.mark.unit
def test_the_mesh_type_steers_the_ccu():
    one = a5()
    assert name("broadcast", MiB, subset(one, [0, 1, 2, 3]), "CCU_MS") == "CcuMSBroadcastSoleMesh"
    assert name("allgather", MiB, subset(one, [0, 1, 2, 3]), "CCU_MS") == "CcuMSAllGatherSoleMesh"
    assert name("allgather", MiB, subset(one, [0, 1, 4, 5, 6, 7]), "CCU_MS") == "AicpuAllGatherSoleMesh"
    assert name("allgather", MiB, subset(one, [0, 1, 4, 5, 6, 7]), "AIV") == "AivAllGatherSoleMesh"


@pytest.mark.unit
def test_a_ccu_kernel_costs_its_launch_its_copies_and_no_dispatch():
    """A CCU kernel's fixed part is its preset constant alone (no AI CPU dispatch per step), and its
    local copies run at the CCU's rate: taking the constant away takes exactly it off every rank,
    tripling the AI CPU's dispatch changes nothing, halving the CCU's copy rate slows it."""
    env = {"HCCL_OP_EXPANSION_MODE": "CCU_MS"}
    base = a5()
    dm = base.device_model

    def twin(**ccu):
        t = a5()
        kernels = {**dm.kernels, "CCU": {**dm.kernels["CCU"], **ccu}}
        t.device_model = dataclasses.replace(dm, kernels=kernels, dispatch_ns=dm.dispatch_ns * 3)
        return t
    times = hccl_sim.simulate("allgather", 8 * MiB, topology=base, env=env).times
    without = hccl_sim.simulate("allgather", 8 * MiB, topology=twin(
        op_overhead_ns={**dm.kernels["CCU"]["op_overhead_ns"], "allgather": 0}), env=env).times
    assert all(abs(a - b - 2e-6) < 1e-12 for a, b in zip(times, without))
    slower = hccl_sim.simulate("allgather", 8 * MiB, topology=twin(copy_bandwidth=100e9), env=env).times
    assert min(slower) > max(times)
    aicpu = hccl_sim.simulate("allgather", 8 * MiB, topology=base).times
    assert aicpu != times


SHAPES = [(1, None, None), (2, None, None), (4, None, None), (3, None, 2), (4, None, 1)]


@pytest.mark.unit
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("coll", collectives.DATA_COLLECTIVES)
def test_every_kernel_program_is_correct_symbolically(mode, shape, coll):
    topo = a5(*shape)
    p = topo.num_ranks
    for nbytes in (4 << 10, 256 << 10, 8 << 20):
        n = 3 * p + 1
        s = Signature(coll, (n * (p if coll in ("reducescatter", "alltoall", "scatter") else 1),), "float32",
                      "sum" if collectives.of(coll).reducing else None, (2 * p) // 3 if collectives.of(coll).rooted
                      else None, None)
        sized = s._replace(shape=(nbytes // 4 * (p if coll in collectives.BLOCK else 1),))
        choice = choose(sized, topo, Config(expansion=mode), 4)
        length = L if coll in collectives.BLOCK else n
        for a, b, program in build_parts(coll, choice, topo, length, 4, s.root):
            verify(program, coll, p, b - a if coll not in collectives.BLOCK else L, s.root or 0,
                   f"{shape} {coll} {choice.label}")


@pytest.mark.local
@pytest.mark.parametrize("mode", ["CCU_SCHED", "AIV"])
@pytest.mark.parametrize("shape", [(1, None, None), (2, None, None), (3, None, 2)], ids=str)
def test_real_data_under_the_kernel_engines(mode, shape):
    """Every collective under the mode, small data (the kernels' sizes), bit-identical to numpy."""
    topo = a5(*shape)
    engines = set()
    for coll in collectives.DATA_COLLECTIVES:
        results = _run_all(coll, topo, 37, env={"HCCL_OP_EXPANSION_MODE": mode})
        engines.add(results[0][1].algo[:3])
    assert ("Ccu" if mode == "CCU_SCHED" else "Aiv") in engines


@pytest.mark.unit
def test_the_executor_grammar_steers_the_kernel_engines_too():
    """Under a CCU mode the CCU selector's pick is one of HCCL_ALGO's candidates (its engines first
    in HCCL's chain): an entry that keeps it runs it, one that removes it leaves the AI CPU's."""
    one = a5()
    env = {"HCCL_OP_EXPANSION_MODE": "CCU_MS"}
    assert name("allgather", 8 * MiB, one, "CCU_MS", env={"HCCL_ALGO": "allgather:sole{mesh2die}"}) == \
        "CcuMSAllGatherSoleMesh2Die"
    left = hccl_sim.simulate("allgather", 8 * MiB, topology=one, env={**env, "HCCL_ALGO": "allgather:not(sole{mesh2die})"})
    assert left.algo.startswith("Aicpu") and "HCCL_ALGO's pick" in left.algo
    with pytest.raises(hccl_sim.HcclError, match="names AicpuAllGatherSoleNHR"):
        hccl_sim.simulate("allgather", 8 * MiB, topology=one, env={**env, "HCCL_ALGO": "allgather:sole{nhr}"})
