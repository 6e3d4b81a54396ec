"""The Ray engine: one Ray actor per rank, each owning its simulated NPU, runtime and communicator.

protocol.py   typed messages between driver, actors and control plane
control.py    the control plane: shared-memory allgather on one host, peer transport across hosts
watch.py      what each rank waits for (the driver's deadlock watch)
group.py      one rank's Group (engines/base.py): rendezvous, then execution by the chosen plane
actors.py     the rank actor
cluster.py    the driver: placement by server, plane from Ray node ids, runs and their failures
"""
from .cluster import PLANES, RayCluster

__all__ = ["RayCluster", "PLANES"]
