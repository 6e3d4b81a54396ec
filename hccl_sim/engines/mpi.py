"""The MPI engine: ranks are MPI processes under mpirun/mpiexec (or `ranks_per_process` threads of
each), every process running the same program (SPMD).

Placement: emulated rank r lives on MPI process r // k, as thread r % k (k = ranks_per_process),
so ranks of one server share a process or neighbouring ones; the topology (a preset, or a rank
table whose servers and devices are taken in order) must have exactly (MPI world size) x k ranks,
else an HcclError names both numbers.

Each rank's Group is a PeerGroup (engines/peer_group.py): the world communicator's rendezvous is
one MPI allgather per op (hcomm.control.mpi), or, for a job of one node with a rank per process
and no rank_crash in its fault plan, one round of a shared-memory control block (as Ray's ranks
of a node meet: waiting ranks sleep on a futex instead of polling MPI); every rank plans the op
itself, small ops are eager (their inputs travel in that round), larger ones run the per-rank
executor over the MPI transport (hcomm.transports.mpi: Isend/Irecv on numpy buffers; data plane "p2p") or the
central data program on MPI-3 shared-memory windows among the ranks of one node
(hcomm.exec.shared_plane over hcomm.memory.window_provider; data plane "window"); split/shrink sub-communicators run over scoped views
of the transport ("p2p"). With no `data_plane` given the job picks, as the Ray engine does from
where its actors landed: "window" when every process of the job is on one node, else "p2p"
(`default_plane`, the same answer on every process); `data_plane=` forces either.

`run_mpi` (hccl_sim.run(..., engine="mpi"), called by every process) returns every rank's result
on every process; a rank that raises makes every rank fail with the same HcclError (the root
cause: the earliest error that is not a consequence of another's), never a hang.
`init` (hccl_sim.init) gives the process its Communicator(s) for a plain MPI program; the job
closes when the program exits.

A fault plan's rank_crash (comm/rank_group.py's `die` / `execute_lost`) stops the rank, not its
process: an MPI process that ends without MPI_Finalize takes the whole job down (MPICH's and Open
MPI's default error handling). The dead rank moves the data of the steps it runs before it dies,
as on the Ray engine, then stops taking part: its endpoint goes (what reaches it is dropped,
never acknowledged), every process is told it is lost (the transport's LOST frame, as a closed
connection tells the peers on Ray's socket plane), and its slot in every later control round is a
LOST marker. Survivors waiting for it fail at once and get the planned E_TIMEOUT at the simulated
time every engine gives; they can comm.shrink() and go on. Its run() result is None on every
process; under `init` its call raises RankCrashed (a BaseException) as on the local engine.
"""
from __future__ import annotations

import atexit
import pickle
import threading
import time
import traceback


from hcomm.control.mpi import HostBlockControl, MpiControl, host_block
from hcomm.transports.mpi import MpiHub, MpiTransport, require_thread_level
from topologies.errors import HcclError

from ..comm.communicator import Communicator  # noqa: F401 - the type MpiJob.communicator returns
from ..faults.fault_plan import RankCrashed
from ..npu.device import storage_in_use
from . import rendezvous as rdv
from .bootstrap import communicator, start_runtime
from .peer_group import PeerGroup
from .registry import ENGINES

PLANES = ENGINES["mpi"].data_planes     # "window", "p2p": the registry's names (comm.data_plane)


def world():
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise HcclError("E_NOT_SUPPORT", f"engine mpi needs mpi4py (pip install mpich mpi4py): {exc}") from None
    return MPI.COMM_WORLD


def check_placement(topo, nprocs: int, k) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise HcclError("E_PARA", f"ranks_per_process must be a positive int, got {k!r}")
    if topo.num_ranks != nprocs * k:
        raise HcclError("E_PARA", f"the topology has {topo.num_ranks} ranks but the MPI job has {nprocs} processes "
                        f"x {k} ranks per process = {nprocs * k} (mpiexec -n {topo.num_ranks // k if topo.num_ranks % k == 0 else '?'}"
                        f" for this topology)")
    return k


def default_plane(comm=None) -> str:
    """The MPI engine's data plane when none is named: "window" (MPI-3 shared-memory windows) when
    every process of `comm` (default the world) shares one node, else "p2p" (Isend/Irecv).
    Collective (`one_node`)."""
    return "window" if one_node(world() if comm is None else comm) else "p2p"


def one_node(comm) -> bool:
    """Whether every process of `comm` shares one node. Collective (a split of `comm` by node,
    MPI_COMM_TYPE_SHARED), and every process gets the same answer: the node groups partition the
    job, so one of them is the whole job for all or for none."""
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.Get_size() == comm.Get_size()
    finally:
        node.Free()


RESULT_POOL_BYTES = 1 << 20
"""Results at least this large come from a per-rank pool (the windows', or host arrays on the p2p
plane), reused once user code has dropped them: a fresh 64 MiB array costs 16,384 page faults on
its first write, every op."""


class MpiSubGroup(PeerGroup):
    """A sub-communicator's group on the MPI engine: PeerGroup's, its data by the per-rank executor
    over a scoped view of the MPI transport (on either world plane). A rank the fault plan crashes
    stops taking part (MpiJob.crash); its process lives on."""
    engine = "mpi"

    def __init__(self, rank, topo, config, control, transport, job):
        super().__init__(rank, topo, config, control, transport)
        self.job = job

    def _end_rank(self, rank) -> None:
        world_rank = self.transport.world_rank(rank)
        self.job.crash(world_rank, f"rank {world_rank} crashed (fault plan)")

    def _subgroup(self, sub_rank, topo, config, control, transport):
        return MpiSubGroup(sub_rank, topo, config, control, transport, self.job)


class MpiGroup(MpiSubGroup):
    """One rank's world group on the MPI engine (data plane "p2p" or "window": the job's; on
    "window", the shared plane over the job's WindowProvider)."""

    pooled_result_bytes = RESULT_POOL_BYTES

    def __init__(self, rank, topo, config, control, transport, job):
        super().__init__(rank, topo, config, control, transport, job)
        self.ranks_per_process = job.k
        if job.memory is not None:
            self._use_shared_plane(job.memory, local=rank - job.memory.base, pooled_result_bytes=RESULT_POOL_BYTES)


class MpiJob:
    """One process's part of an MPI job: the hub, the control plane, its ranks' groups.
    `data_plane`: "window", "p2p", or None for `default_plane` (window when the job is on one
    node); the chosen one is `data_plane`, the same on every process."""

    def __init__(self, topo, config, ranks_per_process: int = 1, comm=None, data_plane: str | None = None):
        comm = world() if comm is None else comm
        if data_plane is not None and data_plane not in PLANES:
            raise HcclError("E_PARA", f"data_plane {data_plane!r}: expected one of {', '.join(PLANES)} (engine mpi)")
        self.k = check_placement(topo, comm.Get_size(), ranks_per_process)
        require_thread_level(self.k)
        here = one_node(comm)
        plane = data_plane or ("window" if here else "p2p")
        self.topo, self.config, self.data_plane = topo, config, plane
        self.hub = MpiHub(comm, topo.num_ranks, self.k, config.wait_timeout_s)
        self.control = MpiControl(self.hub, config.wait_timeout_s)
        # one node, a rank per process, no rank the fault plan crashes (its process lives on, and
        # only MPI's rounds carry its LOST marker): the ranks meet in a shared-memory block
        crashes = config.faults is not None and config.faults.crashes
        self.block, self._block_owner = host_block(comm, topo.num_ranks) if here and self.k == 1 and not crashes \
            else (None, None)
        self.memory = None             # the window plane's WindowProvider
        if plane == "window":
            from hcomm.memory.window_provider import WindowProvider
            try:
                self.memory = WindowProvider(self.hub, topo.device_model.hbm_bytes)
            except HcclError:          # every process fails alike (the windows are collective): end the job's MPI
                self.hub.close(rdv.deadline(config))
                self._close_block()
                raise
        view = self.control.view if self.block is None else (lambda r: HostBlockControl(self.block, self.hub))
        self.groups = {r: MpiGroup(r, topo, config, view(r), MpiTransport(self.hub, r), self)
                       for r in self.hub.local_ranks()}
        self.runtimes = {}
        self._finished = set()
        self.crashed = set()           # this process's ranks the fault plan crashed
        self._lock = threading.Lock()
        self.closed = False

    def communicator(self, rank: int) -> Communicator:
        # device arrays in the HBM window (window plane): collectives on them copy nothing in
        storage = None if self.memory is None else self.memory.device_storage(rank)
        runtime = self.runtimes[rank] = start_runtime(rank, self.topo, storage)
        return communicator(rank, self.groups[rank], runtime)

    def finish(self, rank: int, exc: BaseException | None = None) -> None:
        """Rank `rank` is done: returned (exc None) or raised `exc`; its peers are told."""
        with self._lock:
            if rank in self._finished:
                return
            self._finished.add(rank)
        group = self.groups[rank]
        if exc is None:
            group.exit(rank)
        else:
            try:
                group.fail(rank, exc)
            except HcclError:
                pass            # the job is closing or already aborted: peers know
        if self.block is not None:
            self.block.leave()       # ranks still waiting for this one learn it has returned
        else:
            self.control.finish(rank - self.control.base, None if exc is None else rdv.describe_failure(exc))

    def crash(self, rank: int, reason: str) -> None:
        """Rank `rank` of this process dies (a fault plan's rank_crash) but its process goes on:
        it takes no more calls, its endpoint goes, and every rank of the job takes it for lost."""
        with self._lock:
            if rank in self._finished:
                return
            self._finished.add(rank)
            self.crashed.add(rank)
        self.hub.lose(rank, reason)
        self.control.finish(rank - self.control.base, None, lost=reason)

    def close(self, blob: bytes = b"") -> list:
        """Finish every rank still open, even out and end the job's MPI traffic; every
        process's `blob`, in process order."""
        for r in self.groups:
            self.finish(r)
        try:
            if self.memory is not None:
                held = storage_in_use(self.memory.hbm_arrays(), list(self.runtimes.values()))
                self.memory.close(rdv.deadline(self.config), held)
            self.closed = True
            return self.hub.close(rdv.deadline(self.config), blob)
        finally:     # after the hub's closing exchange: every process has attached and left
            self._close_block()

    def _close_block(self) -> None:
        for handle in (self.block, self._block_owner):
            if handle is not None:
                handle.close()


# ---- hccl_sim.run(engine="mpi") --------------------------------------------------------------------

def outcome_of(rank, exc) -> dict:
    """A failed rank's outcome as every process gets it: plain values, the HcclError's fields with them."""
    if isinstance(exc, HcclError):
        return {"rank": rank, "ok": False, "code": exc.code, "reason": exc.reason, "op": exc.op, "at": time.time(),
                "fields": exc.fields()}
    return {"rank": rank, "ok": False, "code": "E_INTERNAL", "reason": f"{type(exc).__name__}: {exc}", "op": None,
            "at": time.time(), "traceback": traceback.format_exc(limit=8), "fields": {}}


def error_of(o) -> HcclError:
    """The HcclError of a failed rank's outcome (outcome_of), every field of it."""
    return HcclError(o["code"], o["reason"], rank=o["rank"], op=o["op"], **o.get("fields", {}))


def run_mpi(fn, topo, config, args=(), kwargs=None, ranks_per_process: int = 1, data_plane: str | None = None):
    """Every process calls it: fn(comm, *args, **kwargs) on each of its ranks; every rank's result,
    by rank, on every process (results are gathered as pickles: they are Python objects).
    `data_plane` None: the job's default (MpiJob)."""
    kwargs = kwargs or {}
    job = MpiJob(topo, config, ranks_per_process, data_plane=data_plane)
    local = list(job.groups)
    outcomes = {}

    def body(rank):
        try:
            comm = job.communicator(rank)
            value = fn(comm, *args, **kwargs)
            outcomes[rank] = {"rank": rank, "ok": True, "value": value}
            job.finish(rank)
        except RankCrashed as dead:    # the fault plan killed it: its result is None everywhere
            outcomes[rank] = {"rank": rank, "ok": True, "value": None}
            job.crash(rank, str(dead))
        except BaseException as exc:   # noqa: BLE001 - reported to every process below
            outcomes[rank] = outcome_of(rank, exc)
            outcomes[rank]["exc"] = exc
            job.finish(rank, exc)

    if len(local) == 1:
        body(local[0])
    else:
        threads = [threading.Thread(target=body, args=(r,), name=f"hccl-rank-{r}", daemon=True) for r in local]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    mine = []
    for r in local:
        o = {k: v for k, v in outcomes[r].items() if k != "exc"}
        try:
            pickle.dumps(o, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:   # noqa: BLE001 - an unpicklable result is that rank's error
            o = outcome_of(r, HcclError("E_PARA", f"fn's result cannot be sent to the other processes "
                                      f"(pickle: {type(exc).__name__}: {exc})", rank=r))
        mine.append(o)
    blobs = job.close(pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL))
    every = [o for b in blobs for o in pickle.loads(b)]
    failed = [o for o in every if not o["ok"]]
    if failed:
        _, err, _, root = rdv.root_cause([(o["rank"], error_of(o), o["at"], o) for o in failed])
        if root.get("traceback"):
            err.remote_traceback = root["traceback"]
        cause = outcomes.get(root["rank"], {}).get("exc")
        raise err from cause
    return [o["value"] for o in every]


# ---- hccl_sim.init -----------------------------------------------------------------------------------

_JOBS = []


def init_mpi(topo, config, ranks_per_process: int = 1, data_plane: str | None = None):
    """This process's Communicator (a list of its k Communicators with ranks_per_process=k, each to
    be driven by a thread of its own); the job closes at interpreter exit (or finalize()).
    `data_plane` None: the job's default (MpiJob)."""
    job = MpiJob(topo, config, ranks_per_process, data_plane=data_plane)
    if not _JOBS:
        atexit.register(finalize)
    _JOBS.append(job)
    comms = [job.communicator(r) for r in job.groups]
    return comms[0] if len(comms) == 1 else comms


def launch_world(topo, config, data_plane: str | None = None):
    """(this process's one Communicator, a function that closes its job) for a launched script's
    world (hccl_sim.torch under mpirun: every process calls the function at
    destroy_process_group)."""
    comm = init_mpi(topo, config, data_plane=data_plane)
    job = _JOBS[-1]
    return comm, lambda: close_job(job)


def close_job(job) -> None:
    """Close one job init() opened, before the interpreter exits (every process calls it for the
    same job: hccl_sim.torch's destroy_process_group)."""
    if job in _JOBS:
        _JOBS.remove(job)
    if not job.closed:
        job.close()


def finalize() -> None:
    """Close every job init() opened in this process (every process calls it, or exits)."""
    while _JOBS:
        job = _JOBS.pop(0)
        if not job.closed:
            job.close()
