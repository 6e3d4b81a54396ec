"""Symbolic verification of every schedule for rank counts 1..64: each output element receives
exactly the right contributions, no zero-copy hazard, no deadlock (the replay detects all three)."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import algorithms
from hcomm.steps import Recv, Send
from hcomm.timing import replay
from topologies.errors import HcclError

from conftest import add, onehot_input

CASES = [(algo, coll) for algo, mod in algorithms.ALGORITHMS.items() for coll in mod.COLLECTIVES if coll != "barrier"]
RANKS = list(range(1, 65))


def verify(algo, coll, p, n, root=0):
    topo = hccl_sim.topology("fullmesh", ranks=p)
    L = 2  # elements per rank block, to catch column mix-ups
    if coll in algorithms.BLOCK_COLLECTIVES:
        scheds = algorithms.schedules(algo, coll, p, p, L * 4, root)
    else:
        scheds = algorithms.schedules(algo, coll, p, n, 4, root)
    bufs = []
    for r in range(p):
        if coll == "allgather":
            b = {"input": onehot_input(r, p, 1, L, lambda i, j: j + 1), "output": np.full((p, L, 2 * p), np.nan)}
        elif coll in ("reducescatter", "alltoall"):
            b = {"input": onehot_input(r, p, p, L, lambda i, j: i * L + j + 1),
                 "output": np.full((1 if coll == "reducescatter" else p, L, 2 * p), np.nan),
                 "scratch": np.full((p, L, 2 * p), np.nan)}
        else:
            b = {"input": onehot_input(r, p, n, 1, lambda i, j: i + 1), "output": np.full((n, 1, 2 * p), np.nan)}
        bufs.append(b)
    replay(list(scheds), [0] * p, topo, buffers=bufs, reduce_fn=add, check_hazards=True)
    for r in range(p):
        got = bufs[r]["output"]
        if coll in ("allreduce", "reduce"):
            if coll == "reduce" and r != root:
                continue
            want = np.zeros_like(got)
            want[..., :p] = 1
            want[..., p:] = (np.arange(n) + 1)[:, None, None]
        elif coll == "broadcast":
            want = bufs[root]["input"]
        elif coll == "allgather":
            want = np.stack([bufs[k]["input"][0] for k in range(p)])
        elif coll == "reducescatter":
            want = np.zeros_like(got)
            want[..., :p] = 1
            want[..., p:] = (r * L + np.arange(L) + 1)[None, :, None]
        elif coll == "alltoall":
            want = np.stack([bufs[k]["input"][r] for k in range(p)])
        assert np.array_equal(got, want), f"{algo} {coll} p={p} n={n} root={root}: rank {r} output wrong"


@pytest.mark.parametrize("algo,coll", CASES)
def test_schedule_every_rank_count(algo, coll):
    for p in RANKS:
        verify(algo, coll, p, 3 * p + 1, root=p // 2)


@pytest.mark.parametrize("algo,coll", CASES)
def test_schedule_edge_sizes(algo, coll):
    for p in range(1, 18):
        for n in (0, 1, p - 1, p, 2 * p + 3):
            verify(algo, coll, p, max(n, 0), root=(p - 1) if p > 1 else 0)


@pytest.mark.parametrize("p", RANKS)
def test_barrier_schedule_reaches_everyone(p):
    """After the dissemination rounds every rank has (transitively) heard from every other."""
    heard = [{r} for r in range(p)]
    scheds = algorithms.schedules("dissemination", "barrier", p, 0, 0)
    rounds = max((len(s) for s in scheds), default=0)
    for i in range(rounds):
        new = [set(h) for h in heard]
        for r in range(p):
            for op in scheds[r][i]:
                if isinstance(op, Recv):
                    new[r] |= heard[op.peer]
        heard = new
    assert all(h == set(range(p)) for h in heard)
    replay(list(scheds), [0] * p, hccl_sim.topology("fullmesh", ranks=p))   # no deadlock


def test_replay_detects_deadlock():
    topo = hccl_sim.topology("fullmesh", ranks=2)
    from hcomm.steps import Slice
    s = Slice("input", 0, 1)
    # both ranks wait to receive before they send
    scheds = [[(Recv(1, s, 4),), (Send(1, s, 4),)], [(Recv(0, s, 4),), (Send(0, s, 4),)]]
    with pytest.raises(HcclError, match="deadlock"):
        replay(scheds, [0, 0], topo)


def test_replay_detects_zero_copy_hazard():
    topo = hccl_sim.topology("fullmesh", ranks=2)
    from hcomm.steps import Slice
    out = Slice("output", 0, 1)
    # rank 0 overwrites the slice it is still exposing to rank 1
    scheds = [[(Send(1, out, 8), Recv(1, out, 8))], [(Send(0, out, 8), Recv(0, Slice("output", 1, 2), 8))]]
    bufs = [{"output": np.zeros(2)} for _ in range(2)]
    with pytest.raises(HcclError, match="hazard"):
        replay(scheds, [0, 0], topo, buffers=bufs, reduce_fn=add, check_hazards=True)


def test_replay_detects_size_mismatch():
    topo = hccl_sim.topology("fullmesh", ranks=2)
    from hcomm.steps import Slice
    s = Slice("input", 0, 1)
    with pytest.raises(HcclError, match="expects"):
        replay([[(Send(1, s, 4),)], [(Recv(0, s, 8),)]], [0, 0], topo)
