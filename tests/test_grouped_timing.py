"""Steps priced once per group (hcomm.vgroups) equal the same steps priced whole and the
event-driven reference, to the nanosecond; the analytic routers say which groups route alike."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import collectives
from hccl_sim.config.env import Config
from hccl_sim.plan import planner
from hcomm import program as prog
from hcomm.cost import CostModel
from hcomm.timing import replay
from hcomm.vgroups import grouped
from hcomm.vtiming import program_times
from topologies.routers import same_pattern

CLUSTERS = [("atlas800t-a2", {"servers": 5}), ("atlas800-910a", {"servers": 3}),
            ("atlas900-a3", {"superpods": 2, "servers": 3}), ("atlas900-a3", {"superpods": 3, "servers": [2, 4, 2]})]


def _whole(st):
    """The step as the engine prices it without its groups."""
    return prog.LazyStep(st.full, st.timing, st.tkey, st.skey)


def _programs(topo, op, nbytes):
    shape = collectives.get(op).input_shape_for_bytes(nbytes, topo.num_ranks, 4)
    sig = planner.Signature(op, shape, "float32", "sum" if collectives.get(op).reducing else None,
                            0 if collectives.get(op).rooted else None, None)
    plan = planner.make_plan(sig, topo, Config.from_env({"HCCL_BUFFSIZE": "1"}, None), [0] * topo.num_ranks, 4)
    return list(plan.programs.values())


@pytest.mark.unit
@pytest.mark.parametrize("name,params", CLUSTERS, ids=str)
@pytest.mark.parametrize("op", ["allreduce", "broadcast", "reduce"])
def test_steps_priced_by_groups_equal_whole_steps_and_the_event_driven_replay(name, params, op):
    topo = hccl_sim.topology(name, **params)
    cost = CostModel.of(topo)
    p = topo.num_ranks
    rng = np.random.default_rng(p)
    for program in _programs(topo, op, 3 * 2 ** 20 + 4 * 999):
        assert any(grouped(st, cost, "float32", "sum") for st in program)      # the groups are used
        # entries equal (one row per class), skewed (rows apart) and skewed by server (a few rows)
        for entry in ([0] * p, list(rng.integers(0, 40_000, p)), [7_000 * topo.server_of[r] % 30_000 for r in range(p)]):
            by_groups = program_times(program, entry, cost)
            whole = program_times([_whole(st) for st in program], entry, cost)
            reference = replay(prog.rank_steps(program, p), entry, cost, "float32", "sum")
            assert list(by_groups) == list(whole) == list(reference)


@pytest.mark.unit
def test_same_index_cards_route_alike_and_mixed_rows_do_not():
    topo = hccl_sim.topology("atlas800-910a", servers=4)
    cards = np.arange(32).reshape(4, 8)
    assert topo.routes_alike(cards)                          # every server alike
    assert topo.routes_alike(cards.T.copy())                 # card i of every server (level1)
    assert not topo.routes_alike(np.array([[0, 1], [2, 4]]))  # one HCCS group, then across two
    assert not topo.routes_alike(np.array([[0, 8], [1, 2]]))  # two servers, then one
    a3 = hccl_sim.topology("atlas900-a3", superpods=2, servers=2)
    assert a3.routes_alike(np.array([[0, 1], [2, 3]]))        # package partners (SIO)
    assert not a3.routes_alike(np.array([[0, 1], [3, 4]]))    # partners, then two packages (UB)
    assert not a3.routes_alike(np.array([[0, 16], [17, 33]]))  # one superpod (UB), then two (RoCE)
    ring = hccl_sim.topology("ring", ranks=8)
    assert ring.routes_alike(np.array([[0, 1, 3], [4, 5, 7]])) and not ring.routes_alike(np.array([[0, 1], [2, 4]]))


@pytest.mark.unit
def test_same_pattern_compares_how_rows_group_their_columns():
    assert same_pattern(np.array([[5, 5, 9], [1, 1, 0]]))
    assert same_pattern(np.array([[3, 1, 3, 2], [7, 8, 7, 0]]))
    assert not same_pattern(np.array([[3, 1, 3, 2], [7, 8, 8, 0]]))
    assert not same_pattern(np.array([[1, 2], [4, 4]]))
