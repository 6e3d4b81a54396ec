"""Analytic routing for the preset layouts: one definition, scalar and vectorised.

Both the event-driven reference replay (Topology.route) and the vectorised timing engine
(Topology.route_arrays) route through these, so the two price every transfer identically.
Port ids: rank * PORTS + a port code (one shared port per class), or, for HCCS links with ports of
their own (`intra_server.ports: per_link`), rank * PORTS + PER_LINK + the peer's device index: each
peer link then has its own egress and ingress, and a mesh step's seven exchanges run at once. A
synthetic full mesh gives each directed link its own pair.

The 950 (a superpod preset whose servers are meshes, not packages): the server's UB mesh (per-link
ports, the HCCS class), the SuperPoD's UB Clos (UB), UBoE between SuperPoDs (the RoCE class).

A3's backup NIC (HardwareRouter.with_backup): a die whose NIC is down for good reaches RoCE
through its package partner's NIC, over SIO; both dies then share that NIC, half each.
"""
from __future__ import annotations

import copy

import numpy as np

from .model import seconds_to_ns

HCCS, PCIE, ROCE, RIGHT, LEFT, SIO, UB = 0, 1, 2, 3, 4, 5, 6
NIC_SHARE = 0.5
"""The share of a NIC each die of a 910C package gets once one of them borrows it: HCCL's backup
NIC "halves bandwidth" (docs/references.md §10.5). A static even split: each die keeps its own RoCE
port (queue), at half the NIC's bandwidth."""
PORTS = 128                  # port codes per rank (ids keep their order whatever this is: rank * PORTS + code)
PER_LINK = 16                # per-link HCCS port codes: PER_LINK + peer device index (< PORTS - PER_LINK:
#                              the 950's device ids reach 64)
_PORT_NAMES = {HCCS: "hccs", PCIE: "pcie", ROCE: "roce", RIGHT: "right", LEFT: "left", SIO: "sio", UB: "ub"}


class HardwareRouter:
    """Servers of NPUs: HCCS inside a group, PCIe between groups of a server, RoCE between servers.
    A superpod preset (A3): SIO between the two dies of a package, the superpod's UB fabric between
    any other two dies of a superpod (one UB port per die), RoCE between superpods."""

    def __init__(self, server_of, device_of, intra: dict, inter: dict, superpod_of=None, pod: dict | None = None,
                 inter_hccs: bool = True):
        self.inter_hccs = inter_hccs      # False: RoCE between a superpod's servers (HCCL_INTER_HCCS_DISABLE)
        self.server_of = np.asarray(server_of, dtype=np.int64)
        self.device_of = np.asarray(device_of, dtype=np.int64)
        self.superpod_of = None if superpod_of is None else np.asarray(superpod_of, dtype=np.int64)
        # a die's UB port carries more than one pair's rate (`port_bandwidth`, docs/design.md rule 9)
        self.ub = None if pod is None else (2 * seconds_to_ns(pod["latency_per_hop"]), float(pod["bandwidth"]),
                                            pod["kind"], float(pod.get("port_bandwidth", pod["bandwidth"])))
        # A3's servers are packages of two dies (SIO inside one); a 950's are a mesh of NPUs
        self.packages = intra["layout"] == "die_pairs"
        self.group_size = int(intra.get("group_size", 1 << 30)) if intra["layout"] == "groups" else 1 << 30
        self.per_link = intra.get("ports", "shared") == "per_link"
        self.hccs = _spec(seconds_to_ns(intra["latency"]), intra["bandwidth"], intra["kind"])
        cross = intra.get("cross_group")
        self.pcie = None if cross is None else _spec(2 * seconds_to_ns(cross["latency_per_hop"]), cross["bandwidth"],
                                                     cross["kind"])
        self.roce = _spec(2 * seconds_to_ns(inter["latency_per_hop"]), inter["bandwidth"], inter["kind"])
        self.backup = ()                  # dies on their partner's NIC (with_backup)
        self.detour = None                # (mesh share, peers): the 950's Z-axis detour (with_detour)
        self._borrower = self._shared = self._partner = None

    def partners(self) -> np.ndarray:
        """Every rank's package partner (the die joined to it by SIO: same server, device id ^ 1),
        -1 where it has none (every rank, off A3)."""
        if not self.packages:
            return np.full(len(self.device_of), -1, dtype=np.int64)
        width = int(self.device_of.max()) + 2 if len(self.device_of) else 2
        key = self.server_of * width + self.device_of
        order = np.argsort(key, kind="stable")
        ranked = key[order]
        want = self.server_of * width + (self.device_of ^ 1)
        at = np.minimum(np.searchsorted(ranked, want), len(ranked) - 1)
        return np.where(ranked[at] == want, order[at], -1)

    def with_backup(self, dies) -> "HardwareRouter":
        """This router with each die of `dies` reaching RoCE through its partner's NIC: its RoCE
        routes (both directions: its peers address it at the backup NIC) cross SIO to the partner
        first (or last), and the two dies' RoCE traffic runs at NIC_SHARE of the NIC's bandwidth."""
        if self.superpod_of is None or not self.packages:
            raise ValueError("a backup NIC is an A3 (package partners) feature")
        router = copy.copy(self)
        router.backup = tuple(sorted({int(d) for d in dies}))
        partner = self.partners()
        dies = np.asarray(router.backup, dtype=np.int64)
        if (partner[dies] < 0).any():
            raise ValueError(f"dies {dies[partner[dies] < 0].tolist()} have no package partner")
        router._partner = partner
        router._borrower = np.zeros(len(self.server_of), dtype=bool)
        router._borrower[dies] = True
        router._shared = router._borrower.copy()
        router._shared[partner[dies]] = True
        return router

    def with_detour(self, ratio: float, peers: int) -> "HardwareRouter":
        """This router with a server's mesh pairs moved as HCCL's Z-axis detour templates move them
        (the 950's MeshConcur executors, docs/references.md §6.13): `ratio` of a pair's bytes over
        its mesh link, the rest over the two NPUs' Clos ports through the switch, while each NPU
        exchanges with its `peers` level0 peers at once (the templates are meshes). The pair then
        runs at min(mesh rate / ratio, Clos port rate / ((1 - ratio) peers)) and arrives after the
        slower path's latency; its ports stay the mesh link's (the Clos share is in its rate)."""
        if self.packages or self.ub is None or self.superpod_of is None:
            raise ValueError("the Z-axis detour is the 950's: a server's mesh under a SuperPoD's Clos")
        if not 0 < ratio <= 1 or peers < 1:
            raise ValueError(f"a detour needs a mesh share in (0, 1] and peers >= 1, got {ratio}, {peers}")
        router = copy.copy(self)
        mesh_lat, mesh_bw, kind, _ = self.hccs
        clos_lat, _, _, clos_port = self.ub
        bw = mesh_bw / ratio if ratio == 1 else min(mesh_bw / ratio, clos_port / ((1 - ratio) * peers))
        router.hccs = (max(mesh_lat, clos_lat), float(bw), kind, float(bw))
        router.detour = (ratio, peers)
        return router

    def _class(self, src, dst):
        if self.superpod_of is not None:
            same_pod = self.superpod_of[src] == self.superpod_of[dst]
            if not self.inter_hccs:
                same_pod = same_pod & (self.server_of[src] == self.server_of[dst])
            same_server = self.server_of[src] == self.server_of[dst]
            if not self.packages:             # the 950: the server's mesh, the SuperPoD's UB Clos, UBoE
                return np.where(same_server, HCCS, np.where(same_pod, UB, ROCE))
            package = same_server & (self.device_of[src] // 2 == self.device_of[dst] // 2)
            return np.where(package, SIO, np.where(same_pod, UB, ROCE))
        same_server = self.server_of[src] == self.server_of[dst]
        same_group = same_server & (self.device_of[src] // self.group_size == self.device_of[dst] // self.group_size)
        return np.where(same_group, HCCS, np.where(same_server, PCIE, ROCE))

    def many(self, src, dst):
        cls = self._class(src, dst)
        lat = np.empty(len(src), dtype=np.int64)
        bw = np.empty(len(src), dtype=np.float64)
        pbw = np.empty(len(src), dtype=np.float64)
        for code, spec in self._specs():
            if spec is None:
                continue
            sel = cls == code
            lat[sel], bw[sel], pbw[sel] = spec[0], spec[1], spec[3]
        if self.backup:
            roce = cls == ROCE
            lat, bw = self._backup_routes(roce, src, dst, lat, bw)
            pbw = np.where(roce, bw, pbw)         # a NIC: one pair fills it
        eport, iport = src * PORTS + cls, dst * PORTS + cls
        if self.per_link:
            hccs = cls == HCCS
            eport = np.where(hccs, src * PORTS + PER_LINK + self.device_of[dst], eport)
            iport = np.where(hccs, dst * PORTS + PER_LINK + self.device_of[src], iport)
        return lat, bw, pbw, eport, iport

    def routes_alike(self, ranks) -> bool:
        """Whether every row of `ranks` (G, n) routes as its first: a route's class (HCCS, PCIe,
        SIO, UB, RoCE) follows from whether its ends share a superpod, a server, and in a server
        an HCCS group (910A) or a package (A3), and two transfers share a per-link HCCS port
        where they share a sender and the peer's (server, device); so rows whose columns share
        all of these alike route alike. Not with backup NICs (dies borrowing a partner's)."""
        if self.backup:
            return False
        servers, devices = self.server_of[ranks], self.device_of[ranks]
        width = int(self.device_of.max()) + 1
        within = 2 if self.superpod_of is not None else min(self.group_size, width)    # package, HCCS group
        return (same_pattern(servers) and same_pattern(servers * width + devices)
                and same_pattern(servers * width + devices // within)
                and (self.superpod_of is None or same_pattern(self.superpod_of[ranks])))

    def _backup_routes(self, roce, src, dst, lat, bw):
        """Latency and bandwidth of RoCE routes with backup NICs in use: one SIO hop more per
        borrowing end; NIC_SHARE of the bandwidth where either end's NIC is shared (and no more
        than SIO carries, for a borrower)."""
        sio_lat, sio_bw = self.hccs[:2]
        borrowing = self._borrower[src].astype(np.int64) + self._borrower[dst]
        lat = np.where(roce, lat + borrowing * sio_lat, lat)
        bw = np.where(roce & (self._shared[src] | self._shared[dst]), bw * NIC_SHARE, bw)
        return lat, np.where(roce & (borrowing > 0), np.minimum(bw, sio_bw), bw)

    def _specs(self):
        """(class code, (latency ns, bandwidth, kind, port bandwidth) or None) of every link class."""
        if self.superpod_of is not None:     # the intra-server spec: SIO on A3, the mesh on the 950
            return ((SIO if self.packages else HCCS, self.hccs), (UB, self.ub), (ROCE, self.roce))
        return ((HCCS, self.hccs), (PCIE, self.pcie), (ROCE, self.roce))

    def one(self, src, dst):
        code = int(self._class(np.array([src]), np.array([dst]))[0])
        lat, bw, kind, pbw = dict(self._specs())[code]
        via = {HCCS: (), SIO: (), PCIE: (f"pcie:{int(self.server_of[src])}",), ROCE: ("roce",),
               UB: (f"ub:{int(self.superpod_of[src])}",) if self.superpod_of is not None else ()}[code]
        eport = iport = _PORT_NAMES[code]
        if code == HCCS and self.per_link:
            eport, iport = hccs_port(int(self.device_of[dst])), hccs_port(int(self.device_of[src]))
        hops, kinds = (src,) + via + (dst,), (kind,) * (len(via) + 1)
        if code == ROCE and self.backup:
            got = self._backup_routes(np.array([True]), np.array([src]), np.array([dst]), np.array([lat]),
                                      np.array([bw]))
            lat, bw = int(got[0][0]), float(got[1][0])
            pbw = bw
            sio = self.hccs[2]
            if self._borrower[src]:
                hops, kinds = (src, int(self._partner[src])) + hops[1:], (sio,) + kinds
            if self._borrower[dst]:
                hops, kinds = hops[:-1] + (int(self._partner[dst]), dst), kinds + (sio,)
        return lat, bw, pbw, eport, iport, hops, kinds


def _spec(latency_ns: int, bandwidth, kind: str) -> tuple:
    """A link class whose ports one pair fills: (latency ns, bandwidth, kind, port bandwidth)."""
    return latency_ns, float(bandwidth), kind, float(bandwidth)


def same_pattern(labels) -> bool:
    """Whether every row of `labels` (G, n) groups its columns as the first row does:
    labels[g, i] == labels[g, j] exactly when labels[0, i] == labels[0, j]."""
    labels = np.asarray(labels)
    if labels.shape[0] < 2 or labels.shape[1] < 2 or (labels == labels[:, :1]).all():
        return True                                    # one value per row (ranks of one server)
    if (np.diff(labels, axis=1) > 0).all():
        return True                                    # increasing rows: every label distinct
    # each label replaced by the first column holding it in its row, by a stable sort of each row
    order = np.argsort(labels, axis=1, kind="stable")
    ordered = np.take_along_axis(labels, order, axis=1)
    position = np.broadcast_to(np.arange(labels.shape[1]), labels.shape)
    starts = np.ones(labels.shape, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    run_start = np.maximum.accumulate(np.where(starts, position, 0), axis=1)
    first = np.empty_like(order)
    np.put_along_axis(first, order, np.take_along_axis(order, run_start, axis=1), axis=1)
    return bool((first == first[:1]).all())


def hccs_port(peer_device: int) -> str:
    """The name of a per-link HCCS port: the one towards (or from) the peer with this device index."""
    return f"hccs:{peer_device}"


class FullMeshRouter:
    """Every ordered pair has a link with ports of its own."""

    def __init__(self, p, bandwidth, latency):
        self.p, self.bw, self.lat = p, float(bandwidth), seconds_to_ns(latency)

    def many(self, src, dst):
        n = len(src)
        return (np.full(n, self.lat, dtype=np.int64), np.full(n, self.bw), np.full(n, self.bw), src * self.p + dst,
                self.p * self.p + dst * self.p + src)

    def one(self, src, dst):
        return self.lat, self.bw, self.bw, f"link:{dst}", f"link:{src}", (src, dst), ("link",)

    def routes_alike(self, ranks) -> bool:
        """Every pair's route is alike, with ports of its own."""
        return True


class RingRouter:
    """Neighbours linked; farther ranks reached the shorter way round (clockwise on a tie),
    forwarded by the NPUs in between, whose ports this model does not charge."""

    def __init__(self, p, bandwidth, latency):
        self.p, self.bw, self.lat = p, float(bandwidth), seconds_to_ns(latency)

    def _hops(self, src, dst):
        cw = (dst - src) % self.p
        clockwise = cw <= self.p - cw
        return np.where(clockwise, cw, self.p - cw), clockwise

    def many(self, src, dst):
        hops, clockwise = self._hops(src, dst)
        n = len(src)
        return (hops * self.lat, np.full(n, self.bw), np.full(n, self.bw), src * PORTS + np.where(clockwise, RIGHT, LEFT),
                dst * PORTS + np.where(clockwise, LEFT, RIGHT))

    def routes_alike(self, ranks) -> bool:
        """Routes follow the distance round the ring: rows that are turns of the first route alike."""
        ranks = np.asarray(ranks)
        turned = (ranks - ranks[:, :1]) % self.p
        return bool((turned == turned[:1]).all())

    def one(self, src, dst):
        hops, clockwise = self._hops(np.array([src]), np.array([dst]))
        h, cw = int(hops[0]), bool(clockwise[0])
        step = 1 if cw else -1
        path = tuple((src + step * i) % self.p for i in range(h + 1))
        return h * self.lat, self.bw, self.bw, "right" if cw else "left", "left" if cw else "right", path, ("link",) * h
