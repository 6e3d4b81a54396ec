"""Fault scenarios aimed at what a test's fault-free run did, drawn and shrunk by Hypothesis.

The twin's op logs say which calls the test's ranks made: each collective (its communicator and
number there) and each point-to-point op, with its members and its span in simulated time
(`Targets`). A scenario is a FaultPlan of 1..max_faults entries, each aimed at one call: a time
inside its span, ranks and links among its members (a pair in one server or across servers), a
duration against the RDMA retransmission budget the run's environment makes, a crash entering
the call, at one of its steps or at a time inside it, HBM another tenant holds from the call
(or a time inside it) on.

The draw is ordered so that Hypothesis's shrinking (it makes the choices it drew smaller, the
earlier ones first, and lists shorter) finds the smallest plan in the order a reader wants it:
fewest entries, then the earliest call and the earliest moment in it, then the mildest fault
(`MILDEST_FIRST`: a slowdown before a flap, a flap before a failed link, a crash last), then the
mildest form of it (the shortest outage, the slightest slowdown, the lowest rank).
"""
from __future__ import annotations

from dataclasses import dataclass

from hcomm.cost import fingerprint
from topologies.errors import HcclError

from ..chaos.makers import SLOW_FACTORS, STRAGGLER_DELAYS_S, fmt_s
from ..config.env import Config
from ..faults import fault_plan as fault_kinds
from ..faults.fault_plan import FaultPlan
from ..faults.retry import level_of
from ..npu.device import Allocator
from ..plan.costs import effective_cost

MILDEST_FIRST = ("straggler", "link_slow", "corrupt", "link_flap", "nic_down", "link_down", "hbm_pressure",
                 "rank_stall", "rank_crash")
"""Fault kinds from the mildest (a late rank, a slow link: nothing fails) to the worst (a dead
rank); what a shrunk plan's kind tends to. An HBM pressure fails an op as a failed link does (its
rank, alive, gets E_MEMORY; its peers time out), milder than a rank that stops."""
PRESSURES = (None, "all but 1 MiB", "half")
"""What an hbm_pressure holds of the rank's HBM, harshest first (so shrinking keeps the one that
fails): all that is free, all of a fresh device's but 1 MiB (a link setup still fits), half."""
SLOW_PEER_MARGIN_S = 5.0
"""How much later than HCCL_EXEC_TIMEOUT the slowest straggler drawn enters (simulated s)."""
OUTAGES = ("one interval", "under budget", "past budget", "past budget, back within HoldTime")
"""How long a flapping link or NIC stays down, mildest first: within one retransmission interval
(the next attempt gets through), under the whole RDMA budget, past it (an error CQE), past it
but back before op retry's HoldTime is over."""


@dataclass(frozen=True)
class Target:
    """One call of the twin: `scope` and `seq` (its communicator, and its collective number there;
    None: a point-to-point op), its name, members (job ranks) and span (first entry, last exit, ns)."""
    scope: str
    seq: int | None
    name: str
    members: tuple
    start: int
    end: int


@dataclass(frozen=True)
class Facts:
    """What a scenario can aim at: the twin's calls on one topology, with the run's configuration."""
    topology: object
    config: Config
    targets: tuple
    nic_ranks: tuple
    kinds: tuple

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.topology)


def facts_of(runs, kinds=None) -> Facts:
    """The Facts of a twin's runs (hccl_sim.testing.recording.RunRecord): the calls of the runs on
    the first run's topology; `kinds`, the kinds to draw (None: every modelled kind this module
    makes that the topology can have)."""
    done = [r for r in runs if r.status == "done" and r.outcomes is not None]
    if not done:
        raise HcclError("E_PARA", "the test made no hccl_sim run (hccl_sim.run or Cluster.run) that finished: "
                        "there is nothing to aim faults at")
    first = done[0]
    topo, key = first.topology, fingerprint(first.topology)
    if topo.num_ranks < 2:
        raise HcclError("E_PARA", f"faults are between ranks: the test's run has {topo.num_ranks} rank")
    spans = {}
    for run in done:
        if fingerprint(run.topology) != key:
            continue
        for rank, outcome in enumerate(run.outcomes):
            p2p = 0
            for op in outcome.log if outcome is not None else ():
                if op.seq is None:
                    ident, p2p = (op.scope, None, rank, p2p), p2p + 1
                else:
                    ident = (op.scope, op.seq)
                lo, hi, name, members = spans.get(ident, (op.record.start, op.record.end, op.record.name,
                                                          op.world_ranks))
                spans[ident] = (min(lo, op.record.start), max(hi, op.record.end), name, members)
    targets = sorted((Target(k[0], k[1] if len(k) == 2 else None, name, tuple(members), lo, hi)
                      for k, (lo, hi, name, members) in spans.items()), key=lambda t: (t.start, t.end, t.scope))
    if not targets:
        raise HcclError("E_PARA", "the test's ranks made no collective or transfer: there is nothing to aim faults at")
    nic = []
    for r in range(topo.num_ranks):
        try:
            FaultPlan().nic_down(r).check_for(topo)
            nic.append(r)
        except HcclError:
            pass
    wanted = MILDEST_FIRST if kinds is None else tuple(k for k in MILDEST_FIRST if k in kinds)
    usable = tuple(k for k in wanted if k in fault_kinds.MODELLED and (k != "nic_down" or nic))
    if not usable:
        raise HcclError("E_PARA", f"none of the fault kinds {list(kinds or MILDEST_FIRST)} can be drawn on "
                        f"{topo.name}")
    return Facts(topo, first.config, tuple(targets), tuple(nic), usable)


def check_kinds(kinds) -> tuple:
    """`kinds` as given to the marker, checked: known, modelled fault kinds."""
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = (kinds,)
    bad = [k for k in kinds if k not in fault_kinds.KINDS]
    if bad:
        raise HcclError("E_PARA", f"unknown fault kind(s) {bad}: expected some of {', '.join(MILDEST_FIRST)}")
    return tuple(kinds)


def plans(facts: Facts, max_faults: int = 2):
    """The Hypothesis strategy of scenarios' fault plans on `facts`."""
    from hypothesis import strategies as st

    @st.composite
    def entry(draw):
        return _entry(draw, st, facts)

    def plan(entries):
        out = FaultPlan(seed=0)
        for kind, fields in entries:
            getattr(out, kind)(**fields)
        return out
    # a list, so that shrinking can drop any entry, not only the last
    return st.lists(entry(), min_size=1, max_size=max_faults).map(plan)


def _entry(draw, st, facts: Facts):
    t = facts.targets[draw(st.integers(0, len(facts.targets) - 1))]
    at = t.start + 1 + (max(1, t.end - t.start) - 1) * draw(st.integers(0, 99)) // 100
    kind = draw(st.sampled_from(facts.kinds))
    members = t.members if len(t.members) > 1 else tuple(range(facts.topology.num_ranks))
    world_op = t.scope == "" and t.seq is not None
    if kind == "straggler":
        rank = draw(st.sampled_from(members))
        delay = draw(st.sampled_from(_delays(facts.config)))
        every = draw(st.booleans()) or not world_op
        return kind, dict(rank=rank, delay=delay, ops=None if every else [t.seq])
    if kind == "rank_stall":
        rank = draw(st.sampled_from(members))
        if world_op and not draw(st.booleans()):
            return kind, dict(rank=rank, at_op=t.seq)
        return kind, dict(rank=rank, at=at / 1e9)
    if kind == "hbm_pressure":
        rank = draw(st.sampled_from(members))
        fields = dict(at_op=t.seq) if world_op and not draw(st.booleans()) else dict(at=at / 1e9)
        lasting = draw(st.booleans())
        fields["duration"] = None if lasting else max(1, (t.end - t.start) * (1 + draw(st.integers(0, 19))) // 10) / 1e9
        fields["bytes"] = _held_bytes(facts, draw(st.sampled_from(PRESSURES)))
        return kind, dict(rank=rank, **fields)
    if kind == "rank_crash":
        rank = draw(st.sampled_from(members))
        mode = draw(st.sampled_from(("at_op", "at_step", "at") if world_op else ("at",)))
        if mode == "at_op":
            return kind, dict(rank=rank, at_op=t.seq)
        if mode == "at_step":
            return kind, dict(rank=rank, at_op=t.seq, at_step=draw(st.integers(0, 7)))
        return kind, dict(rank=rank, at=at / 1e9)
    if kind == "nic_down":
        rank = draw(st.sampled_from([r for r in members if r in facts.nic_ranks] or list(facts.nic_ranks)))
        if draw(st.booleans()):
            return kind, dict(rank=rank, at=at / 1e9, duration=None)
        return kind, dict(rank=rank, at=at / 1e9, duration=_outage(draw, st, facts) / 1e9)
    a, b = draw(st.sampled_from(_pairs(facts.topology, members)))
    if kind == "link_slow":
        factor = draw(st.sampled_from(SLOW_FACTORS))
        lasting = draw(st.booleans())
        duration = None if lasting else max(1, (t.end - t.start) * (1 + draw(st.integers(0, 19))) // 10)
        return kind, dict(a=a, b=b, factor=factor, at=at / 1e9, duration=None if duration is None else duration / 1e9)
    if kind == "link_flap":
        return kind, dict(a=a, b=b, at=at / 1e9, duration=_outage(draw, st, facts) / 1e9)
    if kind == "link_down":
        return kind, dict(a=a, b=b, at=at / 1e9)
    if kind == "corrupt":
        return kind, dict(a=a, b=b, nth=draw(st.sampled_from((0, 1, 3))))
    raise HcclError("E_NOT_SUPPORT", f"fault kind {kind} is not drawn by hccl_sim.testing")


def _delays(config) -> tuple:
    """How late a straggler enters, shortest first: chaos's, then past HCCL_EXEC_TIMEOUT (its
    peers' notify waits time out: E_TIMEOUT naming it)."""
    timeout = config.exec_timeout_s
    return STRAGGLER_DELAYS_S + ((timeout + SLOW_PEER_MARGIN_S,) if timeout else ())


def _held_bytes(facts: Facts, share):
    """PRESSURES' `share` in bytes of the topology's device (None: all that is free)."""
    if share is None:
        return None
    free = facts.topology.device_model.hbm_bytes - Allocator.rounded(2 * facts.config.buffsize_bytes)
    return free // 2 if share == "half" else free - (1 << 20)


def _outage(draw, st, facts: Facts) -> int:
    """A down time (ns), OUTAGES' regime, against the run's RDMA budget and HoldTime."""
    state = FaultPlan().bind(facts.topology, facts.config).link_state
    interval, total = state.interval_ns, state.interval_ns * state.retries
    hold = dict(facts.config.retry_params)["HoldTime"] * 1_000_000
    regime = draw(st.sampled_from(range(len(OUTAGES))))
    share = draw(st.integers(0, 99)) / 100
    if regime == 0:
        d = interval * (0.05 + 0.85 * share)
    elif regime == 1:
        d = total * (0.3 + 0.65 * share)
    elif regime == 2 or not hold:
        d = total * (1.05 + 2.95 * share)
    else:
        d = (total + interval) * 1.01 + hold * 0.9 * share
    return max(1, int(d))


def _pairs(topo, members) -> list:
    """Ordered pairs of `members`, those inside one server first (an L0 link), then across."""
    same = [(a, b) for a in members for b in members if a != b and topo.server_of[a] == topo.server_of[b]]
    other = [(a, b) for a in members for b in members if topo.server_of[a] != topo.server_of[b]]
    return same + other


def describe(plan: FaultPlan, topology) -> str:
    """A plan's entries in a few words each (chaos's wording)."""
    cost = effective_cost(topology, Config())
    words = []
    for e in plan.entries:
        kind = e["kind"]
        if "a" in e:
            where = f"{e['a']}-{e['b']} ({level_of(cost, e['a'], e['b'])})"
        else:
            where = f"rank {e['rank']}"
        text = f"{kind} {where}"
        if kind == "straggler":
            text += f" +{fmt_s(e['delay'])} in " + ("every op" if e.get("ops") is None else f"op {e['ops']}")
        elif kind == "hbm_pressure":
            text += " holds " + ("all its free HBM" if e["bytes"] is None else f"{e['bytes']} B")
            text += f" from {fmt_s(e['at'])}" if e.get("at") is not None else f" from op {e['at_op']}"
            text += " for good" if e["duration"] is None else f" for {fmt_s(e['duration'])}"
        elif kind in ("rank_crash", "rank_stall"):
            text += (f" at {fmt_s(e['at'])}" if e.get("at") is not None else f" entering op {e['at_op']}"
                     + (f" at step {e['at_step']}" if e.get("at_step") is not None else ""))
        elif kind == "corrupt":
            text += f" transfer {e['nth']}"
        else:
            if kind == "link_slow":
                text += f" x{e['factor']}"
            text += f" at {fmt_s(e.get('at') or 0.0)}"
            if "duration" in e:
                text += " for good" if e["duration"] is None else f" for {fmt_s(e['duration'])}"
        words.append(text)
    return " + ".join(words)
