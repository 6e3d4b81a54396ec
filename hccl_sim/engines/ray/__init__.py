"""The Ray engine: one Ray actor per rank, each owning its simulated NPU, runtime and communicator.

protocol.py   typed messages between driver, actors and control plane
group.py      one rank's RankGroup (comm/rank_group.py): rendezvous, then execution by the chosen plane
actors.py     the rank actor
cluster.py    the driver: placement by server, plane from Ray node ids, runs and their failures

Control planes are hcomm's (hcomm.control: the shared-memory block on one host, the transport
allgather across hosts), and so is each rank's record of what it waits for, the driver's deadlock
watch (hcomm.transports.watched).
"""
from .cluster import PLANES, RayCluster

__all__ = ["RayCluster", "PLANES", "run_ray"]


def run_ray(fn, topo, config, args=(), kwargs=None, address=None, data_plane=None):
    """fn on every rank of a Ray cluster started for this run and closed after it; results by rank."""
    cluster = RayCluster(topo, config, address=address, data_plane=data_plane)
    try:
        return cluster.run(fn, args=args, kwargs=kwargs, config=config)
    finally:
        cluster.close()
