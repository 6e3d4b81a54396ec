"""Expert parallelism as a torch_npu script (one expert per NPU; uneven all_to_all_single for the
dispatch and the combine), run unchanged on emulated NPUs:

    hccl-sim torchrun --nproc-per-node 8 examples/ascend/moe_train.py

The layer, data and one-process reference are examples/torch_moe.py's.
"""
import os
import time

import torch
import torch_npu  # noqa: F401
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_to_all_single_autograd

import npu_common
import torch_moe as moe


def main():
    args = npu_common.options(__doc__, 256)
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.npu.set_device(local_rank)
    dist.init_process_group(backend="hccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    router, experts = moe.layer(world)
    router, expert = router.npu(), experts[rank].npu()
    opt = torch.optim.SGD(list(router.parameters()) + list(expert.parameters()), lr=moe.LR)
    xs, ys = moe.data(args.steps, args.batch)
    share = args.batch // world
    losses, walls = [], []
    for step in range(args.steps):
        wall = time.perf_counter()
        x = xs[step, rank * share:(rank + 1) * share].npu()
        y = ys[step, rank * share:(rank + 1) * share].npu()
        chosen, gate = moe.route(router, x)
        order = torch.argsort(chosen, stable=True)
        send = torch.bincount(chosen, minlength=world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        send, recv = send.tolist(), recv.tolist()
        got = all_to_all_single_autograd(x[order], recv, send, dist.group.WORLD)
        back = all_to_all_single_autograd(expert(got), send, recv, dist.group.WORLD)
        out = torch.empty_like(back).index_copy(0, order, back) * gate[:, None]
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward()
        for p in router.parameters():
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        for p in expert.parameters():
            p.grad.div_(world)
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
        walls.append(time.perf_counter() - wall)
    if rank == 0:
        npu_common.finish(args, world, losses, walls, moe.reference(args.steps, args.batch, world)[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
