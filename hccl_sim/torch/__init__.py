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
CPU modules (torch's own refuses them). `launch(script, nproc)`: a torch script on emulated NPUs
under torchrun or Ray, each rank's `report(value)` its result (hccl_sim.torch.scripts: what fault
suites run torch scripts through). What the process holds is one World (`world()`,
hccl_sim.torch.world), whose `create` is the backend's creator. `hccl_sim.torch.npu.install()` (or
HCCL_SIM_NPU=1 at this import): emulated NPUs for unchanged torch_npu scripts (hccl_sim.torch.npu).
"""
from __future__ import annotations

import os

try:
    import torch  # noqa: F401
    import torch.distributed as dist
except ImportError as exc:                       # pragma: no cover - torch is the [torch] extra
    from topologies.errors import HcclError
    raise HcclError("E_NOT_FOUND", "hccl_sim.torch needs torch: pip install 'hccl-sim[torch]' (CPU build: "
                    "pip install torch --index-url https://download.pytorch.org/whl/cpu)") from exc

from topologies.errors import HcclError

from . import dispatch, mpi_launch  # noqa: F401 - mpi_launch.launched(): whether mpirun started us
from . import npu
from .process_group import BACKEND, ProcessGroupHcclSim
from .device_timeline import Step, Timeline
from .scripts import launch, report
from .sync_batchnorm import SyncBatchNorm, convert_sync_batchnorm
from .trace import export_trace
from .world import Options, World

__all__ = ["init_process_group", "destroy_process_group", "ProcessGroupHcclSim", "BACKEND", "records", "export_trace",
           "timeline", "Timeline", "Step", "Options", "SyncBatchNorm", "convert_sync_batchnorm", "world", "World",
           "launch", "report"]

_WORLD = World()
dist.Backend.register_backend(BACKEND, _WORLD.create, extended_api=True, devices=["cpu"])
dispatch.install()
_WORLD.meet_launcher()
npu.attach(_WORLD)                   # an emulated NPU's HBM is the rank's Device once the World has a communicator
if os.environ.get("HCCL_SIM_NPU", "") == "1":
    npu.install()


def world() -> World:
    """This process's World: its world communicator (`comm`), a torchrun script's endpoint
    (`transport`), the active device timeline (`timeline`)."""
    return _WORLD


def init_process_group(comm, timeout=None):
    """Make `comm` (this rank's Communicator) torch's default process group.

    Refused where the ranks are threads of one process (engine local; engine mpi with
    ranks_per_process > 1): torch.distributed keeps one default group per process (its group
    registry is module state), so threads cannot each have theirs; torch's thread-isolated mode
    for that is a testing internal that turns the registry thread-local for the whole process."""
    _WORLD.adopt(comm, timeout)


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
    return Timeline(pg.comm.device, pg.wait_timeout_s, pg.world)


def destroy_process_group():
    """torch's destroy_process_group (which shuts every group's worker down, and the world's
    closes what a launched script opened); kept as hccl_sim.torch's own name for it."""
    dist.destroy_process_group()
    _WORLD.close()
