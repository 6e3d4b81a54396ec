"""hccl-sim: an emulator of Huawei's HCCL/hcomm collective-communication stack.

Run real collectives on real numpy data among emulated NPU ranks, get correct results, and learn
how long each op would take on a modelled Ascend cluster.

    import numpy as np, hccl_sim
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    def step(comm, n):
        y = comm.all_reduce(np.full(n, comm.rank + 1, dtype=np.float32))
        return y, comm.last_op
    results = hccl_sim.run(step, topology=topo, args=(1024,))
    est = hccl_sim.simulate("allreduce", 1 << 30, topology=topo, algo="ring")
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

import topologies
from topologies import Topology
from topologies.errors import HCCL_RESULT, Cause, HcclError
from topologies.validate import is_integer

from . import collectives
from .comm.communicator import Communicator, OpRecord
from .comm.p2p_calls import ANY_SOURCE, Request
from .config.env import Config
from .faults.hbm import starving_first_op
from .faults.progress import FaultProgress
from .faults.fault_plan import FaultPlan
from .npu.device import Allocator
from .plan.faulted import NEVER_NS, LinkSetupFailed, crash_in, with_faults
from .plan.planner import Signature, make_plan
from .config.types import ReduceOp, check_type, dtype_name, numpy_dtype, parse_reduce_op
from .engines import interception
from .engines import registry as _registry

__all__ = ["topology", "run", "init", "finalize", "simulate", "Cluster", "FaultPlan", "Communicator", "ANY_SOURCE", "Request", "ReduceOp", "HcclError", "HCCL_RESULT",
           "Topology", "Estimate", "OpRecord", "ENGINES", "busbw_factor", "MAX_LOCAL_RANKS",
           "MAX_ALLTOALL_RANKS", "Cause"]
__version__ = "0.1.0"

ENGINES = tuple(name for name, e in _registry.ENGINES.items() if {"run", "simulate"} & set(e.offers))
OPS = collectives.DATA_COLLECTIVES


def topology(spec, **params) -> Topology:
    """A preset ("atlas800t-a2", "atlas800-910a", "fullmesh", "ring") or an HCCL rank-table path."""
    return topologies.load(spec, **params)


def _topology(topology_arg) -> Topology:
    if isinstance(topology_arg, Topology):
        return topology_arg
    if topology_arg is None:
        return topologies.load("atlas800t-a2", servers=1)
    return topologies.load(topology_arg)


MAX_LOCAL_RANKS = 1024
"""Most ranks the local engine runs: one thread each (1,024 ranks start, do an AllReduce and
finish in about 4 s on two cores; 2,048 in 2-7 s). Larger clusters: `simulate` (payload-free, up
to topologies.MAX_RANKS)."""
MAX_ALLTOALL_RANKS = collectives.MAX_ALLTOALL_RANKS
"""Most ranks `simulate` prices an AlltoAll on: its p(p-1) blocks are each priced on their own
(2,048 ranks: 3 s, 1 GB here; 4,096: 10 s, 3.8 GB; 16,384 would need about 60 GB)."""


def _check_call(fn, args, kwargs, topo, engine):
    """Arguments of run/Cluster.run checked before any rank starts."""
    if not callable(fn):
        raise HcclError("E_PARA", f"run: fn must be callable as fn(comm, *args, **kwargs), got {type(fn).__name__}")
    if not isinstance(args, (tuple, list)):
        raise HcclError("E_PARA", f"run: args must be a tuple (or list) of positional arguments, got "
                        f"{type(args).__name__}")
    if kwargs is not None and not (isinstance(kwargs, dict) and all(isinstance(k, str) for k in kwargs)):
        raise HcclError("E_PARA", f"run: kwargs must be a dict of keyword arguments, got {type(kwargs).__name__}")
    _check_local_size(topo, engine)


def _check_local_size(topo, engine):
    if engine.in_process and topo.num_ranks > MAX_LOCAL_RANKS:
        raise HcclError("E_PARA", f"engine local: {topo.num_ranks} ranks are over the limit of {MAX_LOCAL_RANKS} "
                        "(hccl_sim.MAX_LOCAL_RANKS, one thread per rank); use hccl_sim.simulate for larger clusters")




def run(fn, topology=None, engine: str = "local", args=(), kwargs=None, env: dict | None = None,
        policy: str | None = None, address: str | None = None, faults=None, ranks_per_process: int = 1,
        data_plane: str | None = None):
    """Run fn(comm, *args, **kwargs) once on every rank; return the results indexed by rank.

    An exception on any rank releases the others and reaches the caller as an HcclError naming
    the rank (the original exception is its __cause__). `faults`: a FaultPlan the run meets.
    engine="mpi": every MPI process calls run (under mpiexec); each hosts `ranks_per_process`
    ranks (threads) and gets every rank's result; `data_plane` "window" (MPI-3 shared-memory
    windows, every process on one node; the default there) or "p2p" (Isend/Irecv; the default
    when the processes span nodes). Every engine's planes: README, "Engines".
    """
    eng = _registry.get(engine, "run")
    topo = _topology(topology)
    config = with_faults(topo, Config.from_env(env, policy), faults)
    _check_call(fn, args, kwargs, topo, eng)
    rpp = None if ranks_per_process == 1 else ranks_per_process

    def launch(f, cfg):
        return eng.launch(f, topo, cfg, args, kwargs, data_plane=data_plane, address=address, ranks_per_process=rpp)
    hook = interception.current()
    if hook is not None:
        if eng.spmd:
            raise HcclError("E_NOT_SUPPORT", f"a fault suite runs the engines whose ranks one call starts (local, "
                            f"ray), not {eng.name} (under mpiexec every process calls run)")
        return hook.run(interception.Run(fn, tuple(args), dict(kwargs or {}), topo, eng.name, faults,
                                         lambda plan: with_faults(topo, Config.from_env(env, policy), plan), launch))
    return launch(fn, config)


def init(topology=None, ranks_per_process: int = 1, env: dict | None = None, policy: str | None = None,
         faults=None, data_plane: str | None = None, **params):
    """Under mpirun/mpiexec, in every process: this process's Communicator on engine mpi (with
    ranks_per_process=k > 1, a list of its k Communicators, ranks p*k .. p*k+k-1, each to be
    driven by a thread of its own). `topology` as for run (a Topology, a preset name with its
    parameters such as servers=2, or a rank-table path whose servers and devices MPI ranks take
    in order); "fullmesh"/"ring" without ranks= get one rank per emulated slot of the job.
    `data_plane` as for run ("window" when every process is on one node, else "p2p"). The job
    ends when the program exits (or at hccl_sim.finalize())."""
    from .engines.mpi import init_mpi, world
    if isinstance(topology, str) and topology in ("fullmesh", "ring") and "ranks" not in params:
        params["ranks"] = world().Get_size() * ranks_per_process
    if params and not isinstance(topology, str):
        raise HcclError("E_PARA", f"init: {', '.join(sorted(params))} are parameters of a preset name, "
                        "not of a Topology or None")
    topo = topologies.load(topology, **params) if params else _topology(topology)
    config = with_faults(topo, Config.from_env(env, policy), faults)
    return init_mpi(topo, config, ranks_per_process, data_plane=data_plane)


def finalize() -> None:
    """End the MPI jobs init() opened in this process (called at exit anyway)."""
    from .engines.mpi import finalize as _finalize
    _finalize()


class Cluster:
    """A set of ranks kept across runs (`with Cluster(topo) as c: c.run(fn)`).

    With engine="ray" each rank is a Ray actor (joining the cluster at `address` or RAY_ADDRESS,
    else starting a local Ray) that keeps its device, runtime and shared memory across runs.
    `data_plane` is "shm" (every rank on one Ray node, the default there: shared-memory control
    and data), "socket" (the default when ranks span nodes: control and data peer to peer over
    TCP, each rank running its own schedule) or "object" (the same over Ray's object store); the
    chosen one is each rank's `comm.data_plane`. Every engine's planes: README, "Engines"."""

    def __init__(self, topology=None, engine: str = "local", env: dict | None = None, policy: str | None = None,
                 address: str | None = None, data_plane: str | None = None, faults=None):
        self.topology = _topology(topology)
        if engine in _registry.ENGINES and _registry.ENGINES[engine].spmd:
            raise HcclError("E_PARA", "Cluster keeps ranks of engine local or ray across runs; under mpiexec every "
                            "process calls hccl_sim.run(fn, engine='mpi') or hccl_sim.init()")
        self._engine = _registry.get(engine, "cluster", "Cluster")
        self.engine = self._engine.name
        self._env, self._policy, self._faults = env, policy, faults
        self.config = with_faults(self.topology, Config.from_env(env, policy), faults)
        _check_local_size(self.topology, self._engine)
        self._engine.check_plane(data_plane)
        self._data_plane = data_plane
        self._open = True
        self._ray = None
        if not self._engine.in_process:
            from .engines.ray import RayCluster
            self._ray = RayCluster(self.topology, self.config, address=address, data_plane=data_plane)

    def run(self, fn, args=(), kwargs=None, faults=None, env=None):
        """fn(comm, *args, **kwargs) on every rank; results by rank. `faults` (a FaultPlan) and
        `env` (HCCL variables) given here are this run's instead of the cluster's, on the same
        ranks (a chaos campaign's scenarios on one set of actors: starting them takes seconds)."""
        if not self._open:
            raise HcclError("E_IN_STATUS", "the cluster is closed")

        def config_for(plan):
            return with_faults(self.topology, Config.from_env(self._env if env is None else env, self._policy), plan)
        config = self.config if faults is None and env is None else config_for(self._faults if faults is None
                                                                               else faults)
        _check_call(fn, args, kwargs, self.topology, self._engine)

        def launch(f, cfg):
            if self._ray is not None:
                return self._ray.run(f, args=args, kwargs=kwargs, config=cfg)
            return self._engine.launch(f, self.topology, cfg, args, kwargs, data_plane=self._data_plane)
        hook = interception.current()
        if hook is not None:
            return hook.run(interception.Run(fn, tuple(args), dict(kwargs or {}), self.topology, self.engine,
                                             self._faults if faults is None else faults, config_for, launch,
                                             self.close if self._ray is not None else None))
        return launch(fn, config)

    @property
    def data_plane(self) -> str:
        """The data plane the cluster's runs use: ray's chosen (or forced) one, "central" on local."""
        return self._ray.data_plane if self._ray is not None else (self._data_plane or self._engine.data_planes[0])

    # what a cluster of processes (engine ray) is made of, for leak checks and tests of failures
    @property
    def session(self):
        """The name its ranks' shared-memory segments carry (hcomm.memory.segments), or None where
        ranks are threads."""
        return self._ray.session if self._ray is not None else None

    @property
    def pids(self) -> list:
        """Each rank's process id (a rank replaced after a crash has its new one)."""
        return list(self._ray.pids) if self._ray is not None else [os.getpid()] * self.topology.num_ranks

    @property
    def nodes(self) -> list:
        """Each rank's Ray node id (ranks of one node share memory), or None where ranks are threads."""
        return list(self._ray.node_of) if self._ray is not None else None

    def waiting(self, timeout_s: float = 30) -> list:
        """What each rank of a running job waits for now (e.g. "data from rank 3 (allreduce)"), or
        None for a rank that is not waiting: a hang's first clue. Engine ray (whose ranks keep a
        record of their waits for the driver); local runs hold the caller's thread."""
        if self._ray is None:
            raise HcclError("E_NOT_SUPPORT", "Cluster.waiting() reads the ranks of engine ray; engine local's ranks "
                            "are threads of the caller's run")
        return self._ray.waiting(timeout_s)

    @property
    def closed(self) -> bool:
        """Whether the cluster can no longer run: closed by its user, or (engine ray) by itself,
        after a rank it could not replace or a run that would not end; `run` then says why."""
        return not self._open or (self._ray is not None and self._ray.closed)

    def close(self):
        self._open = False
        if self._ray is not None:
            self._ray.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def busbw_factor(op: str, p: int) -> float:
    """nccl-tests' bus-bandwidth factor (PERFORMANCE.md)."""
    return collectives.get(op).busbw_factor(p)


@dataclass(frozen=True)
class Estimate:
    """A payload-free simulation of one op."""
    op: str
    nbytes: int
    count: int
    dtype: str
    algo: str
    ranks: int
    times: tuple          # every rank's simulated duration, s
    retries: int = 0      # op retries a link failure cost (fault plans)
    notes: tuple = ()     # what the fault machinery did (e.g. a backup NIC switched to)

    @property
    def time(self) -> float:
        """The op's makespan: the slowest rank's duration, s."""
        return max(self.times) if self.times else 0.0

    @property
    def mean_time(self) -> float:
        return sum(self.times) / len(self.times) if self.times else 0.0

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time / 1e9 if self.time else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * busbw_factor(self.op, self.ranks)


def canonical_op(op: str) -> str:
    return collectives.get(op).name


def op_count(op: str, nbytes: int, p: int, itemsize: int) -> int:
    """Element count of the op's buffer for a size in bytes (nccl-tests: block ops round to p)."""
    return collectives.get(op).count_for_bytes(nbytes, p, itemsize)


def _first_op(config, topo, entry):
    """What the fault progress gives the job's first op: on each rank an hbm_pressure entry may
    starve its link setup, beside the world communicator's CCL buffer."""
    progress = FaultProgress(config.faults)
    if not progress.pressures:
        return progress.before()
    free = topo.device_model.hbm_bytes - Allocator.rounded(2 * config.buffsize_bytes)
    return progress.before([progress.sent_by(r, {}, starving_first_op(config.faults, r, t, free))
                            for r, t in enumerate(entry)])


def simulate(op: str, nbytes: int | None = None, topology=None, algo: str | None = None, dtype="float32", redop="sum",
             root: int = 0, env: dict | None = None, trace: bool = False, policy: str | None = None, faults=None,
             counts=None):
    """Replay `op` on `nbytes` without payload and return an Estimate (`.time`, `.algo`, `.busbw`).

    The replay is vectorised over ranks (hcomm.vtiming): a 1 GiB AllReduce on 16,384 ranks takes
    about a second. `policy` picks the algorithm when neither `algo` nor HCCL_ALGO does: "hccl"
    (HCCL's own rules, the default) or "model" (the fastest by this timing model).

    `nbytes` is the op's size as nccl-tests counts it: the AllReduce/Broadcast/Reduce buffer, the
    whole AllGather output, the whole ReduceScatter input, the whole AlltoAll send buffer.
    `faults`: a FaultPlan; the op is the job's first (op index 0), entered at time 0 (an
    hbm_pressure that starves its link setup raises the starved rank's E_MEMORY).

    Variable-size ops take `counts` instead of `nbytes`, in elements, blocks laid out in rank
    order: alltoallv and alltoallvc the p x p matrix of what rank i sends rank j (their size: the
    largest send buffer); allgatherv and reducescatterv the p block counts (their size: the whole
    gathered output, the whole input).
    """
    topo = _topology(topology)
    name = canonical_op(op)
    dname = dtype_name(dtype)
    itemsize = numpy_dtype(dname).itemsize
    p = topo.num_ranks
    coll = collectives.get(name)
    shape, v = coll.simulated_size(nbytes, counts, p, itemsize)      # E_PARA on a bad size
    # the root is checked as the Communicator checks it (Collective.checked_root), for every rooted op
    if coll.rooted:
        root = coll.checked_root(root, p, where=f"simulate {name}")
    elif not is_integer(root):
        raise HcclError("E_PARA", f"simulate: root must be an integer rank, got {root!r} ({type(root).__name__})")
    if algo is not None and not isinstance(algo, str):
        raise HcclError("E_PARA", f"simulate: algo must be a string (an HCCL token or HCCL_ALGO string), "
                        f"got {algo!r} ({type(algo).__name__})")
    if not isinstance(trace, (bool, np.bool_)):
        raise HcclError("E_PARA", f"simulate: trace must be True or False, got {trace!r}")
    red = parse_reduce_op(redop).value if coll.reducing else None
    check_type(dname, topo.device_model.data_types, f"simulate {name}", red)
    sig = Signature(name, shape, dname, red, root if coll.rooted else None, algo, False, v)
    config = with_faults(topo, Config.from_env(env, policy), faults)
    entry = [0] * p if config.faults is None else [config.faults.straggle_ns(r, 0) for r in range(p)]
    if config.faults is not None and config.faults.stalls:      # a rank stalled before the op never enters it
        entry = [NEVER_NS if config.faults.stall_of(r, 0, t) else t for r, t in enumerate(entry)]
    now = None if config.faults is None else _first_op(config, topo, entry)
    try:
        plan = make_plan(sig, topo, config, entry, itemsize, trace=trace, faults_now=now)
    except LinkSetupFailed as exc:  # what the starved rank gets (its peers time out 140 s later)
        rank = exc.detail["starved"][0][0]
        raise exc.for_rank(rank, entry[rank]) from None
    if config.faults is not None and config.faults.crashes:
        crash = crash_in(config.faults, plan, 0, topo, config)
        if crash is not None:       # what the survivors get (the dead rank's own end is its crash)
            survivor = next(r for r in range(p) if r != crash[0]) if p > 1 else crash[0]
            raise config.faults.lost_error(crash, plan, config, survivor, name)[1]
    est = Estimate(name, plan.nbytes, plan.nbytes // itemsize, dname, plan.algo, p,
                   tuple(((np.asarray(plan.exits, dtype=np.int64) - np.asarray(plan.entry, dtype=np.int64)) / 1e9)
                         .tolist()), plan.retries, plan.notes)
    return (est, plan) if trace else est
