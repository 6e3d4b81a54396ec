"""Seeded fault campaigns (`hccl-sim chaos`, docs/design.md, "Faults contract"): scenarios generated
apart from running them, each run against its fault-free twin and classified.

A Scenario is one call (a collective, its size, dtype, reduce op, root, algorithm and out= mode,
made 1-3 times in a row by every rank), an HCCL environment (op retry per level and its
parameters, RDMA retransmission, HCCL_EXEC_TIMEOUT, HCCL_BUFFSIZE, HCCL_ALGO) and a FaultPlan
whose times land inside the call the fault aims at (learned from the fault-free twin's plan).
Scenario N of seed S depends on (S, N, the topology, whether the engine runs crashes) only, so
`--replay N` regenerates it alone. Every kind in hccl_sim.faults.fault_plan.MODELLED that this module can
make (MAKERS) joins the campaign; one it cannot make is named in the campaign's header.

Running and classifying (outcomes: recovered, clean error, WRONG, HANG, LEAK; skipped for a
scenario the engine refuses with E_NOT_SUPPORT): hccl_sim.chaos.runners and .check.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topologies.errors import HcclError

from .. import collectives
from ..faults import fault_plan as fault_kinds
from ..config.hccl_algo import ALGO_TOKENS
from ..algorithms import registry
from ..config.env import Config
from ..faults.fault_plan import FaultPlan
from ..plan.costs import effective_cost
from ..plan.planner import Signature, make_plan
from ..faults.retry import level_of
from ..config.types import numpy_dtype
from .makers import MAKERS

OPS = collectives.DATA_COLLECTIVES + collectives.VARIABLE
IN_PLACE_OPS = tuple(n for n in collectives.DATA_COLLECTIVES if collectives.of(n).output_shape((4,), 2) == (4,))
"""Collectives whose result has the input's shape, so out=x (in place) is possible."""
EXEC_TIMEOUTS_S = (10, 20, 45)
"""HCCL_EXEC_TIMEOUT values a scenario runs with: below and above the heartbeat's 30 s LOST
threshold (docs/references.md §10.3), so both detections are exercised; also the engines' wall
deadline of every wait, so a scenario never waits longer than this for a peer."""
HOLD_TIMES_MS = (0, 1, 5, 20, 100)
INTERVAL_TIMES_MS = (0, 1, 5, 10)
"""HCCL_OP_RETRY_PARAMS HoldTime / IntervalTime values (HCCL's range is [0, 60000] ms, docs/references.md §7.2;
when unset, HCCL's defaults 5000 and 1000 ms apply)."""
LOOP_BUFFSIZE_MB = 1
"""HCCL_BUFFSIZE of a multi-loop scenario: HCCL's smallest CCL buffer (docs/references.md §7.2), so that a few MB
of data already takes several buffer loops."""

MAX_CALLS = 3
"""Most calls a scenario makes in a row (each rank holds every call's result until it returns)."""


@dataclass(frozen=True)
class Call:
    """What every rank calls, `calls` times in a row (the same input each time)."""
    op: str                   # canonical collective name
    count: int                # elements of each rank's 1-D input
    dtype: str
    redop: str | None
    root: int | None
    algo: str | None          # the algo= argument (a token or an HCCL_ALGO string), None: selection
    out: str = "new"          # "new" (a fresh result), "out" (out= a preallocated array), "inplace" (out=x)
    calls: int = 1
    data_seed: int = 0

    def describe(self) -> str:
        parts = [f"{self.op} {self.count}x{self.dtype}"]
        if self.redop is not None:
            parts.append(self.redop)
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.algo is not None:
            parts.append(f"algo={self.algo}")
        if self.out != "new":
            parts.append("out=x" if self.out == "inplace" else "out=")
        if self.calls > 1:
            parts.append(f"x{self.calls} calls")
        return " ".join(parts)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Scenario:
    """One call, its environment and a fault plan aimed at one of its repetitions."""
    index: int
    seed: int                 # the campaign's seed
    call: Call
    env: dict
    plan: FaultPlan
    fault: str                # what the plan does, in a few words
    target: int               # the call the fault aims at
    spans: tuple = ()         # the twin's (first entry, last exit) ns of every call, as planned
    rdma: tuple = (0, 0)      # (retransmission interval ns, retransmissions) under the scenario's env

    def to_dict(self) -> dict:
        return {"index": self.index, "seed": self.seed, "call": self.call.to_dict(), "env": dict(self.env),
                "plan": self.plan.to_dict(), "fault": self.fault, "target": self.target,
                "spans_ns": [list(s) for s in self.spans], "rdma_interval_ns": self.rdma[0],
                "rdma_retry_cnt": self.rdma[1]}


class SkewedSplit:
    """How a chaos call's elements divide among ranks: skewed, some blocks empty, the same in the
    scenario and its twin (seeded by the call's data seed and the rank count)."""

    def __init__(self, seed: int):
        self.seed = seed

    def _draw(self, p: int, rows: int, elements: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, p, 0xA2A])
        weights = rng.random((rows, p)) ** 3 * (rng.random((rows, p)) > 0.2)
        weights[weights.sum(axis=1) == 0, 0] = 1.0
        return np.stack([rng.multinomial(elements, w / w.sum()) for w in weights]).astype(np.int64)

    def matrix(self, p: int, elements: int) -> np.ndarray:
        """p x p (elements rank i sends rank j), rows summing to `elements`."""
        return self._draw(p, p, elements)

    def vector(self, p: int, elements: int) -> np.ndarray:
        """p block counts summing to `elements`."""
        return self._draw(p, 1, elements)[0]


def count_matrix(call: Call, p: int):
    """A call's counts (Collective.counts_for over a SkewedSplit): a variable-size op's AlltoAllV
    p x p matrix or AllGatherV's and ReduceScatterV's p block counts, summing to the call's
    count; None for an op that takes none."""
    return collectives.of(call.op).counts_for(SkewedSplit(call.data_seed), p, call.count)


# ---- what a topology offers ----------------------------------------------------------------------

@dataclass(frozen=True)
class Space:
    """What scenarios can be drawn from on one topology and engine."""
    topo: object
    algos: dict               # op -> algo= values that run there (one per distinct outcome label)
    nic_ranks: tuple          # ranks with a RoCE port in use (nic_down targets)
    levels: tuple             # retry levels the topology has links at ("L0", "L1", "L2")
    kinds: tuple              # fault kinds drawn (modelled, made here, runnable on the engine)


def space_for(topo, crash_ok: bool = True) -> Space:
    """The Space of `topo`. `crash_ok`: whether the engine runs rank_crash (a Ray engine that
    refuses it with E_NOT_SUPPORT does not get crash scenarios)."""
    p = topo.num_ranks
    if p < 2:
        raise HcclError("E_PARA", f"chaos needs at least 2 ranks (faults are between ranks); {topo.name} has {p}")
    algos = {op: got for op in OPS if (got := _algos_for(topo, op))}      # ops HCCL runs there
    nic = []
    for r in range(p):
        try:
            FaultPlan().nic_down(r).check_for(topo)
            nic.append(r)
        except HcclError:
            pass
    cost = effective_cost(topo, Config())
    levels = sorted({level_of(cost, 0, b) for b in range(1, p)} | {level_of(cost, a, a + 1) for a in range(p - 1)})
    kinds = [k for k in fault_kinds.KINDS if k in fault_kinds.MODELLED and k in MAKERS
             and (k != "nic_down" or nic) and (k != "rank_crash" or crash_ok)]
    return Space(topo, algos, tuple(nic), tuple(levels), tuple(kinds))


def unmade_kinds() -> list:
    """Modelled fault kinds this module cannot generate yet (reported, never dropped silently)."""
    return [k for k in fault_kinds.MODELLED if k not in MAKERS]


def _algos_for(topo, op: str) -> tuple:
    """algo= values that run `op` on `topo` (HCCL tokens and registry names), one per distinct
    label of what runs (fallbacks included once), selection (None) first; () where HCCL does not
    run `op` at all (AllGatherV on 910A)."""
    plain = ("null", "NA")                  # "let HCCL choose" spelt as a token: tried last
    tokens = ([t for t in ALGO_TOKENS if t not in plain] + [n for n in registry.ALGORITHMS if n not in ALGO_TOKENS]
              + list(plain))
    out = [None]
    with quiet_logs():
        try:
            seen = {_simulate_label(topo, op, None)}
        except HcclError as exc:
            if exc.code == "E_NOT_SUPPORT":
                return ()
            raise
        for token in tokens:
            try:
                label = _simulate_label(topo, op, token)
            except HcclError:
                continue
            if label not in seen:
                seen.add(label)
                out.append(token)
    return tuple(out)


def _simulate_label(topo, op, token):
    """What `token` runs as for a call of 512 elements per rank (a variable-size op's split evenly)."""
    from .. import simulate
    from ..collectives.splits import parse
    coll = collectives.of(op)
    p = topo.num_ranks
    dtype = "int32" if coll.inline_only else "int64"        # what HCCL's ReduceScatterV reduces inline
    return simulate(op, topology=topo, algo=token, dtype=dtype, **coll.size_args(parse("uniform"), p, 512, 8)).algo


class quiet_logs:
    """hccl-sim's own log notes (selection fallbacks, op retry off A3) held back while a campaign
    runs: thousands of scenarios would repeat them; the scenario's outcome is what is reported."""
    NAMES = ("hccl_sim.selection", "hccl_sim.faults.retry")

    def __enter__(self):
        import logging
        self._levels = [(logging.getLogger(n), logging.getLogger(n).level) for n in self.NAMES]
        for logger, _ in self._levels:
            logger.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc):
        for logger, level in self._levels:
            logger.setLevel(level)


# ---- generation -----------------------------------------------------------------------------------

def generate(seed: int, n: int, topo, space: Space | None = None) -> list:
    """Scenarios 0..n-1 of `seed` on `topo` (`space`: space_for(topo), the default)."""
    space = space or space_for(topo)
    return [scenario(seed, i, topo, space) for i in range(n)]


def scenario(seed: int, index: int, topo, space: Space | None = None) -> Scenario:
    """Scenario `index` of the campaign `seed`: drawn from its own generator, so it does not
    depend on the scenarios before it."""
    space = space or space_for(topo)
    rng = np.random.default_rng([seed, index, 0xC4A05])
    p = topo.num_ranks
    call, env = _draw_call(rng, space, p)
    with quiet_logs():
        try:
            spans = twin_spans(call, env, topo)
        except HcclError:
            # the drawn algorithm does not run this call (size-dependent): let selection choose
            call = Call(**{**call.to_dict(), "algo": None})
            env.pop("HCCL_ALGO", None)
            spans = twin_spans(call, env, topo)
    target = int(rng.integers(call.calls))
    budget = rdma_budget(topo, env)
    kinds = space.kinds
    weights = np.array([3.0 if k == "link_flap" else 2.0 if k == "rank_crash" else 1.0 for k in kinds])
    plan = FaultPlan(seed=int(rng.integers(2**31)))
    texts = []
    for extra in range(1 + int(rng.random() < 0.12)):      # now and then a second fault on top
        kind = kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]
        entry, text = MAKERS[kind](rng, space, spans, target, budget, env)
        getattr(plan, kind)(**entry)
        texts.append(text)
    return Scenario(index, seed, call, env, plan, " + ".join(texts), target, tuple(spans), budget)


def _draw_call(rng, space: Space, p: int):
    ops = [op for op in OPS if op in space.algos]
    op = ops[int(rng.integers(len(ops)))]
    coll = collectives.of(op)
    dtype = ("int32", "int64")[int(rng.integers(2))]
    redop = ("sum", "prod", "max", "min")[int(rng.choice(4, p=[0.55, 0.15, 0.15, 0.15]))] if coll.reducing else None
    dm = space.topo.device_model
    if coll.inline_only and dm.hierarchical and not dm.inline(dtype, redop):
        dtype, redop = "int32", ("sum", "max", "min")[int(rng.integers(3))]     # HCCL's ReduceScatterV: inline only
    itemsize = numpy_dtype(dtype).itemsize
    root = int(rng.integers(p)) if coll.rooted else None
    env = {"HCCL_EXEC_TIMEOUT": str(EXEC_TIMEOUTS_S[int(rng.integers(len(EXEC_TIMEOUTS_S)))])}
    size_class = ("tiny", "small", "medium", "loops")[int(rng.choice(4, p=[0.25, 0.35, 0.25, 0.15]))]
    count = _draw_count(rng, size_class, coll, p, itemsize)
    if size_class == "loops":
        env["HCCL_BUFFSIZE"] = str(LOOP_BUFFSIZE_MB)
    algo = None
    tokens = [t for t in space.algos[op] if t is not None]
    if tokens and rng.random() < 0.7:
        token = tokens[int(rng.integers(len(tokens)))]
        form = rng.random()
        if form < 0.6:
            algo = token
        elif form < 0.8:
            algo = f"level0:NA;level1:{token}"
        elif form < 0.9:
            env["HCCL_ALGO"] = f"level0:NA;level1:{token}"
        else:
            env["HCCL_ALGO"] = f"{op}=level0:NA;level1:{token}"
    out = "new"
    if rng.random() < 0.35:
        out = "inplace" if op in IN_PLACE_OPS and rng.random() < 0.6 else "out"
    # repeated calls (a later one can be the faulty one); large ones at most twice, for wall time
    calls = int(rng.choice([1, 2, MAX_CALLS], p=[0.6, 0.25, 0.15])) if size_class in ("tiny", "small") else \
        int(rng.choice([1, 2], p=[0.7, 0.3]))
    env.update(_draw_retry_env(rng, space))
    call = Call(op, count, dtype, redop, root, algo, out, calls, int(rng.integers(2**31)))
    return call, env


def _draw_count(rng, size_class, coll, p, itemsize) -> int:
    """Elements of each rank's input: edge sizes (0, 1, around p), small, medium, or a few
    HCCL_BUFFSIZE=1 MB loops (kept to a few MB per rank: a scenario runs in well under a second)."""
    unit = p if coll.divisible else 1          # ReduceScatter / AlltoAll inputs are p blocks
    if size_class == "tiny":
        m = int(rng.choice([0, 1, 2, 3])) if coll.divisible else int(rng.choice([0, 1, 2, p - 1, p, p + 1]))
        return m * unit
    # small and medium sizes as nccl-tests counts them: an AllGather's is its whole output (p inputs)
    share = p if coll.input_is_block else 1
    if size_class == "small":
        return int(rng.integers(4, 5000)) // share // unit * unit + unit
    if size_class == "medium":
        return max(1, int(rng.integers(5000, 60000)) // share // unit) * unit
    loops = int(rng.choice([2, 3], p=[0.8, 0.2]))
    if coll.variable:                          # blocks of about `loops` buffer slices each
        cap = max(1, (LOOP_BUFFSIZE_MB << 20) // (p * itemsize))
        return cap * p * loops + int(rng.integers(1, cap // 8 + 2))
    cap = collectives.of(coll.name).loops(1 << 40, p, itemsize, LOOP_BUFFSIZE_MB << 20).cap
    per = cap * (loops - 1) + int(rng.integers(1, cap // 8 + 2))    # per block for block collectives
    if coll.block and not coll.input_is_block:
        return per * p
    return per


def _draw_retry_env(rng, space: Space) -> dict:
    env = {}
    if rng.random() < 0.75:
        env["HCCL_OP_RETRY_ENABLE"] = ",".join(f"{lv}:{int(rng.random() < 0.75)}" for lv in space.levels)
    if rng.random() < 0.7:
        env["HCCL_OP_RETRY_PARAMS"] = (f"MaxCnt:{int(rng.integers(1, 5))},"
                                       f"HoldTime:{HOLD_TIMES_MS[int(rng.integers(len(HOLD_TIMES_MS)))]},"
                                       f"IntervalTime:{INTERVAL_TIMES_MS[int(rng.integers(len(INTERVAL_TIMES_MS)))]}")
    if rng.random() < 0.6:
        env["HCCL_RDMA_TIMEOUT"] = str(int(rng.integers(5, 10)))
    if rng.random() < 0.6:
        env["HCCL_RDMA_RETRY_CNT"] = str(int(rng.integers(1, 8)))
    return env


def twin_spans(call: Call, env: dict, topo) -> list:
    """(first entry, last exit) ns of each of the call's repetitions in the fault-free twin, from
    the planner (no data moves): each repetition enters at the clocks the previous one left."""
    config = Config.from_env(env)
    coll = collectives.of(call.op)
    itemsize = numpy_dtype(call.dtype).itemsize
    problem = coll.check_input((call.count,), topo.num_ranks)
    if problem:
        raise HcclError("E_PARA", f"chaos drew an invalid call {call.describe()}: {problem}")
    sig = Signature(call.op, (call.count,), call.dtype, call.redop, call.root, call.algo, call.out == "inplace")
    if coll.variable:                          # as the rendezvous merges the ranks' rows of counts
        sig = Signature(call.op, (), call.dtype, call.redop, None, call.algo, False,
                        coll.vcounts_of(count_matrix(call, topo.num_ranks)))
    entry = [0] * topo.num_ranks
    spans = []
    for _ in range(call.calls):
        plan = make_plan(sig, topo, config, entry, itemsize)
        spans.append((min(plan.entry), max(plan.exits)))
        entry = list(plan.exits)
    return spans


def rdma_budget(topo, env) -> tuple:
    """(retransmission interval ns, retransmissions) under the scenario's HCCL_RDMA_TIMEOUT and
    HCCL_RDMA_RETRY_CNT, as FaultPlan.bind sets them (4.096 us x 2^timeout, docs/references.md §10.1)."""
    state = FaultPlan().bind(topo, Config.from_env(env)).link_state
    return state.interval_ns, state.retries
