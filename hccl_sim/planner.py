"""From a collective call to its plan: algorithm selection, buffer-sized loops, every rank's
schedule, and its simulated timing.

This is engine-agnostic and deterministic: every engine (and every rank of a distributed
engine) that plans the same signature with the same entry clocks gets the same plan, which is
why simulated times are identical across engines.

Selection (issue-2 scope, flat algorithms over all ranks): an `algo=` argument or HCCL_ALGO's
level1 token is honoured when the algorithm implements the collective; otherwise HCCL's default
applies: H-D_R when the rank count is a power of two, else ring, for AllReduce, AllGather and
ReduceScatter (HCCL_ALGO.md default); ring for Broadcast and Reduce; pairwise for AlltoAll.
Like HCCL, an algorithm that does not implement a collective falls back silently to the default
(inter_server_algo_support.md); `last_op.algo` tells what ran.

Loops: as HCCL in op-base mode, data larger than the CCL buffer (HCCL_BUFFSIZE) is processed in
buffer-sized loops (coll_alg_operator.cc: dataSizePerLoop = min(curSize, cclBufferSize)); on
hardware presets each loop is staged user -> CCL buffer -> user, which the timing model charges.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

from hcomm.steps import Stage
from hcomm.timing import index_aligned, replay
from topologies.errors import HcclError
from topologies.model import is_power_of_two

from . import algorithms
from .algo_config import ALGO_TOKENS, parse_hccl_algo

COLLECTIVE_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "barrier": "barrier"}
_TOKEN_TO_ALGO = {"ring": "ring", "H-D_R": "H-D_R", "pairwise": "pairwise"}


class Signature(NamedTuple):
    """What every rank must agree on for a collective call."""
    name: str                 # "allreduce", ...
    shape: tuple
    dtype: str
    redop: Optional[str]
    root: Optional[int]
    algo: Optional[str]       # the algo= argument as given

    def describe(self) -> str:
        parts = [f"shape={self.shape}", f"dtype={self.dtype}"]
        if self.redop is not None:
            parts.append(f"op={self.redop}")
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.algo is not None:
            parts.append(f"algo={self.algo!r}")
        return f"{COLLECTIVE_NAMES.get(self.name, self.name)}({', '.join(parts)})"


@dataclass
class OpPlan:
    signature: Signature
    algo: str                 # what ran, e.g. "ring"
    loops: list               # [(start, stop)] element ranges, per block for block collectives
    schedules: list           # per loop: per rank: tuple of steps
    entry: list               # entry clock of every rank (ns)
    exits: list               # exit clock of every rank (ns)
    nbytes: int               # bytes of the op as nccl-tests sizes it
    events: Optional[list] = None


def requested_token(name: str, algo, config) -> Optional[str]:
    """The level1 token asked for by `algo=` (a token or a whole HCCL_ALGO string) or HCCL_ALGO."""
    if algo is not None:
        if not isinstance(algo, str):
            raise HcclError("E_PARA", f"algo must be a string, got {type(algo).__name__}")
        if ":" in algo:
            levels = parse_hccl_algo(algo, source="algo").levels_for(name)
        else:
            aliases = {"hd": "H-D_R", "h-d": "H-D_R", "rhd": "H-D_R", "h-d_r": "H-D_R"}
            token = aliases.get(algo.lower(), algo)
            if token not in ALGO_TOKENS:
                raise HcclError("E_PARA", f"unknown algorithm {algo!r}; expected an HCCL token "
                                f"({', '.join(ALGO_TOKENS)}) or an HCCL_ALGO string")
            return token
    else:
        levels = config.algo.levels_for(name)
    return levels.get("level1")


def select(name: str, p: int, algo, config) -> str:
    if name == "barrier":
        return "dissemination"
    token = requested_token(name, algo, config)
    chosen = _TOKEN_TO_ALGO.get(token)
    if chosen and algorithms.supports(chosen, name):
        return chosen
    if name == "alltoall":
        return "pairwise"
    if name in ("allreduce", "allgather", "reducescatter") and is_power_of_two(p) and p > 1:
        return "H-D_R"
    return "ring"


def loops_for(sig: Signature, p: int, itemsize: int, buffsize: int) -> list:
    """Element ranges processed per loop: the whole vector, or per-rank block, in CCL-buffer-sized pieces."""
    size = math.prod(sig.shape)
    if sig.name in algorithms.BLOCK_COLLECTIVES:
        per = size if sig.name == "allgather" else size // p
        cap = max(1, buffsize // (p * itemsize))
    else:
        per = size
        cap = max(1, buffsize // itemsize)
    return [(a, min(a + cap, per)) for a in range(0, per, cap)]


def op_nbytes(sig: Signature, p: int, itemsize: int) -> int:
    """Bytes of the op as nccl-tests sizes it (AllGather: the whole gathered output)."""
    size = math.prod(sig.shape) * itemsize
    return size * p if sig.name == "allgather" else size


def _stage_bytes(name: str, p: int, length: int, itemsize: int, rank: int, root) -> tuple:
    vec = length * itemsize
    if name == "allgather":
        return vec, p * vec
    if name == "reducescatter":
        return p * vec, vec
    if name == "alltoall":
        return p * vec, p * vec
    if name == "reduce":
        return vec, vec if rank == root else 0
    return vec, vec


def build_schedules(sig: Signature, algo: str, p: int, itemsize: int, loops: list, staging: bool) -> list:
    out = []
    for a, b in loops:
        length = b - a
        if sig.name in algorithms.BLOCK_COLLECTIVES:
            per_rank = algorithms.schedules(algo, sig.name, p, p, length * itemsize, 0)
        else:
            per_rank = algorithms.schedules(algo, sig.name, p, length, itemsize, sig.root or 0)
        if staging:
            staged = []
            for r, steps in enumerate(per_rank):
                bin_, bout = _stage_bytes(sig.name, p, length, itemsize, r, sig.root)
                staged.append(((Stage(bin_, "in"),),) + steps + (((Stage(bout, "out"),),) if bout else ()))
            per_rank = staged
        out.append(per_rank)
    return out


_TIMING_CACHE_LIMIT = 4096


def timing(topo, key, schedules_per_loop, entry, dtype, redop, trace=False, op_name="op"):
    """Exit clocks for `entry` (cached per topology on the entry offsets: ops repeat)."""
    base = min(entry) if entry else 0
    rel = tuple(t - base for t in entry)
    cache = topo.__dict__.setdefault("_timing_cache", {})
    hit = None if trace else cache.get((key, rel))
    if hit is not None:
        return [base + t for t in hit], None
    p = len(entry)
    full = [sum((loop[r] for loop in schedules_per_loop), ()) for r in range(p)]
    events = [] if trace else None
    exits = replay(full, list(rel), topo, dtype=dtype, redop=redop or "sum", events=events, op_name=op_name)
    if len(cache) >= _TIMING_CACHE_LIMIT:
        cache.clear()
    cache[(key, rel)] = tuple(exits)
    if events is not None:
        events = [(r, n, s + base, e + base, a) for r, n, s, e, a in events]
    return [base + t for t in exits], events


def make_plan(sig: Signature, topo, config, entry: list, itemsize: int, trace: bool = False) -> OpPlan:
    p = topo.num_ranks
    algo = select(sig.name, p, sig.algo, config)
    if sig.name == "barrier":
        loops = [(0, 0)]
        per_loop = [algorithms.schedules(algo, "barrier", p, 0, 0)]
    else:
        loops = loops_for(sig, p, itemsize, config.buffsize_bytes)
        per_loop = build_schedules(sig, algo, p, itemsize, loops, topo.device_model.staging)
    key = (sig.name, sig.shape, sig.dtype, sig.redop, sig.root, algo, config.buffsize_mb)
    exits, events = timing(topo, key, per_loop, entry, sig.dtype, sig.redop, trace=trace,
                           op_name=COLLECTIVE_NAMES.get(sig.name, sig.name))
    if sig.name == "barrier":
        # A barrier releases every rank together: when the last rank has heard from all others.
        exits = [max(exits)] * p
    nbytes = 0 if sig.name == "barrier" else op_nbytes(sig, p, itemsize)
    return OpPlan(sig, algo, loops, per_loop, list(entry), exits, nbytes, events)


def check_signatures(signatures: list) -> Optional[str]:
    """None if every rank made the same call, else a sentence naming who called what."""
    first = signatures[0]
    if all(s == first for s in signatures):
        return None
    groups = {}
    for r, s in enumerate(signatures):
        groups.setdefault(s, []).append(r)
    parts = [f"rank{'s' if len(rs) > 1 else ''} {_ranks(rs)} called {s.describe()}" for s, rs in groups.items()]
    return "mismatched collective calls across ranks: " + "; ".join(parts)


def _ranks(rs):
    return str(rs[0]) if len(rs) == 1 else ("[" + ", ".join(map(str, rs[:12])) + (", ..." if len(rs) > 12 else "") + "]")


def loop_programs(plan: OpPlan, topo) -> list:
    """Per loop, (program, index_aligned) for every rank's schedule (hcomm.timing.run_program).

    Any simulated-time order is a valid serial order, so the program is recorded once per loop
    shape with all ranks entering together, and cached on the topology.
    """
    cache = topo.__dict__.setdefault("_program_cache", {})
    sig = plan.signature
    out = []
    for (a, b), per_rank in zip(plan.loops, plan.schedules):
        key = (plan.algo, sig.name, sig.dtype, sig.root, b - a, len(per_rank))
        program = cache.get(key)
        if program is None:
            moves = []
            replay(list(per_rank), [0] * len(per_rank), topo, dtype=sig.dtype, redop=sig.redop or "sum",
                   program=moves, op_name=COLLECTIVE_NAMES.get(sig.name, sig.name))
            program = (moves, index_aligned(moves))
            if len(cache) >= _TIMING_CACHE_LIMIT:
                cache.clear()
            cache[key] = program
        out.append(program)
    return out
