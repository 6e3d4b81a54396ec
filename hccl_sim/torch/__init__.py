"""torch.distributed over hccl-sim: importing this module registers the backend "hccl_sim".

Inside `hccl_sim.run(fn, engine="ray")` (a process per rank), `hccl_sim.torch.init_process_group(comm)`
makes that rank's communicator torch's default group; a plain script started by `torchrun` calls
`dist.init_process_group(backend="hccl_sim")` and its ranks find each other through torch's store
(hccl_sim.engines.torchrun), one started by `mpirun`/`mpiexec` the same call, its rank and world size
MPI's and its collectives on the MPI engine (hccl_sim.torch.mpi_launch), on the topology
HCCL_SIM_TOPOLOGY names; then ordinary torch.distributed code runs
on it: collectives, `DistributedDataParallel` with its comm hooks, `new_group` (a communicator of
the members, priced on their places in the topology). Every collective's simulated time is in
`hccl_sim.torch.records()`. `SyncBatchNorm` / `convert_sync_batchnorm`: torch's SyncBatchNorm for
CPU modules (torch's own refuses them).
"""
from __future__ import annotations

try:
    import torch  # noqa: F401
    import torch.distributed as dist
except ImportError as exc:                       # pragma: no cover - torch is the [torch] extra
    from topologies.errors import HcclError
    raise HcclError("E_NOT_FOUND", "hccl_sim.torch needs torch: pip install 'hccl-sim[torch]' (CPU build: "
                    "pip install torch --index-url https://download.pytorch.org/whl/cpu)") from exc

from topologies.errors import HcclError

from . import mpi_launch
from .process_group import BACKEND, ProcessGroupHcclSim
from .device_timeline import Step, Timeline
from .sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .trace import export_trace

__all__ = ["init_process_group", "destroy_process_group", "ProcessGroupHcclSim", "BACKEND", "records", "export_trace",
           "timeline", "Timeline", "Step", "Options", "SyncBatchNorm", "convert_sync_batchnorm"]


class Options:
    """pg_options of the hccl_sim backend: the communicator the group runs on."""

    def __init__(self, comm):
        self.comm = comm


class _World:
    comm = None                      # this process's rank's world communicator
    transport = None                 # the transport it was connected with here (a torchrun script)
    job = None                       # the MPI engine's job it runs in (an mpirun script)


def _create(dist_opts, pg_options):
    """torch's backend creator (extended API): the default group's communicator comes in
    pg_options; a new_group's is made from it for the members (they alone call this)."""
    if isinstance(pg_options, Options):
        return ProcessGroupHcclSim(pg_options.comm, timeout=dist_opts.timeout)
    world = _World.comm
    if world is None:
        # a plain script under torchrun / mpirun: dist.init_process_group(backend="hccl_sim")
        from ..engines.torchrun import connect, topology_from_env
        topo = topology_from_env(dist_opts.group_size)
        mpi = mpi_launch.launched()
        if mpi is not None and mpi[1] == dist_opts.group_size:
            world = mpi_launch.world_communicator(dist_opts.group_rank, dist_opts.group_size, topo)
            _World.job = world._group.job
        else:
            world, _World.transport = connect(dist_opts.store, dist_opts.group_rank, dist_opts.group_size, topo)
        _World.comm = world
        return ProcessGroupHcclSim(world, on_shutdown=_close_world, timeout=dist_opts.timeout)
    members = sorted(int(r) for r in dist_opts.global_ranks_in_group)
    if members == list(range(world.size)):
        return ProcessGroupHcclSim(world, timeout=dist_opts.timeout)
    others = [r for r in range(world.size) if r not in set(members)]
    return ProcessGroupHcclSim(world.shrink(exclude=others), timeout=dist_opts.timeout)


dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
mpi_launch.install()


def init_process_group(comm, timeout=None):
    """Make `comm` (this rank's Communicator) torch's default process group.

    Refused where the ranks are threads of one process (engine local; engine mpi with
    ranks_per_process > 1): torch.distributed keeps one default group per process (its group
    registry is module state), so threads cannot each have theirs; torch's thread-isolated mode
    for that is a testing internal that turns the registry thread-local for the whole process."""
    from datetime import timedelta
    k = comm._group.ranks_per_process
    if k > 1:
        raise HcclError("E_NOT_SUPPORT", f"hccl_sim.torch.init_process_group: this rank is one of {k} ranks run as "
                        "threads of one process (engine local, or engine mpi with ranks_per_process > 1), and "
                        "torch.distributed keeps one default process group per process, so they cannot each have "
                        "one; run torch ranks one per process: hccl_sim.run(fn, engine='ray'), engine='mpi' under "
                        "mpiexec (ranks_per_process=1), or a plain script under torchrun / mpirun", rank=comm.rank)
    if dist.is_initialized():
        raise HcclError("E_PARA", "torch.distributed is already initialised in this process "
                        "(dist.destroy_process_group() first)", rank=comm.rank)
    _World.comm = comm
    kw = {} if timeout is None else {"timeout": timedelta(seconds=timeout)}
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=comm.rank, world_size=comm.size,
                            pg_options=Options(comm), **kw)


def _ours(pg):
    """The ProcessGroupHcclSim behind a torch group (torch keeps a Python group as it is)."""
    if isinstance(pg, ProcessGroupHcclSim):
        return pg
    try:
        backend = pg._get_backend(torch.device("cpu"))
    except RuntimeError:
        return None
    return backend if isinstance(backend, ProcessGroupHcclSim) else None


def records(group=None) -> list:
    """comm.last_op of every collective the group (default: the default group) has run."""
    pg = _ours(dist.distributed_c10d._get_default_group() if group is None else group)
    if pg is None:
        raise HcclError("E_PARA", "not an hccl_sim process group")
    return list(pg.records)


def timeline(group=None) -> Timeline:
    """This rank's device timeline (hccl_sim.torch.device_timeline), for `with`: inside it the
    thread's aten ops are kernels on the rank's compute stream and the groups' ops run on comm
    streams of their own; `mark()` / `since()` give a step's simulated time, compute and
    exposed communication. `group`: any of the rank's groups (default: the default group); its
    timeout (or HCCL_EXEC_TIMEOUT) bounds every wait for an op's end."""
    pg = _ours(dist.distributed_c10d._get_default_group() if group is None else group)
    if pg is None:
        raise HcclError("E_PARA", "not an hccl_sim process group")
    return Timeline(pg.comm.device, pg.wait_timeout_s)


def destroy_process_group():
    """torch's destroy_process_group (which shuts every group's worker down, and the world's
    closes what a launched script opened); kept as hccl_sim.torch's own name for it."""
    dist.destroy_process_group()
    _close_world()


def _close_world():
    """What the world group of this process opened: a launched script's endpoint, an mpirun
    script's MPI job; and forget the world's communicator."""
    if _World.transport is not None:        # a launched script's own endpoint: say goodbye to the peers
        group = _World.comm._group
        group.exit(_World.comm.rank)
        _World.transport.close()
        group.close()                       # the shared-memory plane's segments, if any
    if _World.job is not None:              # an mpirun script's MPI job: every process closes it here
        from ..engines.mpi import close_job
        close_job(_World.job)
    _World.comm = _World.transport = _World.job = None
