"""ray.util.collective's backend "hccl_sim" (hccl_sim.ray_collective): unchanged ray.util.collective
calls in four actors, two on each of the session's two Ray nodes, run on emulated NPUs.

Every op once on numpy and once on torch, integer data so results are exact; a group the driver
declares, destroyed and made again; two groups in one actor, their simulated times equal to the
local engine's; bad input and a Ray without the registry as HcclErrors; nothing left in Ray's
key-value store or /dev/shm."""
import os

import numpy as np
import pytest
import ray
import ray.util.collective as col
import torch
from ray.util.collective.types import ReduceOp

import hccl_sim
import hccl_sim.ray_collective as rc          # registers the backend here and in every actor that loads this module
from hccl_sim import HcclError

from conftest import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

W = 4


@ray.remote(num_cpus=0)
class Rank:
    """An actor that runs this module's functions (Ray loads the module, and with it the backend)."""

    def run(self, fn, *args):
        return fn(*args)


@pytest.fixture(scope="module")
def ranks(ray_cluster):
    actors = [Rank.options(resources={f"node{r // 2}": 1}).remote() for r in range(W)]
    pids = ray.get([a.run.remote(os.getpid) for a in actors])
    yield actors
    # a graceful exit (atexit runs), as an actor whose handles are gone has
    for ref in [a.__ray_terminate__.remote() for a in actors]:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(ref, timeout=30)
    # a group's segments are named for its session, which names the process of its rank 0, and
    # each segment for its owner's process (hcomm.memory.segments); its rings are the session's
    wait_until(lambda: not actors_segments(pids), "the actors' segments and rings unlinked")


def actors_segments(pids) -> list:
    return [n for n in os.listdir("/dev/shm") if any(f"-{p}-" in n or f"_{p}_" in n for p in pids)]


def on_all(actors, fn, *args):
    return ray.get([a.run.remote(fn, r, *args) for r, a in enumerate(actors)], timeout=90)


# ---- every op, numpy and torch ---------------------------------------------------------------------

def every_op(rank, lib):
    name = f"ops_{lib}"
    col.init_collective_group(W, rank, backend="hccl_sim", group_name=name)
    new = (lambda v, dt: np.array(v, dtype=dt)) if lib == "numpy" else \
        (lambda v, dt: torch.tensor(v, dtype=getattr(torch, dt)))
    out, rec = {}, {}
    for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX):
        x = new([rank + 1, -rank, 3], "int32")
        col.allreduce(x, group_name=name, op=op)
        out[f"allreduce {op.name}"] = x.tolist()
    rec["allreduce"] = rc.last_op(name)
    if lib == "torch":                             # bfloat16 through ml_dtypes; small integers are exact
        x = torch.full((4,), float(rank + 1), dtype=torch.bfloat16)
        col.allreduce(x, group_name=name)
        out["allreduce bf16"] = x.tolist()
    gathered = [new([0, 0], "int64") for _ in range(W)]
    col.allgather(gathered, new([rank, 10 * rank], "int64"), group_name=name)
    out["allgather"] = [g.tolist() for g in gathered]
    rec["allgather"] = rc.last_op(name)
    got = new([0, 0], "int64")
    col.reducescatter(got, [new([100 * rank + j, j], "int64") for j in range(W)], group_name=name)
    out["reducescatter"] = got.tolist()
    x = new([rank] * 3, "int16")
    col.broadcast(x, src_rank=2, group_name=name)
    out["broadcast"] = x.tolist()
    x = new([rank + 1, 5 - rank], "int64")
    col.reduce(x, dst_rank=1, group_name=name, op=ReduceOp.MAX)
    out["reduce"] = x.tolist()
    p2p = "int32" if lib == "numpy" else "bfloat16"        # bfloat16 frames and same-host records name their type
    x, got = new([rank * 7, rank], p2p), new([0, 0], p2p)
    if rank % 2 == 0:                              # a ring: a send returns once its peer has the data
        col.send(x, (rank + 1) % W, group_name=name)
        col.recv(got, (rank - 1) % W, group_name=name)
        rec["recv"] = rc.last_op(name)
    else:
        col.recv(got, (rank - 1) % W, group_name=name)
        rec["recv"] = rc.last_op(name)
        col.send(x, (rank + 1) % W, group_name=name)
    out["recv"] = got.tolist()
    col.barrier(group_name=name)
    rec["barrier"] = rc.last_op(name)
    col.destroy_collective_group(name)
    return hccl_sim.__file__, out, rec


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_every_op_in_place(ranks, lib):
    results = on_all(ranks, every_op, lib)
    for r, (where, out, rec) in enumerate(results):
        assert where == hccl_sim.__file__                     # the actors import this checkout
        assert out["allreduce SUM"] == [10, -6, 12]
        assert out["allreduce PRODUCT"] == [24, 0, 81]
        assert out["allreduce MIN"] == [1, -3, 3]
        assert out["allreduce MAX"] == [4, 0, 3]
        if lib == "torch":
            assert out["allreduce bf16"] == [10.0] * 4
        assert out["allgather"] == [[i, 10 * i] for i in range(W)]
        assert out["reducescatter"] == [100 * (0 + 1 + 2 + 3) + W * r, W * r]
        assert out["broadcast"] == [2, 2, 2]
        assert out["reduce"] == ([4, 5] if r == 1 else [r + 1, 5 - r])    # only the root's is written
        assert out["recv"] == [7 * ((r - 1) % W), (r - 1) % W]
        assert [rec[k].name for k in ("allreduce", "allgather", "recv", "barrier")] == \
            ["all_reduce", "all_gather", "recv", "barrier"]
        assert rec["allreduce"].nbytes == 12 and rec["allreduce"].time > 0 and rec["allgather"].start > 0
    # a collective leaves every rank at one clock
    assert len({rec["barrier"].end for _, _, rec in results}) == 1


# ---- a group the driver declares; destroyed and made again -------------------------------------------

def declared_sum(rank, name):
    x = np.full(3, rank + 1, dtype=np.int64)
    col.allreduce(x, group_name=name)             # the first op makes the declared group here
    return col.get_rank(name), x.tolist(), rc.last_op(name).end


def destroy(rank, name):
    col.destroy_collective_group(name)
    try:
        rc.last_op(name)
    except HcclError as exc:
        return exc.code
    return "still there"


def reinit_sum(rank, name):
    col.init_collective_group(W, rank, backend="hccl_sim", group_name=name)
    return declared_sum(rank, name)


def test_declared_group_destroyed_and_made_again(ranks):
    order = [2, 0, 3, 1]                          # ranks need not follow the actors' order
    col.create_collective_group(ranks, W, order, backend="hccl_sim", group_name="declared")
    first = on_all(ranks, declared_sum, "declared")
    assert [g for g, _, _ in first] == order
    assert all(x == [10] * 3 for _, x, _ in first)
    assert on_all(ranks, destroy, "declared") == ["E_PARA"] * W
    again = on_all(ranks, reinit_sum, "declared")
    assert [g for g, _, _ in again] == list(range(W))
    assert all(x == [10] * 3 for _, x, _ in again)
    assert sorted(again) == sorted(first)        # a new group's clocks start again at 0: the same ends by rank
    on_all(ranks, destroy, "declared")
    import ray.experimental.internal_kv as kv
    assert kv._internal_kv_list("collective/", namespace="hccl_sim") == []    # the last rank through cleared them


# ---- two groups in one actor; simulated time as the local engine's ------------------------------------

COUNT = 1 << 12


def two_groups(rank):
    os.environ["HCCL_SIM_TOPOLOGY"] = "fullmesh"         # the world group's, as a launched script's
    pair = f"pair{rank % 2}"                              # ranks 0 and 2, 1 and 3: across the two nodes
    rc.configure(pair, topology=hccl_sim.topology("fullmesh", ranks=2, bandwidth=1e9, latency=2e-6))
    try:
        col.init_collective_group(W, rank, backend="hccl_sim", group_name="world")
        col.init_collective_group(2, rank // 2, backend="hccl_sim", group_name=pair)
    finally:
        del os.environ["HCCL_SIM_TOPOLOGY"]
    x = np.arange(COUNT, dtype=np.int32) + rank
    col.allreduce(x, group_name="world")
    world_rec = rc.last_op("world")
    y = np.full(5, rank, dtype=np.int64)
    col.allreduce(y, group_name=pair)
    col.allreduce(x, group_name="world")
    topos = rc.communicator("world").topology.name, rc.communicator(pair).topology.name
    recs = world_rec, rc.last_op(pair), rc.last_op("world")
    col.destroy_collective_group(pair)
    # "world" is left as it is: the actor's exit closes it (the module's teardown checks)
    return x[:3].tolist(), y.tolist(), topos, recs


def test_two_groups_in_one_actor_priced_as_local(ranks):
    got = on_all(ranks, two_groups)
    base = np.arange(3) * W + 6
    for r, (x, y, topos, (world1, pair, world2)) in enumerate(got):
        assert x == (base * W).tolist()                   # allreduced twice
        assert y == [r % 2 + (r % 2 + 2)] * 5             # its pair's ranks
        assert topos == ("fullmesh", "fullmesh")
        assert pair.nbytes == 40 and world2.start == world1.end     # each group keeps its own clock

    def same_op(comm):
        comm.all_reduce(np.arange(COUNT, dtype=np.int32))
        return comm.last_op
    local = hccl_sim.run(same_op, topology=hccl_sim.topology("fullmesh", ranks=W), engine="local")
    assert [(g[3][0].algo, g[3][0].start, g[3][0].end) for g in got] == [(o.algo, o.start, o.end) for o in local]


# ---- bad input ----------------------------------------------------------------------------------------

def bad_calls(rank):
    said = []
    rc.configure("wrong", topology="fullmesh:ranks=8")
    try:
        col.init_collective_group(W, rank, backend="hccl_sim", group_name="wrong")
    except HcclError as exc:
        said.append((exc.code, str(exc)))
    col.init_collective_group(W, rank, backend="hccl_sim", group_name="checked")
    try:                                          # every rank gives the same bad list: none waits
        col.allgather([np.zeros(2, np.int32) for _ in range(W)], np.zeros(2, np.float32), group_name="checked")
    except HcclError as exc:
        said.append((exc.code, str(exc)))
    from datetime import timedelta
    from ray.util.collective.types import AllReduceOptions
    try:                                          # Ray's per-op timeout: refused, not ignored
        opts = AllReduceOptions()
        opts.timeout_ms = timedelta(seconds=5)
        rc.group("checked").allreduce([np.ones(2, np.int32)], opts)
    except HcclError as exc:
        said.append((exc.code, str(exc)))
    x = np.ones(2, np.int32)
    col.allreduce(x, group_name="checked")        # the group still works
    col.destroy_collective_group("checked")
    return said, x.tolist()


def test_bad_input_names_the_problem(ranks, monkeypatch):
    for said, x in on_all(ranks, bad_calls):
        (init_code, init_msg), (op_code, op_msg), (timeout_code, timeout_msg) = said
        assert timeout_code == "E_NOT_SUPPORT" and "HCCL_EXEC_TIMEOUT" in timeout_msg
        assert init_code == "E_PARA" and "has 8 ranks but collective group 'wrong' has world_size 4" in init_msg
        assert op_code == "E_PARA" and "output tensor 0 has shape (2,) and dtype int32" in op_msg \
            and "dtype float32" in op_msg
        assert x == [W, W]
    with pytest.raises(HcclError, match="no hccl_sim collective group named 'nowhere'"):
        rc.last_op("nowhere")
    monkeypatch.delattr(col, "register_collective_backend")       # a Ray without the registry
    with pytest.raises(HcclError, match="has no ray.util.collective backend registry.*register_collective_backend"):
        rc.register()

