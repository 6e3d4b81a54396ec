"""From a collective call to its plan: algorithm selection, buffer-sized loops, the program of
every loop, and its simulated timing.

Engine-agnostic and deterministic: every engine (and every rank of a distributed engine) that
plans the same signature with the same entry clocks gets the same plan, which is why simulated
times are identical across engines.

Levels. Hardware topologies run HCCL's hierarchy: level0 inside a server chosen from the
hardware (910B: fullmesh; 910A: 8 cards 8P ring, 4 cards 4P mesh, else ring), level1 among the
same-index cards of all servers. Synthetic topologies are one flat level.

Selection. An explicit choice (the `algo=` argument, else HCCL_ALGO's level1 token) disables
adaptive selection, with HCCL's fallbacks for combinations it does not support (Broadcast keeps
only NHR, else H-D_R; Reduce takes ring or H-D_R; AlltoAll is pairwise; pipeline needs 910B,
equal servers and at most 65535 FFTS contexts, else H-D_R). Otherwise the policy decides:
- `hccl` reproduces HCCL (hcomm coll_alg_operator.cc, alg_configurator.cc): on 910B, pipeline
  first when its size thresholds hold, then the cost comparison of ring, NHR and H-D_R with the
  60 us latency and 20 GB/s RDMA bandwidth constants; the V1 default (H-D_R for >= 8 or a power of
  two of servers, else ring) for the other ops and for 910A. Synthetic topologies: H-D_R for a
  power-of-two rank count, else ring (HCCL_ALGO.md's documented default).
- `model` replays every candidate on our own timing model and takes the fastest.

Loops: as HCCL in op-base mode, data larger than the CCL buffer (HCCL_BUFFSIZE) is processed in
buffer-sized loops; on hardware presets each loop is staged user -> CCL buffer -> user.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Optional

import numpy as np

from hcomm import program as prog
from hcomm.vtiming import program_times
from topologies.errors import HcclError
from topologies.model import is_power_of_two

from . import algorithms
from .algo_config import ALGO_TOKENS, parse_hccl_algo
from .algorithms import hierarchy, pipeline

COLLECTIVE_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "barrier": "barrier"}
POLICIES = ("hccl", "model")
_ALIASES = {"hd": "H-D_R", "h-d": "H-D_R", "rhd": "H-D_R", "h-d_r": "H-D_R", "nhr": "NHR", "nb": "NB",
            "mesh": "fullmesh", "Ring": "ring", "RING": "ring"}

# HCCL constants (reference/hccl.md §2.4-2.5; hcomm coll_alg_operator.cc, device_capacity.cc)
SELECT_LATENCY_US = 60.0
GB2B = 1 << 30
FFTS_CONTEXT_LIMIT = 65535
PIPELINE_MIN_AG_RS = {True: 32 << 10, False: 2 << 20}       # RDMA-lite supported or not
PIPELINE_MIN_AR_SLICE = {True: 1 << 20, False: 2 << 20}


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


class Choice(NamedTuple):
    """What runs: one flat algorithm, or level0 + level1 of the hierarchy."""
    flat: bool
    level0: Optional[str]
    level1: Optional[str]

    @property
    def label(self) -> str:
        if self.flat:
            return self.level1
        if self.level1 is None:
            return f"level0:{self.level0}"
        return f"level0:{self.level0};level1:{self.level1}"


@dataclass
class OpPlan:
    signature: Signature
    algo: str                 # what ran, e.g. "ring" or "level0:fullmesh;level1:NHR"
    loops: list               # [(start, stop)] element ranges, per block for block collectives
    programs: list            # per loop: the program (list of global steps)
    entry: list               # entry clock of every rank (ns)
    exits: list               # exit clock of every rank (ns)
    nbytes: int               # bytes of the op as nccl-tests sizes it
    choice: Optional[Choice] = None
    events: Optional[list] = None


# ---- selection -------------------------------------------------------------------------------------

def requested_token(name: str, algo, config) -> Optional[str]:
    """The level1 token asked for by `algo=` (a token or a whole HCCL_ALGO string) or HCCL_ALGO."""
    if algo is not None:
        if not isinstance(algo, str):
            raise HcclError("E_PARA", f"algo must be a string, got {type(algo).__name__}")
        if ":" in algo:
            return parse_hccl_algo(algo, source="algo").levels_for(name).get("level1")
        token = _ALIASES.get(algo, _ALIASES.get(algo.lower(), algo))
        if token not in ALGO_TOKENS:
            raise HcclError("E_PARA", f"unknown algorithm {algo!r}; expected an HCCL token "
                            f"({', '.join(ALGO_TOKENS)}) or an HCCL_ALGO string")
        return token
    return config.algo.levels_for(name).get("level1")


def level0_for(topo, srv) -> str:
    if topo.device == "910A":
        if srv.equal and srv.K == 8:
            return "ring"          # 8P ring over the two HCCS groups and the PCIe link between them
        if srv.K == 4:
            return "fullmesh"      # 4P mesh
        return "ring" if srv.equal else "fullmesh"
    return "fullmesh"              # 910B: NP_MESH (HCCS between every pair)


def _servers(topo):
    srv = topo.__dict__.get("_servers")
    if srv is None:
        srv = topo.__dict__["_servers"] = hierarchy.Servers(topo.server_of)
    return srv


def _inline(topo, dtype, redop) -> bool:
    dm = topo.device_model
    return dtype in dm.inline_reduce_dtypes and (redop or "sum") in dm.inline_reduce_ops


def pipeline_contexts(name: str, m: int, k: int) -> int:
    """HCCL's FFTS+ context count of a pipeline op (CalcContextNumForPipeline)."""
    per_step = 5 * (k - 1) + 8
    if name == "allreduce":
        return 2 * (m * per_step + 5)
    return m * per_step + 5


def pipeline_eligible(name, topo, srv, config) -> bool:
    return (name in pipeline.COLLECTIVES and topo.device == "910B" and srv.equal and srv.K > 1 and srv.m > 1
            and pipeline_contexts(name, srv.m, srv.K) <= FFTS_CONTEXT_LIMIT)


def _v1_default(m: int) -> str:
    """HCCL's GetDefaultAlgoLevel1V1."""
    if m >= 8 or (m > 1 and is_power_of_two(m)):
        return "H-D_R"
    return "ring"


def hccl_cost_choice(name: str, cur_size: int, topo, srv, config) -> str:
    """HCCL's cost comparison of ring, NHR and H-D_R (coll_alg_operator.cc SelectAlgoType*)."""
    m, n, N = srv.m, srv.K, srv.p
    if name == "allreduce":
        ccl = config.buffsize_bytes
    else:
        ccl = config.buffsize_bytes // N
    S = min(cur_size, ccl)
    bw_gb = 64 * 0.85 if N == 2 * n else topo.params.get("select_bandwidth_gb", 20.0)
    B = bw_gb * GB2B
    d = SELECT_LATENCY_US
    X = S / n if name == "allreduce" else S * N
    T = (m - 1) / m * X / B * 1e6
    lg = math.ceil(math.log2(m))
    scale = 2 if name == "allreduce" else 1
    ring = scale * ((m - 1) * d + T)
    nhr = scale * (lg * d + T)
    if is_power_of_two(m):
        hd = scale * (int(math.log2(m)) * d + T)
    else:
        hd = scale * (lg * d + (2 * m - 1) / m * X / B * 1e6)
    alg = "NHR" if nhr < ring else "ring"
    if hd < min(nhr, ring):
        alg = "H-D_R"
    return alg


def hccl_policy(sig: Signature, itemsize: int, topo, srv, config) -> str:
    name = sig.name
    if name == "alltoall":
        return "pairwise"
    if topo.device != "910B" or name in ("broadcast", "reduce"):
        default = _v1_default(srv.m)
        return "H-D_R" if name == "broadcast" else default
    count = math.prod(sig.shape)
    per_rank = count * itemsize           # AllReduce: the buffer; AllGather: send bytes
    if name == "reducescatter":
        per_rank //= srv.p                # ReduceScatter: receive bytes
    rdma_lite = bool(topo.params.get("rdma_lite", True))
    nondet = _inline(topo, sig.dtype, sig.redop) and config.deterministic == "false"
    if pipeline_eligible(name, topo, srv, config):
        if name == "allgather" and per_rank >= PIPELINE_MIN_AG_RS[rdma_lite]:
            return "pipeline"
        if name == "reducescatter" and nondet and per_rank >= PIPELINE_MIN_AG_RS[rdma_lite]:
            return "pipeline"
        if name == "allreduce" and nondet and per_rank // (srv.m * srv.K) >= PIPELINE_MIN_AR_SLICE[rdma_lite]:
            return "pipeline"
    return hccl_cost_choice(name, per_rank, topo, srv, config)


def _explicit_hardware(name, token, topo, srv, config) -> str:
    """HCCL's handling of a level1 the user fixed (constructor fallbacks, pipeline limits)."""
    if name == "alltoall":
        return "pairwise"
    if name == "broadcast":
        return "NHR" if token == "NHR" else "H-D_R"
    if name == "reduce":
        return token if token in ("ring", "H-D_R") else "H-D_R"
    if token == "pipeline":
        return "pipeline" if pipeline_eligible(name, topo, srv, config) else "H-D_R"
    return token if token in ("ring", "H-D_R", "NHR", "NB") else None


def candidates(name, topo, srv, flat: bool, config) -> list:
    if flat:
        return [a for a in ("ring", "H-D_R", "NHR", "NB", "fullmesh", "pairwise") if algorithms.supports(a, name)]
    if name == "alltoall":
        return ["pairwise"]
    if name == "broadcast":
        return ["H-D_R", "NHR"]
    if name == "reduce":
        return ["ring", "H-D_R"]
    out = ["ring", "H-D_R", "NHR", "NB"]
    if pipeline_eligible(name, topo, srv, config):
        out.append("pipeline")
    return out


def select(sig: Signature, topo, config, itemsize: int) -> Choice:
    name = sig.name
    if name == "barrier":
        return Choice(True, None, "dissemination")
    token = requested_token(name, sig.algo, config)
    flat = topo.device == "synthetic"
    srv = _servers(topo)
    if flat:
        if token and algorithms.supports(token, name):
            return Choice(True, None, token)
        if config.policy == "model":
            return Choice(True, None, _fastest(sig, topo, config, itemsize, srv, True))
        if name == "alltoall":
            return Choice(True, None, "pairwise")
        if name in ("allreduce", "allgather", "reducescatter") and is_power_of_two(topo.num_ranks) and topo.num_ranks > 1:
            return Choice(True, None, "H-D_R")
        return Choice(True, None, "ring")
    l0 = level0_for(topo, srv)
    if not srv.equal and name in ("reducescatter", "alltoall"):
        return Choice(True, None, "pairwise" if name == "alltoall" else "ring")
    if srv.m == 1:
        return Choice(False, l0, None)
    if srv.K == 1:
        l0 = None
    explicit = _explicit_hardware(name, token, topo, srv, config) if token and token not in ("NA", "null") else None
    if explicit:
        return Choice(False, l0, explicit)
    if config.policy == "model":
        return Choice(False, l0, _fastest(sig, topo, config, itemsize, srv, False))
    return Choice(False, l0, hccl_policy(sig, itemsize, topo, srv, config))


def _fastest(sig, topo, config, itemsize, srv, flat) -> str:
    cache = topo.__dict__.setdefault("_model_choice", {})
    key = (sig.name, sig.shape, sig.dtype, sig.redop, sig.root, config.buffsize_mb)
    if key in cache:
        return cache[key]
    best, best_time = None, None
    l0 = None if flat else level0_for(topo, srv)
    for algo in candidates(sig.name, topo, srv, flat, config):
        choice = Choice(flat, l0 if srv.K > 1 else None, algo)
        t = int(max(plan_times(sig, topo, config, itemsize, choice, [0] * topo.num_ranks)[1]))
        if best_time is None or t < best_time:
            best, best_time = algo, t
    cache[key] = best
    return best


# ---- programs ----------------------------------------------------------------------------------------

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


def _stage_bytes(name, p, length, itemsize, root):
    vec = length * itemsize
    ins = np.full(p, vec, dtype=np.int64)
    outs = ins.copy()
    if name == "allgather":
        outs *= p
    elif name == "reducescatter":
        ins *= p
    elif name == "alltoall":
        ins *= p
        outs *= p
    elif name == "reduce":
        outs[:] = 0
        outs[root] = vec
    return ins, outs


def build_program(name: str, choice: Choice, topo, length: int, itemsize: int, root) -> list:
    p = topo.num_ranks
    root = root or 0
    if name == "barrier":
        return algorithms.flat_program("barrier", "dissemination", p, 0, 0)
    unit = itemsize if name in algorithms.VECTOR_COLLECTIVES else length * itemsize
    if choice.flat:
        return algorithms.flat_program(name, choice.level1, p, length, unit, root)
    srv = _servers(topo)
    l0, l1 = choice.level0 or "fullmesh", choice.level1 or "ring"
    if l1 == "pipeline":
        if name == "allreduce":
            return pipeline.allreduce(srv, length, unit)
        return getattr(pipeline, name)(srv, unit)
    if name == "allreduce":
        return hierarchy.allreduce(srv, length, unit, l0, l1)
    if name == "allgather":
        return hierarchy.allgather(srv, unit, l0, l1)
    if name == "reducescatter":
        return hierarchy.reducescatter(srv, unit, l0, l1)
    if name == "broadcast":
        return hierarchy.broadcast(srv, length, unit, root, l0, l1)
    if name == "reduce":
        return hierarchy.reduce(srv, length, unit, root, l0, l1)
    return hierarchy.alltoall(srv, unit)


def loop_program(name, choice, topo, length, itemsize, root) -> list:
    """The program of one loop, staged on hardware presets (cached per topology)."""
    cache = topo.__dict__.setdefault("_program_cache", {})
    key = (name, choice, length, itemsize, root)
    program = cache.get(key)
    if program is None:
        program = build_program(name, choice, topo, length, itemsize, root)
        if topo.device_model.staging and name != "barrier":
            p = topo.num_ranks
            ins, outs = _stage_bytes(name, p, length, itemsize, root or 0)
            r = np.arange(p)
            program = ([prog.StepBuilder().stages(r, ins, "in").build()] + list(program)
                       + [prog.StepBuilder().stages(r[outs > 0], outs[outs > 0], "out").build()])
        if len(cache) > 256:
            cache.clear()
        cache[key] = program
    return program


def plan_times(sig, topo, config, itemsize, choice, entry, loops=None):
    """(per-loop programs, exit clocks) of the op from `entry` clocks."""
    p = topo.num_ranks
    if loops is None:
        loops = [(0, 0)] if sig.name == "barrier" else loops_for(sig, p, itemsize, config.buffsize_bytes)
    programs = [loop_program(sig.name, choice, topo, b - a, itemsize, sig.root) for a, b in loops]
    cache = topo.__dict__.setdefault("_timing_cache", {})
    base = min(entry) if len(entry) else 0
    rel = tuple(int(t) - base for t in entry)
    key = (sig.name, sig.shape, sig.dtype, sig.redop, sig.root, choice, config.buffsize_mb, rel)
    rel_exits = cache.get(key)
    if rel_exits is None:
        clock = np.asarray(rel, dtype=np.int64)
        for program in programs:
            clock = program_times(program, clock, topo, sig.dtype, sig.redop or "sum")
        rel_exits = tuple(int(t) for t in clock)
        if len(cache) > 4096:
            cache.clear()
        cache[key] = rel_exits
    return programs, [base + t for t in rel_exits], loops


def make_plan(sig: Signature, topo, config, entry: list, itemsize: int, trace: bool = False) -> OpPlan:
    p = topo.num_ranks
    choice = select(sig, topo, config, itemsize)
    programs, exits, loops = plan_times(sig, topo, config, itemsize, choice, entry)
    if sig.name == "barrier":
        # A barrier releases every rank together: when the last rank has heard from all others.
        exits = [max(exits)] * p
    events = None
    if trace:
        from hcomm.timing import replay
        events = []
        full = [sum((tuple(s) for s in steps), ()) for steps in zip(*[program_rank_steps(pr, p) for pr in programs])]
        replay(full, list(entry), topo, dtype=sig.dtype, redop=sig.redop or "sum", events=events)
    nbytes = 0 if sig.name == "barrier" else op_nbytes(sig, p, itemsize)
    return OpPlan(sig, choice.label, loops, programs, list(entry), exits, nbytes, choice, events)


def program_rank_steps(program, p) -> list:
    """Each rank's step list of a program (cached on the program's first step)."""
    if not program:
        return [()] * p
    holder = program[0].cache
    got = holder.get("rank_steps")
    if got is None:
        got = holder["rank_steps"] = prog.rank_steps(program, p)
    return got


def program_moves(program) -> tuple:
    """(serial data moves, whether index-aligned) of a program (cached)."""
    if not program:
        return [], True
    holder = program[0].cache
    got = holder.get("moves")
    if got is None:
        moves = prog.data_moves(program)
        got = holder["moves"] = (moves, prog.index_aligned(moves))
    return got


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
