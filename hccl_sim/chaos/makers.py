"""One fault of each kind for a chaos scenario (hccl_sim.chaos.scenarios draws which): where
(rank pairs inside a server and between servers, NICs in use), when (inside the call aimed at),
for how long against the RDMA retransmission budget, how slow, how late; and the few words the
campaign's table shows for it."""
from __future__ import annotations

from ..config.env import Config
from ..faults.hbm import LINK_SETUP_BYTES
from ..npu.device import Allocator
from ..plan.costs import effective_cost
from ..faults.retry import level_of

STRAGGLER_DELAYS_S = (2e-6, 5e-5, 1e-3, 2e-2)
"""How late a straggler enters, s: from less than one op (a few us) to far more (20 ms, a slow
host step); chaos's choice, not an HCCL constant."""
SLOW_FACTORS = (0.5, 0.2, 0.05, 0.01)
"""Bandwidth factors of a slowed link: a congested port (x0.5) down to a nearly dead one (x0.01)."""


def _inside(rng, spans, target) -> int:
    """A simulated time (ns) strictly inside the target call's span."""
    lo, hi = spans[target]
    return int(lo + rng.integers(max(1, hi - lo)))


def _pair(rng, space):
    """Two ranks: half the time in one server (an L0 link), else in different servers."""
    topo = space.topo
    p = topo.num_ranks
    a = int(rng.integers(p))
    same = [r for r in range(p) if r != a and topo.server_of[r] == topo.server_of[a]]
    other = [r for r in range(p) if topo.server_of[r] != topo.server_of[a]]
    pool = same if same and (not other or rng.random() < 0.5) else other
    b = pool[int(rng.integers(len(pool)))]
    return a, b, level_of(effective_cost(topo, Config()), a, b)


def _duration(rng, budget, env) -> tuple:
    """A down time (ns) against the RDMA retransmission budget: within one interval (the first
    retransmission gets through), under the whole budget, past it (an error CQE), or past it but
    back within HoldTime (what op retry, where it is on, recovers from)."""
    interval, retries = budget
    total = interval * retries
    hold_ns = dict(Config.from_env(env).retry_params)["HoldTime"] * 1_000_000
    regime = int(rng.choice(4, p=[0.25, 0.2, 0.35, 0.2]))
    if regime == 0:
        d = int(interval * rng.uniform(0.05, 0.9))
    elif regime == 1:
        d = int(total * rng.uniform(0.3, 0.95))
    elif regime == 2 or not hold_ns:
        d = int(total * rng.uniform(1.05, 4.0))
    else:
        d = int((total + interval) * 1.01 + hold_ns * rng.uniform(0.0, 0.9))
    return max(1, d), d / total


def fmt_s(seconds: float) -> str:
    """A simulated duration in the unit that reads best."""
    a = abs(seconds)
    if a == 0:
        return "0"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if a >= scale:
            return f"{seconds / scale:.3g}{unit}"
    return f"{seconds * 1e9:.0f}ns"


def _make_flap(rng, space, spans, target, budget, env):
    a, b, level = _pair(rng, space)
    at = _inside(rng, spans, target)
    d, share = _duration(rng, budget, env)
    return (dict(a=a, b=b, at=at / 1e9, duration=d / 1e9),
            f"link_flap {a}-{b} ({level}) at {fmt_s(at / 1e9)} for {fmt_s(d / 1e9)} ({share:.2g}x RDMA budget)")


def _make_down(rng, space, spans, target, budget, env):
    a, b, level = _pair(rng, space)
    at = _inside(rng, spans, target)
    return dict(a=a, b=b, at=at / 1e9), f"link_down {a}-{b} ({level}) at {fmt_s(at / 1e9)}"


def _make_slow(rng, space, spans, target, budget, env):
    a, b, level = _pair(rng, space)
    factor = SLOW_FACTORS[int(rng.integers(len(SLOW_FACTORS)))]
    at = 0 if rng.random() < 0.3 else _inside(rng, spans, target)
    lo, hi = spans[target]
    duration = None if rng.random() < 0.5 else max(1, int((hi - lo) * rng.uniform(0.1, 2.0)))
    text = f"link_slow {a}-{b} ({level}) x{factor} from {fmt_s(at / 1e9)}"
    text += " for good" if duration is None else f" for {fmt_s(duration / 1e9)}"
    return dict(a=a, b=b, factor=factor, at=at / 1e9, duration=None if duration is None else duration / 1e9), text


def _make_nic(rng, space, spans, target, budget, env):
    rank = space.nic_ranks[int(rng.integers(len(space.nic_ranks)))]
    at = _inside(rng, spans, target)
    if rng.random() < 0.4:
        return dict(rank=rank, at=at / 1e9, duration=None), f"nic_down rank {rank} at {fmt_s(at / 1e9)} for good"
    d, share = _duration(rng, budget, env)
    return (dict(rank=rank, at=at / 1e9, duration=d / 1e9),
            f"nic_down rank {rank} at {fmt_s(at / 1e9)} for {fmt_s(d / 1e9)} ({share:.2g}x RDMA budget)")


def _make_straggler(rng, space, spans, target, budget, env):
    rank = int(rng.integers(space.topo.num_ranks))
    delay = STRAGGLER_DELAYS_S[int(rng.integers(len(STRAGGLER_DELAYS_S)))]
    ops = None if rng.random() < 0.4 else [target]
    where = "every op" if ops is None else f"op {target}"
    return dict(rank=rank, delay=delay, ops=ops), f"straggler rank {rank} +{fmt_s(delay)} in {where}"


def _make_crash(rng, space, spans, target, budget, env):
    rank = int(rng.integers(space.topo.num_ranks))
    mode = int(rng.integers(3))
    if mode == 0:
        return dict(rank=rank, at_op=target), f"rank_crash rank {rank} entering op {target}"
    if mode == 1:
        step = int(rng.integers(8))
        return dict(rank=rank, at_op=target, at_step=step), f"rank_crash rank {rank} in op {target} at step {step}"
    at = _inside(rng, spans, target)
    return dict(rank=rank, at=at / 1e9), f"rank_crash rank {rank} at {fmt_s(at / 1e9)} (op {target})"


def _make_corrupt(rng, space, spans, target, budget, env):
    # corrupt counts the transfers a -> b themselves: between servers, a pair that talks directly
    # (the same card of another server, level1's ring/NHR/... peers); inside one, any pair
    a, b, level = _pair(rng, space)
    topo = space.topo
    if topo.server_of[a] != topo.server_of[b]:
        mine = [r for r in range(topo.num_ranks) if topo.server_of[r] == topo.server_of[a]]
        theirs = [r for r in range(topo.num_ranks) if topo.server_of[r] == topo.server_of[b]]
        if len(theirs) > mine.index(a):
            b = theirs[mine.index(a)]
    nth = int(rng.choice([0, 1, 3]))
    return dict(a=a, b=b, nth=nth), f"corrupt {a}->{b} ({level}) transfer {nth}"


def _make_stall(rng, space, spans, target, budget, env):
    rank = int(rng.integers(space.topo.num_ranks))
    if rng.random() < 0.5:
        return dict(rank=rank, at_op=target), f"rank_stall rank {rank} before op {target}"
    at = _inside(rng, spans, target)
    return dict(rank=rank, at=at / 1e9), f"rank_stall rank {rank} at {fmt_s(at / 1e9)} (stops before its next op)"


def _make_pressure(rng, space, spans, target, budget, env):
    # every call of a scenario is the same op and algorithm: only the first sets its links up, so
    # only a pressure held at its entry (time 0) can fail it; the rest must change nothing
    rank = int(rng.integers(space.topo.num_ranks))
    free = space.topo.device_model.hbm_bytes - Allocator.rounded(2 * Config.from_env(env).buffsize_bytes)
    nbytes, left = [(None, "all its free HBM"), (free - 1024, "all but 1 KiB"),
                    (free - 4 * LINK_SETUP_BYTES, "all but 1 MiB"), (free // 2, "half its free HBM")][int(rng.integers(4))]
    mode = int(rng.integers(3))
    if mode == 0:
        fields, when = dict(at_op=target), f"from op {target}"
    elif mode == 1:
        at = _inside(rng, spans, target)
        fields, when = dict(at=at / 1e9), f"from {fmt_s(at / 1e9)} (op {target})"
    else:
        fields, when = dict(at=0.0), "from the start"
    duration = None if rng.random() < 0.5 else max(1, int((spans[0][1] - spans[0][0]) * rng.uniform(0.5, 3.0))) / 1e9
    text = f"hbm_pressure rank {rank} holds {left} {when}" + (" for good" if duration is None else f" for {fmt_s(duration)}")
    return dict(rank=rank, bytes=nbytes, duration=duration, **fields), text


MAKERS = {"link_flap": _make_flap, "link_down": _make_down, "link_slow": _make_slow, "nic_down": _make_nic,
               "straggler": _make_straggler, "rank_crash": _make_crash, "corrupt": _make_corrupt,
               "rank_stall": _make_stall, "hbm_pressure": _make_pressure}
"""kind -> maker(rng, space, spans, target, rdma budget, env) -> (the FaultPlan method's keyword
arguments, a few words saying what it does). A kind of hccl_sim.faults.fault_plan.MODELLED missing here is
not drawn (and the campaign says so)."""

