"""The topology a sub-communicator prices on: some ranks of a cluster, renumbered, in place.

A communicator made by `comm.split` or `comm.shrink` holds members of a bigger cluster. Its ops
must be priced on the members' real positions (docs/design.md, "Public API contract": "its ops are priced on the
members' real places in the topology"), as HCCL builds a sub-communicator's levels from where
its ranks are (HcclCreateSubCommConfig; docs/references.md §8.3): so the subset keeps every member's
server, device id and superpod, numbers servers (and superpods) in order of first appearance,
and routes every pair over the parent's own route. Route hops keep the parent's node names, so
a fault plan bound to the cluster (edges of its routes) applies to the sub-communicator's
transfers too. Port ids are the parent's: two transfers share a port exactly when they would in
the cluster.
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from .errors import HcclError
from .model import Topology

_KEPT_PARAMS = ("inter_hccs", "select_bandwidth_gb", "rdma_lite", "inter_spec", "preset", "superpod_ports")


class SubsetRouter:
    """Routes of sub-communicator ranks: rank i is the parent's rank members[i]."""

    def __init__(self, parent: Topology, members: tuple):
        self.parent = parent
        self.members = tuple(members)
        self._index = np.asarray(self.members, dtype=np.int64)

    def many(self, src, dst):
        idx = self._index
        return self.parent.route_arrays(idx[np.asarray(src, dtype=np.int64)], idx[np.asarray(dst, dtype=np.int64)])

    def routes_alike(self, ranks) -> bool:
        return self.parent.routes_alike(self._index[np.asarray(ranks, dtype=np.int64)])

    def one(self, src, dst):
        r = self.parent.route(self.members[src], self.members[dst])
        return r.latency_ns, r.bandwidth, r.port_bandwidth, r.egress[1], r.ingress[1], r.hops, r.kinds


def _first_seen(values) -> dict:
    order = {}
    for v in values:
        order.setdefault(v, len(order))
    return order


def subset(parent: Topology, members) -> Topology:
    """The topology of the parent's ranks `members` (distinct, in the new communicator's rank order)."""
    members = tuple(int(m) for m in members)
    p = parent.num_ranks
    if not members:
        raise HcclError("E_PARA", "a sub-communicator needs at least one rank")
    bad = [m for m in members if not 0 <= m < p]
    if bad:
        raise HcclError("E_PARA", f"ranks {bad[:8]} are not ranks of {parent.name} (0..{p - 1})")
    if len(set(members)) != len(members):
        raise HcclError("E_PARA", f"a sub-communicator lists a rank twice: {list(members)[:16]}")
    if members == tuple(range(p)):
        return parent
    server_ids = _first_seen(parent.server_of[m] for m in members)
    server_of = [server_ids[parent.server_of[m]] for m in members]
    params = {k: parent.params[k] for k in _KEPT_PARAMS if k in parent.params}
    params["subset_of"] = members           # with the parent's fingerprint: what the subset is (hcomm.cost)
    params["servers"] = len(server_ids)
    pods = parent.params.get("superpod_of_server")
    if pods is not None:
        by_new = sorted(server_ids, key=server_ids.get)
        pod_ids = _first_seen(pods[s] for s in by_new)
        params["superpod_of_server"] = [pod_ids[pods[s]] for s in by_new]
        params["superpods"] = len(pod_ids)
    params["router"] = SubsetRouter(parent, members)

    def graph():
        # members become 0..k-1; other ranks stay in as transit nodes named as strings
        names = {r: (members.index(r) if r in members else f"npu:{r}") for r in range(p)}
        return nx.relabel_nodes(parent.graph, names, copy=True)

    return Topology(name=f"{parent.name}[{len(members)} of {p} ranks]", graph=graph, server_of=server_of,
                    device_of=[parent.device_of[m] for m in members], device=parent.device,
                    device_model=parent.device_model, description=parent.description,
                    server_ids=None if parent.server_ids is None else [parent.server_ids[s] for s in
                                                                         sorted(server_ids, key=server_ids.get)],
                    device_ips=None if parent.device_ips is None else [parent.device_ips[m] for m in members],
                    params=params)
