"""Hardware presets (Atlas 800T A2 / 910B, Atlas 800 / 910A) built from the YAML files beside
this module, and the synthetic `fullmesh` and `ring` presets used to check closed-form costs.

Each YAML file cites where every number comes from. A hardware cluster is `servers` copies of the
server layout joined by one RoCE port per NPU into a single non-blocking switch fabric, HCCL's
same-subnet NIC plan on 910B (docs/references.md §3.2).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import weakref
from functools import lru_cache, partial
from pathlib import Path

import networkx as nx
import yaml

from .errors import HcclError
from .model import DeviceModel, Topology, add_link, seconds_to_ns

from .routers import FullMeshRouter, HardwareRouter, RingRouter
from .server_graphs import server_graph, server_links
from .subset import SubsetRouter, subset
from .validate import device_ids_checked, integer, real

PRESET_DIR = Path(__file__).with_name("presets")
HARDWARE_PRESETS = ("atlas800t-a2", "atlas800-910a", "atlas900-a3", "atlas950")
SYNTHETIC_PRESETS = ("fullmesh", "ring")
ALIASES = {"910b": "atlas800t-a2", "a2": "atlas800t-a2", "atlas800t_a2": "atlas800t-a2",
           "910a": "atlas800-910a", "atlas800_910a": "atlas800-910a",
           "910c": "atlas900-a3", "a3": "atlas900-a3", "atlas900_a3": "atlas900-a3",
           "950": "atlas950", "ascend950": "atlas950", "a5": "atlas950"}
SIZED_PRESETS = {"atlas950-superpod": ("atlas950", ("superpod_servers",)),
                 "atlas950-supercluster": ("atlas950", ("superpod_servers", "supercluster_superpods"))}
"""Named sizes of a hardware preset: the Atlas 950 SuperPoD (its servers) and SuperCluster (its
SuperPoDs of those servers), as the preset's YAML gives them; `servers=` / `superpods=` override."""


def sized_defaults(name: str) -> tuple:
    """(hardware preset, {parameter: default}) of a named size (SIZED_PRESETS), or None."""
    if name not in SIZED_PRESETS:
        return None
    preset, keys = SIZED_PRESETS[name]
    data = preset_data(preset)
    params = {"servers": int(data["superpod_servers"])}
    if "supercluster_superpods" in keys:
        params["superpods"] = int(data["supercluster_superpods"])
    return preset, params


def hardware_name(name) -> str:
    """The canonical name of a hardware preset (aliases such as "910b" accepted), else HcclError."""
    canonical = ALIASES.get(name.lower(), name.lower()) if isinstance(name, str) else None
    if canonical not in HARDWARE_PRESETS:
        raise HcclError("E_PARA", f"unknown hardware preset {name!r}; expected one of {', '.join(HARDWARE_PRESETS)} "
                        f"(aliases {', '.join(sorted(ALIASES))})")
    return canonical


@lru_cache(maxsize=None)
def preset_data(name: str) -> dict:
    path = PRESET_DIR / f"{hardware_name(name)}.yaml"
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def max_device_id(name: str) -> int:
    """The largest device_id a server of this preset holds (its YAML's `max_device_id`, cited
    there; docs/references.md §8.1), else HCCL's documented rule: [0, devices - 1]."""
    data = preset_data(hardware_name(name))
    return int(data.get("max_device_id", int(data["npus_per_server"]) - 1))


def device_model_from(data: dict) -> DeviceModel:
    d, c = data["device_model"], data["compute_model"]
    return DeviceModel(
        hbm_bytes=int(d["hbm_bytes"]),
        copy_bandwidth=float(d["copy_bandwidth"]),
        copy_latency_small_ns=seconds_to_ns(d["copy_latency_small"]),
        copy_latency_large_ns=seconds_to_ns(d["copy_latency_large"]),
        copy_large_threshold=int(d["copy_large_threshold"]),
        reduce_bandwidth=float(d["reduce_bandwidth"]),
        reduce_latency_ns=seconds_to_ns(d["reduce_latency"]),
        inline_reduce_dtypes=frozenset(d["inline_reduce_dtypes"]),
        inline_reduce_ops=frozenset(d["inline_reduce_ops"]),
        inline_reduce_bandwidth=float(d.get("inline_reduce_bandwidth", math.inf)),
        notify_intra_ns=seconds_to_ns(d["notify_latency_intra"]),
        notify_inter_ns=seconds_to_ns(d["notify_latency_inter"]),
        staging=bool(d["staging"]),
        peak_flops=float(c["peak_flops"]),
        hbm_bandwidth=float(c["hbm_bandwidth"]),
        launch_ns=seconds_to_ns(c["launch_overhead"]),
        pcie_bandwidth=float(c["pcie_bandwidth"]),
        pcie_latency_ns=seconds_to_ns(c["pcie_latency"]),
        op_overhead_ns={str(k): seconds_to_ns(v) for k, v in d["op_overhead"].items()},
        p2p_overhead_ns=seconds_to_ns(d["p2p_overhead"]),
        loop_overhead_ns=seconds_to_ns(d["loop_overhead"]),
        dispatch_ns=seconds_to_ns(d.get("dispatch", 0.0)),
        kernels=_kernels(d),
        hierarchical=bool(d["hierarchical"]),
        server_layout=str(data["intra_server"]["layout"]),
        level1_cost_model=bool(d["level1_cost_model"]),
        pipeline=bool(d["pipeline"]),
        op_retry=bool(d["op_retry"]),
        gather_v=bool(d["gather_v"]),
        group_calls=bool(d["group_calls"]),
        algo_grammar=str(d["algo_grammar"]),
        expansion_modes=tuple(str(m) for m in d["expansion_modes"]),
        selector=str(d.get("selector", "hccl")),
        data_types=str(d["data_types"]),
    )


_KERNEL_FIELDS = {"op_overhead": ("op_overhead_ns", lambda v: {str(k): seconds_to_ns(t) for k, t in v.items()}),
                  "loop_overhead": ("loop_overhead_ns", seconds_to_ns),
                  "copy_bandwidth": ("copy_bandwidth", float),
                  "reduce_bandwidth": ("reduce_bandwidth", float)}


def _kernels(d: dict) -> dict:
    """A preset's kernel engines (DeviceModel.kernels) from its `kernels:` section, each engine's
    entry the fields it prices differently; an A3-style `aiv_op_overhead:` is the AIV entry's
    call costs."""
    out = {}
    for engine, entry in (d.get("kernels") or {}).items():
        unknown = set(entry) - set(_KERNEL_FIELDS)
        if unknown:
            raise HcclError("E_PARA", f"kernels.{engine}: unknown field(s) {sorted(unknown)}; "
                            f"expected {sorted(_KERNEL_FIELDS)}")
        out[str(engine)] = {_KERNEL_FIELDS[k][0]: _KERNEL_FIELDS[k][1](v) for k, v in entry.items()}
    if d.get("aiv_op_overhead"):
        out.setdefault("AIV", {})["op_overhead_ns"] = _KERNEL_FIELDS["op_overhead"][1](d["aiv_op_overhead"])
    return out


MAX_RANKS = 1 << 20
"""The most ranks any topology may have: 1,048,576 (131,072 servers of 8 NPUs; 8 times the scale
goal of 16,384 servers), which `simulate` prices (an AllReduce on 131,072 A2 servers: RESULTS.md).

Topologies are cheap at any size (graphs are built only on request), but every op plans and
prices per rank, and a run of anything must finish or be refused up front: past this, `simulate`
would take minutes and tens of gigabytes before saying anything. Engines that move data have
limits of their own, far lower (hccl_sim.MAX_LOCAL_RANKS, ...)."""
MIN_BANDWIDTH = 1e3
"""Slowest link or reduction a synthetic preset accepts, bytes/s (1 kB/s): below it, a large op's
time leaves the int64-nanosecond clocks that every engine keeps."""
MAX_LATENCY = 1.0
"""Largest per-link latency a synthetic preset accepts, seconds (10^5 times any real link): keeps
every route's latency, in integer nanoseconds, far inside the int64 clocks."""


def hardware(name: str, servers=None, devices_per_server: list | None = None,
             server_ids: list | None = None, device_ids: list | None = None,
             device_ips: list | None = None, superpods=None, pod_of_server: list | None = None) -> Topology:
    """Build `servers` servers of a hardware preset (or the given per-server device counts).

    A superpod preset (atlas900-a3) takes `superpods` (default 1) and `servers` per superpod: one
    count for all, or a list with one per superpod (unequal superpods); or, with
    `devices_per_server`, `pod_of_server` (each server's superpod, servers of a superpod contiguous)."""
    data = preset_data(name)
    full = int(data["npus_per_server"])
    where = f"topology {name}"
    limit = f"{full} ranks per server, MAX_RANKS = {MAX_RANKS} ranks"
    pod = data.get("superpod")
    if pod is None and (superpods is not None or pod_of_server is not None):
        raise HcclError("E_PARA", f"{where}: superpods are a SuperPoD preset's notion (atlas900-a3, atlas950); "
                        f"{name} servers have none")
    if devices_per_server is None:
        if pod is not None:
            pods = integer(1 if superpods is None else superpods, "superpods", 1, MAX_RANKS // full, where=where,
                           limit=limit)
            per_pod = _servers_per_superpod(servers, pods, where, MAX_RANKS // full)
            if sum(per_pod) > MAX_RANKS // full:      # before listing them
                raise HcclError("E_PARA", f"{where}: {pods} superpods x servers={servers!r} make {sum(per_pod)} "
                                f"servers, over the limit of {MAX_RANKS // full} ({limit})")
            pod_of_server = [k for k, n in enumerate(per_pod) for _ in range(n)]
            servers = len(pod_of_server)
        servers = integer(1 if servers is None else servers, "servers", 1, MAX_RANKS // full, where=where,
                          limit=limit)
        devices_per_server = [full] * servers
    elif pod is not None and pod_of_server is None:
        pod_of_server = [0] * len(devices_per_server)
    if sum(devices_per_server) > MAX_RANKS:
        raise HcclError("E_PARA", f"{where}: {sum(devices_per_server)} ranks are over the limit of "
                        f"{MAX_RANKS} (topologies.MAX_RANKS)")
    if device_ids is None:
        device_ids = [list(range(n)) for n in devices_per_server]
    device_ids_checked(devices_per_server, device_ids, max_device_id(name), where)
    intra, inter = data["intra_server"], data["inter_server"]
    server_of = [s for s, devs in enumerate(device_ids) for _ in devs]
    device_of = [d for devs in device_ids for d in devs]
    params = {"servers": len(device_ids), "devices_per_server": list(devices_per_server)}
    superpod_of = None
    if pod is not None:
        _check_pods(pod_of_server, len(device_ids), where)
        superpod_of = [pod_of_server[s] for s in server_of]
        params.update(superpods=len(set(pod_of_server)), superpod_of_server=list(pod_of_server), inter_spec=dict(inter),
                      superpod_ports=int(pod.get("ports", 1)))
    params.update(router=HardwareRouter(server_of, device_of, intra, inter, superpod_of, pod),
                  links=server_links(device_ids, intra, inter, pod_of_server, pod))
    return Topology(name=name, graph=partial(server_graph, list(devices_per_server), device_ids, intra, inter,
                                             pod_of_server, pod),
                    server_of=server_of, device_of=device_of, device=data["device"],
                    device_model=device_model_from(data), description=data.get("description", ""),
                    server_ids=server_ids, device_ips=device_ips,
                    params=dict(params, calibration=data.get("calibration", "unvalidated")))


def filled(name: str, ranks: int) -> Topology:
    """`ranks` NPUs of a hardware preset, filling its servers in order (12 on an 8-NPU preset: a
    full server and one of 4): what a launcher's processes make of a preset named without a server
    count (hccl_sim.torch under torchrun or mpirun, `hccl-sim train` under mpiexec)."""
    full = int(preset_data(hardware_name(name))["npus_per_server"])
    ranks = integer(ranks, "ranks", 1, MAX_RANKS, where=f"topology {name}", limit=f"MAX_RANKS = {MAX_RANKS}")
    servers, part = divmod(ranks, full)
    return hardware(name, devices_per_server=[full] * servers + ([part] if part else []))


_ROCE_VARIANTS = weakref.WeakKeyDictionary()


def without_inter_hccs(topo: Topology) -> Topology:
    """An A3 topology as HCCL_INTER_HCCS_DISABLE=TRUE makes it (one per topology): the servers of a
    superpod talk over RoCE (every die's NIC) instead of the UB fabric; inside a server nothing
    changes. HCCL keeps its three levels; only level1's transport changes (transport_manager.cc)."""
    got = _ROCE_VARIANTS.get(topo)
    if got is None:
        router = copy.copy(topo.params["router"])
        router.inter_hccs = False
        inter = topo.params["inter_spec"]

        def graph():
            g = topo.graph.copy()
            for r in range(topo.num_ranks):
                if not g.has_edge(r, "roce"):
                    add_link(g, r, "roce", inter["kind"], inter["bandwidth"], inter["latency_per_hop"], "roce",
                             f"roce:{r}")
            return g
        links = dict(topo.params["links"])
        links[inter["kind"]] = (topo.num_ranks, frozenset({float(inter["bandwidth"])}))
        got = dataclasses.replace(topo, graph=graph, params={**topo.params, "router": router, "inter_hccs": False,
                                                             "links": links})
        _ROCE_VARIANTS[topo] = got
    return got


_KERNEL_VARIANTS = weakref.WeakKeyDictionary()


def with_kernel(topo: Topology, engine: str) -> Topology:
    """The topology as an op HCCL runs as one `engine` kernel ("AIV", "CCU") prices on it (one
    variant per topology and engine): the engine's call and loop costs, local copy and reduce
    rates where the preset gives them (DeviceModel.kernels), and no dispatch per step (the kernel
    runs its own). The links are the same."""
    variants = _KERNEL_VARIANTS.setdefault(topo, {})
    got = variants.get(engine)
    if got is None:
        dm = topo.device_model
        entry = dm.kernels.get(engine)
        if not entry:
            raise HcclError("E_NOT_SUPPORT", f"{topo.name}: no {engine} kernels are modelled on this preset")
        fields = {**entry, "op_overhead_ns": {**dm.op_overhead_ns, **entry.get("op_overhead_ns", {})}}
        kernel = dataclasses.replace(dm, dispatch_ns=0, **fields)
        got = dataclasses.replace(topo, graph=topo.__dict__["graph"], device_model=kernel,
                                  params={**topo.params, "expansion": engine})
        variants[engine] = got
    return got


_BACKUP_VARIANTS = weakref.WeakKeyDictionary()


def with_backup_nics(topo: Topology, dies) -> Topology:
    """An A3 topology in which every die of `dies` uses its package partner's NIC (HCCL's backup
    NIC, `backup_device_ip`, switched to by an L2 op retry when the die's own NIC is down for good;
    docs/references.md §10.5): its RoCE routes cross SIO to the partner and leave by the partner's
    NIC, and the two dies share that NIC at half bandwidth each (routers.NIC_SHARE). `dies` are
    ranks of the cluster (a sub-communicator's subset: of the cluster it is part of, whose route
    hops it keeps). One variant per (topology, dies); no dies: the topology itself."""
    dies = tuple(sorted({int(d) for d in dies}))
    if not dies:
        return topo

    def reroute(router):
        if not isinstance(router, HardwareRouter) or router.superpod_of is None:
            raise HcclError("E_NOT_SUPPORT", f"{topo.name}: a backup NIC is an A3 SuperPoD (atlas900-a3) feature")
        try:
            return router.with_backup(router.backup + dies)
        except ValueError as e:
            raise HcclError("E_PARA", f"{topo.name}: {e}") from None
    return _rerouted(topo, _BACKUP_VARIANTS, dies, reroute, "backup_nics", lambda parent: with_backup_nics(parent, dies))


_DETOUR_VARIANTS = weakref.WeakKeyDictionary()


def with_detour(topo: Topology, ratio: float, peers: int) -> Topology:
    """A 950 topology whose server mesh pairs move as HCCL's Z-axis detour templates move them:
    `ratio` of each pair's bytes over the mesh link, the rest through the Clos, `peers` at once
    (HardwareRouter.with_detour). A sub-communicator's subset: of its cluster's variant. One
    variant per (topology, ratio, peers)."""
    key = (float(ratio), int(peers))

    def reroute(router):
        if not isinstance(router, HardwareRouter):
            raise HcclError("E_NOT_SUPPORT", f"{topo.name}: the Z-axis detour is the 950's (atlas950)")
        try:
            return router.with_detour(*key)
        except ValueError as e:
            raise HcclError("E_NOT_SUPPORT", f"{topo.name}: {e}") from None
    return _rerouted(topo, _DETOUR_VARIANTS, key, reroute, "detour", lambda parent: with_detour(parent, *key))


def _rerouted(topo: Topology, cache, key, reroute, param: str, of_parent) -> Topology:
    """One variant of `topo` per `key` (remembered in `cache`, `param` set to it): the topology
    with its router rerouted (`reroute(router)`: the links are as built, their graph too; only
    routes change), or for a sub-communicator's subset the subset of its cluster's variant
    (`of_parent(cluster)`), whose route hops it keeps."""
    variants = cache.setdefault(topo, {})
    got = variants.get(key)
    if got is None:
        router = topo.params.get("router")
        if isinstance(router, SubsetRouter):
            got = subset(of_parent(router.parent), router.members)
        else:
            got = dataclasses.replace(topo, graph=topo.__dict__["graph"], params={**topo.params, "router": reroute(router)})
        got.params[param] = key
        variants[key] = got
    return got


def package_partner(topo: Topology, rank: int):
    """The other die of the package of the cluster's rank `rank` (its SIO partner) on an A3
    topology (or a subset of one: ranks of the cluster); None elsewhere or where it has none."""
    router = topo.params.get("router")
    while isinstance(router, SubsetRouter):
        router = router.parent.params.get("router")
    if not isinstance(router, HardwareRouter) or router.superpod_of is None:
        return None
    partner = int(router.partners()[rank])
    return None if partner < 0 else partner


def _servers_per_superpod(servers, pods: int, where: str, most: int) -> list:
    """Servers of each superpod from `servers` (one count for every superpod, or a list)."""
    if isinstance(servers, (list, tuple)):
        if len(servers) != pods:
            raise HcclError("E_PARA", f"{where}: servers={list(servers)!r} gives {len(servers)} superpods' server "
                            f"counts for superpods={pods}")
        return [integer(n, "servers", 1, most, where=where) for n in servers]
    n = integer(1 if servers is None else servers, "servers", 1, most, where=where)
    return [n] * pods


def _check_pods(pod_of_server, servers: int, where: str) -> None:
    if len(pod_of_server) != servers:
        raise HcclError("E_PARA", f"{where}: {len(pod_of_server)} superpod ids for {servers} servers")
    seen = []
    for k in pod_of_server:
        if not seen or seen[-1] != k:
            if k in seen:
                raise HcclError("E_PARA", f"{where}: the servers of superpod {k} are not contiguous (HCCL requires "
                                f"a superpod's servers listed together)")
            seen.append(k)


def _synthetic_graph(name: str, ranks: int, bandwidth: float, latency: float) -> nx.Graph:
    g = nx.Graph()
    g.add_nodes_from(range(ranks))
    if name == "fullmesh":
        for a in range(ranks):
            for b in range(a + 1, ranks):
                add_link(g, a, b, "link", bandwidth, latency, f"link:{b}", f"link:{a}")
    else:
        for a in range(ranks):
            b = (a + 1) % ranks
            if b != a and not g.has_edge(a, b):
                add_link(g, a, b, "link", bandwidth, latency, "right", "left")
    return g


def synthetic(name: str, ranks: int, bandwidth: float = 25e9, latency: float = 5e-6,
              reduce_bandwidth: float = math.inf) -> Topology:
    """A flat synthetic topology with no staging, notify cost or op overhead.

    `fullmesh` gives every pair of ranks a link with ports of its own; `ring` joins each rank to
    its two neighbours. Costs then follow HCCL's alpha-beta-gamma formulas exactly:
    alpha = latency, beta = 1/bandwidth, gamma = 1/reduce_bandwidth.
    Bandwidths are in [MIN_BANDWIDTH, inf], latency in [0, MAX_LATENCY] s, ranks in [1, MAX_RANKS].
    """
    if name not in SYNTHETIC_PRESETS:
        raise HcclError("E_PARA", f"unknown synthetic topology {name!r}; expected one of {SYNTHETIC_PRESETS}")
    where = f"topology {name}"
    ranks = integer(ranks, "ranks", 1, MAX_RANKS, where=where, limit="topologies.MAX_RANKS")
    bandwidth = real(bandwidth, "bandwidth", MIN_BANDWIDTH, math.inf, allow_inf=True, unit="bytes/s", where=where)
    reduce_bandwidth = real(reduce_bandwidth, "reduce_bandwidth", MIN_BANDWIDTH, math.inf, allow_inf=True,
                            unit="bytes/s", where=where)
    latency = real(latency, "latency", 0.0, MAX_LATENCY, unit="s", where=where)
    links = ranks * (ranks - 1) // 2 if name == "fullmesh" else (0 if ranks == 1 else 1 if ranks == 2 else ranks)
    dm = DeviceModel(reduce_bandwidth=reduce_bandwidth)
    return Topology(name=name, graph=partial(_synthetic_graph, name, ranks, bandwidth, latency),
                    server_of=[0] * ranks, device_of=list(range(ranks)), device="synthetic",
                    device_model=dm, description=f"synthetic {name}, {ranks} ranks",
                    params={"ranks": ranks, "bandwidth": bandwidth, "latency": latency,
                            "reduce_bandwidth": reduce_bandwidth,
                            "links": {"link": (links, frozenset({bandwidth}))} if links else {},
                            "router": (FullMeshRouter if name == "fullmesh" else RingRouter)(ranks, bandwidth, latency)})
