"""The hccl_sim backend's ProcessGroup surface beyond DDP, on Ray ranks: reduce, gather, the
coalesced ops, send / recv / isend / irecv with tags and from any source, batch_isend_irecv in any
order, Work semantics, and the group names DeviceMesh, functional collectives and DTensor need."""
import pytest

pytestmark = pytest.mark.torch

P = 4


def _rooted_and_coalesced(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    out = {}
    for name in ("SUM", "MAX", "AVG"):
        t = torch.arange(3, dtype=torch.float32) + 10 * r
        dist.reduce(t, dst=2, op=getattr(dist.ReduceOp, name))
        out[name] = t.tolist() if r == 2 else None
    gl = [torch.zeros(2) for _ in range(p)] if r == 1 else None
    dist.gather(torch.full((2,), float(r)), gl, dst=1)
    out["gather"] = [g.tolist() for g in gl] if gl else None
    ts = [torch.full((k + 1,), float(r + k)) for k in range(3)]
    dist.all_reduce_coalesced(ts)
    out["ar_coalesced"] = [t.tolist() for t in ts]
    outs = [[torch.zeros(k + 1) for k in range(2)] for _ in range(p)]
    dist.all_gather_coalesced(outs, [torch.full((k + 1,), float(10 * r + k)) for k in range(2)])
    out["ag_coalesced"] = [[o.tolist() for o in row] for row in outs]
    rs = torch.zeros(1)
    dist.reduce_scatter_tensor(rs, torch.arange(float(p)) + r, op=dist._make_nccl_premul_sum(0.5))
    out["premul"] = rs.item()
    rs_avg = torch.zeros(1)
    dist.reduce_scatter_tensor(rs_avg, torch.arange(float(p)) + r, op=dist.ReduceOp.AVG)
    out["rs_avg"] = rs_avg.item()
    try:
        dist.all_reduce(torch.ones(1, dtype=torch.int32), op=dist.ReduceOp.BAND)
    except Exception as exc:        # noqa: BLE001 - the message is the answer
        out["band"] = str(exc)
    out["seq"] = dist.group.WORLD._get_sequence_number_for_group()
    out["ops"] = [rec.name for rec in ht.records()]
    ht.destroy_process_group()
    return out


def test_reduce_gather_and_coalesced_ops_equal_torchs_semantics(torch_cluster):
    res = torch_cluster.run(_rooted_and_coalesced)
    p = P
    base = [float(i) for i in range(3)]
    for r, out in enumerate(res):
        if r == 2:
            assert out["SUM"] == [p * b + 10 * sum(range(p)) for b in base]
            assert out["MAX"] == [b + 10 * (p - 1) for b in base]
            assert out["AVG"] == [b + 10 * sum(range(p)) / p for b in base]
        assert out["gather"] == ([[float(q)] * 2 for q in range(p)] if r == 1 else None)
        assert out["ar_coalesced"] == [[float(sum(range(p)) + p * k)] * (k + 1) for k in range(3)]
        assert out["ag_coalesced"] == [[[float(10 * q + k)] * (k + 1) for k in range(2)] for q in range(p)]
        assert out["premul"] == 0.5 * (p * r + sum(range(p)))
        assert out["rs_avg"] == (p * r + sum(range(p))) / p
        assert out["band"].startswith("Cannot use ReduceOp.BAND with HCCL\n[ERROR] ")      # torch_npu's words
        # one op per coalesced call; gather as torch_npu runs it, an AllGather
        assert out["ops"] == ["reduce"] * 3 + ["all_gather", "all_reduce", "all_gather"] + ["reduce_scatter"] * 2
        assert out["seq"] == 8


def _point_to_point(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    nxt, prv = (r + 1) % p, (r - 1) % p
    out = {}
    # a ring where everyone sends first: the blocking send returns (buffered), the receives follow
    dist.send(torch.full((3,), float(r)), nxt, tag=7)
    got = torch.zeros(3)
    dist.recv(got, prv, tag=7)
    out["ring"] = got.tolist()
    # receives issued before the sends, in both directions, waited in reverse order
    a, b = torch.zeros(2), torch.zeros(2)
    reqs = [dist.irecv(a, prv), dist.irecv(b, nxt), dist.isend(torch.full((2,), r + 0.5), nxt),
            dist.isend(torch.full((2,), r + 0.25), prv)]
    for w in reversed(reqs):
        w.wait()
    out["cross"] = (a.tolist(), b.tolist(), all(w.is_completed() for w in reqs))
    # batch_isend_irecv with the receive listed first
    c = torch.zeros(4, dtype=torch.int64)
    ops = [dist.P2POp(dist.irecv, c, prv), dist.P2POp(dist.isend, torch.arange(4) * (r + 1), nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch"] = c.tolist()
    # rank 0 receives from any source: every other rank's tensor, its sender named
    if r == 0:
        seen = {}
        for _ in range(p - 1):
            t = torch.zeros(1)
            src = dist.recv(t, tag=3)
            seen[src] = t.item()
        out["any"] = seen
    else:
        dist.send(torch.tensor([100.0 + r]), 0, tag=3)
    # a receive whose tensor is the wrong size fails from wait()
    if r == 0:
        dist.send(torch.zeros(5), 1, tag=9)
    if r == 1:
        try:
            dist.recv(torch.zeros(4), 0, tag=9)
            out["short"] = "no error"
        except Exception as exc:     # noqa: BLE001 - the message is the answer
            out["short"] = str(exc)
    # a sparse tensor's sum, rank r holding entry (r, r) = r + 1 and entry (0, 1) = 1
    sp = torch.sparse_coo_tensor(torch.tensor([[r, 0], [r, 1]]), torch.tensor([r + 1.0, 1.0]), (p, p))
    dist.all_reduce(sp)
    out["sparse"] = sp.to_dense().tolist()
    out["records"] = sorted({rec.name for rec in ht.records()})
    dist.barrier()
    ht.destroy_process_group()
    return out


def test_send_recv_isend_irecv_batches_and_any_source(torch_cluster):
    res = torch_cluster.run(_point_to_point)
    p = P
    for r, out in enumerate(res):
        prv, nxt = (r - 1) % p, (r + 1) % p
        assert out["ring"] == [float(prv)] * 3
        assert out["cross"] == ([prv + 0.5] * 2, [nxt + 0.25] * 2, True)
        assert out["batch"] == [k * (prv + 1) for k in range(4)]
        assert {"isend", "irecv"} <= set(out["records"])
    want = [[float(q + 1) if q == c else 0.0 for c in range(p)] for q in range(p)]
    want[0][1] += p
    assert all(out["sparse"] == want for out in res)
    assert res[0]["any"] == {q: 100.0 + q for q in range(1, p)}
    assert "5 elements of float32 arrived for a tensor of 4 elements" in res[1]["short"]


def _mesh_and_functional(comm):
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r = comm.rank
    out = {"name": dist.group.WORLD.group_name}
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh.get_group("tp")
    out["tp_ranks"] = dist.get_process_group_ranks(tp)
    out["ar"] = fc.all_reduce(torch.full((2,), float(r)), "sum", mesh["tp"]).tolist()
    out["ag"] = fc.all_gather_tensor(torch.full((1,), float(r)), 0, mesh["dp"]).tolist()
    out["rs"] = fc.reduce_scatter_tensor(torch.arange(2.0) + r, "sum", 0, mesh["tp"]).tolist()
    full = torch.arange(8.0).reshape(4, 2)
    d = distribute_tensor(full, mesh, [Shard(0), Replicate()])
    out["local"] = d.to_local().tolist()
    out["replicated"] = d.redistribute(mesh, [Replicate(), Replicate()]).to_local().tolist()
    ht.destroy_process_group()
    return out


def test_device_mesh_functional_collectives_and_dtensor_run_on_named_groups(torch_cluster):
    res = torch_cluster.run(_mesh_and_functional)
    for r, out in enumerate(res):
        dp, tp = divmod(r, 2)
        assert out["name"] == "0"
        assert out["tp_ranks"] == [2 * dp, 2 * dp + 1]
        assert out["ar"] == [float(4 * dp + 1)] * 2
        assert out["ag"] == [float(tp), float(tp + 2)]
        assert out["rs"] == [float(2 * tp + 4 * dp + 1)]
        assert out["local"] == ([[0.0, 1.0], [2.0, 3.0]] if dp == 0 else [[4.0, 5.0], [6.0, 7.0]])
        assert out["replicated"] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]


def _monitored(comm):
    from datetime import timedelta
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    pg, r = dist.group.WORLD, comm.rank
    pg.monitored_barrier(timedelta(seconds=5))
    pg.monitored_barrier(timedelta(seconds=5), wait_all_ranks=True)
    said = None
    if r != 1:                                 # rank 1 does not come
        try:
            pg.monitored_barrier(timedelta(seconds=0.5))
        except RuntimeError as exc:
            said = str(exc)
    dist.barrier()
    if r == 0:
        try:
            pg.monitored_barrier(timedelta(seconds=0))
        except RuntimeError as exc:
            said = (said, str(exc))
    ht.destroy_process_group()
    return said


def test_monitored_barrier_names_the_missing_rank_as_gloo_does(torch_cluster):
    said = torch_cluster.run(_monitored)
    assert said[0] == ("Rank 1 failed to pass monitoredBarrier in 500 ms",
                       "Rank 0 timed out in monitoredBarrier after 0 ms") and said[1] is None
    for r in (2, 3):
        assert said[r].startswith(f"Rank {r} successfully reached monitoredBarrier, but received errors while "
                                  "waiting for send/recv from rank 0")


def _group_timeout(comm):
    from datetime import timedelta
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r = comm.rank
    pair = dist.new_group([0, 1], timeout=timedelta(seconds=1))
    said = None
    if r == 0:                                 # alone in the pair's barrier: the group's timeout ends the wait
        try:
            dist.barrier(group=pair)
        except dist.DistBackendError as exc:
            said = str(exc)
    dist.barrier()
    if r == 1:                                 # now rank 0's barrier completes, and the pair is usable again
        dist.barrier(group=pair)
    dist.barrier()
    ht.destroy_process_group()
    return said


def test_a_groups_timeout_ends_a_wait_with_torchs_error(torch_cluster):
    said = torch_cluster.run(_group_timeout)
    assert said[0].startswith("hccl_sim: Timed out after 1 s waiting for the op to complete") and said[1:] == [None] * 3
