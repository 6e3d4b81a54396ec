"""`hccl-sim train`: its options (in the bench's style) and the command.

Runs training.trainer.train_rank on every rank of the chosen engine and prints the per-step
table (training.report); `--json`, `--plot` and `--trace` write the rest. Under `mpiexec -n N
hccl-sim train --engine mpi` every process trains its rank and receives every rank's result; rank 0
alone prints and writes the files, and a preset named without a size takes the job's N ranks.
"""
from __future__ import annotations

import contextlib
import time

from topologies.errors import HcclError

from ..engines import registry

TRAIN_ENGINES = registry.offering("train")


def add_parser(sub, add_topology_args):
    p = sub.add_parser("train", help="data-parallel training of an MLP on the UCI handwritten digits through hccl-sim")
    add_topology_args(p)
    p.add_argument("--engine", default="local", help=f"one of {', '.join(TRAIN_ENGINES)} (default local; mpi under mpiexec -n N)")
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument("--batch", type=int, default=256, help="global batch, split among the ranks (default 256)")
    p.add_argument("--hidden", type=int, default=1024, help="width of the hidden layers (default 1024)")
    p.add_argument("--depth", type=int, default=2, help="hidden layers, each Linear+SyncBatchNorm+ReLU (default 2)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (default 0.9)")
    p.add_argument("--bucket-mb", dest="bucket_mb", type=float, default=25.0,
                   help="DDP bucket cap in MiB (first bucket 1 MiB); 0: one bucket after backward, no overlap "
                        "(default 25)")
    p.add_argument("--algo", default=None, help="HCCL algorithm token or HCCL_ALGO string for every AllReduce")
    p.add_argument("--seed", type=int, default=0, help="initial weights and batch order (default 0)")
    p.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=5,
                   help="steps between checkpoints, restored after a crash (default 5)")
    p.add_argument("--env", action="append", metavar="HCCL_X=VALUE", help="set an HCCL environment variable")
    p.add_argument("--faults", default=None, metavar="PLAN.yaml", help="train under a fault plan (hccl_sim.FaultPlan "
                   "YAML): link faults are retried per HCCL_OP_RETRY_*, a crashed rank is shrunk away")
    p.add_argument("--json", default=None, metavar="FILE", help="write every step's loss and timings")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="plot the loss and each step's breakdown")
    p.add_argument("--trace", default=None, metavar="FILE", help="Chrome trace (Perfetto) of one step's streams")
    p.add_argument("--trace-step", dest="trace_step", type=int, default=None,
                   help="the step --trace shows (default 1, the first steady-state step)")
    return p


def one_blas_thread(engine: str):
    """On the local engine every rank is a thread of this process, on the MPI engine a process of
    this host: each rank's matrix products on a BLAS of its own threads would oversubscribe the
    cores (3x slower on 2 cores, 8 ranks). Ray's actors already run with OMP_NUM_THREADS=1."""
    if not (engine.in_process or engine.spmd):
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits
    return threadpool_limits(limits=1, user_api="blas")


def run_command(args, topology, env) -> int:
    import hccl_sim
    from ..faults.fault_plan import FaultPlan
    from . import report
    from .trainer import TrainConfig, train_rank
    engine = registry.get(args.engine, "train", f"--engine {args.engine!r}")
    if args.bucket_mb < 0:
        raise HcclError("E_PARA", f"--bucket-mb {args.bucket_mb:g}: a cap in MiB > 0, or 0 for one bucket")
    trace_step = None
    if args.trace:
        trace_step = 1 if args.trace_step is None else args.trace_step
        if not 0 <= trace_step < args.steps:
            raise HcclError("E_PARA", f"--trace-step {trace_step}: a step in [0, {args.steps})")
    elif args.trace_step is not None:
        raise HcclError("E_PARA", "--trace-step needs --trace FILE")
    cfg = TrainConfig(steps=args.steps, batch=args.batch, hidden=args.hidden, depth=args.depth, lr=args.lr,
                      momentum=args.momentum, bucket_mb=args.bucket_mb or None, algo=args.algo, seed=args.seed,
                      checkpoint_every=args.checkpoint_every, trace_step=trace_step)
    quiet = False
    if engine.spmd:
        from ..engines.mpi import world
        quiet = world().Get_rank() != 0      # every process gets every result; rank 0 reports them
        topo = _mpi_topology(args, topology, world().Get_size())
    else:
        topo = topology(args)
    if cfg.batch < topo.num_ranks:
        raise HcclError("E_PARA", f"--batch {cfg.batch} is smaller than the {topo.num_ranks} ranks")
    faults = None if args.faults is None else FaultPlan.load(args.faults)
    wall = time.perf_counter()
    with one_blas_thread(engine):
        results = hccl_sim.run(train_rank, topology=topo, engine=args.engine, args=(cfg,), env=env(args.env),
                               faults=faults)
    wall = time.perf_counter() - wall
    if quiet:
        return 0 if len({r.digest for r in results if r is not None}) == 1 else 1
    alive = [r for r in results if r is not None]
    from .layers import MLP
    nparams = MLP(64, cfg.hidden, 10, depth=cfg.depth).num_parameters()
    print(report.header(cfg, topo, args.engine, nparams, alive[0].buckets))
    rows = report.step_rows(results)
    for row in rows:
        print(report.format_row(row))
    print(report.footer(rows, results, wall))
    if args.json:
        report.write_json(args.json, cfg, topo, args.engine, rows, results)
        print(f"# steps written to {args.json}")
    if args.plot:
        report.write_plot(args.plot, rows)
        print(f"# plot written to {args.plot}")
    if args.trace:
        report.write_trace(args.trace, results, trace_step)
        print(f"# trace of step {trace_step} written to {args.trace}")
    return 0 if len({r.digest for r in alive}) == 1 else 1


def _mpi_topology(args, topology, nprocs: int):
    """Under mpiexec a preset named without its size (no --servers/--ranks) takes the job's ranks:
    a synthetic one that many, a hardware one its servers filled in order."""
    import topologies
    name = topologies.ALIASES.get(args.topology.lower(), args.topology.lower())
    if args.servers is None and args.ranks is None and args.superpods is None:
        if name in topologies.SYNTHETIC_PRESETS:
            args.ranks = nprocs
        elif name in topologies.HARDWARE_PRESETS:
            return topologies.presets.filled(name, nprocs)
    return topology(args)
