"""Expert parallelism: a mixture-of-experts layer whose dispatch and combine are uneven
`all_to_all_single`s (HCCL's AlltoAllV), on emulated Ascend NPUs.

    python examples/torch_moe.py --check                       # 8 Ray actors, 8 experts, one 910B server
    torchrun --nproc-per-node 8 examples/torch_moe.py          # 8 processes
    mpiexec -n 8 python examples/torch_moe.py                  # the same under MPI

Each rank holds one expert (a GELU MLP) and a replica of the router. Every step each rank routes
its share of the batch's tokens top-1 (skewed: the router starts biased towards the low experts),
exchanges how many tokens go to each expert (an AlltoAll of one count per rank), sends them to
their experts by an uneven all_to_all_single (the functional collectives' autograd one, which
carries the gradients back the same way: AlltoAllV both ways), runs its expert on what it received, and returns the
results by a second one (the combine). The router's gradients are averaged over the ranks (an
AllReduce) and the experts' scaled to the whole batch's mean loss. Each step prints the loss, the
collectives with the HCCL algorithm each ran, the tokens the busiest expert took, the simulated
communication time and the wall time; `--check` compares the losses and every expert's final
parameters with one process running the same layer on the whole batch.
"""
import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import tiny_lm

DIM, HIDDEN, LR = 32, 64, 0.5


def layer(world):
    """The router and every expert, seeded (each rank keeps its own expert)."""
    torch.manual_seed(0)
    router = nn.Linear(DIM, world)
    with torch.no_grad():
        router.bias.copy_(-torch.arange(world, dtype=torch.float32) * 0.5)     # skewed towards the low experts
    experts = nn.ModuleList(nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, DIM))
                            for _ in range(world))
    return router, experts


def data(steps, batch):
    g = torch.Generator().manual_seed(1)
    return torch.randn(steps, batch, DIM, generator=g), torch.randn(steps, batch, DIM, generator=g)


def route(router, x):
    """Top-1 routing: each token's expert and its gate (the softmax probability)."""
    gate, expert = F.softmax(router(x), dim=-1).max(dim=-1)
    return expert, gate


def train(steps, batch):
    """Expert-parallel training on this rank's share: per step (loss, ops, wall s, the simulated
    Step on the rank's device timeline, busiest expert's tokens), and the full final parameters
    (every expert's, gathered)."""
    import torch.distributed as dist
    import hccl_sim.torch
    from torch.distributed._functional_collectives import all_to_all_single_autograd
    rank, world = dist.get_rank(), dist.get_world_size()
    router, experts = layer(world)
    expert = experts[rank]
    params = list(router.parameters()) + list(expert.parameters())
    opt = torch.optim.SGD(params, lr=LR)
    xs, ys = data(steps, batch)
    share = batch // world
    rec = tiny_lm.Recorder({"ep": None})
    log = []
    with hccl_sim.torch.timeline() as timeline:
        for step in range(steps):
            rec.mark()
            timeline.mark()
            wall = time.perf_counter()
            x, y = xs[step, rank * share:(rank + 1) * share], ys[step, rank * share:(rank + 1) * share]
            chosen, gate = route(router, x)
            order = torch.argsort(chosen, stable=True)
            send = torch.bincount(chosen, minlength=world)
            recv = torch.empty_like(send)
            dist.all_to_all_single(recv, send)                        # how many tokens each expert gets
            send, recv = send.tolist(), recv.tolist()
            got = all_to_all_single_autograd(x[order], recv, send, dist.group.WORLD)            # dispatch
            back = all_to_all_single_autograd(expert(got), send, recv, dist.group.WORLD)        # combine
            out = torch.empty_like(back).index_copy(0, order, back) * gate[:, None]
            loss = F.mse_loss(out, y)
            opt.zero_grad()
            loss.backward()
            for p in router.parameters():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
            for p in expert.parameters():
                p.grad.div_(world)            # its tokens' losses from every rank, as a share of the mean
            opt.step()
            mean, busiest = loss.detach().clone(), torch.tensor([sum(recv)])
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            dist.all_reduce(busiest, op=dist.ReduceOp.MAX)
            log.append((float(mean), rec.since(), time.perf_counter() - wall, timeline.since(), int(busiest)))
    mine = {f"experts.{rank}.{k}": v.detach().clone() for k, v in expert.state_dict().items()}
    everyone = [None] * world
    dist.all_gather_object(everyone, mine)
    whole = {f"router.{k}": v.detach().clone() for k, v in router.state_dict().items()}
    for part in everyone:
        whole.update(part)
    return log, whole


def reference(steps, batch, world):
    """The same layer in one process on each step's whole batch: losses, parameters."""
    router, experts = layer(world)
    opt = torch.optim.SGD(list(router.parameters()) + list(experts.parameters()), lr=LR)
    xs, ys = data(steps, batch)
    losses = []
    for step in range(steps):
        x, y = xs[step], ys[step]
        chosen, gate = route(router, x)
        out = torch.zeros_like(x)
        for e in range(world):
            mask = chosen == e
            out = out.index_put((mask,), experts[e](x[mask]))
        loss = F.mse_loss(out * gate[:, None], y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    params = {f"router.{k}": v.detach().clone() for k, v in router.state_dict().items()}
    params.update({f"experts.{k}": v.detach().clone() for k, v in experts.state_dict().items()})
    return losses, params


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ranks", type=int, default=8, help="910B cards (experts) when not launched (default 8)")
    ap.add_argument("--check", action="store_true", help="compare with one process on the whole batch")
    args = ap.parse_args()
    log, params, world = tiny_lm.launch(train, "Expert parallelism (one expert per rank)", args, sys.modules[__name__],
                                        compare_lm=False)
    if log is None:
        return
    for step, entry in enumerate(log):
        print(f"  step {step}: the busiest expert took {entry[4]} of {args.batch} tokens")
    if args.check:
        losses, want = reference(args.steps, args.batch, world)
        worst_loss = max(abs(a - b) for a, b in zip((e[0] for e in log), losses))
        worst_param = max(float((params[k] - want[k]).abs().max()) for k in want)
        print(f"# against one process on the whole batch: losses within {worst_loss:.2e}, parameters within "
              f"{worst_param:.2e}")


if __name__ == "__main__":
    main()
