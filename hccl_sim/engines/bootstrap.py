"""A rank's start, the same on every engine: its runtime and device, then its Communicator.

1. `start_runtime(rank, topo, storage)`: the rank's simulated runtime, initialised, with the
   device the topology gives the rank set; `storage`, when given, is where the device keeps its
   arrays' bytes (an engine whose ranks share memory places them where peers can map them).
2. `communicator(rank, group, runtime)`: the rank's Communicator over the group its engine made,
   on the runtime's device (the runtime kept on it, for user code and for leak checks).
"""
from __future__ import annotations

from ..comm.communicator import Communicator
from ..npu.device import Runtime


def start_runtime(rank: int, topo, storage=None) -> Runtime:
    runtime = Runtime(rank, topo).init()
    device = runtime.set_device(topo.device_of[rank])
    if storage is not None:
        device.storage = storage
    return runtime


def communicator(rank: int, group, runtime: Runtime) -> Communicator:
    comm = Communicator(rank, group, runtime.device)
    comm.runtime = runtime
    return comm
