"""Hardware presets (Atlas 800T A2 / 910B, Atlas 800 / 910A) built from the YAML files beside
this module, and the synthetic `fullmesh` and `ring` presets used to check closed-form costs.

Each YAML file cites where every number comes from. A hardware cluster is `servers` copies of the
server layout joined by one RoCE port per NPU into a single non-blocking switch fabric, HCCL's
same-subnet NIC plan on 910B (reference/hccl.md §7).
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

import networkx as nx
import yaml

from .errors import HcclError
from .model import DeviceModel, Topology, add_link, seconds_to_ns
from .routers import FullMeshRouter, HardwareRouter, RingRouter

PRESET_DIR = Path(__file__).with_name("presets")
HARDWARE_PRESETS = ("atlas800t-a2", "atlas800-910a")
SYNTHETIC_PRESETS = ("fullmesh", "ring")
ALIASES = {"910b": "atlas800t-a2", "a2": "atlas800t-a2", "atlas800t_a2": "atlas800t-a2",
           "910a": "atlas800-910a", "atlas800_910a": "atlas800-910a"}


@lru_cache(maxsize=None)
def preset_data(name: str) -> dict:
    path = PRESET_DIR / f"{name}.yaml"
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


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
        notify_intra_ns=seconds_to_ns(d["notify_latency_intra"]),
        notify_inter_ns=seconds_to_ns(d["notify_latency_inter"]),
        staging=bool(d["staging"]),
        peak_flops=float(c["peak_flops"]),
        hbm_bandwidth=float(c["hbm_bandwidth"]),
        launch_ns=seconds_to_ns(c["launch_overhead"]),
        pcie_bandwidth=float(c["pcie_bandwidth"]),
        pcie_latency_ns=seconds_to_ns(c["pcie_latency"]),
    )


def hardware(name: str, servers: int | None = None, devices_per_server: list | None = None,
             server_ids: list | None = None, device_ids: list | None = None,
             device_ips: list | None = None) -> Topology:
    """Build `servers` servers of a hardware preset (or the given per-server device counts)."""
    data = preset_data(name)
    full = int(data["npus_per_server"])
    if devices_per_server is None:
        servers = 1 if servers is None else servers
        if not isinstance(servers, int) or servers < 1:
            raise HcclError("E_PARA", f"topology {name}: servers must be a positive integer, got {servers!r}")
        devices_per_server = [full] * servers
    if device_ids is None:
        device_ids = [list(range(n)) for n in devices_per_server]
    intra, inter = data["intra_server"], data["inter_server"]
    g = nx.Graph()
    server_of, device_of = [], []
    rank = 0
    for s, devs in enumerate(device_ids):
        ranks = list(range(rank, rank + len(devs)))
        rank += len(devs)
        for r, d in zip(ranks, devs):
            g.add_node(r, server=s, device=d)
            server_of.append(s)
            device_of.append(d)
        group = (lambda d: 0) if intra["layout"] == "fullmesh" else (lambda d: d // int(intra["group_size"]))
        for i, a in enumerate(ranks):
            for b in ranks[i + 1:]:
                if group(devs[a - ranks[0]]) == group(devs[b - ranks[0]]):
                    add_link(g, a, b, intra["kind"], intra["bandwidth"], intra["latency"], "hccs", "hccs")
        if intra["layout"] == "groups" and len({group(d) for d in devs}) > 1:
            cross = intra["cross_group"]
            switch = f"pcie:{s}"
            for r in ranks:
                add_link(g, r, switch, cross["kind"], cross["bandwidth"], cross["latency_per_hop"], "pcie", f"pcie:{r}")
    if len(device_ids) > 1:
        for r in range(rank):
            add_link(g, r, "roce", inter["kind"], inter["bandwidth"], inter["latency_per_hop"], "roce", f"roce:{r}")
    return Topology(name=name, graph=g, server_of=server_of, device_of=device_of, device=data["device"],
                    device_model=device_model_from(data), description=data.get("description", ""),
                    server_ids=server_ids, device_ips=device_ips,
                    params={"servers": len(device_ids), "devices_per_server": list(devices_per_server),
                            "router": HardwareRouter(server_of, device_of, intra, inter)})


def synthetic(name: str, ranks: int, bandwidth: float = 25e9, latency: float = 5e-6,
              reduce_bandwidth: float = math.inf) -> Topology:
    """A flat synthetic topology with no staging, notify cost or op overhead.

    `fullmesh` gives every pair of ranks a link with ports of its own; `ring` joins each rank to
    its two neighbours. Costs then follow HCCL's alpha-beta-gamma formulas exactly:
    alpha = latency, beta = 1/bandwidth, gamma = 1/reduce_bandwidth.
    """
    if not isinstance(ranks, int) or ranks < 1:
        raise HcclError("E_PARA", f"topology {name}: ranks must be a positive integer, got {ranks!r}")
    for label, value in (("bandwidth", bandwidth), ("reduce_bandwidth", reduce_bandwidth)):
        if not value > 0:
            raise HcclError("E_PARA", f"topology {name}: {label} must be > 0 bytes/s, got {value!r}")
    if not latency >= 0:
        raise HcclError("E_PARA", f"topology {name}: latency must be >= 0 s, got {latency!r}")
    g = nx.Graph()
    g.add_nodes_from(range(ranks))
    if name == "fullmesh":
        for a in range(ranks):
            for b in range(a + 1, ranks):
                add_link(g, a, b, "link", bandwidth, latency, f"link:{b}", f"link:{a}")
    elif name == "ring":
        for a in range(ranks):
            b = (a + 1) % ranks
            if b != a and not g.has_edge(a, b):
                add_link(g, a, b, "link", bandwidth, latency, "right", "left")
    else:
        raise HcclError("E_PARA", f"unknown synthetic topology {name!r}; expected one of {SYNTHETIC_PRESETS}")
    dm = DeviceModel(reduce_bandwidth=float(reduce_bandwidth))
    return Topology(name=name, graph=g, server_of=[0] * ranks, device_of=list(range(ranks)), device="synthetic",
                    device_model=dm, description=f"synthetic {name}, {ranks} ranks",
                    params={"ranks": ranks, "bandwidth": bandwidth, "latency": latency,
                            "reduce_bandwidth": reduce_bandwidth,
                            "router": (FullMeshRouter if name == "fullmesh" else RingRouter)(ranks, bandwidth, latency)})
