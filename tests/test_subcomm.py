"""Communicators from communicators: split (colors, keys, opting out, nesting), its ops on real
integer data and priced on the members' real places, abort (pending and later ops fail on every
rank), shrink (excluded and crashed ranks left out, renumbered, then collectives go on), the
disagreements and bad arguments they refuse."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import FaultPlan, HcclError
from topologies.presets import hardware
from topologies.subset import subset


def _collectives(comm, base):
    """Every collective on `comm`, integer data, against numpy on the world ranks it holds."""
    n, world = comm.size, comm.world_ranks
    x = np.arange(2 * n, dtype=np.int64) + 100 * base
    xs = [np.arange(2 * n, dtype=np.int64) + 100 * w for w in world]
    got = {
        "allreduce": comm.all_reduce(x),
        "allgather": comm.all_gather(x[:3]),
        "reducescatter": comm.reduce_scatter(x),
        "broadcast": comm.broadcast(x, root=n - 1),
        "reduce": comm.reduce(x, root=0),
        "alltoall": comm.all_to_all(x),
    }
    total = np.sum(xs, axis=0)
    want = {
        "allreduce": total,
        "allgather": np.concatenate([v[:3] for v in xs]),
        "reducescatter": total[2 * comm.rank:2 * comm.rank + 2],
        "broadcast": xs[-1],
        "reduce": total if comm.rank == 0 else None,
        "alltoall": np.concatenate([v[2 * comm.rank:2 * comm.rank + 2] for v in xs]),
    }
    for name, w in want.items():
        if w is None:
            assert got[name] is None
        else:
            np.testing.assert_array_equal(got[name], w, err_msg=name)
    return True


@pytest.mark.local
@pytest.mark.parametrize("p", [1, 2, 3, 5, 7, 8, 11, 16])
@pytest.mark.parametrize("colors", [1, 2, 3])
def test_split_by_color_runs_every_collective(p, colors):
    def fn(comm):
        sub = comm.split(comm.rank % colors, key=-comm.rank)        # key reverses the order
        mine = [r for r in range(p) if r % colors == comm.rank % colors]
        assert sub.world_ranks == tuple(sorted(mine, reverse=True))
        assert sub.rank == sub.world_ranks.index(comm.rank) and sub.size == len(mine)
        assert sub.last_op.name == "split" and (sub.last_op.time > 0 or p == 1)   # the gather of colors, the init
        return _collectives(sub, comm.rank)
    assert hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=p)) == [True] * p


@pytest.mark.local
def test_color_none_opts_out_and_splits_nest():
    def fn(comm):
        sub = comm.split(None if comm.rank == 5 else comm.rank // 3)
        if comm.rank == 5:
            assert sub is None
            return None
        inner = sub.split(sub.rank % 2)
        assert inner.world_ranks == tuple(r for r in sub.world_ranks if sub.world_ranks.index(r) % 2 == sub.rank % 2)
        _collectives(inner, comm.rank)
        return sub.world_ranks, inner.world_ranks
    got = hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=7))
    assert got[0] == ((0, 1, 2), (0, 2)) and got[4] == ((3, 4), (4,)) and got[6] == ((6,), (6,)) and got[5] is None


@pytest.mark.local
def test_sub_communicator_priced_on_the_members_places():
    """Card 0 of each of two 910B servers: the same RoCE ring as a cluster of two one-card
    servers; four cards of one server: that server's HCCS mesh."""
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    n = 1 << 18

    def fn(comm):
        across = comm.split(0 if comm.rank in (0, 8) else None)
        inside = comm.split(0 if comm.rank < 4 else None)
        out = {}
        for name, sub in (("across", across), ("inside", inside)):
            if sub is not None:
                sub.barrier()
                sub.all_reduce(np.ones(n, dtype=np.float32))
                out[name] = (sub.last_op.time, sub.last_op.algo)
        return out
    got = hccl_sim.run(fn, topology=topo)
    two = hardware("atlas800t-a2", devices_per_server=[1, 1], device_ids=[[0], [0]])
    want = hccl_sim.simulate("allreduce", 4 * n, topology=two)
    assert got[0]["across"] == got[8]["across"] == (pytest.approx(want.time, abs=1e-12), want.algo)
    mesh = hccl_sim.simulate("allreduce", 4 * n, topology=subset(topo, [0, 1, 2, 3]))
    assert got[0]["inside"] == (pytest.approx(mesh.time, abs=1e-12), mesh.algo)
    assert "level1" in want.algo and got[0]["inside"][0] < got[0]["across"][0]


@pytest.mark.unit
def test_subset_topology_keeps_places_and_routes():
    topo = hccl_sim.topology("atlas800t-a2", servers=3)
    sub = subset(topo, [17, 1, 9, 2])
    assert sub.server_of == [0, 1, 2, 1] and sub.device_of == [1, 1, 1, 2] and sub.num_servers == 3
    assert sub.route(1, 3).kinds == topo.route(1, 2).kinds == ("HCCS",)
    assert sub.route(0, 1).hops == topo.route(17, 1).hops            # the cluster's own links
    assert subset(topo, range(24)) is topo
    for bad, match in (([], "at least one rank"), ([0, 0], "lists a rank twice"), ([30], "not ranks of")):
        with pytest.raises(HcclError, match=match):
            subset(topo, bad)
    a3 = hccl_sim.topology("atlas900-a3", servers=2, superpods=2)
    s3 = subset(a3, [48, 0, 16])
    assert s3.server_of == [0, 1, 2] and s3.params["superpod_of_server"] == [0, 1, 1] and s3.params["superpods"] == 2


@pytest.mark.local
@pytest.mark.parametrize("members", [(0, 1, 16, 17, 32, 33, 48, 49), (5, 21, 37, 53), (0, 2, 4, 6)])
def test_a3_sub_communicators_run_their_levels(members):
    """Two dies of every server of two superpods (double ring, level1, level2); one die per
    server; one server's dies that are not SIO pairs."""
    topo = hccl_sim.topology("atlas900-a3", servers=2, superpods=2)

    def fn(comm):
        sub = comm.split(0 if comm.rank in members else None)
        if sub is None:
            return None
        _collectives(sub, comm.rank)
        return sub.last_op.algo
    got = [g for g in hccl_sim.run(fn, topology=topo) if g is not None]
    assert len(got) == len(members) and len(set(got)) == 1


@pytest.mark.local
def test_link_faults_reach_sub_communicators():
    """The plan names world ranks and the cluster's links: the sub-communicator of cards 0 and 8
    crosses the RoCE route between them, down from 10 ms (after the split's own exchange)."""
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    plan = FaultPlan().link_down(0, 8, at=0.01)

    def fn(comm):
        sub = comm.split(0 if comm.rank in (0, 8) else 1)
        assert comm.clock < 1e7
        comm.device.default_stream.compute(bytes=1 << 36)     # HBM-bound work past 10 ms
        try:
            sub.all_reduce(np.ones(1024, dtype=np.int64))
        except HcclError as e:
            return e.code
        return "ok"
    got = hccl_sim.run(fn, topology=topo, faults=plan, env={"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1"})
    assert got[0] == got[8] == "E_REMOTE"
    assert got[1] == "ok"


@pytest.mark.local
def test_abort_fails_pending_and_later_ops_on_every_rank_then_shrink_goes_on():
    p = 6

    def fn(comm):
        if comm.rank == 2:
            comm.abort()
            with pytest.raises(HcclError, match="was aborted on this rank") as e:
                comm.all_reduce(np.ones(3))
            assert e.value.code == "E_PARA"
            return "aborted"
        with pytest.raises(HcclError, match=r"aborted: rank 2 aborted the communicator") as e:
            comm.all_reduce(np.ones(3))          # pending when rank 2 aborts, or entered after: fails
        assert e.value.code == "E_REMOTE"
        with pytest.raises(HcclError, match="aborted"):
            comm.barrier()
        new = comm.shrink(exclude=[2])
        assert new.size == p - 1 and new.rank == comm.rank - (comm.rank > 2)
        assert new.last_op.name == "shrink" and new.last_op.time > 0
        return _collectives(new, comm.rank)
    got = hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=p))
    assert got == [True, True, "aborted", True, True, True]


@pytest.mark.local
def test_shrink_leaves_out_a_crashed_rank():
    topo = hccl_sim.topology("atlas800t-a2")

    def fn(comm):
        comm.all_reduce(np.ones(8, dtype=np.int64))
        try:
            comm.all_reduce(np.ones(8, dtype=np.int64))
        except HcclError as e:
            assert e.code == "E_TIMEOUT" and "rank 3" in e.reason
        assert comm.lost_ranks == {3}
        new = comm.shrink()
        y = new.all_reduce(np.full(4, comm.rank, dtype=np.int64))
        return new.rank, new.world_ranks, int(y[0])
    got = hccl_sim.run(fn, topology=topo, faults=FaultPlan().rank_crash(3, at_op=1))
    assert got[3] is None
    survivors = (0, 1, 2, 4, 5, 6, 7)
    assert [g for g in got if g is not None] == [(i, survivors, sum(survivors)) for i in range(7)]


@pytest.mark.local
def test_shrink_views_must_agree_and_arguments_are_checked():
    def disagree(comm):
        if comm.rank < 4:
            comm.shrink(exclude=[4] if comm.rank < 2 else [4, 0])
    with pytest.raises(HcclError, match="disagree on the members") as e:
        hccl_sim.run(disagree, topology=hccl_sim.topology("fullmesh", ranks=5), env={"HCCL_EXEC_TIMEOUT": "20"})
    assert e.value.code == "E_PARA"

    def bad(comm):
        for args, match in (({"exclude": [comm.rank]}, "only the survivors call shrink"),
                            ({"exclude": [9]}, "not a rank of this communicator"),
                            ({"exclude": 1}, "exclude must be a list of ranks"),
                            ({"exclude": [True]}, "must be an integer")):
            with pytest.raises(HcclError, match=match):
                comm.shrink(**args)
        for args, match in (((-1,), "color must be an integer >= 0"), ((1.5,), "color must be"),
                            ((0, "k"), "key must be an integer")):
            with pytest.raises(HcclError, match=match):
                comm.split(*args)
        return True
    assert hccl_sim.run(bad, topology=hccl_sim.topology("fullmesh", ranks=2)) == [True, True]


@pytest.mark.local
def test_a_sub_communicator_runs_with_its_own_config():
    """HcclCreateSubCommConfig's config as env-style variables (torch_npu's hccl_config): the new
    communicator's CCL buffer and algorithm are its own, its parent's stay; a bad value is the
    variable's error."""
    topo = hccl_sim.topology("atlas800t-a2", servers=1)

    def fn(comm):
        sub = comm.split(comm.rank % 2, env={"HCCL_BUFFSIZE": "1", "HCCL_ALGO": "level0:NA;level1:ring"})
        y = sub.all_reduce(np.ones(1 << 19, np.float32))          # 2 MiB: two loops of a 1 MiB buffer
        try:
            comm.split(0, env={"HCCL_BUFFSIZE": "zero"})
        except hccl_sim.HcclError as exc:
            bad = str(exc)
        return sub.config.buffsize_mb, comm.config.buffsize_mb, sub.last_op.algo, float(y[0]), bad
    for sub_mb, parent_mb, algo, total, bad in hccl_sim.run(fn, topology=topo):
        assert (sub_mb, parent_mb, total) == (1, 200, 4.0)
        assert "ring" in algo
        assert "HCCL_BUFFSIZE" in bad
