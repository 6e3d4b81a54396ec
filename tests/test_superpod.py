"""The Atlas 900 A3 SuperPoD's collectives: HCCL's three levels with a double ring inside each
server, checked symbolically (every output element holds exactly its contributions, no zero-copy
hazard), on real integer data over 1-3 superpods of unequal server counts, against the
event-driven timing reference, against the closed form of a double-ring step, and HCCL's A3
selection and HCCL_ALGO level2 rules."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError, collectives
from hccl_sim.algorithms import double_ring, grouped_mesh, superpod
from hccl_sim.config.env import Config
from hccl_sim.plan.costs import effective_cost
from hccl_sim.plan.planner import Signature, choose
from hccl_sim.plan.loop_programs import build_parts, pods_of
from hccl_sim.selection import Choice
from hcomm.vtiming import program_times
from test_schedules import L, des_times, verify

# (superpods, servers per superpod), dies_per_server (None: whole 16-die servers)
A3_CASES = [(1, 1, None), (1, 2, None), (1, 3, None), (2, 1, None), (2, 2, None), (3, [2, 1, 3], None),
            (2, [2, 4], None), (2, 2, 4), (1, 3, 2), (3, 1, 6)]


def a3(superpods, servers, dies=None):
    if dies is None:
        return hccl_sim.topology("atlas900-a3", superpods=superpods, servers=servers)
    import topologies
    per = [servers] * superpods if isinstance(servers, int) else servers
    pod_of_server = [k for k, n in enumerate(per) for _ in range(n)]
    return topologies.hardware("atlas900-a3", devices_per_server=[dies] * len(pod_of_server),
                               pod_of_server=pod_of_server)


def sig(coll, p, n, algo=None):
    return Signature(coll, (n,), "float32", "sum" if coll in ("allreduce", "reducescatter", "reduce") else None,
                     (p * 2) // 3 if coll in ("broadcast", "reduce") else None, algo)


LONG_A3_CASES = [(2, 2, None), (3, [2, 1, 3], None), (2, [2, 4], None)]     # 64-96 ranks: the longest sweeps


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.campaign if c in LONG_A3_CASES else pytest.mark.unit)
                                  for c in A3_CASES], ids=str)
def test_three_level_programs_verify(case):
    """Each double-ring half's program, for every collective and level1/level2 choice, verified
    symbolically; both ring directions."""
    topo = a3(*case)
    p = topo.num_ranks
    for coll in collectives.DATA_COLLECTIVES:
        if coll == "scatter":
            continue                      # its A3 executor is a single ring at level0 (tests/test_scatter.py)
        for algo in (None, "level0:NA;level1:ring;level2:ring", "level0:NA;level1:NB;level2:NB",
                     "level0:NA;level1:NHR;level2:H-D_R"):
            if coll == "broadcast" and algo and "NB" in algo:
                continue                                  # NB Broadcast: refused (tested below)
            n = 3 * p + 2
            s = sig(coll, p, n, algo)
            choice = choose(s, topo, Config(), 4)
            if not choice.flat:
                assert choice.level0 == "double_ring" or pods_of(effective_cost(topo, Config())).N0 == 1
            # per-block lengths (block collectives) or vector lengths that split into 128-byte halves
            # and that do not; the symbolic check runs each half's program on its own
            length = 100 if coll in collectives.BLOCK else n
            for itemsize in (4, 1):
                parts = build_parts(coll, choice, topo, length, itemsize, s.root)
                assert sum(b - a for a, b, _ in parts) == length
                for a, b, program in parts:
                    verify(program, coll, p, b - a if coll not in collectives.BLOCK else L, s.root or 0,
                           f"{case} {coll} {choice.label} part {a}:{b}")
            if choice.level0 == "double_ring":
                pods = pods_of(topo)
                builder = {"allreduce": lambda k: superpod.allreduce(pods, n, 4, choice.level1 or "ring",
                                                                     choice.level2 or "NHR", k),
                           "allgather": lambda k: superpod.allgather(pods, L * 4, choice.level1 or "ring",
                                                                     choice.level2 or "NHR", k),
                           "reducescatter": lambda k: superpod.reducescatter(pods, L * 4, choice.level1 or "ring",
                                                                             choice.level2 or "NHR", k),
                           "broadcast": lambda k: superpod.broadcast(pods, n, 4, s.root, choice.level1 or "ring",
                                                                     choice.level2 or "NHR", k),
                           "reduce": lambda k: superpod.reduce(pods, n, 4, s.root, choice.level1 or "ring",
                                                               choice.level2 or "NHR", k)}.get(coll)
                if builder is not None:
                    for k in (0, 1):
                        verify(builder(k), coll, p, n, s.root or 0, f"{case} {coll} ring {k}")


def _inputs(coll, p, n):
    return [(np.arange(n * (p if coll in ("reducescatter", "alltoall", "scatter") else 1), dtype=np.int64) * (r + 3) + r) % 997
            for r in range(p)]


def _run_all(coll, topo, n, env=None, algo=None):
    p = topo.num_ranks
    root = (2 * p) // 3

    def fn(comm):
        x = _inputs(coll, p, n)[comm.rank]
        call = {"allreduce": lambda: comm.all_reduce(x, algo=algo), "allgather": lambda: comm.all_gather(x, algo=algo),
                "reducescatter": lambda: comm.reduce_scatter(x, algo=algo),
                "broadcast": lambda: comm.broadcast(x, root=root, algo=algo),
                "reduce": lambda: comm.reduce(x, root=root, algo=algo),
                "alltoall": lambda: comm.all_to_all(x, algo=algo),
                "scatter": lambda: comm.scatter(x, root=root, algo=algo)}[coll]
        return call(), comm.last_op
    results = hccl_sim.run(fn, topology=topo, env=env)
    want = collectives.of(coll).reference(_inputs(coll, p, n), "sum", root)
    for r, ((got, _), exp) in enumerate(zip(results, want)):
        assert (got is None and exp is None) or np.array_equal(got, exp), f"{coll} rank {r} wrong"
    return results


@pytest.mark.local
@pytest.mark.parametrize("case", [(1, 2), (2, 1), (3, [2, 1, 3], 4), (2, [1, 2])], ids=str)   # 4-die servers: 24 ranks, not 96
@pytest.mark.parametrize("coll", collectives.DATA_COLLECTIVES)
def test_real_data_on_superpods(case, coll):
    """Integer data, bit-identical to numpy, sizes that split into halves and that do not, and
    more than one CCL-buffer loop."""
    topo = a3(*case)
    for n in (1, 37, 1000):
        _run_all(coll, topo, n)
    if coll in ("allreduce", "broadcast"):
        results = _run_all(coll, topo, 150_000, env={"HCCL_BUFFSIZE": "1"})   # 1.2 MB: two loops
        assert "double_ring" in results[0][1].algo or results[0][1].algo.startswith("NHR")


@pytest.mark.parametrize("case", [pytest.param((1, 2), marks=pytest.mark.unit),
                                  pytest.param((2, 2), marks=pytest.mark.campaign),     # 64 ranks
                                  pytest.param((2, [2, 1]), marks=pytest.mark.unit),
                                  pytest.param((1, 1, 6), marks=pytest.mark.unit)], ids=str)
def test_vectorised_timing_equals_event_driven_reference(case):
    topo = a3(*case)
    p = topo.num_ranks
    rng = np.random.default_rng(p)
    for coll in collectives.DATA_COLLECTIVES:
        for algo in (None, "level0:NA;level1:ring;level2:ring"):
            s = sig(coll, p, p * 40, algo)
            choice = choose(s, topo, Config(), 4)
            for length in ((40 * p, 3) if coll not in collectives.BLOCK else (40, 3)):
                parts = build_parts(coll, choice, topo, length, 4, s.root)
                from hccl_sim.algorithms.common import side_by_side
                program = side_by_side(*[prog for _, _, prog in parts])
                for entry in (np.zeros(p, dtype=np.int64), rng.integers(0, 50_000, p)):
                    want = des_times(program, entry, topo, s.dtype, s.redop or "sum")
                    got = program_times(program, entry, topo, s.dtype, s.redop or "sum")
                    assert list(got) == list(want), f"{case} {coll} {choice.label} len={length}"


@pytest.mark.local
def test_simulate_rank_durations_and_algo_equal_on_the_local_engine_on_a3_superpods():
    topo = a3(2, [2, 1])
    p = topo.num_ranks
    for coll in collectives.DATA_COLLECTIVES:
        n = 5000
        records = [rec for _, rec in _run_all(coll, topo, n, env={"HCCL_BUFFSIZE": "1"})]
        nbytes = n * 8 * (p if coll == "allgather" else 1) * (p if coll in ("reducescatter", "alltoall", "scatter") else 1)
        est = hccl_sim.simulate(coll, nbytes, topology=topo, dtype="int64", root=(2 * p) // 3,
                                env={"HCCL_BUFFSIZE": "1"})
        assert [r.end - r.start for r in records] == [round(t * 1e9) for t in est.times], coll
        assert {r.algo for r in records} == {est.algo}


def _link_phase_ns(topo, coll, choice, nbytes):
    """The unstaged link phase of one loop (no fixed costs) from aligned clocks."""
    p = topo.num_ranks
    length = nbytes // 4 if coll not in collectives.BLOCK else nbytes // 4 // p
    parts = build_parts(coll, choice, topo, length, 4, None)
    from hccl_sim.algorithms.common import side_by_side
    program = side_by_side(*[prog for _, _, prog in parts])
    return int(program_times(program, np.zeros(p, dtype=np.int64), topo, "float32", "sum").max())


@pytest.mark.unit
def test_double_ring_step_takes_half_a_chunk_over_the_slower_link():
    """Closed form: an AllGather of S bytes on one 16-die server is 15 steps, each moving S/32
    over a die's UB link (125.3 GB/s; its SIO link, 158.8 GB/s, carries the other ring's half at
    once) after the step's dispatch, following the copy of its own block: half of a single ring's
    link time. The per-step notifies (~1 us of each ~275 us step) are within the tolerance."""
    topo = a3(1, 1)
    S = 1 << 30
    double = _link_phase_ns(topo, "allgather", Choice(False, "double_ring", None), S)
    single = _link_phase_ns(topo, "allgather", Choice(False, "ring", None), S)
    closed = topo.device_model.copy_ns(S // 16) + 15 * (topo.route(1, 2).cost_ns(S // 32) + topo.device_model.dispatch_ns)
    assert topo.route(1, 2).cost_ns(S // 32) > topo.route(0, 1).cost_ns(S // 32)     # UB slower than SIO
    assert 0 <= double - closed < 0.01 * closed
    assert 0.49 < (double - topo.device_model.copy_ns(S // 16)) / (single - topo.device_model.copy_ns(S // 16)) < 0.51


@pytest.mark.unit
def test_double_ring_reduce_scatter_runs_at_the_inline_reduce_rate():
    """Closed form: a ReduceScatter of S bytes on one 16-die server is 15 steps, each reducing S/32
    inline over the die's UB hop at the inline-reducing rate (105.4 GB/s, below UB's 125.3), after
    the step's dispatch. The per-step notifies are within the tolerance."""
    from topologies.model import transfer_ns
    topo = a3(1, 1)
    S = 1 << 30
    dm, ub = topo.device_model, topo.route(1, 2)
    assert dm.inline_reduce_bandwidth < ub.bandwidth
    phase = _link_phase_ns(topo, "reducescatter", Choice(False, "double_ring", None), S)
    closed = 15 * (ub.latency_ns + transfer_ns(S // 32, dm.inline_reduce_bandwidth) + dm.dispatch_ns)
    assert 0 <= phase - closed < 0.01 * closed


@pytest.mark.unit
def test_a3_selection_defaults_and_level2_tokens():
    topo = a3(2, 2)
    p = topo.num_ranks
    big = 1 << 24

    def label(coll, algo=None, env=None):
        return hccl_sim.simulate(coll, big, topology=topo, algo=algo, env=env).algo
    # level1 default: 4 servers (a power of two) -> NHR; level2 default NHR (the code, not the doc)
    assert label("allreduce") == "level0:double_ring;level1:NHR;level2:NHR"
    assert label("reduce") == "level0:double_ring;level1:ring;level2:H-D_R"      # its default NHR runs as H-D_R
    assert label("alltoall") == "grouped_fullmesh"
    # level2 accepted as HCCL's executors run them
    assert label("allreduce", "level0:NA;level1:ring;level2:ring").endswith("level1:ring;level2:ring")
    assert label("allreduce", "level0:NA;level1:NB;level2:H-D_R").endswith("level1:NB;level2:H-D_R")
    assert "level2:ring (A3 allgather runs ring at level2 for H-D_R)" in label("allgather", "level0:NA;level1:NHR;level2:H-D_R")
    assert "level2:NHR (level2 NHR_V1 is read as NHR by HCCL)" in label("allreduce", "level0:NA;level1:NHR;level2:NHR_V1")
    assert label("allgather", "H-D_R") == "level0:double_ring;level1:NHR;level2:NHR (A3 runs NHR at level1 instead of H-D_R)"
    assert label("broadcast", "ring") == ("level0:double_ring;level1:NHR;level2:NHR (A3 Broadcast runs NHR at level1 "
                                          "instead of ring)")
    with pytest.raises(HcclError, match="unknown algorithm 'HD'") as e:
        label("allreduce", "level0:NA;level1:NHR;level2:HD")
    assert e.value.code == "E_PARA"
    with pytest.raises(HcclError, match="level1 pipeline is not run") as e:
        label("allreduce", "pipeline")
    assert e.value.code == "E_NOT_SUPPORT"
    with pytest.raises(HcclError, match="NB Broadcast") as e:
        label("broadcast", "NB")
    assert e.value.code == "E_NOT_SUPPORT"
    with pytest.raises(HcclError, match="not built by hccl-sim") as e:
        label("broadcast", "level0:NA;level1:NHR;level2:NB")
    assert e.value.code == "E_NOT_SUPPORT"
    assert label("allgather", env={"HCCL_ALGO": "level0:NA;level1:ring;level2:NB"}).endswith("level1:ring;level2:NB")
    # one superpod: a level2 token has nothing to run on, and says so
    one = a3(1, 3)
    got = hccl_sim.simulate("allreduce", big, topology=one, algo="level0:NA;level1:NHR;level2:ring").algo
    assert got == "level0:double_ring;level1:NHR (one superpod: no level2, ring not used)"
    # 3 servers: neither >= 8 nor a power of two -> ring
    assert hccl_sim.simulate("allgather", big, topology=one).algo == "level0:double_ring;level1:ring"
    # small AllReduce: AllReduceComm, flat NHR; 16 KiB x 16 across superpods
    assert hccl_sim.simulate("allreduce", 1 << 20, topology=one).algo.startswith("NHR (small data")
    assert hccl_sim.simulate("allreduce", 1 << 20, topology=topo).algo.startswith("level0:double_ring")
    assert hccl_sim.simulate("allreduce", 256 << 10, topology=topo).algo.startswith("NHR (small data")
    # a die without its SIO partner: a single ring
    half = a3(1, 2, 3)
    assert hccl_sim.simulate("allgather", big, topology=half).algo == "level0:ring;level1:NHR"
    del p


@pytest.mark.unit
def test_unequal_superpods_split_by_their_highest_common_factor():
    pods = pods_of(a3(2, [2, 4]))
    assert pods.shape == (3, 2, 16) and pods.unequal
    assert pods_of(a3(3, [2, 1, 3])).shape == (6, 1, 16)


@pytest.mark.local
def test_inter_hccs_disable_puts_roce_between_servers():
    topo = a3(1, 2)
    on = effective_cost(topo, Config()).topology
    off = effective_cost(topo, Config.from_env({"HCCL_INTER_HCCS_DISABLE": "true"})).topology
    assert on.route(0, 16).kinds == ("HCCS",) * len(on.route(0, 16).kinds)
    assert set(off.route(0, 16).kinds) == {"RoCE"} and off.route(0, 2).kinds == on.route(0, 2).kinds
    assert effective_cost(topo, Config.from_env({"HCCL_INTER_HCCS_DISABLE": "TRUE"})).topology is off
    t_on = hccl_sim.simulate("allreduce", 1 << 26, topology=topo).time
    t_off = hccl_sim.simulate("allreduce", 1 << 26, topology=topo, env={"HCCL_INTER_HCCS_DISABLE": "True"}).time
    assert t_off > t_on
    assert effective_cost(topo, Config.from_env({"HCCL_INTER_HCCS_DISABLE": ""})).topology is on    # "" is unset
    for bad in ("yes", "1"):
        with pytest.raises(HcclError, match="HCCL_INTER_HCCS_DISABLE") as e:
            hccl_sim.simulate("allreduce", 64, topology=topo, env={"HCCL_INTER_HCCS_DISABLE": bad})
        assert e.value.code == "E_PARA"
    _run_all("alltoall", topo, 5, env={"HCCL_INTER_HCCS_DISABLE": "TRUE"})
    _run_all("allreduce", topo, 5000, env={"HCCL_INTER_HCCS_DISABLE": "TRUE"})


@pytest.mark.unit
def test_grouped_mesh_peers_and_steps():
    assert grouped_mesh.sdma_distances(5) == [1, 4, 2, 3]
    assert grouped_mesh.sdma_distances(4) == [1, 3, 2]
    group_of = np.repeat(np.arange(3), 16)
    program = grouped_mesh.alltoall(group_of, 8)
    assert len(program) == 48 - 16                 # one remote peer per step outlasts 2 SDMA rounds
    first = program[0]
    sends = np.bincount(first.t_src, minlength=48)
    assert (sends == 8 + 1).all()                  # 8 SDMA peers and one RDMA peer at once
    assert (np.bincount(first.t_dst, minlength=48) == 9).all()
    verify(program, "alltoall", 48, 0, 0, "grouped")


@pytest.mark.unit
def test_double_ring_halves_are_128_byte_aligned():
    assert double_ring.halves(1000, 4) == [(0, 512), (512, 1000)]
    assert double_ring.halves(10, 4) == [(0, 10)]
    assert double_ring.halves(0, 4) == [(0, 0)]
    assert list(double_ring.order(5, 1)) == [0, 4, 3, 2, 1] and list(double_ring.order(4, 0, first=2)) == [2, 3, 0, 1]


def _one_step_events(topo, sends):
    """The event-driven replay's transfer events of one step in which die 0 sends `sends` (peer,
    bytes) in that order and each peer receives them."""
    from hcomm.steps import Recv, Send
    from hcomm.timing import replay
    p = topo.num_ranks
    steps = [[] for _ in range(p)]
    steps[0] = [tuple(Send(peer, None, n, order=k) for k, (peer, n) in enumerate(sends))]
    for peer in {peer for peer, _ in sends}:
        steps[peer] = [tuple(Recv(0, None, n, order=k) for k, (q, n) in enumerate(sends) if q == peer)]
    events = []
    replay(steps, [0] * p, topo, events=events)
    return [(start, end) for r, name, start, end, _ in events if r == 0 and name.startswith("send->")]


@pytest.mark.unit
def test_a_ub_port_carries_more_than_one_pair_and_a_pair_runs_at_its_own_rate():
    """Pricing rule 9: a die's UB port is held for bytes / its port rate (178 GB/s) while each
    pair's transfer runs at one pair's rate (125.3 GB/s): sends to two UB peers overlap, the second
    starting one port time after the first; two sends to one peer run back to back; over SIO
    (port = pair) the second waits for the whole first, as before."""
    from topologies.model import transfer_ns
    topo = a3(1, 1)
    b = 1 << 20
    ub = topo.route(0, 2)
    assert ub.port_bandwidth == 178.0e9 and ub.bandwidth == 125.3e9
    wire, held = transfer_ns(b, ub.bandwidth), transfer_ns(b, ub.port_bandwidth)
    (s1, e1), (s2, e2) = _one_step_events(topo, [(2, b), (4, b)])
    assert s2 - s1 == held and e1 - s1 == e2 - s2 == wire + ub.latency_ns
    (s1, e1), (s2, e2) = _one_step_events(topo, [(2, b), (2, b)])
    assert s2 - s1 == wire
    sio = topo.route(0, 1)
    assert sio.port_bandwidth == sio.bandwidth
    (s1, _), (s2, _) = _one_step_events(topo, [(1, b), (1, b)])
    assert s2 - s1 == transfer_ns(b, sio.bandwidth)
    # the rate a die reaches over many UB peers at once: its port's, not the pair's
    (first, _), *_, (_, last) = _one_step_events(topo, [(peer, b) for peer in range(2, 16)])
    assert last - first == 13 * held + wire + ub.latency_ns


@pytest.mark.parametrize("case", [pytest.param((1, 1), marks=pytest.mark.unit),
                                  pytest.param((1, 1, 8), marks=pytest.mark.unit),
                                  pytest.param((1, 2), marks=pytest.mark.unit)], ids=str)
def test_vectorised_timing_equals_event_driven_reference_on_mesh_steps(case):
    """Steps where a die drives many UB peers at once (AIV mesh kernels, the AI CPU's small-count
    mesh, AlltoAll's and the mesh's transfers between servers of a superpod) price alike in both
    engines, ports held shorter than their transfers."""
    from hccl_sim.algorithms.common import side_by_side
    from hccl_sim.plan.costs import priced_as
    from hcomm.cost import CostModel
    topo = a3(*case)
    p = topo.num_ranks
    rng = np.random.default_rng(p)
    labels = set()
    for env in ({"HCCL_OP_EXPANSION_MODE": "AIV"}, {}):
        config = Config.from_env(env)
        for coll in collectives.DATA_COLLECTIVES:
            for algo in (None, "level0:NA;level1:ring"):
                s = sig(coll, p, p * 40, algo)
                choice = choose(s, topo, config, 4)
                labels.add(choice.label.split(" ")[0])
                cost = priced_as(CostModel.of(topo), choice)
                for length in ((40 * p, 3) if coll not in collectives.BLOCK else (40, 3)):
                    parts = build_parts(coll, choice, cost.topology, length, 4, s.root)
                    program = side_by_side(*[pg for _, _, pg in parts])
                    for entry in (np.zeros(p, dtype=np.int64), rng.integers(0, 50_000, p)):
                        want = des_times(program, entry, cost, s.dtype, s.redop or "sum")
                        got = program_times(program, entry, cost, s.dtype, s.redop or "sum")
                        assert list(got) == list(want), f"{case} {env} {coll} {choice.label} len={length}"
    assert "grouped_fullmesh" in labels and ("fullmesh" in labels) == (topo.num_servers == 1)


@pytest.mark.unit
def test_labels_name_only_the_levels_that_run():
    """A superpod of one-die servers has neither level0 nor level1; one rank runs a local copy."""
    assert hccl_sim.simulate("allreduce", 1 << 20, topology=a3(2, 1, 1)).algo == "level2:NHR"
    assert hccl_sim.simulate("reduce", 1 << 20, topology=a3(2, 1, 1), root=1).algo == "level2:H-D_R"
    for op in ("reducescatter", "allgather", "allreduce"):
        assert hccl_sim.simulate(op, 1 << 20, topology=a3(1, 1, 1)).algo == "one rank: a local copy"
    assert hccl_sim.simulate("allreduce", 64 << 20, topology=a3(1, 2, 2)).algo == "level0:double_ring;level1:NHR"
