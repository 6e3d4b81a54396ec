"""The hccl_sim backend as torch_npu's ProcessGroupHCCL behaves (issue 40), on 4 Ray ranks: a
backend for the group's device (`_get_backend`, the functional collectives' out form, the
coalescing manager and the coalesced ops as one group launch each), AVG on integer tensors, bool
tensors on every data-moving op, a rank's pairs with itself in batch_isend_irecv, and torch's (and
torch_npu's) argument checks in their words (docs/references.md §7.5)."""
import pytest

pytestmark = pytest.mark.torch

P = 4


def _backend_paths(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    out = {}
    pg = dist.group.WORLD
    out["backend_is_group"] = pg._get_backend(torch.device("cpu")) is pg
    try:
        pg._get_backend(torch.device("meta"))
    except RuntimeError as exc:
        out["meta"] = str(exc)
    x = torch.full((2,), r, dtype=torch.int64)
    got = torch.empty(2 * p, dtype=torch.int64)
    torch.ops._c10d_functional.all_gather_into_tensor_out(x, p, pg.group_name, out=got)
    torch.ops._c10d_functional.wait_tensor(got)
    out["ag_out"] = got.tolist()
    # a gloo group beside it still gets torch's own kernel behind the functional op (groups of one:
    # the ranks' default store here is each process's own HashStore)
    glo = [dist.new_group(ranks=[q], backend="gloo") for q in range(p)][r]
    got_gloo = torch.empty(2, dtype=torch.int64)
    torch.ops._c10d_functional.all_gather_into_tensor_out(x + 10, 1, glo.group_name, out=got_gloo)
    torch.ops._c10d_functional.wait_tensor(got_gloo)
    out["ag_out_gloo"] = got_gloo.tolist()
    before = len(ht.records())
    a, b = torch.full((3,), float(r)), torch.full((2,), float(r + 1))
    with dist._coalescing_manager(group=pg, device=torch.device("cpu"), async_ops=True) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    cm.wait()
    out["coalesced_ar"] = (a.tolist(), b.tolist())
    ga, gb = torch.empty(p), torch.empty(2 * p)
    with dist._coalescing_manager(group=pg, device=torch.device("cpu")):
        dist.all_gather_into_tensor(ga, torch.full((1,), float(r)))
        dist.all_gather_into_tensor(gb, torch.full((2,), float(r)))
    out["coalesced_ag"] = (ga.tolist(), gb.tolist())
    ra, rb = torch.empty(1), torch.empty(2)
    with dist._coalescing_manager(group=pg, device=torch.device("cpu")):
        dist.reduce_scatter_tensor(ra, torch.arange(float(p)))
        dist.reduce_scatter_tensor(rb, torch.arange(float(2 * p)))
    out["coalesced_rs"] = (ra.tolist(), rb.tolist())
    c = torch.full((2,), float(r))
    with dist._coalescing_manager(group=pg, device=torch.device("cpu"), async_ops=True) as cm:
        dist.broadcast(c, src=1)                # no fast path: one Work for what ran inside
    cm.wait()
    out["coalesced_bc"] = c.tolist()
    out["ops"] = [rec.name for rec in ht.records()[before:]]
    ht.destroy_process_group()
    return out


def test_the_group_is_the_backend_for_its_device_and_serves_every_path_that_asks_for_one(torch_cluster):
    res = torch_cluster.run(_backend_paths)
    for r, out in enumerate(res):
        assert out["backend_is_group"]
        assert out["meta"] == "No backend type associated with device type meta"
        assert out["ag_out"] == [q for q in range(P) for _ in range(2)]
        assert out["ag_out_gloo"] == [r + 10] * 2
        total = float(sum(range(P)))
        assert out["coalesced_ar"] == ([total] * 3, [total + P] * 2)
        assert out["coalesced_ag"] == ([float(q) for q in range(P)], [float(q) for q in range(P) for _ in range(2)])
        assert out["coalesced_rs"] == ([float(P * r)], [float(P * 2 * r), float(P * (2 * r + 1))])
        assert out["coalesced_bc"] == [1.0, 1.0]
        # each coalesced form is one launch: one AllReduce over both tensors, one HCCL group of
        # AllGathers (its last op's record), one of ReduceScatters
        assert out["ops"] == ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]


def _functional_wait_after_the_op(comm):
    """The functional op's Work waited only after the op has completed (the group's ops run in
    issue order, so once the barrier behind it returns it has): its Python part must still be
    there for C++'s wait. The wait runs on a thread of its own, so that a hang is an answer."""
    import threading
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    pg = dist.group.WORLD
    got = torch.empty(comm.size, dtype=torch.int64)
    torch.ops._c10d_functional.all_gather_into_tensor_out(torch.tensor([comm.rank]), comm.size, pg.group_name, out=got)
    dist.barrier()
    import gc
    gc.collect()
    waiter = threading.Thread(target=torch.ops._c10d_functional.wait_tensor, args=(got,), daemon=True)
    waiter.start()
    waiter.join(60)
    hung = waiter.is_alive()
    ht.destroy_process_group()
    return hung, got.tolist()


def test_a_functional_ops_work_waited_after_the_op_completed_returns(torch_cluster):
    for hung, got in torch_cluster.run(_functional_wait_after_the_op):
        assert not hung
        assert got == list(range(P))


def _integer_avg(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    avg = dist.ReduceOp.AVG
    out = {}
    for dtype in (torch.int8, torch.uint8, torch.int32, torch.int64):
        base = 100 if dtype != torch.int8 else 20          # uint8: 100+..+103 overflows uint8, not int32
        t = torch.full((3,), base + r, dtype=dtype)
        dist.all_reduce(t, op=avg)
        red = torch.full((3,), base + 2 * r, dtype=dtype)
        dist.reduce(red, dst=1, op=avg)
        rs = torch.zeros(1, dtype=dtype)
        dist.reduce_scatter_tensor(rs, torch.full((p,), base + r, dtype=dtype), op=avg)
        rsl = torch.zeros(2, dtype=dtype)
        dist.reduce_scatter(rsl, [torch.full((2,), base + r + k, dtype=dtype) for k in range(p)], op=avg)
        out[str(dtype)] = (t.tolist(), red.tolist() if r == 1 else None, rs.tolist(), rsl.tolist(), str(t.dtype))
    ht.destroy_process_group()
    return out


def test_avg_on_integer_tensors_is_the_truncated_quotient(torch_cluster):
    res = torch_cluster.run(_integer_avg)
    for r, out in enumerate(res):
        for dtype, base in (("torch.int8", 20), ("torch.uint8", 100), ("torch.int32", 100), ("torch.int64", 100)):
            t, red, rs, rsl, kept = out[dtype]
            assert kept == dtype
            assert t == [(P * base + sum(range(P))) // P] * 3             # 101.5 -> 101
            assert red == ([(P * base + 2 * sum(range(P))) // P] * 3 if r == 1 else None)
            assert rs == [(P * base + sum(range(P))) // P]
            assert rsl == [(P * base + sum(range(P)) + P * r) // P] * 2


def _bools(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    out = {}
    mine = torch.tensor([r == 0, r % 2 == 1, True])
    b = mine.clone()
    dist.broadcast(b, src=1)
    out["broadcast"] = b.tolist()
    gathered = [torch.zeros(3, dtype=torch.bool) for _ in range(p)]
    dist.all_gather(gathered, mine)
    out["all_gather"] = [g.tolist() for g in gathered]
    flat = torch.zeros(3 * p, dtype=torch.bool)
    dist.all_gather_into_tensor(flat, mine)
    out["all_gather_into_tensor"] = flat.tolist()
    got = torch.zeros(2, dtype=torch.bool)
    dist.scatter(got, [torch.tensor([q % 2 == 0, q == 3]) for q in range(p)] if r == 2 else None, src=2)
    out["scatter"] = got.tolist()
    a2a = torch.zeros(p, dtype=torch.bool)
    dist.all_to_all_single(a2a, torch.tensor([q == r for q in range(p)]))
    out["all_to_all_single"] = a2a.tolist()
    for name in ("SUM", "MAX", "MIN", "PRODUCT"):
        t = mine.clone()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, name))
        out[name] = t.tolist()
    if r == 0:
        dist.send(torch.tensor([True, False, True]), 3)
    elif r == 3:
        rec = torch.zeros(3, dtype=torch.bool)
        dist.recv(rec, 0)
        out["recv"] = rec.tolist()
    ht.destroy_process_group()
    return out


def test_bool_tensors_travel_as_bytes_and_sum_as_or(torch_cluster):
    res = torch_cluster.run(_bools)
    mine = [[q == 0, q % 2 == 1, True] for q in range(P)]
    for r, out in enumerate(res):
        assert out["broadcast"] == mine[1]
        assert out["all_gather"] == mine
        assert out["all_gather_into_tensor"] == [v for row in mine for v in row]
        assert out["scatter"] == [r % 2 == 0, r == 3]
        assert out["all_to_all_single"] == [q == r for q in range(P)]
        assert out["SUM"] == out["MAX"] == [True, True, True]          # torch_npu: SUM on bool is MAX (an OR)
        assert out["MIN"] == out["PRODUCT"] == [False, False, True]
        if r == 3:
            assert out["recv"] == [True, False, True]


def _self_pairs(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    own, nxt = torch.zeros(3), torch.zeros(3)
    ops = [dist.P2POp(dist.irecv, own, r), dist.P2POp(dist.isend, torch.arange(3.) + 10 * r, r),
           dist.P2POp(dist.isend, torch.full((3,), float(r)), (r + 1) % p),
           dist.P2POp(dist.irecv, nxt, (r - 1) % p)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    ht.destroy_process_group()
    return own.tolist(), nxt.tolist()


def test_a_pair_with_the_rank_itself_in_a_batch_is_a_local_copy(torch_cluster):
    for r, (own, nxt) in enumerate(torch_cluster.run(_self_pairs)):
        assert own == [10.0 * r, 10.0 * r + 1, 10.0 * r + 2]
        assert nxt == [float((r - 1) % P)] * 3


def _argument_checks(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    out = {}
    cases = {
        "split_sum": lambda: dist.all_to_all_single(torch.empty(10), torch.arange(10.), [3, 3, 2, 2], [3, 3, 3, 3]),
        "split_count": lambda: dist.all_to_all_single(torch.empty(8), torch.arange(8.), [2, 2, 4], [2, 2, 2, 2]),
        "split_even": lambda: dist.all_to_all_single(torch.empty(6), torch.arange(6.)),
        "premul_int": lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist._make_nccl_premul_sum(2.0)),
        "contiguous": lambda: dist.all_reduce(torch.ones(4, 4).t()[0]),
        "ag_dtype": lambda: dist.all_gather_into_tensor(torch.empty(8), torch.ones(2, dtype=torch.int64)),
        "ag_size": lambda: dist.all_gather_into_tensor(torch.empty(7), torch.ones(2)),
        "rs_dtype": lambda: dist.reduce_scatter_tensor(torch.empty(2), torch.ones(8, dtype=torch.int64)),
    }
    for name, call in cases.items():
        try:
            call()
        except RuntimeError as exc:
            out[name] = (str(exc).split("\n")[0], getattr(exc, "code", None))
    dist.barrier()
    ht.destroy_process_group()
    return out


def test_arguments_torch_npu_refuses_are_refused_in_its_words(torch_cluster):
    for out in torch_cluster.run(_argument_checks):
        assert out == {"split_sum": ("Split sizes doesn't match total dim 0 size", "E_PARA"),
                       "split_count": ("Number of tensor splits not equal to group size", "E_PARA"),
                       "split_even": ("Tensor's dim 0 does not divide equally across group size", "E_PARA"),
                       "premul_int": ("PreMulSum Data type must be half, float, bfloat16 or double", "E_PARA"),
                       "contiguous": ("Tensors must be contiguous", "E_PARA"),
                       "ag_dtype": ("output tensor must have the same type as input tensor", "E_PARA"),
                       "ag_size": ("output tensor size must be equal to world_size times input tensor size", "E_PARA"),
                       "rs_dtype": ("input tensor must be the same type as the output tensor.", "E_PARA")}


def _torch_npu_ops(comm):
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    r, p = comm.rank, comm.size
    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    out = {}
    splits = [1, 2, 0, 3]                         # rows of each rank's block
    rs = torch.zeros(splits[r], 2, dtype=torch.int32)
    pg.reduce_scatter_tensor_uneven(rs, torch.arange(12, dtype=torch.int32).reshape(6, 2) + r, splits,
                                    dist.ReduceScatterOptions()).wait()
    out["rs_uneven"] = rs.tolist()
    ag = torch.zeros(6, 2, dtype=torch.int32)
    pg.all_gather_into_tensor_uneven(ag, torch.full((splits[r], 2), r, dtype=torch.int32), splits).wait()
    out["ag_uneven"] = ag.tolist()
    try:
        pg.all_gather_into_tensor_uneven(torch.zeros(6), torch.zeros(2, dtype=torch.int64), splits)
    except RuntimeError as exc:
        out["dtype"] = str(exc).split("\n")[0]
    own, prev = torch.zeros(2), torch.zeros(2)
    pg.batch_isend_irecv(["irecv", "isend", "isend", "irecv"],
                         [own, torch.full((2,), 10. + r), torch.full((2,), float(r)), prev],
                         [r, r, (r + 1) % p, (r - 1) % p]).wait()
    out["batch"] = (own.tolist(), prev.tolist(), ht.records()[-1].name)
    out["name"] = pg.get_hccl_comm_name(r) == dist.group.WORLD.group_name
    # torch_npu's _group_start / _group_end: the ops between them are one HCCL group launch
    a, rs = torch.full((3,), 5 + r, dtype=torch.int32), torch.zeros(1, dtype=torch.uint8)
    outs = [torch.zeros(2) for _ in range(p)]
    before = len(ht.records())
    pg._group_start()
    works = [dist.all_reduce(a, op=dist.ReduceOp.AVG, async_op=True),
             dist.all_gather(outs, torch.full((2,), float(r)), async_op=True),
             dist.reduce_scatter_tensor(rs, torch.full((p,), 200, dtype=torch.uint8), op=dist.ReduceOp.AVG,
                                        async_op=True)]
    held = [w.is_completed() for w in works]
    pg._group_end()
    for w in works:
        w.wait()
    out["group"] = (held, a.tolist(), [o.tolist() for o in outs], rs.tolist(), len(ht.records()) - before)
    ht.destroy_process_group()
    return out


def test_torch_npus_own_ops_run_as_hccls_v_ops_one_batch_and_one_group(torch_cluster):
    splits, starts = [1, 2, 0, 3], [0, 1, 3, 3]
    for r, out in enumerate(torch_cluster.run(_torch_npu_ops)):
        rows = [[P * (2 * i) + sum(range(P)), P * (2 * i + 1) + sum(range(P))] for i in range(6)]
        assert out["rs_uneven"] == rows[starts[r]:starts[r] + splits[r]]
        assert out["ag_uneven"] == [[q, q] for q in range(P) for _ in range(splits[q])]
        assert out["dtype"] == "output tensor must have the same type as input tensor"
        assert out["batch"] == ([10. + r] * 2, [float((r - 1) % P)] * 2, "batch_send_recv")
        assert out["name"]
        held, avg, gathered, rs, records = out["group"]
        assert held == [False] * 3 and records == 1          # held until the end, launched as one group
        assert (avg, gathered, rs) == ([(P * 5 + sum(range(P))) // P] * 3, [[float(q)] * 2 for q in range(P)], [200])


def _held_and_withdrawn(comm):
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm, timeout=2)
    r = comm.rank
    pg = dist.group.WORLD._get_backend(torch.device("cpu"))
    a, b = torch.full((2,), 1.0 + r), torch.full((3,), 10.0 + r)
    pg._group_start()
    work = pg.allreduce_coalesced([a, b])
    pg._group_end()
    work.wait()
    before = len(ht.records())
    pg._group_start()
    pg._group_end()                                  # nothing held: no launch, no record
    dist.barrier()
    out = {"coalesced": (a.tolist(), b.tolist()), "records": len(ht.records()) - before}
    got = torch.zeros(2)
    try:                                             # a receive from itself that no send meets
        dist.irecv(got, r).wait(timeout=timedelta(seconds=6))     # past the group's 2 s: the receive's own error
    except Exception as exc:                         # noqa: BLE001 - its code is the answer
        out["lonely"] = getattr(exc, "code", type(exc).__name__)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((2,), 7.0), r),
                                    dist.P2POp(dist.irecv, got, r)])
    for w in works:
        w.wait()
    out["paired_after"] = got.tolist()              # the timed-out receive was withdrawn
    ht.destroy_process_group()
    return out


def test_held_coalesced_ops_empty_groups_and_withdrawn_self_receives(torch_cluster):
    total_a, total_b = float(sum(1 + q for q in range(P))), float(sum(10 + q for q in range(P)))
    for out in torch_cluster.run(_held_and_withdrawn):
        assert out == {"coalesced": ([total_a] * 2, [total_b] * 3), "records": 1, "lonely": "E_TIMEOUT",
                       "paired_after": [7.0, 7.0]}
