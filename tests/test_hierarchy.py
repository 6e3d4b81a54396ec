"""Topology-aware algorithms on real data (local engine): HCCL's hierarchy on 1-5 servers of both
hardware presets and on unequal servers, every flat algorithm on 2-17 ranks, HCCL_ALGO and algo=,
and the algorithm each policy picks."""
import numpy as np
import pytest

import hccl_sim
import topologies
from hccl_sim.config.env import Config
from hccl_sim.plan.planner import Signature, choose
from hccl_sim.selection.hccl import pipeline_contexts

from test_collectives import all_collectives, check

LEVEL1 = [None, "ring", "H-D_R", "NHR", "NB", "pipeline"]


@pytest.mark.local
@pytest.mark.parametrize("preset,servers", [("atlas800t-a2", s) for s in (1, 2, 3, 4, 5)] +
                         [("atlas800-910a", s) for s in (1, 2, 3)])
def test_hierarchy_real_data(preset, servers):
    topo = hccl_sim.topology(preset, servers=servers)
    p = topo.num_ranks
    for algo in LEVEL1:
        for count in (1, p + 3, 3 * p):
            root = (count * 7) % p
            results = hccl_sim.run(all_collectives, topology=topo, args=(count, np.int32, "sum", algo, root))
            check(results, p, count, np.int32, "sum", root)


@pytest.mark.local
@pytest.mark.parametrize("counts", [(8, 3), (2, 8, 5), (1, 1, 1), (4, 1)])
def test_unequal_servers_real_data(counts):
    topo = topologies.hardware("atlas800t-a2", devices_per_server=list(counts))
    p = topo.num_ranks
    for algo in (None, "ring", "NHR"):
        results = hccl_sim.run(all_collectives, topology=topo, args=(2 * p + 1, np.int64, "max", algo, p - 1))
        check(results, p, 2 * p + 1, np.int64, "max", p - 1)


@pytest.mark.local
@pytest.mark.parametrize("algo", ["NHR", "NB", "fullmesh"])
@pytest.mark.parametrize("p", range(2, 18))
def test_new_flat_algorithms_real_data(algo, p):
    topo = hccl_sim.topology("fullmesh", ranks=p)
    for count in (1, p + 3, 64 * p):      # NHR switches to its one-shot tree for small data
        results = hccl_sim.run(all_collectives, topology=topo, args=(count, np.float32, "sum", algo, p // 2))
        check(results, p, count, np.float32, "sum", p // 2)


@pytest.mark.local
def test_pipeline_larger_than_buffer():
    topo = hccl_sim.topology("atlas800t-a2", servers=3)
    count = (1 << 20) // 4 * 3 // 24 + 5
    results = hccl_sim.run(all_collectives, topology=topo, args=(count, np.float32, "sum", "pipeline", 5),
                           env={"HCCL_BUFFSIZE": "1"})
    check(results, 24, count, np.float32, "sum", 5)


def labels(topo, op, nbytes, **kw):
    return hccl_sim.simulate(op, nbytes, topology=topo, **kw).algo


@pytest.mark.unit
def test_algo_labels_name_each_level():
    one, two = hccl_sim.topology("atlas800t-a2"), hccl_sim.topology("atlas800t-a2", servers=2)
    assert labels(one, "allreduce", 1 << 20) == "level0:fullmesh"
    assert labels(two, "allreduce", 1 << 20, algo="NHR") == "level0:fullmesh;level1:NHR"
    assert labels(hccl_sim.topology("atlas800-910a", servers=2), "allreduce", 1 << 20) == "level0:ring;level1:H-D_R"
    assert labels(hccl_sim.topology("fullmesh", ranks=6), "allreduce", 1 << 20, algo="NB") == "NB"


@pytest.mark.unit
def test_hccl_algo_env_and_per_op_form():
    topo = hccl_sim.topology("atlas800t-a2", servers=4)
    env = {"HCCL_ALGO": "allreduce=level0:NA;level1:ring/allgather=level0:NA;level1:NB"}
    assert labels(topo, "allreduce", 1 << 20, env=env) == "level0:fullmesh;level1:ring"
    assert labels(topo, "allgather", 1 << 20, env=env) == "level0:fullmesh;level1:NB"
    assert labels(topo, "allgather", 1 << 20, env={"HCCL_ALGO": "level0:NA;level1:H-D_R"}) == "level0:fullmesh;level1:H-D_R"
    # the algo= argument beats the environment, token or whole string
    assert labels(topo, "allreduce", 1 << 20, env=env, algo="NHR") == "level0:fullmesh;level1:NHR"
    assert labels(topo, "allreduce", 1 << 20, algo="level0:NA;level1:NB") == "level0:fullmesh;level1:NB"


@pytest.mark.unit
def test_hccl_fallbacks_for_unsupported_combinations():
    """HCCL's documented fallbacks run, and say so in the label (never silently)."""
    topo = hccl_sim.topology("atlas800t-a2", servers=4)
    fb = "level0:fullmesh;level1:H-D_R ({} unsupported for {}: HCCL falls back to H-D_R)"
    assert labels(topo, "broadcast", 1 << 20, algo="ring") == fb.format("ring", "broadcast")
    assert labels(topo, "broadcast", 1 << 20, algo="NHR") == "level0:fullmesh;level1:NHR"
    assert labels(topo, "reduce", 1 << 20, algo="NHR") == fb.format("NHR", "reduce")
    assert labels(topo, "alltoall", 1 << 20, algo="ring") == \
        "level0:fullmesh;level1:pairwise (ring unsupported for alltoall: HCCL runs pairwise)"
    assert labels(topo, "alltoall", 1 << 20, algo="pairwise") == "level0:fullmesh;level1:pairwise"
    big = hccl_sim.topology("atlas800t-a2", servers=800)                                 # too many FFTS contexts
    assert pipeline_contexts("allreduce", 800, 8) > 65535
    got = labels(big, "allreduce", 1 << 30, algo="pipeline")
    assert got.startswith("level0:fullmesh;level1:H-D_R (pipeline needs ") and "65535" in got


@pytest.mark.unit
def test_explicit_choice_is_never_replaced_silently(caplog):
    """The cases a review found silently replaced: each now runs as asked, runs HCCL's documented
    fallback and says so (label and log), or is an error naming what is supported."""
    mesh8, two = hccl_sim.topology("fullmesh", ranks=8), hccl_sim.topology("atlas800t-a2", servers=2)
    with caplog.at_level("WARNING", logger="hccl_sim.selection"):
        got = labels(mesh8, "allreduce", 1 << 20, algo="pipeline")
    assert got == "H-D_R (pipeline needs 910B servers: HCCL falls back to H-D_R)"
    assert any("pipeline needs 910B servers" in r.getMessage() for r in caplog.records)
    assert labels(mesh8, "allreduce", 1 << 20, algo="pairwise").endswith(
        "(pairwise applies to alltoall only: HCCL ignores it for allreduce and selects)")
    assert labels(two, "allreduce", 1 << 20, algo="fullmesh") == \
        "level0:fullmesh;level1:ring (fullmesh is not a level1 algorithm: HCCL ignores it and selects)"
    assert labels(hccl_sim.topology("atlas800t-a2"), "allreduce", 1 << 20, algo="ring") == \
        "level0:fullmesh (one server: no level1, ring not used)"
    with pytest.raises(hccl_sim.HcclError, match="allreduce on synthetic topologies supports ring, H-D_R") as e:
        labels(mesh8, "allreduce", 1 << 20, algo="star")
    assert e.value.code == "E_PARA"
    with pytest.raises(hccl_sim.HcclError, match="not built by hccl-sim") as e:
        labels(two, "allreduce", 1 << 20, algo="level0:NA;level1:AHC")
    assert e.value.code == "E_NOT_SUPPORT"
    assert labels(mesh8, "allreduce", 1 << 20, algo="fullmesh") == "fullmesh"      # a flat algorithm: runs
    one = hccl_sim.topology("atlas800t-a2")          # one server: a token HCCL refuses is refused here too
    with pytest.raises(hccl_sim.HcclError, match="not built by hccl-sim"):
        labels(one, "allreduce", 1 << 20, algo="level0:NA;level1:AHC")
    with pytest.raises(hccl_sim.HcclError, match="does not run allreduce"):
        labels(one, "allreduce", 1 << 20, algo="star")


@pytest.mark.local
def test_star_added_through_the_registry():
    """Star (one-step rooted ops) came in as one module plus one registry line: it runs flat and as
    level1, gives exact results, and costs a + n b on a full mesh (docs/references.md §6.2)."""
    from hccl_sim.algorithms import registry
    assert registry.supporting("broadcast", "level1") == ["H-D_R", "NHR", "star"]
    topo = hccl_sim.topology("fullmesh", ranks=6, bandwidth=10e9, latency=4e-6)
    est = hccl_sim.simulate("broadcast", 1 << 20, topology=topo, algo="star")
    assert est.algo == "star" and round(est.time * 1e9) == 4000 + -(-(1 << 20) * 10**9 // 10**10)
    def rooted(comm):
        x = (np.arange(37, dtype=np.int32) * (comm.rank + 2)) % 11
        return comm.broadcast(x, root=2, algo="star"), comm.reduce(x, root=2, algo="star"), comm.last_op.algo
    for name, params in (("fullmesh", {"ranks": 5}), ("atlas800t-a2", {"servers": 3})):
        t = hccl_sim.topology(name, **params)
        xs = [(np.arange(37, dtype=np.int32) * (r + 2)) % 11 for r in range(t.num_ranks)]
        for r, (b, red, algo) in enumerate(hccl_sim.run(rooted, topology=t)):
            assert np.array_equal(b, xs[2]) and algo.endswith("star")
            assert (red is None) == (r != 2) and (r != 2 or np.array_equal(red, sum(xs)))


# The hccl policy's decisions on the cases HCCL's code documents (coll_alg_operator.cc).
POLICY_CASES = [
    # (servers, op, bytes, dtype, redop, expected level1)
    (2, "allreduce", 64 << 10, "float32", "sum", "ring"),       # cost model: m <= 3 -> ring
    (3, "allreduce", 64 << 10, "float32", "sum", "ring"),
    (4, "allreduce", 64 << 10, "float32", "sum", "NHR"),        # m >= 4 -> NHR, whatever the size
    (16, "allreduce", 256 << 10, "float32", "sum", "NHR"),
    (2, "allreduce", 64 << 20, "float32", "sum", "pipeline"),   # per-slice 4 MiB >= 1 MiB, inline reduce
    (2, "allreduce", 64 << 20, "float32", "prod", "ring"),      # prod: no inline reduce -> no pipeline
    (2, "allreduce", 64 << 20, "int64", "sum", "ring"),         # int64: no inline reduce
    (4, "allreduce", 8 << 20, "float32", "sum", "NHR"),         # slice 256 KiB < 1 MiB
    (2, "allgather", 32 << 10, "float32", None, "pipeline"),    # AllGather pipeline from 32 KiB per rank
    (2, "allgather", 16 << 10, "float32", None, "ring"),
    (8, "allgather", 16 << 10, "float32", None, "NHR"),
    (2, "reducescatter", 32 << 10, "float32", "sum", "pipeline"),
    (5, "reducescatter", 16 << 10, "float32", "sum", "NHR"),
    (3, "broadcast", 1 << 20, "float32", None, "H-D_R"),        # Broadcast: default, then ring -> HD
    (3, "reduce", 1 << 20, "float32", "sum", "ring"),           # Reduce: V1 default (3 servers: ring)
    (4, "reduce", 1 << 20, "float32", "sum", "H-D_R"),          # V1 default (power of two: HD)
    (12, "reduce", 1 << 20, "float32", "sum", "H-D_R"),         # V1 default (>= 8: HD)
    (3, "alltoall", 1 << 20, "float32", None, "pairwise"),
]


@pytest.mark.unit
@pytest.mark.parametrize("servers,op,nbytes,dtype,redop,want", POLICY_CASES)
def test_hccl_policy_decisions(servers, op, nbytes, dtype, redop, want):
    topo = hccl_sim.topology("atlas800t-a2", servers=servers)
    est = hccl_sim.simulate(op, nbytes * (8 * servers if op in ("allgather", "reducescatter", "alltoall") else 1),
                            topology=topo, dtype=dtype, redop=redop or "sum")
    assert est.algo == f"level0:fullmesh;level1:{want}"


@pytest.mark.unit
def test_hccl_policy_deterministic_disables_pipeline():
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    est = hccl_sim.simulate("allreduce", 64 << 20, topology=topo, env={"HCCL_DETERMINISTIC": "true"})
    assert est.algo.endswith("level1:ring")


@pytest.mark.unit
def test_910a_uses_hccl_default_rule():
    for servers, want in ((2, "H-D_R"), (3, "ring"), (4, "H-D_R"), (5, "ring"), (9, "H-D_R")):
        topo = hccl_sim.topology("atlas800-910a", servers=servers)
        assert labels(topo, "allreduce", 1 << 20).endswith(want)


@pytest.mark.unit
def test_model_policy_is_never_slower_than_hccl():
    for servers in (2, 3, 5):
        topo = hccl_sim.topology("atlas800t-a2", servers=servers)
        for op in ("allreduce", "allgather", "reducescatter", "broadcast"):
            for nbytes in (8 << 10, 4 << 20, 256 << 20):
                hccl = hccl_sim.simulate(op, nbytes, topology=topo, policy="hccl")
                model = hccl_sim.simulate(op, nbytes, topology=topo, policy="model")
                assert model.time <= hccl.time, (servers, op, nbytes, hccl.algo, model.algo)


@pytest.mark.unit
def test_policy_argument_validated():
    with pytest.raises(hccl_sim.HcclError, match="policy"):
        hccl_sim.simulate("allreduce", 8, policy="fastest")


@pytest.mark.local
@pytest.mark.parametrize("cards,level0", [(8, "ring"), (4, "fullmesh"), (2, "ring")])
def test_910a_level0_rules(cards, level0):
    """HCCL's 910A level0: 8 cards 8P ring, 4 cards 4P mesh, 2 cards ring (alg_configurator.cc)."""
    table = topologies.ranktable.to_dict(topologies.hardware("atlas800-910a", devices_per_server=[cards] * 2))
    topo = topologies.ranktable.parse(table, preset="atlas800-910a")
    assert labels(topo, "allreduce", 1 << 20).startswith(f"level0:{level0};")
    results = hccl_sim.run(all_collectives, topology=topo, args=(3 * cards + 1, np.int32, "sum", None, 1))
    check(results, 2 * cards, 3 * cards + 1, np.int32, "sum", 1)
