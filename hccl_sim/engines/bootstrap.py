"""A rank's start, the same on every engine: its runtime and device, then its Communicator.

1. `start_runtime(rank, topo, storage)`: the rank's simulated runtime, initialised, with the
   device the topology gives the rank set; `storage`, when given, is where the device keeps its
   arrays' bytes (an engine whose ranks share memory places them where peers can map them).
2. `communicator(rank, group, runtime)`: the rank's Communicator over the group its engine made,
   on the runtime's device (the runtime kept on it, for user code and for leak checks). Then the
   fault plan's hbm_pressure entries on the rank are held on its device: after the init, whose
   CCL buffer the job's start allocates before any tenant (hccl_sim.faults.hbm).
"""
from __future__ import annotations

from ..comm.communicator import Communicator
from ..faults.hbm import pressure_for
from ..npu.device import Runtime


def start_runtime(rank: int, topo, storage=None) -> Runtime:
    runtime = Runtime(rank, topo).init()
    device = runtime.set_device(topo.device_of[rank])
    if storage is not None:
        device.storage = storage
    return runtime


def communicator(rank: int, group, runtime: Runtime) -> Communicator:
    device = runtime.device
    device.pressure = None             # a device kept from an earlier run (Ray) forgets that run's plan
    comm = Communicator(rank, group, device)
    comm.runtime = runtime
    device.pressure = pressure_for(group.config.faults, rank)
    return comm
