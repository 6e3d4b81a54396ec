"""Fault plans: what goes wrong, where and when, as a user writes it (docs/design.md, "Faults contract").

A FaultPlan is data: timed link and NIC changes, corrupted transfers, crashing, stalling and
straggling ranks, HBM another tenant holds, each entry checked when it is added (or loaded,
hccl_sim.faults.entries) and again against the topology it is run on, every error an HcclError
naming the entry. Times are simulated seconds from the job's start.
`link_state(topo)` turns the link entries into hcomm's LinkState (the graph edges of each route,
down or slowed over windows of integer nanoseconds), which prices retransmission; stragglers
delay a rank's entry into the ops they name; a corrupt entry names the nth transfer a -> b of the
job, which hccl_sim.faults.progress finds in the op that holds it; an hbm_pressure entry is held
on the rank's device (hccl_sim.faults.hbm). Plans save to and load from YAML.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import yaml

from hcomm.link_state import LinkState
from topologies.errors import Cause, HcclError
from topologies.model import seconds_to_ns

from .entries import KINDS, bad_entry as _bad, check_entry, entry_label as _describe  # noqa: F401 - KINDS read here

RDMA_TIMEOUT_RANGE = {"910A": (5, 24)}     # HCCL_RDMA_TIMEOUT: [5, 20] on A2/A3 (910B, 910C), [5, 24] on 910A
RDMA_TIMEOUT_DEFAULT_RANGE = (5, 20)


@dataclass(frozen=True)
class BoundFaults:
    """A fault plan bound to one topology and HCCL configuration: what the planner and the
    communicators read (hashable; travels with the Config to every rank)."""
    link_state: LinkState
    late: tuple                   # ((rank, ops or None, delay ns), ...)
    plan: tuple                   # the plan's entries, for messages
    crashes: tuple = ()           # ((rank, at_op or None, at ns or None, at_step or None, label), ...)
    corrupt: tuple = ()           # ((src, dst, nth, label), ...): the nth transfer src -> dst fails its CRC
    late_labels: tuple = ()       # ((rank, label), ...) of the straggler entries
    stalls: tuple = ()            # ((rank, at_op or None, at ns or None, label), ...): ranks that stop progressing
    pressures: tuple = ()         # ((rank, at_op or None, at ns or None, duration ns or None, bytes or None,
    #                               label), ...): HBM another tenant holds (hccl_sim.faults.hbm), by world rank

    def restricted(self, world: tuple) -> "BoundFaults":
        """The plan as a communicator of the job's ranks `world` (its rank i is world[i]) sees it:
        link faults as they are (by the cluster's links); stragglers of every op and `at`-second
        crashes renumbered; entries that count op indices (those count the world communicator's
        ops: hccl_sim.comm.split) left out, and so are corrupt entries (their nth counts the world
        communicator's transfers). HBM pressures are as they are: they are held on the device of
        their (world) rank, whichever communicator allocates there."""
        index = {w: i for i, w in enumerate(world)}
        late = tuple((index[r], None, d) for r, ops, d in self.late if ops is None and r in index)
        crashes = tuple((index[r], None, at, None, label) for r, at_op, at, _, label in self.crashes
                        if at_op is None and r in index)
        labels = tuple((index[r], label) for r, label in self.late_labels if r in index)
        stalls = tuple((index[r], None, at, label) for r, at_op, at, label in self.stalls
                       if at_op is None and r in index)
        return dataclasses.replace(self, late=late, crashes=crashes, corrupt=(), late_labels=labels, stalls=stalls)

    def late_label(self, rank: int):
        """The label of `rank`'s straggler entry (its first), or None."""
        return next((label for r, label in self.late_labels if r == rank), None)

    def stall_of(self, rank: int, op_index: int, entry_ns: int):
        """The label of the stall that stops `rank` before it enters its op `op_index` (entering
        at `entry_ns`), or None: an at_op stall of this op, or an `at` stall at or before the
        entry (a host thread that hangs stops launching ops; the device finishes the one it has)."""
        for r, at_op, at, label in self.stalls:
            if r == rank and (at_op == op_index if at_op is not None else at <= entry_ns):
                return label
        return None

    def straggle_ns(self, rank: int, op_index: int) -> int:
        """How late `rank` enters its op number `op_index` (0-based, per communicator)."""
        return sum(d for r, ops, d in self.late if r == rank and (ops is None or op_index in ops))

    def lost_error(self, crash, plan, config, rank: int, opname: str):
        """The HcclError a surviving rank gets, and the clock it gets it at: the heartbeat finds the
        dead rank LOST after 30 s, a notify wait times out after HCCL_EXEC_TIMEOUT, whichever first."""
        dead, t, label = crash
        wait = HEARTBEAT_LOST_S if not config.exec_timeout_s else min(HEARTBEAT_LOST_S, config.exec_timeout_s)
        why = "Heartbeat Lost Occurred" if wait == HEARTBEAT_LOST_S else \
            f"notify wait timed out (HCCL_EXEC_TIMEOUT): EI0002 The wait execution of the Notify register times out, " \
            f"remote rank [{dead}]"
        at = max(t, plan.entry[rank]) + seconds_to_ns(wait)
        return at, HcclError("E_TIMEOUT", f"Cluster Exception Location[rank {dead}], op {plan.signature.name}, "
                             f"algorithm {plan.algo}, crashed at {t / 1e9:.6f} s, detected at {at / 1e9:.6f} s: "
                             f"{why} ({label})", rank=rank, op=opname, **lost_fields(crash, at, wait))


def lost_fields(crash, at: int | None = None, wait: float | None = None) -> dict:
    """HcclError fields of a rank lost to the crash (rank, ns, label) the fault plan put in an op:
    the dead rank, the entry, when it crashed and (`at`) when this rank found it lost, by the
    heartbeat's 30 s or a notify wait's HCCL_EXEC_TIMEOUT (`wait`, s)."""
    dead, t, label = crash
    detail = {"crashed_ns": t}
    if wait is not None:
        detail["detected_by"] = "heartbeat" if wait == HEARTBEAT_LOST_S else "HCCL_EXEC_TIMEOUT"
        detail["wait_s"] = wait
    return {"cause": Cause.RANK_LOST, "peers": (dead,), "fault": label, "time_ns": at, "detail": detail}


LINK_KINDS = ("link_flap", "link_down", "link_slow", "nic_down")
MODELLED = LINK_KINDS + ("straggler", "rank_crash", "corrupt", "rank_stall", "hbm_pressure")
STOPPING = ("rank_crash", "rank_stall")
"""Kinds that stop a rank: its function ends there and its result is None."""
"""Kinds a run prices today; a plan holding another kind is refused (E_NOT_SUPPORT) when run."""
HEARTBEAT_LOST_S = 30
"""A rank that stops answering is LOST after 30 s without heartbeat (HCCL_LOST_THRESHOLD,
heartbeat.h; docs/references.md §10.3)."""


class RankCrashed(BaseException):
    """Raised on a rank the fault plan kills: its function stops there, and its result is None.
    A BaseException, so that the rank's own `except HcclError` cannot survive its death."""

    def __init__(self, rank: int, time_ns: int, op: str):
        self.rank, self.time_ns, self.op = rank, time_ns, op
        super().__init__(f"rank {rank} crashed in {op} at {time_ns / 1e9:.6f} s (fault plan)")


class RankStalled(RankCrashed):
    """Raised on a rank the fault plan stalls (its host thread hangs: the process lives, no op is
    launched any more): its function stops there, its result is None, its process goes on."""

    def __init__(self, rank: int, time_ns: int, op: str):
        BaseException.__init__(self, f"rank {rank} stalled before {op} at {time_ns / 1e9:.6f} s (fault plan)")
        self.rank, self.time_ns, self.op = rank, time_ns, op


class FaultPlan:
    """A seeded list of faults. Each method adds one entry and returns the plan."""

    def __init__(self, seed: int = 0):
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise HcclError("E_PARA", f"FaultPlan seed must be an integer, got {seed!r}")
        self.seed = seed
        self.entries: list = []

    def _add(self, **entry):
        self.entries.append(check_entry(len(self.entries), entry))
        return self

    def link_flap(self, a, b, at, duration):
        """The link(s) of the route between ranks a and b, both directions, down during [at, at + duration) s."""
        return self._add(kind="link_flap", a=a, b=b, at=at, duration=duration)

    def link_down(self, a, b, at=0.0):
        return self._add(kind="link_down", a=a, b=b, at=at)

    def link_slow(self, a, b, factor, at=0.0, duration=None):
        return self._add(kind="link_slow", a=a, b=b, factor=factor, at=at, duration=duration)

    def nic_down(self, rank, at=0.0, duration=None):
        """The rank's RoCE port: every route through it."""
        return self._add(kind="nic_down", rank=rank, at=at, duration=duration)

    def corrupt(self, a, b, nth=0):
        """The nth transfer from rank a to rank b (0-based, over the whole job in op order: every
        transfer a -> b of every collective, every loop, and every send a -> b) fails its CRC and is
        retransmitted after the retransmission interval: one lost attempt."""
        return self._add(kind="corrupt", a=a, b=b, nth=nth)

    def rank_crash(self, rank, at_op=None, at=None, at_step=None):
        return self._add(kind="rank_crash", rank=rank, at_op=at_op, at=at, at_step=at_step)

    def rank_stall(self, rank, at_op=None, at=None):
        return self._add(kind="rank_stall", rank=rank, at_op=at_op, at=at)

    def straggler(self, rank, delay, ops=None):
        return self._add(kind="straggler", rank=rank, delay=delay, ops=ops)

    def hbm_pressure(self, rank, at=None, at_op=None, duration=None, bytes=None):  # noqa: A002 - the entry's field
        """Another tenant of the rank's NPU holds `bytes` of its free HBM (None: all that is free),
        from `at` seconds (or from the rank's entry into its world op number `at_op`; neither: from
        the job's start) for `duration` seconds (None: for good). The rank's allocations and link
        setups that do not fit beside it fail with E_MEMORY (docs/design.md, "Faults contract")."""
        return self._add(kind="hbm_pressure", rank=rank, at_op=at_op, at=at, duration=duration, bytes=bytes)

    def __len__(self):
        return len(self.entries)

    def __repr__(self):
        return f"<FaultPlan seed={self.seed}: {len(self.entries)} fault(s)>"

    # ---- persistence ------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"seed": self.seed, "faults": [dict(e) for e in self.entries]}

    @classmethod
    def from_dict(cls, data) -> "FaultPlan":
        if not isinstance(data, dict) or set(data) - {"seed", "faults"}:
            raise HcclError("E_PARA", "a fault plan is a mapping with 'seed' and 'faults' (a list of entries), got "
                            f"{data!r:.120}")
        faults = data.get("faults") or []
        if not isinstance(faults, list):
            raise HcclError("E_PARA", f"fault plan 'faults' must be a list of entries, got {faults!r:.80}")
        plan = cls(data.get("seed", 0))
        for entry in faults:
            plan.entries.append(check_entry(len(plan.entries), entry))
        return plan

    def save(self, path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))

    @classmethod
    def load(cls, path) -> "FaultPlan":
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise HcclError("E_PARA", f"fault plan {path}: cannot be read ({e.strerror})") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            raise HcclError("E_PARA", f"fault plan {path}: not valid YAML{where}: "
                            f"{getattr(e, 'problem', None) or e}") from None
        try:
            return cls.from_dict(data if data is not None else {})
        except HcclError as e:
            raise HcclError(e.code, f"fault plan {path}: {e.reason}") from None

    # ---- binding to a run -------------------------------------------------------------------------
    def check_for(self, topo) -> None:
        """Every entry names ranks of `topo`, and every kind is one a run prices."""
        p = topo.num_ranks
        for i, e in enumerate(self.entries):
            for f in ("a", "b", "rank"):
                if f in e and e[f] >= p:
                    raise _bad(i, e, f"{f}={e[f]} is not a rank of {topo.name} (ranks 0..{p - 1})")
            if e["kind"] == "hbm_pressure" and e["bytes"] is not None and e["bytes"] > topo.device_model.hbm_bytes:
                raise _bad(i, e, f"bytes={e['bytes']} is more than the {topo.device_model.hbm_bytes} B of HBM a "
                           f"{topo.device} device of {topo.name} has: no tenant can hold that")
            if e["kind"] == "nic_down" and "RoCE" not in _kinds_from(topo, e["rank"]):
                raise _bad(i, e, f"rank {e['rank']} reaches no peer over RoCE on {topo.name}: it has no NIC in use")
            if e["kind"] not in MODELLED:
                raise HcclError("E_NOT_SUPPORT", f"{_describe(i, e)}: {e['kind']} faults are not modelled yet; "
                                f"hccl-sim runs {', '.join(MODELLED)}")

    def bind(self, topo, config) -> BoundFaults:
        """The plan on `topo` under `config` (HCCL_RDMA_TIMEOUT and HCCL_RDMA_RETRY_CNT set the
        retransmission rule), checked against both."""
        lo, hi = RDMA_TIMEOUT_RANGE.get(topo.device, RDMA_TIMEOUT_DEFAULT_RANGE)
        if not lo <= config.rdma_timeout <= hi:
            raise HcclError("E_PARA", f"HCCL_RDMA_TIMEOUT={config.rdma_timeout} is out of range [{lo}, {hi}] on "
                            f"{topo.device}")
        interval = seconds_to_ns(4.096e-6 * 2 ** config.rdma_timeout)
        late = tuple((e["rank"], None if e["ops"] is None else tuple(e["ops"]), seconds_to_ns(e["delay"]))
                     for e in self.entries if e["kind"] == "straggler")
        crashes = tuple((e["rank"], e["at_op"], None if e["at"] is None else seconds_to_ns(e["at"]), e["at_step"],
                         _describe(i, e)) for i, e in enumerate(self.entries) if e["kind"] == "rank_crash")
        corrupt = tuple((e["a"], e["b"], e["nth"], _describe(i, e)) for i, e in enumerate(self.entries)
                        if e["kind"] == "corrupt")
        labels = tuple((e["rank"], _describe(i, e)) for i, e in enumerate(self.entries) if e["kind"] == "straggler")
        stalls = tuple((e["rank"], e["at_op"], None if e["at"] is None else seconds_to_ns(e["at"]), _describe(i, e))
                       for i, e in enumerate(self.entries) if e["kind"] == "rank_stall")
        pressures = tuple((e["rank"], e["at_op"], None if e["at"] is None else seconds_to_ns(e["at"]),
                           None if e["duration"] is None else max(1, seconds_to_ns(e["duration"])), e["bytes"],
                           _describe(i, e)) for i, e in enumerate(self.entries) if e["kind"] == "hbm_pressure")
        if stalls and not config.exec_timeout_s:
            raise HcclError("E_PARA", f"{stalls[0][3]}: a stalled rank is found only by its peers' HCCL_EXEC_TIMEOUT, "
                            "which is 0 (never): they would wait for it for ever")
        return BoundFaults(self.link_state(topo, interval, config.rdma_retry_cnt), late,
                           tuple(tuple(sorted(e.items(), key=lambda kv: kv[0])) for e in self.entries), crashes,
                           corrupt, labels, stalls, pressures)

    def link_state(self, topo, interval_ns: int = 4096 << 20, retries: int = 7) -> LinkState:
        """hcomm's LinkState of the plan's link entries on `topo` (edges of each route, ns windows)."""
        self.check_for(topo)
        changes = []
        for i, e in enumerate(self.entries):
            kind = e["kind"]
            if kind not in LINK_KINDS:
                continue
            if kind == "nic_down":
                edges = _nic_edges(topo, e["rank"])
            else:
                edges = _route_edges(topo, e["a"], e["b"])
            start = seconds_to_ns(e["at"])
            if kind == "link_flap":
                end = start + max(1, seconds_to_ns(e["duration"]))
            elif e.get("duration") is None:
                end = None
            else:
                end = start + max(1, seconds_to_ns(e["duration"]))
            factor = e["factor"] if kind == "link_slow" else 0.0
            changes.append((tuple(edges), start, end, float(factor), _describe(i, e)))
        return LinkState(tuple(changes), interval_ns, retries)


def _route_edges(topo, a, b):
    """The graph edges a route crosses, both directions alike (undirected, sorted by name)."""
    hops = topo.route(a, b).hops
    return sorted({tuple(sorted((str(u), str(v)))) for u, v in zip(hops[:-1], hops[1:])})


def _roce_route(topo, rank):
    """A route from `rank` over RoCE (to the first rank of some other server), or None."""
    seen = set()
    for other in range(topo.num_ranks):
        s = topo.server_of[other]
        if s == topo.server_of[rank] or s in seen:
            continue
        seen.add(s)
        route = topo.route(rank, other)
        if "RoCE" in route.kinds:
            return route
    return None


def _kinds_from(topo, rank):
    route = _roce_route(topo, rank)
    return () if route is None else route.kinds


def _nic_edges(topo, rank):
    hops = _roce_route(topo, rank).hops
    return [tuple(sorted((str(hops[0]), str(hops[1]))))]
