"""The cost model: one object per (topology content, link state) that prices every transfer and
owns every cache built from prices.

Everything that turns a schedule into simulated time goes through a CostModel: the vectorised
engine (hcomm.vtiming), the event-driven reference (hcomm.timing), the planner's program and
timing caches, the selection policies' decisions, and point-to-point send/recv. Keys are content:
a CostModel is found by the topology's fingerprint (two equal topologies share one), and every
cache it owns lives and dies with it, so a different link state (a fault plan's timed link
changes, hcomm.link_state.LinkState) is a different CostModel whose caches start empty — no stale
fault-free price can be served for a faulty link. Without a plan every link is as the topology
built it: `link_state` is the empty tuple. A Topology is treated as immutable
once priced (its fingerprint is computed once).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from topologies.model import transfer_ns

from .link_state import LinkFailure

_MODELS_KEPT = 16          # cost models kept alive for topologies no longer referenced elsewhere
_CACHE_LIMIT = 4096        # entries per cache before it is emptied (programs can be large)


def fingerprint(topo) -> str:
    """A digest of everything about a topology that prices a transfer (computed once per object)."""
    got = getattr(topo, "_fingerprint", None)
    if got is not None:
        return got
    h = hashlib.sha1()
    h.update(repr((topo.name, topo.device, topo.device_model)).encode())
    h.update(np.asarray(topo.server_of, dtype=np.int64).tobytes())
    h.update(np.asarray(topo.device_of, dtype=np.int64).tobytes())
    params = {k: v for k, v in topo.params.items() if k != "router"}
    h.update(repr(sorted(params.items(), key=lambda kv: kv[0])).encode())
    router = topo.params.get("router")
    if router is not None:
        h.update(type(router).__qualname__.encode())
        parent = getattr(router, "parent", None)      # a sub-communicator's subset: its cluster's content
        if parent is not None:
            h.update(fingerprint(parent).encode())
        h.update(repr(sorted((k, repr(v)) for k, v in vars(router).items()
                             if not isinstance(v, np.ndarray) and k != "parent")).encode())
    else:
        for a, b, data in sorted(topo.graph.edges(data=True), key=lambda e: (str(e[0]), str(e[1]))):
            h.update(repr((a, b, data["kind"], data["bandwidth"], data["latency_ns"], sorted(data["ports"].items(),
                                                                                            key=str))).encode())
    topo._fingerprint = h.hexdigest()
    return topo._fingerprint


class CostModel:
    """Prices transfers, copies, reductions and notifies on one topology in one link state."""

    def __init__(self, topo, link_state: tuple = ()):
        self.topology = topo
        self.device_model = topo.device_model
        self.server_of = topo.server_of
        self.num_ranks = topo.num_ranks
        self.link_state = link_state
        self.key = (fingerprint(topo), link_state)
        self._caches = {}

    _shared: "OrderedDict[tuple, CostModel]" = OrderedDict()

    @classmethod
    def of(cls, topo, link_state: tuple = ()) -> "CostModel":
        """The cost model of `topo` in `link_state`, shared by every equal topology."""
        key = (fingerprint(topo), link_state)
        model = cls._shared.get(key)
        if model is None:
            model = cls._shared[key] = cls(topo, link_state)
            while len(cls._shared) > _MODELS_KEPT:
                cls._shared.popitem(last=False)
        else:
            cls._shared.move_to_end(key)
        return model

    def cache(self, name: str) -> dict:
        """The cache called `name` (programs, timings, vtiming, selection, ...), owned by this model.

        Callers key entries by content; a cache that grows past its limit is emptied."""
        c = self._caches.get(name)
        if c is None or len(c) > _CACHE_LIMIT:
            c = self._caches[name] = {}
        return c

    # ---- prices -----------------------------------------------------------------------------------
    def route(self, src: int, dst: int):
        return self.topology.route(src, dst)

    def route_arrays(self, src, dst):
        return self.topology.route_arrays(src, dst)

    def notify_ns(self, src: int, dst: int) -> int:
        return self.topology.notify_ns(src, dst)

    def notify_arrays(self, src, dst):
        return self.topology.notify_arrays(src, dst)

    def routes_alike(self, ranks) -> bool:
        """Whether every row of `ranks` (G, n) routes as its first (topologies' Topology.routes_alike)."""
        return self.topology.routes_alike(ranks)

    def group(self, members) -> "GroupCost":
        """The cost model of one group of ranks, `members` (n distinct ranks) numbered 0..n-1
        (one per group, kept in this model's caches)."""
        members = np.asarray(members, dtype=np.int64)
        key = hash((members.tobytes(), len(members)))
        groups = self.cache("groups")
        got = groups.get(key)
        if got is None or not np.array_equal(got.members, members):
            got = groups[key] = GroupCost(self, members, key)
        return got

    def p2p_ns(self, src: int, dst: int, nbytes: int, send_clock: int, recv_clock: int, crc: str | None = None,
               call_ns: int | None = None) -> tuple:
        """(receiver's exit, sender's exit) clocks of one send/recv pair, priced as a one-transfer
        step: the transfer starts once both sides have posted and the sender's notify has arrived
        (HCCL's record/wait), crosses the route (latency + bytes / bottleneck bandwidth), and the
        sender learns it was consumed one notify later; staged through the CCL buffer on presets
        that stage (a local copy on each side); each call pays the preset's fixed per-call cost.

        Under a link state the transfer is retransmitted over down links and slowed over slowed
        ones (hcomm.link_state.LinkState.transmit; `crc`: it is corrupted, and loses one attempt);
        hcomm.link_state.LinkFailure when its retransmissions run out (src, dst and hops set).
        `call_ns`: each side's call cost, when not the preset's (a batch's items share one)."""
        dm = self.device_model
        stage = dm.copy_ns(nbytes) if dm.staging and nbytes else 0
        call = dm.p2p_overhead_ns if call_ns is None else call_ns   # each side's call: expansion and launch
        ready = max(send_clock + call + stage, recv_clock + call) + self.notify_ns(src, dst)
        route = self.route(src, dst)
        wire = transfer_ns(nbytes, route.bandwidth)
        end = ready + wire
        links = self.link_state
        if links or crc is not None:
            try:
                end, _ = links.transmit(route.hops, ready, wire, crc=crc)
            except LinkFailure as failure:
                failure.src, failure.dst, failure.hops = src, dst, route.hops
                raise
        arrive = end + route.latency_ns
        return arrive + stage, arrive + self.notify_ns(dst, src)


class GroupCost:
    """What the vectorised engine prices a group's step with (hcomm.vgroups): a CostModel's
    prices of the group's ranks in the group's own numbering, rank i being members[i]. Made and
    kept by the CostModel (`CostModel.group`), so its caches live and die with the model's."""

    def __init__(self, parent: CostModel, members: np.ndarray, key):
        self.parent, self.members = parent, members
        self.device_model = parent.device_model
        self.num_ranks = len(members)
        self.key = (parent.key, "group", key)
        self._caches = {}

    def cache(self, name: str) -> dict:
        c = self._caches.get(name)
        if c is None or len(c) > _CACHE_LIMIT:
            c = self._caches[name] = {}
        return c

    def route_arrays(self, src, dst):
        return self.parent.route_arrays(self.members[src], self.members[dst])

    def notify_arrays(self, src, dst):
        return self.parent.notify_arrays(self.members[src], self.members[dst])


def as_cost(cost_or_topology) -> CostModel:
    """A CostModel as given, or the shared one of a Topology."""
    if isinstance(cost_or_topology, CostModel):
        return cost_or_topology
    return CostModel.of(cost_or_topology)
