"""FSDP2 (`torch.distributed.fsdp.fully_shard`) of a small decoder-only transformer on emulated
Ascend NPUs.

    python examples/torch_fsdp2.py                             # 8 Ray actors, one 910B server
    torchrun --nproc-per-node 8 examples/torch_fsdp2.py        # 8 processes
    mpiexec -n 8 python examples/torch_fsdp2.py                # the same under MPI (the MPI engine)

Every block and the whole model are sharded over a 1-D DeviceMesh of the ranks on the "hccl_sim"
backend: FSDP2's parameter AllGathers and gradient ReduceScatters really move the shards between
the ranks and are priced on the modelled cluster. Each step prints the loss (the mean over the
ranks' shares of the batch), the collectives and which HCCL algorithm each ran, their simulated
time, and the wall time; `--check` also trains the same model in this one process on the whole
batch and compares the losses and the final parameters.
"""
import argparse
import os
import time
from collections import Counter

import torch
import torch.nn as nn
import torch.nn.functional as F

import hccl_sim.torch
from topologies import hardware

VOCAB, DIM, HEADS, LAYERS, SEQ = 128, 64, 4, 2, 16


class Block(nn.Module):
    """A pre-norm decoder block: causal self-attention and a GELU MLP."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.GELU(), nn.Linear(4 * DIM, DIM))

    def forward(self, x):
        causal = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.pos = nn.Embedding(VOCAB, DIM), nn.Parameter(torch.zeros(SEQ, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def model_and_data(steps, batch):
    torch.manual_seed(0)
    model = TinyLM()
    tokens = torch.randint(0, VOCAB, (steps, batch, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return model, tokens


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def train(steps, batch):
    """FSDP2 training on this rank's share of each step's batch: per step (loss, [(op, algo, sim
    s)], wall s), and the full final parameters."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    rank, world = dist.get_rank(), dist.get_world_size()
    model, tokens = model_and_data(steps, batch)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    share = batch // world
    log = []
    for step in range(steps):
        before = len(hccl_sim.torch.records())
        wall = time.perf_counter()
        loss = lm_loss(model, tokens[step, rank * share:(rank + 1) * share])
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        ops = [(r.name, r.algo, r.time) for r in hccl_sim.torch.records()[before:]]
        log.append((float(mean), ops, time.perf_counter() - wall))
    params = {name: p.full_tensor().detach().clone() for name, p in model.named_parameters()}
    return log, params


def reference(steps, batch):
    """The same model trained in one process on each step's whole batch: losses, parameters."""
    model, tokens = model_and_data(steps, batch)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(steps):
        loss = lm_loss(model, tokens[step])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def report(log, world, how):
    print(f"# FSDP2 of a {LAYERS}-layer decoder ({sum(p.numel() for p in TinyLM().parameters())} parameters) "
          f"on {world} emulated 910B ranks ({how}), backend hccl_sim")
    print(f"# {'step':>4} {'loss':>8} {'collectives (HCCL algorithm)':50s} {'sim comm (us)':>13} {'wall (ms)':>9}")
    for step, (loss, ops, wall) in enumerate(log):
        kinds = Counter(f"{name} ({algo})" for name, algo, _ in ops)
        said = ", ".join(f"{n}x {k}" for k, n in sorted(kinds.items()))
        print(f"  {step:>4} {loss:>8.4f} {said:50s} {sum(t for *_, t in ops) * 1e6:>13.1f} {wall * 1e3:>9.1f}")


def compare(log, params, steps, batch):
    losses, want = reference(steps, batch)
    worst_loss = max(abs(a - b) for a, b in zip((l for l, *_ in log), losses))
    worst_param = max(float((params[k] - want[k]).abs().max()) for k in want)
    print(f"# against one process on the whole batch: losses within {worst_loss:.2e}, parameters within "
          f"{worst_param:.2e}")
    return worst_loss, worst_param


def on_ray_rank(comm, steps, batch):
    hccl_sim.torch.init_process_group(comm)
    try:
        return train(steps, batch)
    finally:
        hccl_sim.torch.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--ranks", type=int, default=8, help="910B cards when not launched (default 8, one server)")
    ap.add_argument("--check", action="store_true", help="compare with one process on the whole batch")
    args = ap.parse_args()
    launcher = "torchrun" if "RANK" in os.environ else "mpirun" if hccl_sim.torch.mpi_launch.launched() else None
    if launcher:
        import torch.distributed as dist
        dist.init_process_group(backend="hccl_sim")
        log, params = train(args.steps, args.batch)
        world, rank = dist.get_world_size(), dist.get_rank()
        hccl_sim.torch.destroy_process_group()
        if rank == 0:
            report(log, world, f"{launcher} processes")
            if args.check:
                compare(log, params, args.steps, args.batch)
        return
    topo = hardware("atlas800t-a2", devices_per_server=[args.ranks])
    (log, params), *_ = hccl_sim.run(on_ray_rank, topology=topo, engine="ray", args=(args.steps, args.batch))
    report(log, topo.num_ranks, "Ray actors")
    if args.check:
        compare(log, params, args.steps, args.batch)


if __name__ == "__main__":
    main()
