"""The 950's PipeLine AllGather (HCCL's OmniPipe, algorithms.omnipipe): HCCL's slicing
(omnipipe_plan), its data parts verified symbolically and on real data, its timing program
moving what the parts move, both timing engines alike, faster than the levels in turn."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import collectives
from hccl_sim.algorithms import omnipipe
from hccl_sim.algorithms.omnipipe_plan import allgather_plan, plan2d
from hccl_sim.config.env import Config
from hccl_sim.plan.costs import effective_cost
from hccl_sim.plan.loop_programs import pods_of
from hccl_sim.plan.planner import Signature, choose, plan_times
from hcomm.vtiming import program_times
from test_schedules import L, des_times, verify
from test_superpod import _run_all

SHAPES = [(2, 2), (3, 2), (2, 3), (4, 3)]        # (servers per SuperPoD, SuperPoDs), 8 NPUs a server


def cluster(servers, superpods):
    return hccl_sim.topology("atlas950", servers=servers, superpods=superpods)


@pytest.mark.unit
def test_hccls_2d_plan_for_a_worked_case():
    """CalAllgatherDataSize2D and CalAllgather2DOffset on the inner plan of 4 servers of 8 with
    4,329,472 bytes (outer step 0 of 8 MiB on 2 SuperPoDs): y slow, x fast; y's own pieces cover
    the block over steps 0..S-2, x sends its whole block at step 0."""
    xb, yb = 50.0, 50.0 / 3
    p = plan2d(yb, xb, 4, 8, 4329472)
    assert p.steps == 4
    assert p.fast[0] == 4329472 and p.fast_off[0] == 0
    assert sum(p.slow[:p.steps - 1]) == 4329472              # the slow axis's own block, in pieces
    assert p.slow[p.steps - 1] + p.fast[p.steps - 1] + sum(p.fast[1:p.steps - 1]) == 4329472    # the diagonal
    assert all(s % 512 == 0 for s in p.slow[:p.steps - 2])   # aligned pieces (the remainders are not)


@pytest.mark.unit
@pytest.mark.parametrize("n1,n2", [(2, 2), (3, 2), (4, 2), (8, 4), (16, 8), (1024, 64)])
@pytest.mark.parametrize("nbytes", [4096, 1 << 20, 8 << 20, 100 << 20, 1 << 30])
def test_every_rank_sends_what_an_allgather_must(n1, n2, nbytes):
    """Every piece a level moves goes to each of its n - 1 peers (mesh at once, NHR over its
    rounds): in all, (R - 1) blocks of every byte, as HCCL's plan guarantees."""
    plan = allgather_plan(8, n1, n2, nbytes)
    size = {"x": 8, "y": n1, "z": n2}
    blocks = {("x", "own"): 1, ("x", "across"): n1 - 1, ("y", "own"): 1, ("y", "across"): 7,
              ("z", "own"): 1, ("z", "across"): 8 * n1 - 1}
    sent = sum((size[p.level] - 1) * blocks[(p.level, p.kind)] * (n2 - 1 if p.of == "zpeers" else 1) * p.size
               for p in plan.pieces)
    assert sent == (8 * n1 * n2 - 1) * nbytes


@pytest.mark.unit
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_data_parts_are_an_allgather_and_the_timing_program_moves_what_they_move(shape):
    topo = cluster(*shape)
    p = topo.num_ranks
    M = pods_of(topo).M
    for length, itemsize in ((1, 8), (37, 4), (4096, 4), (300000, 2)):
        timing, parts = omnipipe.allgather_parts(M, length, itemsize)
        assert parts[0][0] == 0 and parts[-1][1] == length and all(a < b for a, b, _ in parts)
        data, priced = {}, {}
        for lo, hi, program in parts:
            verify(program, "allgather", p, L, 0, f"{shape} {length} [{lo}, {hi})")
            for st in program:
                full = st.full()
                for s, d in zip(full.t_src.tolist(), full.t_dst.tolist()):
                    data[(s, d)] = data.get((s, d), 0) + (hi - lo) * itemsize
        for st in timing:
            full = st.full()
            for s, d, b in zip(full.t_src.tolist(), full.t_dst.tolist(), full.t_bytes.tolist()):
                priced[(s, d)] = priced.get((s, d), 0) + b
        assert priced == data


@pytest.mark.unit
@pytest.mark.parametrize("shape", SHAPES[:3], ids=str)
def test_both_timing_engines_price_it_alike(shape):
    topo = cluster(*shape)
    entry = np.arange(topo.num_ranks, dtype=np.int64) * 977
    for length in (40, 300000):
        timing, _ = omnipipe.allgather_parts(pods_of(topo).M, length, 4)
        assert list(program_times(timing, entry, topo, "float32", "sum")) == \
            list(des_times(timing, entry, topo, "float32", "sum"))


@pytest.mark.unit
def test_it_is_hccls_choice_and_its_pieces_price_against_the_levels_in_turn():
    """HCCL's choice for 8-NPU servers across UBoE SuperPoDs. Its plan balances the levels by
    HCCL's own constants (x 50, y 50 / (N1 - 1), z 25 / (N2 - 1)): on 2 servers a SuperPoD it
    beats the levels in turn; with more servers the preset's Clos (448 GB/s an NPU, against the 50
    HCCL's plan assumes) makes the levels in turn faster (experiments/RESULTS.md)."""
    config = Config()
    for shape, faster in (((2, 2), True), ((8, 2), False)):
        topo = cluster(*shape)
        size, _ = collectives.of("allgather").simulated_size(1 << 30, None, topo.num_ranks, 4)
        sig = Signature("allgather", size, "float32", None, None, None)
        choice = choose(sig, topo, config, 4)
        assert choice.executor == "AicpuAllGatherPipeLine" and choice.pipelined

        def priced(c):
            return max(plan_times(sig, effective_cost(topo, config), config, 4, c, [0] * topo.num_ranks,
                                  faults=False)[2])
        assert (priced(choice) < priced(choice._replace(pipelined=False))) == faster
    assert "not modelled" not in hccl_sim.simulate("allgather", 64 << 20, topology=cluster(2, 2)).algo


@pytest.mark.local
def test_real_data_with_buffer_loops():
    topo = cluster(2, 2)
    for n in (1, 37, 5000):
        assert _run_all("allgather", topo, n)[0][1].algo.startswith("AicpuAllGatherPipeLine")
    _run_all("allgather", topo, 150_000, env={"HCCL_BUFFSIZE": "1"})
