"""The Ascend 950 presets: the server's UB mesh, the SuperPoD's UB Clos, UBoE between SuperPoDs;
HCCL's AICPU_TS auto selectors (hccl_sim.selection.hccl_950) and HCCL_ALGO's executor grammar
honoured there; every collective's programs verified symbolically and on real integer data."""
import numpy as np
import pytest

import hccl_sim
import topologies
from hccl_sim import HcclError, collectives
from hccl_sim.config.env import Config
from hccl_sim.plan.loop_programs import build_parts
from hccl_sim.plan.planner import Signature, choose
from test_schedules import L, verify
from test_superpod import _run_all


def a5(servers=1, superpods=None, per_server=None):
    if per_server is None:
        return hccl_sim.topology("atlas950", servers=servers, superpods=superpods)
    per = [servers] * (superpods or 1)
    return topologies.hardware("atlas950", devices_per_server=[per_server] * sum(per),
                               pod_of_server=[k for k, n in enumerate(per) for _ in range(n)])


@pytest.mark.unit
def test_the_presets_links_and_sizes():
    topo = a5(2, 2)
    assert (topo.device, topo.num_ranks, topo.device_model.algo_grammar) == ("950", 32, "executor")
    mesh, clos, uboe = topo.route(0, 1), topo.route(0, 8), topo.route(0, 16)
    assert (mesh.kind, mesh.bandwidth, mesh.egress) == ("UB", 56e9, (0, "hccs:1"))     # a port per peer link
    assert (clos.kind, clos.bandwidth, clos.hops) == ("UB", 448e9, (0, "ub:0", 8))
    assert (uboe.kind, uboe.bandwidth) == ("UBoE", 100e9)
    assert hccl_sim.topology("atlas950-superpod").num_ranks == 8192
    assert hccl_sim.topology("atlas950-supercluster").num_ranks == 524288
    assert hccl_sim.topology("atlas950-superpod", servers=2).num_ranks == 16
    with pytest.raises(HcclError, match="backup NIC is an A3"):
        topologies.presets.with_backup_nics(topo, [1])


def _algo(op, nbytes, topo, **kw):
    return hccl_sim.simulate(op, nbytes, topology=topo, **kw).algo.split(":")[0]


@pytest.mark.unit
def test_hccl_s_auto_selectors_as_the_open_source_code_has_them():
    MiB = 1 << 20
    one, pod, cluster = a5(1), a5(4), a5(2, 2)
    assert _algo("allreduce", 8 * MiB, one) == "AicpuAllReduceSoleMeshOneShot"
    assert _algo("allreduce", 8 * MiB + 4, one) == "AicpuAllReduceSoleMeshTwoShot"
    assert _algo("allreduce", 512 * MiB, one) == "AicpuAllReduceSoleMeshChunkTwoShot"
    assert _algo("allreduce", 1 * MiB, one, dtype="int64") == "AicpuAllReduceSoleMeshOneShot"
    assert _algo("allreduce", 32 * MiB, pod) == "AicpuAllReduceSoleNHR"
    assert _algo("allreduce", 64 * MiB, pod) == "AicpuAllReduceParallelMeshNHR"
    assert _algo("allreduce", 64 * MiB, pod, redop="prod") == "AicpuAllReduceSoleNHRAicpuReduce"
    assert _algo("allreduce", 64 * MiB, cluster) == "AicpuAllReducePipeLine"
    assert _algo("allgather", 1 * MiB * 32, pod) == "AicpuAllGatherSoleNHR"      # 1 MiB per rank
    assert _algo("allgather", 2 * MiB * 32, pod) == "AicpuAllGatherParallelMeshNHR"
    assert _algo("reducescatter", 2 * MiB * 32, pod) == "AicpuReduceScatterSoleNHR"        # 2 MiB per rank
    assert _algo("alltoall", 1 * MiB, one) == "AicpuAllToAllSoleMeshSingleChannel"
    assert _algo("broadcast", MiB, one) == "AicpuBroadcastSoleMeshTwoShot"
    assert _algo("reduce", MiB, one) == "AicpuReduceSoleMesh"
    assert _algo("scatter", MiB, pod) == "AicpuScatterParallelMeshNHR"
    assert _algo("allreduce", 64 * MiB, a5(4, per_server=1)) == "AicpuAllReduceSoleNHR"    # one NPU per server
    label = hccl_sim.simulate("scatter", 64 * MiB * 32, topology=pod).algo
    assert "level0:fullmesh;level1:NHR (0.5 of the data mesh first" in label      # Scatter's fixed half
    label = hccl_sim.simulate("allreduce", 512 * MiB, topology=one).algo
    assert label == "AicpuAllReduceSoleMeshChunkTwoShot: mesh_chunk"                 # HCCL's chunked mesh, run


@pytest.mark.unit
def test_the_parallel_executor_splits_the_data_by_port_counts_and_runs_both_levels_at_once():
    """AllReduce's ParallelMeshNHR: 3/8 of the data mesh first on 4 servers of 8 (HCCL's ratio from
    7 mesh links and 8 Clos ports), the rest across servers first; faster than the levels in turn."""
    pod = a5(4)
    est = hccl_sim.simulate("allreduce", 64 << 20, topology=pod)
    assert est.algo.startswith("AicpuAllReduceParallelMeshNHR") and "0.375 of the data mesh first" in est.algo
    config = Config.from_env({"HCCL_ALGO": "allreduce:sequence{meshconcur,nhr}"})
    sig = _sized("allreduce", 64 << 20, pod)
    sequence = choose(sig, pod, config, 4)
    assert sequence.executor == "AicpuAllReduceSequenceMeshConcurNHR" and sequence.detour == (0.5, 7)
    # the levels in turn (the Sequence executor without its level0 detour) are slower
    assert _priced(sig, pod, config, sequence._replace(detour=None)) > 1.1 * est.time * 1e9


def _sized(op, nbytes, topo):
    """The Signature hccl_sim.simulate prices for `nbytes` of float32."""
    shape, _ = collectives.of(op).simulated_size(nbytes, None, topo.num_ranks, 4)
    return Signature(op, shape, "float32", "sum" if collectives.of(op).reducing else None, None, None)


def _priced(sig, topo, config, choice):
    """The op's slowest rank (ns) with `choice` as it is."""
    from hccl_sim.plan.costs import effective_cost
    from hccl_sim.plan.planner import plan_times
    return max(plan_times(sig, effective_cost(topo, config), config, 4, choice, [0] * topo.num_ranks, faults=False)[2])


@pytest.mark.unit
def test_broadcast_reduce_and_scatter_parallel_split_as_hccl_does():
    """Broadcast's Parallel splits by CalcParallelDataSplitRatio's SCATTER form (3/8 on 4 servers
    of 8), Reduce's as AllReduce's (its executor runs a parallel AllReduce), Scatter's half and half
    whatever HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO says; each beats its levels in turn."""
    pod = a5(4)
    env = {"HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO": "0.25"}
    for op, share, given in (("broadcast", "0.375", "0.25"), ("reduce", "0.375", "0.25"), ("scatter", "0.5", "0.5")):
        est = hccl_sim.simulate(op, 64 << 20, topology=pod, root=5)
        assert est.algo.startswith(f"Aicpu{op.capitalize()}ParallelMeshNHR") and f"({share} of the data mesh first" in est.algo
        assert f"({given} of the data mesh first" in hccl_sim.simulate(op, 64 << 20, topology=pod, env=env).algo
        config = Config()
        sig = _sized(op, 64 << 20, pod)._replace(root=5)
        choice = choose(sig, pod, config, 4)
        assert _priced(sig, pod, config, choice) < _priced(sig, pod, config, choice._replace(split=1.0)), op


@pytest.mark.unit
def test_the_new_selector_takes_the_least_cost_of_hcclS_candidates():
    """HCCL_USE_NEW_SELECTOR=1 (0 or 1, else E_PARA) hands AllReduce, ReduceScatter and AllGather
    to HCCL's cost-model engine: the least cost of the candidates, here by hccl-sim's timing (said
    in the label), HCCL_ALGO's entries still filtering them; other ops, other devices: as without."""
    pod = a5(4)
    env = {"HCCL_USE_NEW_SELECTOR": "1"}
    for op in ("allreduce", "reducescatter", "allgather"):
        rule = hccl_sim.simulate(op, 64 << 20, topology=pod)
        least = hccl_sim.simulate(op, 64 << 20, topology=pod, env=env)
        assert "HCCL_USE_NEW_SELECTOR=1: the least cost of HCCL's candidates" in least.algo
        assert least.time <= rule.time
    nhr = hccl_sim.simulate("allreduce", 64 << 20, topology=pod, env={**env, "HCCL_ALGO": "allreduce:sole{nhr}"})
    assert nhr.algo.startswith("AicpuAllReduceSoleNHR")
    assert hccl_sim.simulate("broadcast", 1 << 20, topology=pod, env=env).algo == \
        hccl_sim.simulate("broadcast", 1 << 20, topology=pod).algo
    with pytest.raises(HcclError, match="HCCL_USE_NEW_SELECTOR='2' is invalid; expected 0 or 1"):
        hccl_sim.simulate("allreduce", 1 << 20, topology=pod, env={"HCCL_USE_NEW_SELECTOR": "2"})
    with pytest.warns(UserWarning, match="HCCL_USE_NEW_SELECTOR=1 changes nothing on atlas800t-a2"):
        hccl_sim.simulate("allreduce", 1 << 20, topology=hccl_sim.topology("atlas800t-a2"), env=env)


@pytest.mark.unit
def test_three_uboe_levels_run_hccls_parallel_over_a_superpod_and_across():
    """Across SuperPoDs joined by UBoE HCCL's Parallel executors take a whole SuperPoD as level0
    (TopoMatchSqueeze2D) and the SuperPoDs as level1: AllReduce and ReduceScatter with a mesh
    inside, AllGather, Broadcast and Reduce with NHR; PipeLine for 8-NPU servers, whose Broadcast
    and Reduce are Parallel too."""
    twos = a5(4, 2, per_server=2)
    names = {"allreduce": "InsAllReduceParallelRSAGUboe: level0:fullmesh;level1:NHR",
             "allgather": "AicpuAllGatherParallelNHRNHR: level0:NHR;level1:NHR",
             "reducescatter": "InsReduceScatterParallelNHRNHRUboe: level0:fullmesh;level1:NHR",
             "broadcast": "InsBroadcastParallelNHRNHRUboe: level0:NHR;level1:NHR",
             "reduce": "ReduceParallelNHRNHRUboe: level0:NHR;level1:NHR"}
    for op, label in names.items():
        est = hccl_sim.simulate(op, 64 << 20, topology=twos)
        assert est.algo.startswith(label) and "of the data inside each SuperPoD first" in est.algo, est.algo
    cluster = a5(2, 2)
    assert hccl_sim.simulate("broadcast", 64 << 20, topology=cluster).algo.startswith("InsBroadcastParallelNHRNHRUboe")
    assert hccl_sim.simulate("allgather", 64 << 20, topology=cluster).algo.startswith("AicpuAllGatherPipeLine")


@pytest.mark.unit
def test_the_z_axis_detour_moves_part_of_each_mesh_pair_through_the_clos():
    """HCCL's MeshConcur executors run their level0 mesh with a share of each pair's bytes through
    the Clos (Mesh1DZAxisDetour: 0.5, 0.25 for two ranks): a pair then runs at min(56 GB/s / share,
    448 GB/s / ((1 - share) peers)), after the Clos's 1 us; the same program without it is slower."""
    from topologies.presets import with_detour
    from topologies.subset import subset
    one = a5(1)
    route = with_detour(one, 0.5, 7).route(0, 1)
    assert (route.bandwidth, route.latency_ns, route.egress) == (112e9, 1000, (0, "hccs:1"))
    assert with_detour(one, 0.25, 1).route(0, 1).bandwidth == 224e9
    assert with_detour(one, 0.5, 7).route(0, 3) != one.route(0, 3)
    pair = subset(one, [0, 1])
    config = Config()
    for coll, nbytes in (("allreduce", 8 << 20), ("allgather", 2 * (4 << 20)), ("reducescatter", 2 * (4 << 20))):
        sig = _sized(coll, nbytes, pair)
        choice = choose(sig, pair, config, 4)
        assert choice.executor.endswith("SoleMeshConcur") and choice.detour == (0.25, 1), choice
        assert _priced(sig, pair, config, choice) < 0.7 * _priced(sig, pair, config, choice._replace(detour=None))
    big = hccl_sim.simulate("allgather", 8 * (256 << 20), topology=one)
    assert big.algo.startswith("AicpuAllGatherSoleMeshConcur") and "0.5 of each pair's bytes" in big.algo


@pytest.mark.unit
def test_allgather_and_reducescatter_parallel_split_as_hccl_computes_it():
    """AllGather's and ReduceScatter's ParallelMeshNHR run as HCCL's do (CalcParallelDataSplitRatio):
    an AllGather's share mesh first from its own form, at most 0.5 (1/4 on 4 servers of 8, 1/8 on
    2, 1/2 on 1,024), a ReduceScatter's from AllReduce's (3/8); HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO
    is an AllGather's share across servers first. Either beats the levels in turn, and the
    executor grammar's Parallel is the same split."""
    from hccl_sim.selection.hccl_950 import Shape, allgather_split  # noqa: F401
    pod = a5(4)
    ag = hccl_sim.simulate("allgather", 1 << 30, topology=pod)
    rs = hccl_sim.simulate("reducescatter", 1 << 30, topology=pod)
    assert "(0.25 of the data mesh first" in ag.algo and "(0.375 of the data mesh first" in rs.algo
    assert "(0.125 of the data mesh first" in hccl_sim.simulate("allgather", 1 << 30, topology=a5(2)).algo
    assert "(0.5 of the data mesh first" in hccl_sim.simulate("allgather", 1 << 30,
                                                             topology=hccl_sim.topology("atlas950-superpod")).algo
    env = {"HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO": "0.75"}
    assert "(0.25 of the data mesh first" in hccl_sim.simulate("allgather", 1 << 30, topology=pod, env=env).algo
    assert "(0.75 of the data mesh first" in hccl_sim.simulate("reducescatter", 1 << 30, topology=pod, env=env).algo
    for op, est in (("allgather", ag), ("reducescatter", rs)):
        config = Config.from_env({"HCCL_ALGO": f"{op}:sequence{{meshconcur,nhr}}"})
        sig = _sized(op, 1 << 30, pod)
        seq = choose(sig, pod, config, 4)
        assert seq.executor.startswith("Aicpu") and "Sequence" in seq.executor
        in_turn = _priced(sig, pod, config, seq._replace(detour=None))     # the levels in turn, no detour
        assert in_turn > est.time * 1e9, (op, in_turn, est.time)
        forced = hccl_sim.simulate(op, 1 << 30, topology=pod, algo=f"{op}:parallel{{mesh,nhr}}")
        assert forced.algo == est.algo and forced.time == est.time


@pytest.mark.unit
def test_hccl_algo_executor_expressions_steer_the_950():
    MiB = 1 << 20
    pod = a5(2)
    assert _algo("allreduce", 64 * MiB, pod, env={"HCCL_ALGO": "allreduce:sole{nhr}"}) == "AicpuAllReduceSoleNHR"
    assert _algo("allreduce", 64 * MiB, pod, algo="nhr") == "AicpuAllReduceSoleNHR"
    assert _algo("allreduce", 64 * MiB, pod, env={"HCCL_ALGO": "allreduce:not(parallel{mesh,nhr});sole{nhr}"}) == \
        "AicpuAllReduceSoleNHR"
    # another op's entry leaves this one to HCCL's own rules
    assert _algo("allreduce", 64 * MiB, pod, env={"HCCL_ALGO": "allgather:sole{nhr}"}) == "AicpuAllReduceParallelMeshNHR"
    with pytest.raises(HcclError) as info:
        hccl_sim.simulate("allreduce", 64 * MiB, topology=pod, env={"HCCL_ALGO": "allreduce:sequence{mesh2die}"})
    assert info.value.code == "E_NOT_SUPPORT" and "AicpuAllReduceSequenceMesh2Die" in str(info.value)
    with pytest.raises(HcclError, match="leaves AllReduce no algorithm"):
        hccl_sim.simulate("allreduce", 64 * MiB, topology=a5(1),
                          env={"HCCL_ALGO": "allreduce:not(sole{})"})
    with pytest.warns(UserWarning, match="legacy grammar: the 950's HCCL reads it and its selectors do not use it"):
        hccl_sim.simulate("allreduce", 64 * MiB, topology=pod, env={"HCCL_ALGO": "level0:NA;level1:ring"})


SHAPES = [(1, None, None), (2, None, 4), (2, 2, 2), (3, None, 1), (1, 3, 2)]


@pytest.mark.unit
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("coll", collectives.DATA_COLLECTIVES)
def test_every_950_program_is_correct_symbolically(shape, coll):
    topo = a5(*shape)
    p = topo.num_ranks
    for nbytes in (4 << 10, 64 << 20):          # the small and the large rules
        n = 3 * p + 1
        s = Signature(coll, (n * (p if coll in ("reducescatter", "alltoall", "scatter") else 1),), "float32",
                      "sum" if collectives.of(coll).reducing else None, (2 * p) // 3 if collectives.of(coll).rooted
                      else None, None)
        sized = s._replace(shape=(nbytes // 4,)) if coll not in collectives.BLOCK else s
        choice = choose(sized, topo, Config(), 4)
        length = L if coll in collectives.BLOCK else n
        for a, b, program in build_parts(coll, choice, topo, length, 4, s.root):
            verify(program, coll, p, b - a if coll not in collectives.BLOCK else L, s.root or 0,
                   f"{shape} {coll} {choice.label}")


@pytest.mark.local
@pytest.mark.parametrize("shape,levels", [((2, None, 4), "parallel{}"), ((2, 2, 2), "sequence{}")], ids=str)
def test_real_data_on_950_superpods(shape, levels):
    """HCCL's own choice (small data: the mesh or NHR), then the levels one after another (HCCL_ALGO
    asks for every Parallel / Sequence algorithm of the op), bit-identical to numpy."""
    topo = a5(*shape)
    for coll in collectives.DATA_COLLECTIVES:
        _run_all(coll, topo, 37)
        results = _run_all(coll, topo, 1000, env={"HCCL_ALGO": levels})
        assert results[0][1].algo.startswith(("Aicpu", "Ins", "Reduce")), results[0][1].algo


@pytest.mark.unit
def test_vectorised_timing_equals_the_event_driven_reference_on_the_950():
    from hccl_sim.algorithms.common import side_by_side
    from hcomm.vtiming import program_times
    from test_schedules import des_times
    for topo, algo in ((a5(2, None, 4), "parallel{}"), (a5(2, 2, 2), None), (a5(1), None)):
        p = topo.num_ranks
        for coll in collectives.DATA_COLLECTIVES:
            s = Signature(coll, (p * 40,), "float32", "sum" if collectives.of(coll).reducing else None,
                          (2 * p) // 3 if collectives.of(coll).rooted else None, algo)
            choice = choose(s, topo, Config(), 4)
            length = 40 if coll in collectives.BLOCK else 40 * p
            program = side_by_side(*[prog for _, _, prog in build_parts(coll, choice, topo, length, 4, s.root)])
            entry = np.arange(p, dtype=np.int64) * 977
            assert list(program_times(program, entry, topo, "float32", "sum")) == \
                list(des_times(program, entry, topo, "float32", "sum")), f"{coll} {choice.label}"


@pytest.mark.unit
@pytest.mark.parametrize("l0", ["ring", "fullmesh"])
def test_a_levels_row_sets_moved_together_are_the_same_transfers_priced_alike(l0):
    """A level whose ranks each hold q row sets (rows i * N0 + d of every server i): the row sets
    moved together in each step (common.repeat_rows, one group per server) are the transfers that
    tiling the level once per row set (q overlapping groups per server) made, and price to the
    same nanosecond, by the vectorised engine and by the event-driven reference."""
    from hccl_sim.algorithms import mesh, ring
    from hccl_sim.algorithms.common import OUTPUT, repeat_rows, tile
    from hcomm.program import ARRAYS
    from hcomm.vtiming import program_times
    from test_schedules import des_times
    topo = hccl_sim.topology("atlas950", superpods=1, servers=3)
    N0, q = 8, 3
    servers = np.arange(24).reshape(q, N0)
    base = (mesh if l0 == "fullmesh" else ring).allgather(N0, np.arange(N0 + 1), 4096, OUTPUT)
    shifts = np.repeat(np.tile(np.arange(q) * N0, q)[:, None], 3, axis=1)
    per_set = tile(base, np.repeat(servers, q, axis=0), shifts)
    together = tile(repeat_rows(base, q, [N0] * 3), servers)
    assert len(per_set) == len(together)

    def rows(step):
        st = step.full()
        return sorted(zip(*(np.asarray(getattr(st, name)).tolist() for name in ARRAYS if name.startswith("t_"))))
    for a, b in zip(per_set, together):
        assert rows(a) == rows(b)
    entry = np.arange(24, dtype=np.int64) * 311
    times = list(program_times(together, entry, topo))
    assert times == list(program_times(per_set, entry, topo)) == list(des_times(together, entry, topo))


@pytest.mark.unit
def test_block_collectives_of_a_supercluster_are_priced():
    """AllGather and ReduceScatter on 524,288 ranks (once refused: their p(p-1) blocks were rows of
    one program); on the 8,192 ranks of a SuperPoD, the times of the program that moved every
    block as its own row, the levels in turn (181 s and 10.7 GB to price then; RESULTS.md, issue 37)."""
    pod = hccl_sim.topology("atlas950-superpod")
    in_turn = {"allgather": 0.003261371, "reducescatter": 0.036496918}
    for op, before in in_turn.items():                  # its levels in turn (the Sequence without its detour)
        config = Config.from_env({"HCCL_ALGO": f"{op}:sequence{{meshconcur,nhr}}"})
        sig = _sized(op, 1 << 30, pod)
        seq = choose(sig, pod, config, 4)
        assert _priced(sig, pod, config, seq._replace(detour=None)) == round(before * 1e9)
    cluster = hccl_sim.topology("atlas950-supercluster")
    est = hccl_sim.simulate("allgather", 1 << 30, cluster)
    assert est.ranks == 524288 and est.algo.startswith("AicpuAllGatherPipeLine")
    assert est.time > in_turn["allgather"]              # a third level of NHR over UBoE on top
    # HCCL's PipeLine ReduceScatter needs every block's working copy in the CCL buffer: 512 bytes
    # of each of 524,288 blocks is more than 200 MB, so no loop fits (CalcOmniPipeScratchInfo)
    with pytest.raises(HcclError, match="HCCL_BUFFSIZE"):
        hccl_sim.simulate("reducescatter", 1 << 30, cluster)
    est = hccl_sim.simulate("reducescatter", 1 << 30, cluster,
                            env={"HCCL_ALGO": "reducescatter:sequence{meshconcur,nhr,nhr}"})
    assert est.algo.startswith("AicpuReduceScatterSequenceMeshConcurNHRNHR") and est.time > in_turn["reducescatter"]


def _hccl_round_peers(rank, p):
    """InsTempAlltoAllVMesh1D's peers of `rank`, round by round, as CalcCommRankSetForOneLoop and
    RunALLtoALL's loop compute them (ins_temp_all_to_all_v_mesh_1D.cc:71-99, 193)."""
    concurrent = min(16, p - 1)
    pair_num = (concurrent + 1) // 2
    remain, out, round_idx = p - 1, [], 0
    while remain > 0:
        pair_size = (remain + 1) // 2 if remain < concurrent else pair_num
        peers = []
        for i in range(round_idx * pair_num + 1, round_idx * pair_num + pair_size + 1):
            left, right = (rank + p - i) % p, (rank + i) % p
            if left == right:
                peers.append(left)
                break
            peers += [left, right]
        out.append(peers)
        remain -= len(peers)
        round_idx += 1
    return out


@pytest.mark.unit
def test_the_950s_alltoall_visits_hccls_peers_round_by_round_and_moves_every_block():
    """The 950's AlltoAll (algorithms.mesh_rounds): each round's peers are HCCL's, in HCCL's order
    (rank - 1, rank + 1, ..., 16 a round), and the program moves every block to its place, its own
    block a local copy and the rest through the receiver's scratch slot (symbolic data), on every
    rank count to 40."""
    from hccl_sim import algorithms
    from hccl_sim.algorithms import mesh_rounds
    from test_schedules import unit_for
    for p in list(range(1, 41)) + [8192]:
        for rank in {0, p // 3, p - 1}:
            want = _hccl_round_peers(rank, p)
            assert [[(rank + d) % p for d in ds] for ds in mesh_rounds.rounds(p)] == want, (p, rank)
        if p <= 40:
            program = algorithms.flat_program("alltoall", "mesh_rounds", p, 3 * p, unit_for("alltoall"))
            assert len(program) == (len(mesh_rounds.rounds(p)) + 1 if p > 1 else 1)
            verify(program, "alltoall", p, 3 * p, 0, f"mesh_rounds p={p}")
    assert len(mesh_rounds.rounds(8192)) == 512


@pytest.mark.unit
def test_the_950s_alltoall_cuts_each_block_into_loops_of_one_ccl_slot():
    """A loop moves at most HCCL_BUFFSIZE / 16 of each peer's block (a slot per concurrent peer),
    not HCCL_BUFFSIZE / p as the staged AlltoAll does: 1 GiB on 8 ranks is 128 MiB blocks, 11
    loops of the default 200 MB buffer's 12.5 MB slots; the 910B's staged AlltoAll on 8 NPUs, 6 of
    25 MB."""
    from hccl_sim.plan.planner import Signature, op_programs
    from hccl_sim.algorithms import mesh_rounds
    from hcomm.cost import as_cost
    for name, want in (("atlas950", 11), ("atlas800t-a2", 6)):
        topo = hccl_sim.topology(name, servers=1)
        p = topo.num_ranks
        s = Signature("alltoall", ((1 << 30) // 4,), "float32", None, None, None)
        cfg = Config()
        choice = choose(s, topo, cfg, 4)
        loops, _, _ = op_programs(s, as_cost(topo), cfg, 4, choice)
        assert len(loops) == want, (name, p, choice.label)
    assert mesh_rounds.loop_block_bytes(200 * 10 ** 6) == 12499968


@pytest.mark.unit
def test_the_950s_alltoallv_runs_the_same_template_under_its_own_name():
    """AlltoAllV and AlltoAllVC select by their own selectors, with their counts: HCCL's names
    for them are AicpuAllToAllVSoleMesh and AicpuAllToAllVCSoleMesh (alltoallv_ /
    alltoallvc_auto_selector.cc), the template the same rounds; a pair's block larger than a CCL
    slot takes a loop per slot, as the fixed op's."""
    topo = hccl_sim.topology("atlas950", servers=2)
    p = topo.num_ranks
    counts = np.full((p, p), 1000, dtype=np.int64)
    for op, name in (("alltoallv", "AicpuAllToAllVSoleMesh"), ("alltoallvc", "AicpuAllToAllVCSoleMesh")):
        est = hccl_sim.simulate(op, counts=counts, topology=topo)
        assert est.algo == f"{name}: mesh_rounds"
    # 4 MiB slots (HCCL_BUFFSIZE=64 MB): one loop for 1000 elements a pair, three for 2.5 M
    small = hccl_sim.simulate("alltoallv", counts=counts, topology=topo, env={"HCCL_BUFFSIZE": "64"})
    big = hccl_sim.simulate("alltoallv", counts=counts * 2500, topology=topo, env={"HCCL_BUFFSIZE": "64"})
    same = hccl_sim.simulate("alltoall", int(counts.sum(axis=1)[0]) * 2500 * 4, topo, env={"HCCL_BUFFSIZE": "64"})
    assert small.time < big.time and big.time == same.time


@pytest.mark.unit
def test_the_parallel_split_ratio_variable_as_hccl_reads_it():
    """HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO: set, it is the AllReduce Parallel executor's share
    mesh first in place of HCCL's formula (0.375 on 4 servers of 8); 0 and 1 run the whole data in
    one order; above 1 is 0.5 with a warning; anything but digits with an optional fraction
    (an empty value included: HCCL reads it raw) fails as HCCL's init does."""
    topo = hccl_sim.topology("atlas950", servers=4)

    def run(ratio):
        env = {} if ratio is None else {"HCCL_ALG_MULTIPLE_DIMENSION_SPLIT_RATIO": ratio}
        return hccl_sim.simulate("allreduce", 64 << 20, topo, env=env)
    default = run(None)
    assert "(0.375 of the data mesh first" in default.algo
    assert run("0.375").time == default.time and "(0.25 of the data" in run("0.25").algo
    times = {r: run(r).time for r in ("0", "0.5", "1")}
    assert len(set(times.values())) == 3 and min(times.values()) > default.time
    with pytest.warns(UserWarning, match="out of range"):
        assert run("1.5").time == times["0.5"]
    for bad in ("", "-0.5", ".5", "5.", "1e-1", " 0.5", "abc"):
        with pytest.raises(HcclError, match="expected a non-negative number"):
            run(bad)


@pytest.mark.unit
def test_the_950s_alltoall_is_priced_past_2048_ranks_a_step_at_a_time():
    """The 950's rounds are built a step at a time, so they price past MAX_ALLTOALL_RANKS (to
    mesh_rounds.MAX_RANKS, a SuperPoD); any other AlltoAll program there is refused, naming it."""
    from hccl_sim.algorithms import mesh_rounds
    topo = hccl_sim.topology("atlas950", servers=257)
    est = hccl_sim.simulate("alltoall", 1 << 20, topo)
    assert est.ranks == 2056 > hccl_sim.MAX_ALLTOALL_RANKS and est.algo.startswith("AicpuAllToAllSoleMesh")
    assert len(mesh_rounds.rounds(2056)) == 129
    with pytest.raises(HcclError, match="MAX_ALLTOALL_RANKS"):
        hccl_sim.simulate("alltoall", 1 << 20, hccl_sim.topology("atlas800t-a2", servers=257))
    with pytest.raises(HcclError, match="mesh_rounds.MAX_RANKS"):
        hccl_sim.simulate("alltoall", 1 << 20, hccl_sim.topology("atlas950", servers=1025))


@pytest.mark.unit
def test_an_hccl_algo_entry_on_unequal_servers_is_refused_unless_it_names_the_one_nhr():
    """Servers of unequal size run HCCL's one NHR over every rank: an entry naming it runs; one
    naming another algorithm is E_NOT_SUPPORT naming what runs there (it was silently replaced)."""
    uneven = topologies.hardware("atlas950", devices_per_server=[8, 4, 8, 4], pod_of_server=[0, 0, 1, 1])
    est = hccl_sim.simulate("allreduce", 64 << 20, topology=uneven, env={"HCCL_ALGO": "allreduce:sole{nhr}"})
    assert est.algo.startswith("AicpuAllReduceSoleNHR: NHR")
    with pytest.raises(HcclError, match="PipeLine.*it runs AicpuAllReduceSoleNHR"):
        hccl_sim.simulate("allreduce", 64 << 20, topology=uneven,
                          env={"HCCL_ALGO": "allreduce:pipeline{mesh,nhr,nhr}"})
