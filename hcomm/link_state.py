"""Link state in time: which graph edges are down or slowed when, and what that does to a transfer.

A LinkState is immutable and hashed by content, so it can key a CostModel: every cache priced in
one link state is apart from those of another (hcomm.cost). A change is (edges, start, end, factor,
label): the edges (node pairs of the topology's graph, as route hops name them) are down
(factor 0) or run at `factor` times their bandwidth during [start, end) ns (end None: for good).

Retransmission (docs/references.md §10.1; docs/design.md, "Faults contract"): an attempt that finds
a link of its route down, or sees one go down before its last byte is on the wire, is retried
after `interval` ns (4.096 us x 2^HCCL_RDMA_TIMEOUT) up to `retries` times (HCCL_RDMA_RETRY_CNT);
past that the transfer ends in an error CQE. A slowed route carries the attempt at the rate in
force when it starts. A flap shorter than the budget only delays the transfer. A corrupted
transfer (`crc`: a plan's `corrupt` entry) loses its first attempt that finds the route up: the
receiver drops it on its CRC, and the sender retransmits after the same interval; that attempt
counts against the same budget.
"""
from __future__ import annotations

import math


class LinkFailure(Exception):
    """A transfer's retransmissions ran out (an error CQE): when, on which link, between whom, and
    which ranks had already finished the op. Raised by the timing replay; the planner turns it
    into an op retry or an HcclError (E_REMOTE)."""

    def __init__(self, time_ns: int, label: str, attempts: int, src: int = -1, dst: int = -1):
        self.time_ns, self.label, self.attempts, self.src, self.dst = time_ns, label, attempts, src, dst
        self.finished = ()          # ranks whose every step had completed (set by the replay)
        self.hops = ()
        self.step = None            # the sender's step index in the op (set by the replay)
        self.down_edges = ()        # graph edges down when the last attempt failed (none: a CRC error)
        super().__init__(f"error CQE after {attempts} attempts ({label}) at {time_ns} ns")


class LinkState:
    """Timed link changes plus the retransmission rule; empty = every link as built."""

    def __init__(self, changes: tuple = (), interval_ns: int = 4096 << 20, retries: int = 7):
        self.changes = tuple(changes)
        self.interval_ns, self.retries = int(interval_ns), int(retries)
        self.key = (self.changes, self.interval_ns, self.retries)
        self._by_edge = {}
        for edges, start, end, factor, label in self.changes:
            for e in edges:
                e = tuple(e)
                self._by_edge.setdefault(e, []).append((start, math.inf if end is None else end, factor, label, e))

    def __bool__(self):
        return bool(self.changes)

    def __eq__(self, other):
        return isinstance(other, LinkState) and other.key == self.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"<LinkState {len(self.changes)} change(s)>"

    def affects(self, lo: int, hi: int) -> bool:
        """Some change is in force somewhere during [lo, hi] ns."""
        return any(start <= hi and (end is None or end > lo) for _, start, end, _, _ in self.changes)

    @staticmethod
    def edges_of(hops) -> list:
        return [tuple(sorted((str(u), str(v)))) for u, v in zip(hops[:-1], hops[1:])]

    def _changes_on(self, edges):
        out = []
        for e in edges:
            out.extend(self._by_edge.get(e, ()))
        return out

    def down_for_good(self, edge, t: int) -> bool:
        """Edge `edge` is down at `t` and never comes back (a change of factor 0 with no end)."""
        return any(f == 0 and s <= t and e == math.inf for s, e, f, _, _ in self._by_edge.get(tuple(edge), ()))

    def down_at(self, edge, t: int) -> bool:
        """Edge `edge` is down at `t`."""
        return any(f == 0 and s <= t < e for s, e, f, _, _ in self._by_edge.get(tuple(edge), ()))

    def transmit(self, hops, start: int, wire: int, crc: str | None = None, attempts: list | None = None):
        """(end of the last attempt's wire time, attempts that failed) of a transfer posted at
        `start` needing `wire` ns; LinkFailure when the retransmissions run out.

        `crc`: the transfer is corrupted (the label of the fault): its first attempt that finds the
        route up fails its CRC all the same. `attempts`: a list to which every failed attempt is
        appended as (start, retransmission time, why)."""
        changes = self._changes_on(self.edges_of(hops))
        if not changes and crc is None:
            return start + wire, 0
        t, failed = start, 0
        while True:
            factor = 1.0
            for s, e, f, _, _ in changes:
                if f > 0 and s <= t < e:
                    factor *= f
            need = wire if factor == 1.0 else math.ceil(wire / factor)
            down = [(label, edge) for s, e, f, label, edge in changes if f == 0 and s < t + max(need, 1) and e > t]
            if not down and crc is None:
                return t + need, failed
            label = down[0][0] if down else crc
            if attempts is not None:
                attempts.append((t, t + self.interval_ns, f"link down: {label}" if down else f"CRC error: {label}"))
            if not down:
                crc = None              # the corrupted attempt is the only one
            failed += 1
            t += self.interval_ns
            if failed > self.retries:
                failure = LinkFailure(t, label, failed)
                failure.down_edges = tuple(dict.fromkeys(edge for _, edge in down))
                raise failure
