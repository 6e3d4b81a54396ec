"""Data-parallel training of the MLP on one rank (`train_rank`, run on every rank by any engine),
and the single-process full-batch reference it must equal (`train_reference`).

A step: this rank's shard of the global batch forward (SyncBatchNorm statistics all-reduced),
softmax cross-entropy scaled by 1 / global batch (so the summed gradients are the batch mean's),
backward layer by layer with each gradient bucket all-reduced as soon as it is complete
(buckets.Reducer), then SGD with momentum once every bucket has arrived. Every kernel is charged
on the device roofline; the step's record says what compute and communication took, how much
communication was exposed (the step's time beyond its compute) and the loss terms of this shard.

Elastic recovery (Horovod-elastic style): parameters, momentum and BatchNorm statistics are
checkpointed every `checkpoint_every` steps; when a collective fails because a rank of the
communicator was lost (a crash), the survivors shrink the communicator, restore the last
checkpoint, and carry on from its step, re-sharding the same global batches among themselves.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from topologies.errors import HcclError

from . import buckets as bk
from .data import CLASSES, FEATURES, Batches, load_digits, shard
from .layers import MLP, loss_cost, softmax_cross_entropy
from .sync import Sync


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 20
    batch: int = 256                 # global batch, split among the ranks
    hidden: int = 1024
    depth: int = 2
    lr: float = 0.1
    momentum: float = 0.9
    bucket_mb: float | None = 25.0   # None: one bucket for every gradient (no overlap)
    algo: str | None = None
    seed: int = 0
    checkpoint_every: int = 5
    trace_step: int | None = None    # the step whose kernels and collectives are kept for a trace
    keep_params: bool = False        # return the final parameters (tests compare them)

    def __post_init__(self):
        for name in ("steps", "batch", "hidden", "depth", "checkpoint_every"):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                raise HcclError("E_PARA", f"{name} must be an integer >= 1, got {v!r}")
        for name in ("lr", "momentum"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not np.isfinite(v) or v < 0:
                raise HcclError("E_PARA", f"{name} must be a finite number >= 0, got {v!r}")
        if self.bucket_mb is not None and not (isinstance(self.bucket_mb, (int, float)) and self.bucket_mb > 0):
            raise HcclError("E_PARA", f"bucket_mb must be a number > 0 (MiB) or None, got {self.bucket_mb!r}")

    @property
    def bucket_cap(self):
        return None if self.bucket_mb is None else max(1, int(self.bucket_mb * bk.MIB))


@dataclass
class StepRecord:
    step: int
    ranks: int                       # the communicator's size in this step
    loss: float                      # mean over the global batch (every rank has it)
    accuracy: float                  # of the global batch, before the step's update
    start: int                       # simulated ns
    end: int
    compute_ns: int
    comm_ns: int
    retries: int
    wall_s: float
    launches: list = field(default_factory=list)   # (bucket, ns its gradients were ready)
    ops: list = field(default_factory=list)        # (collective, start, end)
    algos: list = field(default_factory=list)      # the algorithms that ran them


@dataclass
class RankResult:
    rank: int
    steps: list
    events: list                     # what happened besides steps (a recovery)
    digest: str                      # of the final parameters: equal on every rank
    accuracy: float                  # of the final model on the whole data set (running statistics)
    buckets: list                    # bytes per bucket
    trace: list = field(default_factory=list)      # (stream, name, start, end) of trace_step
    params: dict | None = None


class _Model:
    """The MLP with its optimizer state, a checkpoint of both, and the step's computation."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.net = MLP(FEATURES, cfg.hidden, CLASSES, depth=cfg.depth, seed=cfg.seed)
        self.params = self.net.parameters()
        self.velocity = [np.zeros_like(layer.params[key]) for _, layer, key in self.params]

    def nbytes(self) -> int:
        return sum(layer.params[key].nbytes for _, layer, key in self.params)

    def checkpoint(self, step: int) -> dict:
        return {"step": step,
                "params": [layer.params[key].copy() for _, layer, key in self.params],
                "velocity": [v.copy() for v in self.velocity],
                "state": [layer.state() for layer in self.net.layers]}

    def restore(self, ckpt: dict) -> int:
        for (_, layer, key), value in zip(self.params, ckpt["params"]):
            layer.params[key] = value.copy()
        self.velocity = [v.copy() for v in ckpt["velocity"]]
        for layer, state in zip(self.net.layers, ckpt["state"]):
            layer.load_state(state)
        return ckpt["step"]

    def step(self, x, y, global_batch: int, sync: Sync, reducer) -> tuple:
        """One training step on this shard; (loss sum, correct) over the whole global batch."""
        n = len(y)
        h = x
        for layer in self.net.layers:
            (flops, nbytes), _ = layer.cost(n)
            sync.kernel(f"{layer.name}.forward", flops, nbytes)
            h = layer.forward(h, sync)
        (lf, lb), (bf, bb) = loss_cost(n, CLASSES)
        sync.kernel("loss.forward", lf, lb)
        loss_sum, grad, correct = softmax_cross_entropy(h, y, 1.0 / global_batch)
        sync.kernel("loss.backward", bf, bb)
        reducer.reset()
        for layer in reversed(self.net.layers):
            _, (flops, nbytes) = layer.cost(n)
            sync.kernel(f"{layer.name}.backward", flops, nbytes)
            grad = layer.backward(grad, sync)
            if layer.params:
                reducer.ready(layer)
        reducer.finish()
        # the batch's loss and accuracy for the log, summed over ranks as a training script's
        # all_reduce(loss) does; on the comm stream, overlapping the optimizer
        metrics = sync.all_reduce_async(np.array([loss_sum, correct], dtype=np.float64), "metrics")
        total = 0
        mu, lr = np.float32(self.cfg.momentum), np.float32(self.cfg.lr)
        for i, (_, layer, key) in enumerate(self.params):
            v = self.velocity[i]
            v *= mu
            v += layer.grads[key]
            layer.params[key] -= lr * v
            total += v.size
        sync.kernel("sgd", 3 * total, 5 * total * 4)
        loss_sum, correct = sync.wait(metrics)
        return float(loss_sum), int(correct)

    def accuracy(self, x, y) -> float:
        """The final model on (x, y) in evaluation mode (BatchNorm's running statistics)."""
        h = x
        for layer in self.net.layers:
            if hasattr(layer, "running_mean"):
                invstd = 1.0 / np.sqrt(layer.running_var + layer.EPS)
                h = (h - layer.running_mean) * invstd * layer.params["weight"] + layer.params["bias"]
            elif layer.params:
                h = h @ layer.params["weight"] + layer.params["bias"]
            else:
                h = np.maximum(h, 0)
        return float((h.argmax(axis=1) == y).mean())

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=12)
        for _, layer, key in self.params:
            h.update(np.ascontiguousarray(layer.params[key]).tobytes())
        return h.hexdigest()


def train_rank(comm, cfg: TrainConfig) -> RankResult:
    """Runs on every rank of `comm` (hccl_sim.run(train_rank, args=(cfg,), engine=...))."""
    x_all, y_all = load_digits()
    batches = Batches(len(y_all), cfg.batch, cfg.seed)
    if cfg.batch < comm.size:
        raise HcclError("E_PARA", f"batch {cfg.batch} is smaller than the {comm.size} ranks: every rank needs "
                        "a sample", rank=comm.rank)
    model = _Model(cfg)
    sync = Sync(comm, cfg.algo)
    reducer = bk.Reducer(model.params, cfg.bucket_cap, sync)
    records, events, trace = [], [], []
    ckpt = None
    step = 0
    while step < cfg.steps:
        if step % cfg.checkpoint_every == 0 and (ckpt is None or ckpt["step"] != step):
            sync.host_copy("checkpoint", 2 * model.nbytes())
            ckpt = model.checkpoint(step)
        idx = shard(batches.indices(step), comm.rank, comm.size)
        sync.new_step()
        start, wall = sync.now(), time.perf_counter()
        try:
            loss_sum, correct = model.step(x_all[idx], y_all[idx], cfg.batch, sync, reducer)
        except HcclError as exc:
            if not comm.lost_ranks:
                raise
            comm, resumed = _recover(comm, exc, model, ckpt, sync, step, events)
            reducer = bk.Reducer(model.params, cfg.bucket_cap, sync)
            step = resumed
            continue
        end = sync.now()
        records.append(StepRecord(step, comm.size, loss_sum / cfg.batch, correct / cfg.batch, start, end,
                                  sync.compute_ns, sync.comm_ns, sync.retries, time.perf_counter() - wall,
                                  list(reducer.launches), list(sync.ops), sorted(sync.algos)))
        if step == cfg.trace_step:
            trace = _stream_tasks(comm, sync, start, end)
        step += 1
    return RankResult(comm.rank, records, events, model.digest(), model.accuracy(x_all, y_all),
                      list(reducer.bucket_bytes), trace,
                      {name: layer.params[key].copy() for name, layer, key in model.params} if cfg.keep_params
                      else None)


def _recover(comm, exc, model, ckpt, sync, step, events):
    """A rank of `comm` was lost: the survivors' communicator, the checkpoint restored."""
    failed_at = comm.clock
    lost = sorted(comm.lost_ranks)
    wall = time.perf_counter()
    survivors = comm.shrink()
    sync.rebind(survivors)
    resumed = model.restore(ckpt)
    events.append({"kind": "recovered", "step": step, "lost_ranks": lost, "error": exc.code,
                   "detected_ns": failed_at, "shrink_ns": survivors.last_op.end - survivors.last_op.start,
                   "resumed_at_ns": sync.now(), "resumed_step": resumed, "ranks": survivors.size,
                   "rank": survivors.rank, "wall_s": time.perf_counter() - wall})
    return survivors, resumed


def _stream_tasks(comm, sync, start, end) -> list:
    """(stream, name, start, end) of the step's kernels and collectives, a collective named for
    what it carried (bucket0, bn1.stats, ...)."""
    purpose = {(s, e): name for name, s, e in sync.ops}
    out = []
    for label, stream in (("compute", sync.compute), ("comm", sync.comm_stream)):
        out += [(label, purpose.get((s, e), name), s, e) for name, s, e in stream.tasks if s >= start and e <= end]
    return out


def train_reference(cfg: TrainConfig) -> dict:
    """Single-process training on the whole global batch: the losses and final parameters that
    data-parallel training on any number of ranks must reproduce (to float rounding)."""
    x_all, y_all = load_digits()
    batches = Batches(len(y_all), cfg.batch, cfg.seed)
    model = _Model(cfg)
    sync = Sync(None)
    reducer = bk.Reducer(model.params, cfg.bucket_cap, sync)
    losses = []
    for step in range(cfg.steps):
        idx = batches.indices(step)
        loss_sum, _ = model.step(x_all[idx], y_all[idx], cfg.batch, sync, reducer)
        losses.append(loss_sum / cfg.batch)
    return {"losses": losses, "params": {name: layer.params[key].copy() for name, layer, key in model.params},
            "accuracy": model.accuracy(x_all, y_all)}
