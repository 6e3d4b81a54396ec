"""The cluster description every layer shares: a networkx graph of NPUs, switches and links.

Nodes are ranks (ints 0..p-1) and fabric nodes (strings such as "roce" or "pcie:0"). Every edge
carries `kind` (HCCS, PCIe, RoCE, link), `bandwidth` (bytes/s), `latency_ns` (int) and `ports`,
a dict from each endpoint node to the name of the port the edge uses there. A port is the unit of
contention: each HCCS peer link of a 910B NPU has ports of its own ("hccs:<peer device>", so the
seven links of a mesh step run at once), a preset may instead share one "hccs" port among an NPU's
links, every inter-server transfer of an NPU crosses its single "roce" port, and a synthetic full
mesh gives every link ports of its own.

The device model (copy/reduce bandwidth, notify cost, staging, inline reduce) and the rank ->
server placement ride along, so that the transport's timing model needs nothing but a Topology.
This module knows nothing about how bytes move or what a collective is.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from .errors import HcclError

NS_PER_S = 1_000_000_000


def seconds_to_ns(seconds: float) -> int:
    """Round a duration in seconds to integer nanoseconds (the unit of every simulated clock)."""
    return int(round(seconds * NS_PER_S))


def transfer_ns(nbytes: int, bandwidth: float) -> int:
    """Serialisation time of `nbytes` at `bandwidth` bytes/s, rounded up to whole nanoseconds."""
    if nbytes <= 0 or math.isinf(bandwidth):
        return 0
    bw = float(bandwidth)
    if bw.is_integer():
        return -(-nbytes * NS_PER_S // int(bw))   # exact integer ceiling
    return math.ceil(nbytes * NS_PER_S / bw)


_EXACT_MAX_BYTES = np.iinfo(np.int64).max // NS_PER_S    # ~9.2 GB: above it nbytes * 1e9 leaves int64
MAX_CLOCK_NS = 1 << 62
"""Largest simulated duration of one transfer, ns (146 years): clocks are int64 nanoseconds."""


def transfer_ns_array(nbytes, bandwidth):
    """transfer_ns over arrays, rounding exactly as the scalar version."""
    nbytes = np.asarray(nbytes, dtype=np.int64)
    bw = np.broadcast_to(np.asarray(bandwidth, dtype=np.float64), nbytes.shape)
    out = np.zeros(nbytes.shape, dtype=np.int64)
    finite = np.isfinite(bw) & (nbytes > 0)
    big = finite & (nbytes > _EXACT_MAX_BYTES)
    finite &= ~big
    integral = finite & (bw == np.floor(bw))
    if integral.any():
        b = bw[integral].astype(np.int64)
        out[integral] = -(-nbytes[integral] * NS_PER_S // b)
    other = finite & ~integral
    if other.any():
        out[other] = np.ceil(nbytes[other] * NS_PER_S / bw[other]).astype(np.int64)
    if big.any():
        # int64 would wrap silently (a 64 GiB transfer came out negative): exact Python ints
        values = [transfer_ns(int(n), float(b)) for n, b in zip(nbytes[big], bw[big])]
        if max(values) > MAX_CLOCK_NS:
            raise HcclError("E_PARA", f"a transfer of {int(nbytes[big].max())} B would take over {MAX_CLOCK_NS} ns, "
                            "past the int64 nanosecond clocks of the simulation")
        out[big] = values
    return out


@dataclass(frozen=True)
class Route:
    """How bytes travel from one rank to another: the cost the timing model charges."""
    src: int
    dst: int
    hops: tuple            # node path, src..dst
    kinds: tuple           # link kind of each hop
    latency_ns: int        # sum of hop latencies
    bandwidth: float       # bottleneck bandwidth, bytes/s
    egress: tuple          # (node, port) the transfer leaves by
    ingress: tuple         # (node, port) the transfer arrives by
    # What its ports carry, bytes/s: a port is held for bytes / this, while the transfer itself runs
    # at `bandwidth` (one pair's rate). Above `bandwidth` only where one pair cannot fill a port
    # (A3's UB); None: `bandwidth`.
    port_bandwidth: float = None

    def __post_init__(self):
        if self.port_bandwidth is None or self.port_bandwidth < self.bandwidth:
            object.__setattr__(self, "port_bandwidth", self.bandwidth)

    @property
    def kind(self) -> str:
        return "+".join(dict.fromkeys(self.kinds))

    def cost_ns(self, nbytes: int) -> int:
        return self.latency_ns + transfer_ns(nbytes, self.bandwidth)


@dataclass
class DeviceModel:
    """Per-NPU costs outside the links: local copies, reductions, notifies, staging."""
    hbm_bytes: int = 64 << 30
    copy_bandwidth: float = math.inf
    copy_latency_small_ns: int = 0
    copy_latency_large_ns: int = 0
    copy_large_threshold: int = 512 * 1024
    reduce_bandwidth: float = math.inf
    reduce_latency_ns: int = 0
    inline_reduce_dtypes: frozenset = frozenset()
    inline_reduce_ops: frozenset = frozenset()
    # A transfer that reduces inline (the DMA engine adds as it writes) runs at most this fast.
    inline_reduce_bandwidth: float = math.inf
    notify_intra_ns: int = 0
    notify_inter_ns: int = 0
    staging: bool = False
    peak_flops: float = math.inf
    hbm_bandwidth: float = math.inf
    launch_ns: int = 0
    pcie_bandwidth: float = math.inf
    pcie_latency_ns: int = 0
    # Fixed cost of one collective call by collective name (HCCL's op expansion, task launch and
    # handshakes the schedule does not show), charged once at entry, and of one send or recv
    # call; from measured small-message floors on hardware presets, empty (zero) elsewhere.
    op_overhead_ns: dict = field(default_factory=dict)
    p2p_overhead_ns: int = 0
    # Fixed cost of every CCL-buffer loop of an op after its first (HCCL re-launches the schedule).
    loop_overhead_ns: int = 0
    # Fixed cost of every transfer of a schedule before it can start, beyond the sender's notify:
    # the device-side dispatch of an op's step (A3 expands ops on the AI CPU, which launches each
    # step's tasks); zero where expansion happens on the host ahead of the schedule.
    dispatch_ns: int = 0
    # HCCL's kernel engines here, by name ("AIV", "CCU"): an op HCCL runs as one such kernel per
    # CCL-buffer loop does its own steps, so no dispatch per step; each engine's entry holds the
    # DeviceModel fields it prices differently (op_overhead_ns by collective, loop_overhead_ns, the
    # CCU's copy_bandwidth and reduce_bandwidth; topologies.presets.with_kernel). Empty: none.
    kernels: dict = field(default_factory=dict)
    # What HCCL does on this device, read from the preset (each cites docs/references.md there);
    # the defaults are a synthetic preset's, one flat level where every op runs.
    # HCCL plans ops in levels: level0 inside a server, level1 across (§6.4).
    hierarchical: bool = False
    # How a server's NPUs are linked (the preset's intra_server.layout): "fullmesh" (910B, 950), "groups"
    # (910A: two 4-NPU HCCS meshes joined by PCIe, §3.1), "die_pairs" (A3); HCCL's level0 follows it.
    server_layout: str = "fullmesh"
    # HCCL picks level1 by its cost model (§6.5 items 2-3), else by its V1 defaults (§6.5 item 4).
    level1_cost_model: bool = False
    # HCCL's op-base pipeline executors run here (§6.5 item 2).
    pipeline: bool = False
    # HCCL re-executes ops after a link flap (HCCL_OP_RETRY_ENABLE) here: A3 only (§10.4).
    op_retry: bool = False
    # HCCL runs AllGatherV and ReduceScatterV here: not on 910A (§6.9).
    gather_v: bool = True
    # HCCL's group calls (HcclGroupStart/End) run here: not on 910A (§6.10).
    group_calls: bool = True
    # How HCCL reads HCCL_ALGO here (§7.7): "legacy" (level0:NA;level1:<algo>, A2 and A3) or
    # "executor" (the open-source HCCL's executor grammar, falling back to the legacy one: the 950).
    algo_grammar: str = "legacy"
    # The HCCL_OP_EXPANSION_MODE values priced here (each as its own path); the first is the
    # device's default. Empty: a synthetic preset, where the mode changes nothing.
    expansion_modes: tuple = ()
    # Whose selection rules run here: "hccl" (A2's and A3's, by the layout) or "a5" (the open-source
    # HCCL's rule-based auto selectors of the 950, hccl_sim.selection.hccl_950).
    selector: str = "hccl"
    # Which data types HCCL takes here for which ops, by the code that checks them there
    # (hccl_sim.config.type_rules names each: "hcomm_910b", "hcomm_910", "hccl_ops"; §9.3).
    data_types: str = "synthetic"

    @property
    def aiv_op_overhead_ns(self) -> dict:
        """The call's fixed cost by collective as one AIV kernel (empty: no AIV path here)."""
        return self.kernels.get("AIV", {}).get("op_overhead_ns", {})

    def kernel_ns(self, flops: float = 0.0, nbytes: int = 0) -> int:
        """A kernel's duration on the roofline: launch + max(compute time, memory time)."""
        compute = 0 if flops <= 0 or math.isinf(self.peak_flops) else math.ceil(flops * NS_PER_S / self.peak_flops)
        return self.launch_ns + max(compute, transfer_ns(int(nbytes), self.hbm_bandwidth))

    def pcie_ns(self, nbytes: int) -> int:
        """A host <-> device copy."""
        return self.pcie_latency_ns + transfer_ns(int(nbytes), self.pcie_bandwidth)

    def copy_ns(self, nbytes: int) -> int:
        if nbytes <= 0:
            return 0
        fixed = self.copy_latency_large_ns if nbytes >= self.copy_large_threshold else self.copy_latency_small_ns
        return fixed + transfer_ns(nbytes, self.copy_bandwidth)

    def copy_ns_array(self, nbytes):
        nbytes = np.asarray(nbytes, dtype=np.int64)
        fixed = np.where(nbytes >= self.copy_large_threshold, self.copy_latency_large_ns, self.copy_latency_small_ns)
        return np.where(nbytes > 0, fixed + transfer_ns_array(nbytes, self.copy_bandwidth), 0)

    def inline(self, dtype: str, op: str) -> bool:
        """Whether the DMA engine reduces `dtype` with `op` in the transfer itself."""
        return dtype in self.inline_reduce_dtypes and op in self.inline_reduce_ops

    def wire_bandwidth(self, bandwidth, reducing, dtype: str, op: str):
        """The rate of transfers over routes of `bandwidth` (scalar or array; `reducing` likewise):
        an inline-reducing one is capped at the engine's inline reduce rate."""
        if not self.inline(dtype, op) or math.isinf(self.inline_reduce_bandwidth):
            return bandwidth
        return np.where(reducing, np.minimum(bandwidth, self.inline_reduce_bandwidth), bandwidth)

    def reduce_ns_array(self, nbytes, dtype: str, op: str):
        nbytes = np.asarray(nbytes, dtype=np.int64)
        if dtype in self.inline_reduce_dtypes and op in self.inline_reduce_ops:
            return np.zeros(nbytes.shape, dtype=np.int64)
        return np.where(nbytes > 0, self.reduce_latency_ns + transfer_ns_array(nbytes, self.reduce_bandwidth), 0)

    def local_reduce_ns_array(self, nbytes, dtype: str, op: str):
        """A local reduce (HCCL's LocalReduce task: two buffers of this device into one): where the
        DMA engine reduces inline (docs/references.md §2.5) an SDMA task, priced as HCCL's profiling
        model prices SDMA tasks, a copy's (§2.3; not the fitted rate of inline-reducing transfers,
        which are link writes: §6.12 says why); elsewhere a copy and a CCE reduce."""
        return self.copy_ns_array(nbytes) + self.reduce_ns_array(nbytes, dtype, op)

    def local_reduce_ns(self, nbytes: int, dtype: str, op: str) -> int:
        return self.copy_ns(nbytes) + self.reduce_ns(nbytes, dtype, op)

    def reduce_ns(self, nbytes: int, dtype: str, op: str) -> int:
        """Cost of reducing `nbytes` into a local buffer; zero where the DMA engine reduces inline."""
        if nbytes <= 0 or (dtype in self.inline_reduce_dtypes and op in self.inline_reduce_ops):
            return 0
        return self.reduce_latency_ns + transfer_ns(nbytes, self.reduce_bandwidth)


class _LazyGraph:
    """The `graph` field of a Topology: a networkx graph, or a zero-argument function that builds
    it on first use. Presets pass a builder: routing and timing use analytic routers, so a
    131,072-rank cluster (or a 10^5-rank full mesh, 5 * 10^9 links) costs no graph unless asked for."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            raise AttributeError(self.name)       # dataclasses: the field has no default
        value = obj.__dict__[self.name]
        if not isinstance(value, nx.Graph):
            value = obj.__dict__[self.name] = value()
        return value

    def __set__(self, obj, value):
        if not (isinstance(value, nx.Graph) or callable(value)):
            raise TypeError(f"Topology.graph must be a networkx Graph or a function building one, got {value!r}")
        obj.__dict__[self.name] = value

    @staticmethod
    def built(obj) -> bool:
        return isinstance(obj.__dict__.get("graph"), nx.Graph)


@dataclass(repr=False, eq=False)
class Topology:
    """A modelled cluster: ranks, servers, links and the device cost model.

    Attributes:
        name: preset or file it came from.
        graph: networkx graph (see module docstring), built on first use when the topology was
            given a builder function instead (every preset does).
        server_of: server index of every rank.
        device_of: device (physical NPU) id of every rank within its server.
        device: device type, e.g. "910B", "910A" or "synthetic".
    """
    name: str
    graph: nx.Graph = _LazyGraph()
    server_of: list
    device_of: list
    device: str
    device_model: DeviceModel = field(default_factory=DeviceModel)
    description: str = ""
    server_ids: list | None = None
    device_ips: list | None = None
    params: dict = field(default_factory=dict)

    def __post_init__(self):
        self._route_cache = {}

    def __getstate__(self):
        # caches (routes, programs, timings) are rebuilt where the topology lands
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._route_cache = {}

    def __repr__(self):
        return (f"<Topology {self.name}: {self.num_ranks} rank{'s' if self.num_ranks != 1 else ''} on "
                f"{self.num_servers} server{'s' if self.num_servers != 1 else ''} ({self.device})>")

    @property
    def num_ranks(self) -> int:
        return len(self.server_of)

    @property
    def num_servers(self) -> int:
        return len(set(self.server_of))

    def ranks_of_server(self, server: int) -> list:
        return [r for r, s in enumerate(self.server_of) if s == server]

    def route(self, src: int, dst: int) -> Route:
        """The route from rank `src` to rank `dst` (lowest total latency, then fewest hops)."""
        key = (src, dst)
        route = self._route_cache.get(key)
        if route is None:
            route = self._route_cache[key] = self._find_route(src, dst)
        return route

    def _find_route(self, src: int, dst: int) -> Route:
        p = self.num_ranks
        if not (0 <= src < p and 0 <= dst < p):
            raise HcclError("E_PARA", f"route {src}->{dst}: ranks must be in [0, {p})")
        if src == dst:
            raise HcclError("E_PARA", f"route {src}->{dst}: a rank has no route to itself")
        router = self.params.get("router")
        if router is not None:
            lat, bw, pbw, eport, iport, hops, kinds = router.one(src, dst)
            return Route(src=src, dst=dst, hops=hops, kinds=kinds, latency_ns=lat, bandwidth=bw,
                         egress=(src, eport), ingress=(dst, iport), port_bandwidth=pbw)
        g = self.graph
        if g.has_edge(src, dst):
            path = [src, dst]
        else:
            # Prefer switches to NPUs as transit nodes.
            def weight(u, v, data, _ranks=(src, dst)):
                transit = 10 ** 15 if isinstance(v, int) and v not in _ranks else 0
                return data["latency_ns"] + 1 + transit
            try:
                path = nx.shortest_path(g, src, dst, weight=weight)
            except nx.NetworkXNoPath:
                raise HcclError("E_NOT_FOUND", f"no route from rank {src} to rank {dst} in topology {self.name}")
        edges = [g.edges[u, v] for u, v in zip(path, path[1:])]
        return Route(
            src=src, dst=dst, hops=tuple(path), kinds=tuple(e["kind"] for e in edges),
            latency_ns=sum(e["latency_ns"] for e in edges),
            bandwidth=min(e["bandwidth"] for e in edges),
            egress=(src, edges[0]["ports"][src]),
            ingress=(dst, edges[-1]["ports"][dst]),
        )

    def route_arrays(self, src, dst):
        """Vectorised routes: (latency_ns, bandwidth, port bandwidth, egress port id, ingress port
        id) arrays (Route's fields).

        Port ids are integers that are equal exactly when two transfers share a port."""
        router = self.params.get("router")
        if router is not None:
            return router.many(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64))
        routes = [self.route(int(a), int(b)) for a, b in zip(src, dst)]
        ports = {}
        def pid(port):
            return ports.setdefault(port, len(ports))
        return (np.array([r.latency_ns for r in routes], dtype=np.int64),
                np.array([r.bandwidth for r in routes], dtype=np.float64),
                np.array([r.port_bandwidth for r in routes], dtype=np.float64),
                np.array([pid(r.egress) for r in routes], dtype=np.int64),
                np.array([pid(("in",) + r.ingress) for r in routes], dtype=np.int64))

    def routes_alike(self, ranks) -> bool:
        """Whether every row of `ranks` (G groups of n ranks, none in two) routes as the first:
        ranks[g, i] -> ranks[g, j] has the latency, rates and notify cost of ranks[0, i] ->
        ranks[0, j], and two transfers of a row share a port exactly when the first row's do
        (ports belong to ranks: rows share none). False without an analytic router."""
        router = self.params.get("router")
        return router is not None and bool(router.routes_alike(np.asarray(ranks, dtype=np.int64)))

    def notify_arrays(self, src, dst):
        dm = self.device_model
        if dm.notify_intra_ns == dm.notify_inter_ns:
            return np.full(np.shape(src), dm.notify_intra_ns, dtype=np.int64)
        so = self.__dict__.get("_server_array")
        if so is None:        # converted once: server_of is a list of up to 131,072 ints
            so = self._server_array = np.asarray(self.server_of, dtype=np.int64)
        same = so[src] == so[dst]
        return np.where(same, dm.notify_intra_ns, dm.notify_inter_ns).astype(np.int64)

    def notify_ns(self, src: int, dst: int) -> int:
        dm = self.device_model
        return dm.notify_intra_ns if self.server_of[src] == self.server_of[dst] else dm.notify_inter_ns

    def links_by_kind(self) -> dict:
        """kind -> (count, set of bandwidths) over every edge of the graph.

        Presets count their links in closed form (params["links"]), so that a summary of a large
        cluster does not build its graph."""
        counted = self.params.get("links")
        if counted is not None and not _LazyGraph.built(self):
            return {kind: (count, set(bws)) for kind, (count, bws) in counted.items()}
        out = {}
        for _, _, data in self.graph.edges(data=True):
            count, bws = out.get(data["kind"], (0, set()))
            bws.add(data["bandwidth"])
            out[data["kind"]] = (count + 1, bws)
        return out

    def summary(self) -> str:
        lines = [f"topology   : {self.name}" + (f" ({self.description})" if self.description else ""),
                 f"device     : {self.device}",
                 *([f"calibrated : {self.params['calibration']}"] if self.params.get("calibration") else []),
                 f"ranks      : {self.num_ranks}",
                 f"servers    : {self.num_servers}"]
        per_server = [n for _, n in sorted(Counter(self.server_of).items())]
        lines.append(f"per server : {per_server if len(set(per_server)) > 1 else per_server[0]}")
        pods = self.params.get("superpod_of_server")
        if pods is not None:
            sizes = [n for _, n in sorted(Counter(pods).items())]
            lines.append(f"superpods  : {len(sizes)} (servers each: {sizes if len(set(sizes)) > 1 else sizes[0]})")
        for kind, (count, bws) in sorted(self.links_by_kind().items()):
            bw = ", ".join(f"{b / 1e9:g} GB/s" for b in sorted(bws))
            lines.append(f"links      : {count:6d} x {kind:5s} {bw}")
        dm = self.device_model
        lines.append("reduce     : " + ("free" if math.isinf(dm.reduce_bandwidth) else f"{dm.reduce_bandwidth / 1e9:g} GB/s")
                     + (f", inline for {sorted(dm.inline_reduce_dtypes)} x {sorted(dm.inline_reduce_ops)}"
                        if dm.inline_reduce_dtypes else ""))
        lines.append("staging    : " + ("via the CCL buffer" if dm.staging else "none (zero-copy)"))
        if dm.expansion_modes:
            lines.append(f"expansion  : {dm.expansion_modes[0]} (default); also {', '.join(dm.expansion_modes[1:])}")
        for engine, entry in sorted(dm.kernels.items()):
            launch = sorted(set(entry.get("op_overhead_ns", {}).values()))
            rates = [f"{what} {entry[f'{what}_bandwidth'] / 1e9:g} GB/s" for what in ("copy", "reduce")
                     if f"{what}_bandwidth" in entry]
            span = f"{launch[0] / 1e3:g}" + (f"-{launch[-1] / 1e3:g}" if len(launch) > 1 else "")
            lines.append(f"kernels    : {engine}: one per loop, {span} us a launch, no dispatch per step"
                         + "".join(f", {r}" for r in rates))
        return "\n".join(lines)


def add_link(graph: nx.Graph, a, b, kind: str, bandwidth: float, latency_s: float,
             port_a: str, port_b: str) -> None:
    graph.add_edge(a, b, kind=kind, bandwidth=float(bandwidth), latency_ns=seconds_to_ns(latency_s),
                   ports={a: port_a, b: port_b})


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0
