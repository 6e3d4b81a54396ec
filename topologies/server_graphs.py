"""The networkx graphs of hardware clusters, built on first use of Topology.graph, and their link
counts (what `hccl-sim topo` lists) counted without building them: servers of a preset's layout
(a full mesh, HCCS groups joined by PCIe, A3's die pairs, the 950's mesh) joined by their fabrics.
"""
from __future__ import annotations

import networkx as nx

from .model import add_link
from .routers import hccs_port


def server_graph(devices_per_server, device_ids, intra: dict, inter: dict, pod_of_server=None,
                  pod: dict | None = None) -> nx.Graph:
    """The networkx graph of a hardware cluster (built on first use of Topology.graph)."""
    if pod is not None:
        return _superpod_graph(device_ids, intra, inter, pod_of_server, pod)
    group = (lambda d: 0) if intra["layout"] == "fullmesh" else (lambda d: d // int(intra["group_size"]))
    g = nx.Graph()
    rank = 0
    for s, devs in enumerate(device_ids):
        ranks = list(range(rank, rank + len(devs)))
        rank += len(devs)
        for r, d in zip(ranks, devs):
            g.add_node(r, server=s, device=d)
        per_link = intra.get("ports", "shared") == "per_link"
        for i, a in enumerate(ranks):
            for b in ranks[i + 1:]:
                da, db = devs[a - ranks[0]], devs[b - ranks[0]]
                if group(da) == group(db):
                    ports = (hccs_port(db), hccs_port(da)) if per_link else ("hccs", "hccs")
                    add_link(g, a, b, intra["kind"], intra["bandwidth"], intra["latency"], *ports)
        if intra["layout"] == "groups" and len({group(d) for d in devs}) > 1:
            cross = intra["cross_group"]
            switch = f"pcie:{s}"
            for r in ranks:
                add_link(g, r, switch, cross["kind"], cross["bandwidth"], cross["latency_per_hop"], "pcie", f"pcie:{r}")
    if len(device_ids) > 1:
        for r in range(rank):
            add_link(g, r, "roce", inter["kind"], inter["bandwidth"], inter["latency_per_hop"], "roce", f"roce:{r}")
    return g


def _superpod_graph(device_ids, intra: dict, inter: dict, pod_of_server, pod: dict) -> nx.Graph:
    """Every rank on its superpod's UB switch fabric, every rank's NIC on the fabric between
    superpods when there are several; inside a server, A3's dies of a package joined by SIO, or the
    950's NPUs in a full mesh (a port per peer link)."""
    g = nx.Graph()
    rank = 0
    pods = len(set(pod_of_server))
    for s, devs in enumerate(device_ids):
        ranks = list(range(rank, rank + len(devs)))
        rank += len(devs)
        by_die = dict(zip(devs, ranks))
        for r, d in zip(ranks, devs):
            g.add_node(r, server=s, device=d, superpod=pod_of_server[s])
            add_link(g, r, f"ub:{pod_of_server[s]}", pod["kind"], pod["bandwidth"], pod["latency_per_hop"], "ub", "ub")
            if pods > 1:
                add_link(g, r, "roce", inter["kind"], inter["bandwidth"], inter["latency_per_hop"], "roce", f"roce:{r}")
            partner = by_die.get(d ^ 1)
            if intra["layout"] == "die_pairs" and d % 2 == 0 and partner is not None:
                add_link(g, r, partner, intra["kind"], intra["bandwidth"], intra["latency"], "sio", "sio")
        if intra["layout"] == "fullmesh":
            for i, a in enumerate(ranks):
                for b in ranks[i + 1:]:
                    add_link(g, a, b, intra["kind"], intra["bandwidth"], intra["latency"],
                             hccs_port(devs[b - ranks[0]]), hccs_port(devs[a - ranks[0]]))
    return g


def server_links(device_ids, intra: dict, inter: dict, pod_of_server=None, pod: dict | None = None) -> dict:
    """kind -> (count, bandwidths) of `server_graph`'s edges, counted without building it."""
    links = {}

    def add(kind, count, bandwidth):
        if count:
            n, bws = links.get(kind, (0, frozenset()))
            links[kind] = (n + count, bws | {float(bandwidth)})
    if intra["layout"] == "die_pairs":
        ranks = sum(len(devs) for devs in device_ids)
        add(intra["kind"], sum(sum(1 for d in devs if d % 2 == 0 and d + 1 in devs) for devs in device_ids),
            intra["bandwidth"])
        add(pod["kind"], ranks, pod["bandwidth"])
        if len(set(pod_of_server)) > 1:
            add(inter["kind"], ranks, inter["bandwidth"])
        return links
    if pod is not None:              # the 950: a mesh per server, the UB fabric, the fabric between superpods
        add(intra["kind"], sum(len(devs) * (len(devs) - 1) // 2 for devs in device_ids), intra["bandwidth"])
        add(pod["kind"], sum(len(devs) for devs in device_ids), pod["bandwidth"])
        if len(set(pod_of_server)) > 1:
            add(inter["kind"], sum(len(devs) for devs in device_ids), inter["bandwidth"])
        return links
    shapes = {}
    for devs in device_ids:
        shapes[tuple(devs)] = shapes.get(tuple(devs), 0) + 1
    for devs, copies in shapes.items():
        if intra["layout"] == "fullmesh":
            sizes = [len(devs)]
        else:
            size = int(intra["group_size"])
            sizes = [sum(1 for d in devs if d // size == g) for g in {d // size for d in devs}]
        add(intra["kind"], copies * sum(n * (n - 1) // 2 for n in sizes), intra["bandwidth"])
        if len(sizes) > 1:
            add(intra["cross_group"]["kind"], copies * len(devs), intra["cross_group"]["bandwidth"])
    if len(device_ids) > 1:
        add(inter["kind"], sum(len(devs) for devs in device_ids), inter["bandwidth"])
    return links
