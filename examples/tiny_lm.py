"""The small decoder-only transformer the torch parallelism examples train, its data, and its
one-process reference (the same model on each step's whole batch), which every example's
distributed run must equal within float rounding.

Attention has separate q, k, v and output projections and the MLP an up and a down projection,
so tensor parallelism can split them as Megatron does (q, k, v and up by columns, the output and
down projections by rows); the block reads its head count from its q projection's width, which is
the local share under tensor parallelism.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, DIM, HEADS, LAYERS, SEQ = 128, 64, 8, 2, 16
HEAD_DIM = DIM // HEADS
LR = 0.5


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(DIM, DIM) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        heads = self.q(x).shape[-1] // HEAD_DIM        # this rank's heads
        q, k, v = (f(x).view(b, s, heads, HEAD_DIM).transpose(1, 2) for f in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, heads * HEAD_DIM))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """A pre-norm decoder block: causal self-attention and a GELU MLP."""

    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, layers=LAYERS):
        super().__init__()
        self.embed, self.pos = nn.Embedding(VOCAB, DIM), nn.Parameter(torch.zeros(SEQ, DIM))
        self.blocks = nn.ModuleList(Block() for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def model_and_data(steps, batch, layers=LAYERS):
    """The model (seeded) and every step's batch of token sequences."""
    torch.manual_seed(0)
    model = TinyLM(layers)
    tokens = torch.randint(0, VOCAB, (steps, batch, SEQ + 1), generator=torch.Generator().manual_seed(1))
    return model, tokens


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


def reference(steps, batch, layers=LAYERS):
    """The same model trained by SGD in one process on each step's whole batch: losses, parameters."""
    model, tokens = model_and_data(steps, batch, layers)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        loss = lm_loss(model, tokens[step])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


def compare(losses, params, steps, batch, layers=LAYERS) -> tuple:
    """How far a distributed run's losses and full final parameters are from the reference's;
    printed and returned."""
    want_losses, want = reference(steps, batch, layers)
    worst_loss = max(abs(a - b) for a, b in zip(losses, want_losses))
    worst_param = max(float((params[k] - want[k]).abs().max()) for k in want)
    print(f"# against one process on the whole batch: losses within {worst_loss:.2e}, parameters within "
          f"{worst_param:.2e}")
    return worst_loss, worst_param


def full_parameters(model) -> dict:
    """Every parameter whole (a DTensor's full tensor), by name."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


def on_ray(module):
    """Let Ray's rank actors unpickle this module and `module` by value (examples/ is not on their
    path when a script runs them)."""
    import sys
    import ray.cloudpickle
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    if module.__name__ != "__main__":
        ray.cloudpickle.register_pickle_by_value(module)


class Recorder:
    """The collectives each step ran on each named group (a mesh dimension, or "world" for the
    default group): (dimension, op, HCCL algorithm, simulated s) since the last `mark()`."""

    def __init__(self, groups: dict):
        import torch.distributed as dist
        self.groups, self.marks, ids = {}, {}, set()
        for dim, pg in groups.items():             # a mesh dimension over every rank is the world group
            pg = dist.group.WORLD if pg is None else pg
            if id(pg) not in ids:
                ids.add(id(pg))
                self.groups[dim] = pg
        self.mark()

    def mark(self):
        import hccl_sim.torch
        self.marks = {dim: len(hccl_sim.torch.records(pg)) for dim, pg in self.groups.items()}

    def since(self) -> list:
        import hccl_sim.torch
        return [(dim, r.name, r.algo, r.time) for dim, pg in self.groups.items()
                for r in hccl_sim.torch.records(pg)[self.marks[dim]:]]


def train_steps(model, tokens, rows: slice, rec, trace=None) -> list:
    """SGD steps of a distributed model on `rows` of each step's batch: per step (the loss's mean
    over the ranks, the step's collectives from `rec`, wall s, its simulated Step: time, compute,
    exposed communication). The steps run on the rank's device timeline (hccl_sim.torch.timeline:
    every kernel priced on the 910B's roofline, each group's collectives on a stream of its own).
    `trace`: rank 0 writes its last step's communication there (hccl_sim.torch.export_trace, for
    `hccl-sim replay`)."""
    import time
    import torch.distributed as dist
    import hccl_sim.torch
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    log = []
    with hccl_sim.torch.timeline() as timeline:
        for step in range(tokens.shape[0]):
            rec.mark()
            timeline.mark()
            wall = time.perf_counter()
            loss = lm_loss(model, tokens[step, rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
            log.append((float(mean), rec.since(), time.perf_counter() - wall, timeline.since()))
    if trace and dist.get_rank() == 0:
        hccl_sim.torch.export_trace(trace, rec.groups, since=rec.marks)
    return log


def report(log, world, title):
    """Per step: the loss; the simulated step time, its compute (kernels, FLOPs) and exposed
    communication; the collectives by mesh dimension with HCCL's algorithm and the simulated
    time each dimension's ran; and the wall time."""
    from collections import Counter, defaultdict
    print(f"# {title} on {world} emulated 910B ranks, backend hccl_sim")
    print("# simulated time on rank 0: kernels on the 910B roofline (peak FLOPs a third-party figure, unverified), "
          "each group's collectives on its own stream")
    for step, (loss, ops, wall, sim, *_) in enumerate(log):
        kinds = Counter(f"{dim}: {name} ({algo})" for dim, name, algo, _ in ops)
        per_dim = defaultdict(float)
        for dim, _, _, t in ops:
            per_dim[dim] += t
        comm = ", ".join(f"{dim} {t * 1e6:.1f} us" for dim, t in per_dim.items())
        print(f"  step {step}: loss {loss:.4f}; simulated step {sim.time / 1e3:.1f} us = compute "
              f"{sim.compute / 1e3:.1f} us ({sim.kernels} kernels, {sim.flops / 1e6:.1f} MFLOP) + exposed comm "
              f"{sim.exposed / 1e3:.1f} us; comm {comm}; wall {wall * 1e3:.1f} ms")
        print("    " + "; ".join(f"{n}x {k}" for k, n in sorted(kinds.items())))


def launch(train, title, args, here, compare_lm=True, layers=LAYERS):
    """Run `train(steps, batch)` (it returns (per-step log, full parameters)) where the script was
    started: under torchrun or mpirun, in this process as one rank; else on `args.ranks` Ray
    actors (one 910B server). Rank 0's log is reported; with `args.check` (and `compare_lm`) the
    run is compared with this module's one-process reference (of `layers` blocks; None: as many
    as ranks). Returns (log, parameters, ranks),
    the first two None on every launched process but rank 0's."""
    import os
    import hccl_sim.torch
    from topologies import hardware
    # MPI's first: importing hccl_sim.torch under mpirun sets RANK as torchrun would
    launcher = "mpirun" if hccl_sim.torch.mpi_launch.launched() else "torchrun" if "RANK" in os.environ else None
    if launcher:
        import torch.distributed as dist
        dist.init_process_group(backend="hccl_sim")
        log, params = train(args.steps, args.batch)
        # each rank's result when hccl_sim.torch.launch runs the script (a fault suite's oracle)
        hccl_sim.torch.report({"losses": [entry[0] for entry in log], "params": params})
        world, rank = dist.get_world_size(), dist.get_rank()
        hccl_sim.torch.destroy_process_group()
        if rank != 0:
            return None, None, world
        how = f"{launcher} processes"
    else:
        on_ray(here)
        topo = hardware("atlas800t-a2", devices_per_server=[args.ranks])
        (log, params), *_ = hccl_sim.run(on_ray_rank, topology=topo, engine="ray", args=(train, args.steps, args.batch))
        world, how = topo.num_ranks, "Ray actors"
    report(log, world, f"{title} ({how})")
    if args.check and compare_lm:
        blocks = world if layers is None else layers
        compare([entry[0] for entry in log], params, args.steps, args.batch, blocks)
    return log, params, world


def on_ray_rank(comm, train, steps, batch):
    """One Ray rank of an example: its process group on `comm`, then `train`."""
    import hccl_sim.torch
    hccl_sim.torch.init_process_group(comm)
    try:
        return train(steps, batch)
    finally:
        hccl_sim.torch.destroy_process_group()
