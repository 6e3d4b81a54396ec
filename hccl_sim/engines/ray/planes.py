"""The Ray engine's data planes as data: what each one runs on, so the driver and the actors read
a plane's properties instead of testing its name. The names are the engine registry's
(hccl_sim.engines.registry: `ray`'s data_planes), which `comm.data_plane` reports.

| plane    | ranks                 | transport                 | control                              | data                         |
|----------|-----------------------|---------------------------|--------------------------------------|------------------------------|
| `shm`    | every one on one node | TCP on loopback           | one shared-memory block for the job  | the shared plane (segments)  |
| `socket` | any nodes             | TCP on the node's address | a block per node, its leader across  | hosted: node peers in place  |
| `object` | any nodes             | Ray's object store        | the transport's allgather            | per rank, over the transport |
"""
from __future__ import annotations

from dataclasses import dataclass

from topologies.errors import HcclError

from ..registry import ENGINES


@dataclass(frozen=True)
class RayPlane:
    name: str
    one_node: bool            # needs every rank on one Ray node
    object_store: bool        # payloads through Ray's object store (else direct TCP between the actors)
    node_address: bool        # the TCP endpoint listens on the node's address (peers on other nodes reach it)
    job_block: bool           # the job's ranks meet in one shared-memory control block
    node_blocks: bool         # each node's ranks meet in a block of their own, one leader per node across
    shared_data: bool         # data on the shared plane over the actors' segments
    host_peers_in_place: bool  # a node's ranks read each other's slices in place (hosted)


PLANES = {p.name: p for p in (
    RayPlane("shm", one_node=True, object_store=False, node_address=False, job_block=True, node_blocks=False,
             shared_data=True, host_peers_in_place=False),
    RayPlane("socket", one_node=False, object_store=False, node_address=True, job_block=False, node_blocks=True,
             shared_data=False, host_peers_in_place=True),
    RayPlane("object", one_node=False, object_store=True, node_address=False, job_block=False, node_blocks=False,
             shared_data=False, host_peers_in_place=False),
)}
assert tuple(PLANES) == ENGINES["ray"].data_planes, "the Ray planes are the registry's"


def choose(requested, one_node: bool) -> RayPlane:
    """The plane a run takes: `requested` (a name, or None: shm when every rank is on one node,
    else socket), which must suit where the ranks landed."""
    if requested is None:
        return PLANES["shm" if one_node else "socket"]
    plane = PLANES[requested]
    if plane.one_node and not one_node:
        others = " or ".join(repr(p.name) for p in PLANES.values() if not p.one_node)
        raise HcclError("E_PARA", f"data_plane {plane.name!r} needs every rank on one Ray node; ranks landed on "
                        f"more than one (use {others})")
    return plane
