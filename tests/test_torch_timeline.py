"""A rank's device timeline under torch (hccl_sim.torch.timeline): aten ops priced as kernels on
the 910B roofline (FLOPs by torch's counter, views free), torch CPU streams as device streams
ordered by the data they read, and on Ray ranks collectives on their group's stream: entering
where they were issued, joined where the program waits or reads their output, so a step's
exposed communication is what compute did not hide."""
import pytest
import torch

import hccl_sim
import hccl_sim.torch as ht
from hccl_sim.npu.device import Device
from hccl_sim.torch.device_timeline import Timeline
from topologies import hardware

pytestmark = pytest.mark.torch

TOPO = hardware("atlas800t-a2", devices_per_server=[4])
TOPO_ONE = hardware("atlas800t-a2", devices_per_server=[1])     # a lone rank: one process, no Ray


def _timeline():
    return Timeline(Device(0, TOPO), timeout_s=10, world=ht.world())


def _ns(flops, nbytes):
    return TOPO.device_model.kernel_ns(flops, nbytes)


def test_a_matmul_is_one_kernel_on_the_roofline_and_views_are_free():
    a, b = torch.ones(64, 128), torch.ones(128, 32)
    with _timeline() as tl:
        tl.mark()
        bt = b.t().contiguous().t()         # a view, a copy (a kernel), a view
        tl.mark()
        y = a @ bt
        step = tl.since()
    assert step.kernels == 1 and step.flops == 2 * 64 * 128 * 32
    assert step.compute == step.time == _ns(2 * 64 * 128 * 32, (64 * 128 + 128 * 32 + 64 * 32) * 4)
    assert y.shape == (64, 32) and float(y[0, 0]) == 128.0


def test_kernels_of_a_step_add_up_and_outside_a_timeline_nothing_is_priced():
    x = torch.ones(1 << 16)
    tl = _timeline()
    x.mul_(2)                               # not inside: no kernel
    with tl:
        tl.mark()
        x.mul_(2)
        z = x + 1
        step = tl.since()
    n = x.numel() * 4
    assert step.kernels == 2 and step.flops == 0
    assert step.compute == step.time == 2 * _ns(0, 2 * n)       # each reads and writes n bytes (1 is a scalar)
    assert float(z[0]) == 5.0


def test_a_side_stream_runs_beside_the_default_one_unless_it_reads_what_the_default_wrote():
    a, b = torch.ones(1 << 18), torch.ones(1 << 18)
    side = torch.cpu.Stream()
    one = _ns(0, 2 * a.numel() * 4)         # a negation reads and writes one tensor
    with _timeline() as tl:
        tl.mark()
        ya = a.neg()
        with torch.cpu.stream(side):
            yb = b.neg()                     # independent: overlaps
        apart = tl.since()
        tl.mark()
        ya = a.neg()
        with torch.cpu.stream(side):
            yb = ya.neg()                    # reads ya: starts when it is written
        chained = tl.since()
    assert apart.kernels == 2 and apart.time == apart.compute == one
    assert chained.kernels == 2 and chained.time == chained.compute == 2 * one
    assert float(yb[0]) == 1.0


def test_memory_a_freed_tensor_held_is_not_mistaken_for_the_next_tensors():
    """A tensor freed and its address handed out again must not make its successor wait for the
    kernels that wrote the old one (the timeline holds what it tracks until the program lets go)."""
    n = 1 << 20
    side = torch.cpu.Stream()
    with _timeline() as tl:
        tl.mark()
        with torch.cpu.stream(side):
            x = torch.ones(n)
            for _ in range(8):
                x = x.neg()                  # late on the side stream
        address = x.data_ptr()
        del x
        y = torch.empty(n)                   # memory handed out (likely x's again), written by no kernel
        reused = y.data_ptr() == address
        y.neg()                              # on the default stream, depends on nothing
        step = tl.since()
    one = _ns(0, 2 * n * 4)
    assert not reused                        # held: not handed out again while the step may read it
    assert step.compute == step.time == _ns(0, n * 4) + 8 * one     # the neg ran beside the side stream


def test_a_timeline_is_one_per_process():
    with _timeline():
        with pytest.raises(hccl_sim.HcclError, match="already active"):
            _timeline().__enter__()


def _overlap(comm, n, matmuls, wait):
    """On a rank: an async all_reduce of n floats issued after one kernel, `matmuls` independent
    matmuls, then the op's output read (after work.wait() or, as a Future waited in C++ is, just
    read); the step, the op's record and the kernels' durations."""
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    try:
        a = torch.ones(256, 256)
        with ht.timeline() as tl:
            for _ in range(2):              # the second step: warm, as the first
                t = torch.full((n,), float(comm.rank + 1))
                tl.mark()
                t.mul_(1)                    # the kernel before the issue
                work = dist.all_reduce(t, async_op=True)
                for _ in range(matmuls):
                    a = a @ a * 0.0 + 1.0   # 3 kernels each, none reading t
                if wait:
                    work.wait()
                total = t.sum()             # reads t: after the op's end
                step = tl.since()
        rec = ht.records()[-1]
        return step, rec.start, rec.end, float(total)
    finally:
        ht.destroy_process_group()


def _kernel_ns(n, matmuls):
    mm = _ns(2 * 256 ** 3, 3 * 256 * 256 * 4)
    elementwise = 2 * _ns(0, 2 * 256 * 256 * 4)      # a * 0.0, + 1.0 (a Python scalar is no tensor)
    return _ns(0, 2 * n * 4), matmuls * (mm + elementwise), _ns(0, n * 4 + 4)


@pytest.mark.parametrize("matmuls,wait", [(0, True), (40, True), (40, False)])
def test_an_async_all_reduce_hides_behind_independent_compute(torch_cluster, matmuls, wait):
    n = 1 << 20                             # 4 MiB: a few hundred us on one 910B server
    res = torch_cluster.run(_overlap, args=(n, matmuls, wait))
    before, between, after = _kernel_ns(n, matmuls)
    for step, start, end, total in res:
        assert total == n * (1 + 2 + 3 + 4)
        comm = end - start
        assert comm > 0 and start == step.start + before      # it enters where it was issued
        assert step.compute == before + between + after
        assert step.time == before + max(between, comm) + after
        assert step.exposed == max(0, comm - between)
    if matmuls:
        assert res[0][0].exposed < res[0][2] - res[0][1]     # some of it hidden


def _pipeline(comm):
    """Rank 0 computes, then sends to rank 1, which reads it: rank 1's step waits for it."""
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    try:
        with ht.timeline() as tl:
            tl.mark()
            x = torch.ones(1 << 16)
            if comm.rank == 0:
                for _ in range(10):
                    x = x * 1.0
                dist.send(x, 1)
            elif comm.rank == 1:
                dist.recv(x, 0)
                x = x + 1
            step = tl.since()
        return step, [(r.name, r.start, r.end) for r in ht.records()], float(x[0])
    finally:
        ht.destroy_process_group()


def test_a_receive_waits_for_the_senders_compute(torch_cluster):
    res = torch_cluster.run(_pipeline)
    (s0, rec0, _), (s1, rec1, x1) = res[0], res[1]
    ten = 10 * _ns(0, 2 * (1 << 16) * 4)
    assert x1 == 2.0 and s0.compute == _ns(0, (1 << 16) * 4) + ten
    (name, start, end), = [r for r in rec0 if r[0] == "isend"]
    assert start == s0.start + s0.compute    # the send leaves once its tensor is computed
    (name, rstart, rend), = [r for r in rec1 if r[0] == "irecv"]
    assert rstart == s1.start + _ns(0, (1 << 16) * 4)                   # issued after its ones()
    assert rend > start and s1.end == rend + _ns(0, 2 * (1 << 16) * 4)
    assert s1.exposed == s1.time - s1.compute > ten                       # rank 1 waited for rank 0


def test_the_same_step_is_priced_alike_every_run(torch_cluster):
    first = [step.time for step, *_ in torch_cluster.run(_overlap, args=(1 << 16, 5, False))]
    again = [step.time for step, *_ in torch_cluster.run(_overlap, args=(1 << 16, 5, False))]
    assert first == again


def _ddp_buckets(comm, steps):
    """DDP with a bucket per layer: each bucket's AllReduce is issued from backward (its Future
    waited in C++) and the optimizer's kernels read its gradients."""
    import torch
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    import hccl_sim.torch as ht
    ht.init_process_group(comm)
    try:
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(256, 256) for _ in range(6)])
        ddp = DDP(model, bucket_cap_mb=0.3)                      # 257 KiB a layer: a bucket for every two
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.full((64, 256), float(comm.rank + 1)) / 256
        with ht.timeline() as tl:
            for _ in range(steps):
                before = len(ht.records())
                tl.mark()
                opt.zero_grad()
                ddp(x).sum().backward()
                opt.step()
                step = tl.since()
        ops = ht.records()[before:]
        return step, sum(r.end - r.start for r in ops), len(ops), [p.detach().clone() for p in model.parameters()]
    finally:
        ht.destroy_process_group()


def test_ddp_buckets_hide_behind_backward_and_train_alike(torch_cluster):
    res = torch_cluster.run(_ddp_buckets, args=(3,))
    for step, comm, n, params in res:
        assert n >= 3 and comm > 0 and step.kernels > 0             # three buckets at least
        assert 0 < step.exposed < comm                 # some of the buckets' AllReduces ran during backward
        assert step.time < step.compute + comm
    for _, _, _, params in res[1:]:
        assert all(torch.equal(a, b) for a, b in zip(params, res[0][3]))


def _own_follow_ups(comm, timeout_s):
    """On a lone rank, in a step: FSDP2's gradient ReduceScatter (reduce_scatter_tensor, AVG,
    synchronous), a synchronous all_reduce of a bool tensor and an async AVG all_reduce waited;
    their outputs, whether the Work completed, and the step."""
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    import hccl_sim.torch as ht
    # the group's timeout bounds the timeline's waits for an op's end: an op that waits for its
    # own end fails within it (HCCL_E_TIMEOUT) instead of hanging for HCCL_EXEC_TIMEOUT
    ht.init_process_group(comm, timeout=timeout_s)
    try:
        grads = torch.arange(8, dtype=torch.float32)
        shard = torch.zeros(8)
        flags = torch.tensor([True, False, True])
        ones = torch.ones(2)
        with ht.timeline() as tl:
            tl.mark()
            dist.reduce_scatter_tensor(shard, grads, op=dist.ReduceOp.AVG)
            dist.all_reduce(flags)
            work = dist.all_reduce(ones, op=dist.ReduceOp.AVG, async_op=True)
            done = work.wait(timedelta(seconds=timeout_s))
            step = tl.since()
        return shard.tolist(), flags.tolist() + ones.tolist(), done, step
    finally:
        ht.destroy_process_group()


def test_an_ops_own_follow_up_on_its_output_does_not_wait_for_the_op():
    """AVG's divide and a bool's int32 copy and copy back are the collective's own work on its
    output: unlike a read of that output by the program, they must not wait for the op's end, which
    is set only once they are done. Run on the program's thread, under its timeline's dispatch
    mode (thread-local), they waited for themselves: FSDP2's AVG ReduceScatter in backward hung so
    when a synchronous op's job ran on the thread that waited for it."""
    shard, flags, done, step = hccl_sim.run(_own_follow_ups, topology=TOPO_ONE, args=(5,))[0]
    assert shard == [float(i) for i in range(8)] and flags == [True, False, True, 1.0, 1.0] and done
    assert step.kernels == 0        # the collectives' own ops are not the program's kernels
