"""Symbolic verification of every program: each output element receives exactly the right
contributions, no zero-copy hazard (a rank never writes a slice it exposes in the same step);
and the vectorised timing engine equals the event-driven reference to the nanosecond."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import algorithms
from hccl_sim.algorithms import nhr
from hccl_sim.config.env import Config
from hccl_sim import collectives
from hccl_sim.algorithms import registry
from hccl_sim.plan.planner import Signature, choose
from hccl_sim.plan.loop_programs import build_program
from hccl_sim.selection import Choice
from hcomm import program as prog
from hcomm.exec.schedules import rank_schedules
from hcomm.timing import replay
from hcomm.vtiming import program_times
from topologies.errors import HcclError

from conftest import add, onehot_input

FLAT_CASES = [(a.name, coll) for a in registry.ALGORITHMS.values() for coll in a.collectives
              if a.supports(coll, "flat") and coll != "barrier"]
L = 2  # elements per rank block, to catch column mix-ups


def symbolic_buffers(coll, p, n, root):
    bufs = []
    for r in range(p):
        if coll == "allgather":
            b = [onehot_input(r, p, 1, L, lambda i, j: j + 1), np.full((p, L, 2 * p), np.nan), None]
        elif coll in ("reducescatter", "alltoall", "scatter"):
            b = [onehot_input(r, p, p, L, lambda i, j: i * L + j + 1),
                 np.full((p if coll == "alltoall" else 1, L, 2 * p), np.nan), np.full((p, L, 2 * p), np.nan)]
        else:
            b = [onehot_input(r, p, n, 1, lambda i, j: i + 1), np.full((n, 1, 2 * p), np.nan), None]
        bufs.append(b)
    return bufs


def check_outputs(coll, bufs, p, n, root, label):
    for r in range(p):
        got = bufs[r][1]
        if coll in ("allreduce", "reduce"):
            if coll == "reduce" and r != root:
                continue
            want = np.zeros_like(got)
            want[..., :p] = 1
            want[..., p:] = (np.arange(n) + 1)[:, None, None]
        elif coll == "broadcast":
            want = bufs[root][0]
        elif coll == "allgather":
            want = np.stack([bufs[k][0][0] for k in range(p)])
        elif coll == "reducescatter":
            want = np.zeros_like(got)
            want[..., :p] = 1
            want[..., p:] = (r * L + np.arange(L) + 1)[None, :, None]
        elif coll == "scatter":
            want = bufs[root][0][r:r + 1]
        else:
            want = np.stack([bufs[k][0][r] for k in range(p)])
        assert np.array_equal(got, want), f"{label}: rank {r} output wrong"


def verify(program, coll, p, n, root, label):
    bufs = symbolic_buffers(coll, p, n, root)
    prog.execute(prog.data_moves(program), bufs, add)
    check_outputs(coll, bufs, p, n, root, label)
    assert prog.hazards(program) == [], f"{label}: zero-copy hazard"


def unit_for(coll):
    return L * 4 if coll in collectives.BLOCK else 4


@pytest.mark.unit
@pytest.mark.parametrize("algo,coll", FLAT_CASES)
def test_flat_program_every_rank_count(algo, coll):
    for p in range(1, 65):
        n = 3 * p + 1
        root = p // 2
        verify(algorithms.flat_program(coll, algo, p, n, unit_for(coll), root), coll, p, n, root, f"{algo} {coll} p={p}")


@pytest.mark.unit
@pytest.mark.parametrize("algo,coll", FLAT_CASES)
def test_flat_program_edge_sizes(algo, coll):
    for p in range(1, 18):
        for n in (0, 1, max(p - 1, 0), p, 2 * p + 3):
            root = p - 1
            verify(algorithms.flat_program(coll, algo, p, n, unit_for(coll), root), coll, p, n, root,
                   f"{algo} {coll} p={p} n={n}")


def overwritten_sends(steps):
    """(k, j) for every step k of a rank's schedules-form steps that writes a slice its step j < k
    sent, by exact slices."""
    def overlap(a, b):
        return a[0] == b[0] and max(a[1], b[1]) < min(a[2], b[2])
    for k, (_, copies, recvs, _) in enumerate(steps):
        writes = [c[3:6] for c in copies] + [r[1:4] for r in recvs]
        for j in range(k):
            if any(overlap(s[1:4], w) for s in steps[j][0] for w in writes):
                yield k, j


@pytest.mark.unit
@pytest.mark.parametrize("algo,coll", FLAT_CASES)
def test_per_rank_fences_guard_every_overwrite(algo, coll):
    """The per-rank executor waits for a send's consumer only at a later step's fence: every step
    that writes a slice an earlier step sent has its fence past that step, and the schedules have
    the steps rank_steps gives."""
    for p in (2, 5, 8, 13):
        n = 3 * p + 1
        program = algorithms.flat_program(coll, algo, p, n, unit_for(coll), p // 2)
        per_rank, reference = rank_schedules(program, p), prog.rank_steps(program, p)
        for rank in range(p):
            steps = per_rank[rank]
            assert len(steps) == len(reference[rank]), f"{algo} {coll} p={p} rank {rank}"
            for k, j in overwritten_sends(steps):
                assert steps[k][3] > j, f"{algo} {coll} p={p} rank {rank}: step {k} overwrites step {j}'s send"


@pytest.mark.unit
@pytest.mark.parametrize("oneshot", [True, False])
@pytest.mark.parametrize("coll", ["allreduce", "broadcast"])
def test_nhr_both_variants(oneshot, coll):
    for p in range(1, 40):
        n = 2 * p + 1
        program = (nhr.allreduce(p, n, 4, oneshot=oneshot) if coll == "allreduce"
                   else nhr.broadcast(p, n, 4, p // 3, oneshot=oneshot))
        verify(program, coll, p, n, p // 3, f"NHR {coll} oneshot={oneshot} p={p}")


@pytest.mark.unit
def test_nhr_slice_map_matches_hccl():
    assert nhr.slice_map(8) == (0, 4, 2, 6, 1, 5, 3, 7)
    assert nhr.slice_map(5) == (0, 3, 1, 4, 2)
    assert nhr.slice_map(6) == (0, 3, 1, 4, 2, 5)


HIER_TOPOLOGIES = [("atlas800t-a2", s) for s in (1, 2, 3, 4, 5)] + [("atlas800-910a", s) for s in (1, 2, 3)]


def unequal_topology(counts):
    import topologies
    return topologies.hardware("atlas800t-a2", devices_per_server=list(counts))


def hier_cases():
    for name, servers in HIER_TOPOLOGIES:
        yield f"{name}x{servers}", hccl_sim.topology(name, servers=servers)
    for counts in ((8, 3), (5, 8, 2), (1, 4), (3, 3, 3, 3, 3)):
        yield f"unequal{counts}", unequal_topology(counts)


@pytest.mark.unit
@pytest.mark.parametrize("label,topo", list(hier_cases()))
def test_hierarchical_programs(label, topo):
    p = topo.num_ranks
    for coll in collectives.DATA_COLLECTIVES:
        for l1 in ("ring", "H-D_R", "NHR", "NB", "pipeline", None):
            sig = Signature(coll, (p * 3 + 2,), "float32", "sum" if coll in ("allreduce", "reducescatter", "reduce")
                            else None, 1 if coll in ("broadcast", "reduce") else None, l1)
            choice = choose(sig, topo, Config(), 4)
            n = 3 * p + 2
            root = 1 if p > 1 else 0
            program = build_program(coll, choice, topo, L if coll in collectives.BLOCK else n, 4, root)
            verify(program, coll, p, n, root, f"{label} {coll} {choice.label}")


def des_times(program, entry, topo, dtype="float32", redop="sum"):
    p = len(entry)
    return replay(list(prog.rank_steps(program, p)), list(entry), topo, dtype=dtype, redop=redop)


TIMING_TOPOLOGIES = [("fullmesh", {"ranks": 7}), ("fullmesh", {"ranks": 16}), ("ring", {"ranks": 9}),
                     ("atlas800t-a2", {"servers": 1}), ("atlas800t-a2", {"servers": 3}),
                     ("atlas800-910a", {"servers": 2}), ("atlas800t-a2", {"servers": 8})]


@pytest.mark.parametrize("name,params", [pytest.param(*t, marks=pytest.mark.campaign if t[1] == {"servers": 8}
                                                      else pytest.mark.unit) for t in TIMING_TOPOLOGIES])   # 64 ranks: long
def test_vectorised_timing_equals_reference(name, params):
    """Every collective, every applicable algorithm, aligned and skewed entry clocks, contention
    included (the 910B's shared HCCS port, incast, reductions on the CCE): both engines agree."""
    topo = hccl_sim.topology(name, **params)
    p = topo.num_ranks
    rng = np.random.default_rng(p)
    flat = topo.device == "synthetic"
    for coll in collectives.DATA_COLLECTIVES:
        algos = registry.supporting(coll, "flat") if flat else \
            ["ring", "H-D_R", "NHR", "NB", "pipeline"]
        for algo in algos:
            sig = Signature(coll, (p * 40,), "float32" if algo != "NB" else "int64",
                            "sum" if coll in ("allreduce", "reducescatter", "reduce") else None,
                            2 % p if coll in ("broadcast", "reduce") else None, algo)
            choice = choose(sig, topo, Config(), 4)
            for length in (40 * p, 3):
                program = build_program(coll, choice, topo, length, 8 if algo == "NB" else 4, sig.root)
                for entry in (np.zeros(p, dtype=np.int64), rng.integers(0, 50_000, p)):
                    want = des_times(program, entry, topo, sig.dtype, sig.redop or "sum")
                    got = program_times(program, entry, topo, sig.dtype, sig.redop or "sum")
                    assert list(got) == list(want), f"{name} {coll} {choice.label} len={length}"


@pytest.mark.unit
def test_replay_detects_deadlock_and_mismatch():
    from hcomm.steps import Recv, Send, Slice
    topo = hccl_sim.topology("fullmesh", ranks=2)
    s = Slice("input", 0, 1)
    with pytest.raises(HcclError, match="deadlock"):
        replay([[(Recv(1, s, 4),), (Send(1, s, 4),)], [(Recv(0, s, 4),), (Send(0, s, 4),)]], [0, 0], topo)
    with pytest.raises(HcclError, match="expects"):
        replay([[(Send(1, s, 4),)], [(Recv(0, s, 8),)]], [0, 0], topo)


@pytest.mark.unit
def test_hazard_check_can_fail():
    b = prog.StepBuilder()
    # rank 0 overwrites the slice it is exposing to rank 1 in the same step
    b.transfers([0], [1], 4, prog.OUTPUT, 0, 1, prog.OUTPUT, 0).transfers([1], [0], 4, prog.OUTPUT, 1, 2, prog.OUTPUT, 0)
    assert prog.hazards([b.build()])


@pytest.mark.unit
def test_lazy_steps_and_repricing_equal_reference(monkeypatch):
    """Large programs build steps lazily and re-price same-structure steps from a cached prep;
    forced at small scale, both must still equal the event-driven reference (uneven chunks)."""
    from hccl_sim.algorithms import common, ring
    monkeypatch.setattr(ring, "_EAGER_TRANSFERS", 1)
    monkeypatch.setattr(common, "_EAGER_OPS", 1)
    rng = np.random.default_rng(7)
    for name, params, algo in (("ring", {"ranks": 9}, "ring"), ("fullmesh", {"ranks": 6}, "ring"),
                               ("atlas800t-a2", {"servers": 3}, "ring"), ("atlas800t-a2", {"servers": 5}, "ring")):
        topo = hccl_sim.topology(name, **params)
        p = topo.num_ranks
        for coll in ("allreduce", "allgather", "reducescatter"):
            sig = Signature(coll, (p * 7 + 3,), "float32", "sum" if coll != "allgather" else None, None, algo)
            choice = choose(sig, topo, Config(), 4)
            length = 7 * p + 3 if coll == "allreduce" else 5
            program = build_program(coll, choice, topo, length, 4, None)
            assert any(type(st).__name__ == "LazyStep" for st in program)
            for entry in (np.zeros(p, dtype=np.int64), rng.integers(0, 20_000, p)):
                got = program_times(program, entry, topo, "float32", sig.redop or "sum")
                assert list(got) == list(des_times(program, entry, topo, "float32", sig.redop or "sum")), (name, coll)
