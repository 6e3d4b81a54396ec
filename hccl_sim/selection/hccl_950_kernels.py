"""HCCL's CCU and AIV selection on the Ascend 950: what HCCL_OP_EXPANSION_MODE=CCU_MS, CCU_SCHED
or AIV runs (hicann/hccl @09300b70, each op's SelectCcuMsAlgo / SelectCcuScheduleAlgo /
SelectAivAlgo in src/ops/<op>/selector/*_auto_selector.cc; docs/references.md §6.14).

HCCL tries the mode's engines in turn and falls back to the AI CPU where none matches
(auto_selector_base.cc Select): CCU_MS, then CCU_SCHED, then AICPU_TS; CCU_SCHED, then AICPU_TS;
AIV, then AICPU_TS (selection.hccl_950). A match runs as one CCU or AIV kernel per CCL-buffer loop
(Choice.expansion "CCU" / "AIV", priced on topologies.presets.with_kernel) with the algorithm
hccl-sim builds for HCCL's template:

- `...Mesh2Die`, `...SoleMesh`, `...MultiLink` (one kernel over a server's mesh, or over every rank
  where HCCL runs it flat): the full mesh (algorithms.mesh); AllReduce's small `SoleMesh2Die` and
  `SoleMeshOneShot` the one-shot mesh (algorithms.mesh_oneshot), Reduce's `SoleMesh` too.
- `...SoleNHR`: NHR over every rank; `...SequenceMeshMesh`: the server's mesh, then the mesh among
  servers; `...ParallelMeshNHR`: as the AI CPU's Parallel (selection.hccl_950).

Mesh2Die's two kernels, one per die, each over the peers its die's ports reach, are one mesh here:
every peer has its own link either way. The 950 presets' level0 is MESH_1D, so the selectors'
branches for MESH_1D_CLOS (UBX, PCIe mixes) and CLOS level0s, and the 960's, are not read.

HCCL's level0MeshType and is2DieFullMesh count an NPU's mesh links by the die of their local port
(topo_host.cc CalcLevel0MeshType, Is2DieFullMesh): SINGLE_DIE for two ranks or fewer, or one die
without links; TWO_DIE_REGULAR when the two counts differ by one (an 8-NPU server: 4 + 3); else
TWO_DIE_NOT_REGULAR. Which die reaches which peer is not published: hccl-sim takes the links to
the other half of the 8-NPU board (device ids // 4 differ) on die 0 and those to the own half on
die 1 (inferred: 4 + 3 on a whole server, as HCCL's TWO_DIE_REGULAR has it), counted for the
comm's rank 0.
"""
from __future__ import annotations

from typing import Optional

from .. import collectives as colls
from . import hccl_950
from .hccl_950 import GiB, MiB

KiB = 1 << 10
SMALL = 512 * KiB               # IsSmallData: under 512 KiB ("the most UB moves in one transfer")
AIV_MAX_PER_RANK = 8 * MiB      # AIV_MAX_PER_RANK_DATA_SIZE (auto_selector_base.h)
AIV_MAX_CCL_LOOPS = 16          # AIV_MAX_CCL_LOOP_NUM (hccl_aiv_utils.h)
AIV_MAX_RANKS = 512             # MAX_RANK_SIZE (hccl_aiv_utils.h)
AIV_MAX_RANKS_V = 256           # MAX_RANK_SIZE_V (aiv_defines.h): AlltoAllV / AlltoAllVC
CCU_MAX_RANKS = 64              # the CCU selectors' 64-rank limits (AR_CCU_MAX_RANK, AG_CCU_MAX_RANK, ...)
WIDE = ("int64", "uint64", "float64")
BOARD = 8                       # NPUs of a 950 board, the die rule's unit (module docstring)

CHAINS = {"CCU_MS": ("CCU_MS", "CCU_SCHED"), "CCU_SCHED": ("CCU_SCHED",), "AIV": ("AIV",)}
"""HCCL_OP_EXPANSION_MODE -> the kernel engines HCCL tries before the AI CPU (auto_selector_base.cc)."""
ENGINE_OF = {"CCU_MS": "CCU", "CCU_SCHED": "CCU", "AIV": "AIV"}


class Call:
    """What the CCU and AIV selectors read of a call beyond hccl_950.Shape."""

    def __init__(self, ctx, shape):
        self.s = shape
        sig = ctx.signature
        self.dtype, self.redop = sig.dtype, sig.redop
        self.inplace = bool(sig.inplace)
        self.strict = ctx.config.deterministic == "strict"
        self.buffsize = ctx.config.buffsize_bytes
        coll = colls.of(ctx.name)
        # the AIV selectors' size: an AllGather's, ReduceScatter's, Scatter's or AlltoAll's piece
        # per rank times the ranks; an AllReduce's, Broadcast's or Reduce's buffer
        self.total = shape.d * shape.n if coll.block else shape.d
        self.mesh_type, self.two_die = mesh_type(ctx)
        self.level1_nhr = not shape.equal          # unequal servers: HCCL's Level1Nhr
        self.frames = shape.servers


def mesh_type(ctx) -> tuple:
    """(level0MeshType, is2DieFullMesh) of the comm's rank 0 over the ranks of its server."""
    topo = ctx.topo
    server = topo.server_of[0]
    peers = [r for r in range(1, topo.num_ranks) if topo.server_of[r] == server]
    if len(peers) + 1 <= 2:
        return "SINGLE_DIE", False
    half = topo.device_of[0] // (BOARD // 2)
    die1 = sum(1 for r in peers if topo.device_of[r] // (BOARD // 2) == half)
    die0 = len(peers) - die1
    if die0 == 0 or die1 == 0:
        return "SINGLE_DIE", False
    return ("TWO_DIE_REGULAR" if abs(die0 - die1) == 1 else "TWO_DIE_NOT_REGULAR"), True


def _flat(ctx, engine, algo, name, notes=()):
    return hccl_950._flat(ctx, algo, name, notes)._replace(expansion=ENGINE_OF[engine])


def _levels(ctx, engine, name, s, l1="NHR"):
    split = hccl_950.modelled_split(ctx, s, name)
    choice = hccl_950._levels(name, s, split=split)
    if l1 == "fullmesh":
        choice = choice._replace(level1="fullmesh")
    return choice._replace(expansion=ENGINE_OF[engine])


def _mesh_by_type(c: Call, regular: str, other: str) -> Optional[str]:
    """HCCL's Mesh1D rule: TWO_DIE_REGULAR runs `regular`, TWO_DIE_NOT_REGULAR nothing, else `other`."""
    if c.mesh_type == "TWO_DIE_REGULAR":
        return regular
    return None if c.mesh_type == "TWO_DIE_NOT_REGULAR" else other


def _two_rank_detour(c: Call, limit: int) -> bool:
    """Two ranks behind a two-level network with `limit` or more: HCCL keeps them on the AI CPU."""
    return c.s.two_level_net and c.s.n == 2 and c.s.d >= limit


# ---- AllReduce (all_reduce_auto_selector.cc) ---------------------------------------------------
def _allreduce(ctx, c: Call, engine: str):
    s = c.s
    if engine == "AIV":
        if not _aiv_fits(c, reducing=True):
            return None
        one_shot = s.d < (128 * KiB if s.n <= 8 else SMALL)      # AR_AIV_SMALL_IN_BOARD within a board of 8
        return _flat(ctx, engine, "mesh_oneshot" if one_shot else "fullmesh",
                     "AivAllReduceSoleMeshOneShot" if one_shot else "AivAllReduceSoleMeshTwoShot")
    if not _ccu_reduces(c):
        return None
    if engine == "CCU_MS":
        if s.L > 1 or c.dtype == "int8" or c.inplace or _two_rank_detour(c, 8 * MiB):
            return None
        small = s.d < SMALL
        name = _mesh_by_type(c, "CcuMSAllReduceSoleMesh2Die" if small else "CcuMSAllReduceSequenceMesh2Die",
                             "CcuMSAllReduceSoleMeshOneShot" if small else "CcuMSAllReduceSoleMesh")
        return None if name is None else _flat(ctx, engine, "mesh_oneshot" if small else "fullmesh", name)
    # CCU_SCHED
    if s.L >= 3 or c.inplace:
        return None
    if s.L == 2:
        if c.level1_nhr or s.per_server == 1:
            return _flat(ctx, engine, "NHR", "CcuSchedAllReduceSoleNHR")
        if c.two_die:
            return None
        int8 = c.dtype == "int8"
        if (s.d <= 32 * MiB and s.n > 64) or (s.d <= 16 * MiB and s.n >= 64 and not int8):
            return _levels(ctx, engine, "CcuSchedAllReduceSequenceMeshMesh", s, l1="fullmesh")
        if s.d <= SMALL and s.n <= 64 and not int8:
            return _flat(ctx, engine, "fullmesh", "CcuSchedAllReduceSoleMesh")
        if s.d <= 64 * MiB and s.n < 64 and not int8:
            return _levels(ctx, engine, "CcuSchedAllReduceSequenceMeshMesh", s, l1="fullmesh")
        if s.d <= 64 * MiB and not int8:
            return _levels(ctx, engine, "CcuSchedAllReduceParallelMeshNHR", s)
        return None
    if c.dtype == "int8" or s.d * 8 / s.n ** 2 > 8 * MiB or c.mesh_type == "TWO_DIE_NOT_REGULAR":
        return None
    if c.mesh_type == "TWO_DIE_REGULAR":
        small = s.d < SMALL
        return _flat(ctx, engine, "mesh_oneshot" if small else "fullmesh",
                     "CcuSchedAllReduceSoleMesh2Die" if small else "CcuSchedAllReduceSequenceMesh2Die")
    return _flat(ctx, engine, "fullmesh", "CcuSchedAllReduceSoleMesh")


def _ccu_reduces(c: Call) -> bool:
    """Every CCU selector refuses strict order, PROD and 64-bit types for a reduction."""
    return not (c.strict or c.redop == "prod" or c.dtype in WIDE)


def _aiv_fits(c: Call, reducing: bool = False, max_ranks: int = AIV_MAX_RANKS, sized: bool = True) -> bool:
    """The AIV selectors' common gates: at most `max_ranks`, fewer than three levels, no strict
    order, PROD, uint64 or fp64 for a reduction, under 8 MiB per rank and 16 CCL buffers."""
    if c.s.n > max_ranks or c.s.L >= 3:
        return False
    if reducing and (c.strict or c.redop == "prod" or c.dtype in ("uint64", "float64")):
        return False
    return not sized or (c.total < AIV_MAX_PER_RANK * c.s.n and c.total <= c.buffsize * AIV_MAX_CCL_LOOPS)


# ---- AllGather and ReduceScatter (all_gather_ / reduce_scatter_auto_selector.cc) ---------------
def _allgather(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":
        if s.L > 1 or c.inplace or _two_rank_detour(c, 4 * MiB):
            return None
        name = _mesh_by_type(c, "CcuMSAllGatherSoleMesh2Die", "CcuMSAllGatherSoleMesh")
        return None if name is None else _flat(ctx, engine, "fullmesh", name)
    if engine == "CCU_SCHED":
        if s.L >= 3:
            return None
        if s.L == 2:
            if c.inplace or s.n > CCU_MAX_RANKS:
                return None
            if c.level1_nhr:
                return _flat(ctx, engine, "NHR", "CcuSchedAllGatherSoleNHR")
            if c.two_die:
                return None
            if s.per_server == 1:
                return _flat(ctx, engine, "NHR", "CcuSchedAllGatherSoleNHR")
            if s.n <= 8:
                if s.d <= MiB:
                    return _flat(ctx, engine, "fullmesh", "CcuSchedAllGatherSoleMesh")
            elif s.d < 128 * KiB and s.n <= 32:
                return _flat(ctx, engine, "fullmesh", "CcuSchedAllGatherSoleMesh")
            elif s.d < 4 * MiB and c.frames <= 16:
                return _levels(ctx, engine, "CcuSchedAllGatherSequenceMeshMesh", s, l1="fullmesh")
            if c.frames <= 16:
                return _levels(ctx, engine, "CcuSchedAllGatherParallelMeshNHR", s)
            return _flat(ctx, engine, "NHR", "CcuSchedAllGatherSoleNHR")
        if c.mesh_type != "TWO_DIE_REGULAR" and _two_rank_detour(c, 4 * MiB):
            return None
        name = _mesh_by_type(c, "CcuSchedAllGatherSoleMesh2Die", "CcuSchedAllGatherSoleMesh")
        return None if name is None else _flat(ctx, engine, "fullmesh", name)
    if not _aiv_fits(c):
        return None
    return _flat(ctx, engine, "fullmesh", "AivAllGatherSoleMesh")


def _reducescatter(ctx, c: Call, engine: str):
    s = c.s
    if engine == "AIV":
        return _flat(ctx, engine, "fullmesh", "AivReduceScatterSoleMesh") if _aiv_fits(c, reducing=True) else None
    if not _ccu_reduces(c):
        return None
    if engine == "CCU_MS":
        if s.L > 1 or c.dtype == "int8" or c.inplace or _two_rank_detour(c, 4 * MiB):
            return None
        name = _mesh_by_type(c, "CcuMSReduceScatterSoleMesh2Die", "CcuMSReduceScatterSoleMesh")
        return None if name is None else _flat(ctx, engine, "fullmesh", name)
    # CCU_SCHED
    if s.L >= 3 or c.inplace:
        return None
    if s.L == 2:
        total = s.d * s.n
        if s.d >= 32 * MiB:
            return None
        if c.level1_nhr or s.per_server == 1:
            return _flat(ctx, engine, "NHR", "CcuSchedReduceScatterSoleNHR")
        if c.dtype == "int8":
            return None
        if s.n == 16 and c.frames == 2 and 4 * MiB <= total <= 16 * MiB:     # "2*8p", RS_CCU_2DIE_*
            return _flat(ctx, engine, "fullmesh", "CcuSchedReduceScatterSoleMesh2Die")
        if total < SMALL and s.n < 64:
            return _flat(ctx, engine, "fullmesh", "CcuSchedReduceScatterSoleMesh")
        if c.frames <= 16 and ((total < 16 * MiB and s.n < 64) or (total <= 16 * MiB and s.n == 64)):
            return _levels(ctx, engine, "CcuSchedReduceScatterSequenceMeshMesh", s, l1="fullmesh")
        if c.frames <= 16 and total <= 128 * MiB and s.n == 64:
            return _levels(ctx, engine, "CcuSchedReduceScatterParallelMeshNHR", s)
        if c.frames > 16:
            return _flat(ctx, engine, "NHR", "CcuSchedReduceScatterSoleNHR")
        return None
    if c.dtype == "int8" or s.d * 8 / s.n >= 8 * MiB:
        return None
    name = _mesh_by_type(c, "CcuSchedReduceScatterSoleMesh2Die", "CcuSchedReduceScatterSoleMesh")
    return None if name is None else _flat(ctx, engine, "fullmesh", name)


# ---- AlltoAll, AlltoAllV, AlltoAllVC (alltoall*_auto_selector.cc) ------------------------------
def _alltoall(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":                  # no AlltoAll on CCU_MS: CCU_SCHED next
        return None
    if engine == "CCU_SCHED":
        if s.L >= 3 or c.inplace:
            return None
        if s.L > 1:
            return None if s.n > CCU_MAX_RANKS else _flat(ctx, engine, "fullmesh", "CcuSchedAllToAllSoleMeshMultiLink")
        name = _mesh_by_type(c, "CcuSchedAllToAllSoleMesh2Die", "CcuSchedAllToAllSoleMesh")
        return None if name is None else _flat(ctx, engine, "fullmesh", name)
    return _flat(ctx, engine, "fullmesh", "AivAllToAllSoleMesh") if _aiv_fits(c) else None


def _alltoallv(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":                  # AlltoAllVAutoSelector has no CCU_MS rule
        return None
    if engine == "CCU_SCHED":
        if s.L >= 3:
            return None
        if s.L > 1:
            if s.n > CCU_MAX_RANKS or c.dtype == "int8":
                return None
            return _flat(ctx, engine, "fullmesh", "CcuSchedAllToAllVSoleMesh" if s.n <= 4
                         else "CcuSchedAllToAllVSoleMeshMultiLink")
        name = _mesh_by_type(c, "CcuSchedAllToAllVSoleMesh2Die", "CcuSchedAllToAllVSoleMesh")
        return None if name is None else _flat(ctx, engine, "fullmesh", name)
    return _flat(ctx, engine, "fullmesh", "AivAllToAllVSoleMesh") if _aiv_fits(
        c, max_ranks=AIV_MAX_RANKS_V, sized=False) else None


def _alltoallvc(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":
        return None
    if engine == "CCU_SCHED":               # one level only
        return None if s.L > 1 else _flat(ctx, engine, "fullmesh", "CcuSchedAllToAllVCSoleMesh")
    return _flat(ctx, engine, "fullmesh", "AivAllToAllVSoleMesh") if _aiv_fits(
        c, max_ranks=AIV_MAX_RANKS_V, sized=False) else None


# ---- Broadcast, Reduce, Scatter (broadcast_ / reduce_ / scatter_auto_selector.cc) -------------
def _rooted_caps(c: Call) -> bool:
    """Broadcast's and Reduce's CCU_SCHED caps over a SuperPoD: 64 MiB under 64 ranks, 1 MiB per
    rank from 64."""
    s = c.s
    return (s.n < 64 and s.d > 64 * MiB) or (s.n >= 64 and s.d / s.n > MiB)


def _broadcast(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":
        if s.L > 1 or c.two_die:
            return None
        return _flat(ctx, engine, "fullmesh", "CcuMSBroadcastSoleMesh")
    if engine == "CCU_SCHED":
        if s.L >= 3:
            return None
        if s.L == 2:
            if _rooted_caps(c):
                return None
            if c.level1_nhr or s.per_server == 1:
                return _flat(ctx, engine, "NHR", "CcuSchedBroadcastSoleNHR")
            if c.two_die:
                return None
            per = s.d / s.n
            if per <= 16 * KiB and s.n <= 64:
                return _flat(ctx, engine, "fullmesh", "CcuSchedBroadcastSoleMesh")
            if (per <= 4 * MiB and s.n < 64) or (per <= MiB and s.n >= 64):
                return _flat(ctx, engine, "NHR", "CcuSchedBroadcastSoleNHR")
            return _levels(ctx, engine, "CcuSchedBroadcastParallelMeshNHR", s)
        return None if c.two_die else _flat(ctx, engine, "fullmesh", "CcuSchedBroadcastSoleMesh")
    return _flat(ctx, engine, "fullmesh", "AivBroadcastSoleMesh") if _aiv_fits(c) else None


def _reduce(ctx, c: Call, engine: str):
    s = c.s
    if engine == "AIV":
        return _flat(ctx, engine, "mesh_oneshot", "AivReduceSoleMesh") if _aiv_fits(c, reducing=True) else None
    if c.redop == "prod" or c.dtype in WIDE:        # CCU_MS and CCU_SCHED alike
        return None
    int8 = c.dtype == "int8"
    if engine == "CCU_MS":
        if s.L > 1 or int8 or c.two_die or s.d >= 8 * MiB:
            return None
        return _flat(ctx, engine, "mesh_oneshot", "CcuMSReduceSoleMesh")
    # CCU_SCHED
    if s.L >= 3:
        return None
    if s.L == 2:
        if _rooted_caps(c):
            return None
        if c.level1_nhr:
            return _flat(ctx, engine, "NHR", "CcuReduceNHR1DMem2Mem")
        if s.per_server == 1:
            return _flat(ctx, engine, "NHR", "CcuSchedReduceSoleNHR")
        if c.two_die or int8:
            return None
        if s.d / s.n <= 256 * KiB:
            return _flat(ctx, engine, "NHR", "CcuSchedReduceSoleNHR")
        return _levels(ctx, engine, "CcuSchedReduceParallelMeshNHR", s)
    if c.two_die or (s.n < 8 and s.d >= 8 * MiB) or s.d > 16 * MiB or int8:
        return None
    return _flat(ctx, engine, "fullmesh", "CcuSchedReduceSoleMeshTwoShot")


def _scatter(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":                  # no Scatter on CCU_MS: CCU_SCHED next
        return None
    if engine == "CCU_SCHED":
        if s.L >= 3:
            return None
        if s.L == 2:
            if s.d > MiB or s.n > CCU_MAX_RANKS:         # per rank (CCU_SCHEDULE_2LEVEL_MAX_PER_RANK_DATA_SIZE)
                return None
            if c.level1_nhr or s.per_server == 1:
                return _flat(ctx, engine, "NHR", "CcuSchedScatterSoleNHR")
            if c.two_die:
                return None
            return _levels(ctx, engine, "CcuSchedScatterParallelMeshNHR", s)
        if c.inplace or c.two_die:
            return None
        return _flat(ctx, engine, "fullmesh", "CcuSchedScatterSoleMesh")
    return _flat(ctx, engine, "fullmesh", "AivScatterSoleMesh") if _aiv_fits(c) else None


# ---- AllGatherV, ReduceScatterV (all_gather_v_ / reduce_scatter_v_auto_selector.cc) -----------
def _allgatherv(ctx, c: Call, engine: str):
    # CCU_SCHED alone, on one level, not in place; no CCU_MS or AIV AllGatherV
    if engine != "CCU_SCHED" or c.s.L > 1 or c.inplace:
        return None
    return _flat(ctx, engine, "fullmesh", "CcuSchedAllGatherVSoleMesh")


RSV_CCU_MAX = 32 * MiB          # RSV_CCU_8P_MIN_DATA_SIZE: a rank's whole input


def _reducescatterv(ctx, c: Call, engine: str):
    # CCU_MS's mesh rule matches nothing; CCU_SCHED on one level, under 32 MiB of input per rank
    if engine != "CCU_SCHED" or c.s.L > 1 or c.inplace or not _ccu_reduces(c) or c.dtype == "int8":
        return None
    own = ctx.own_signature
    sent = int(own.v.counts.sum(axis=1).max()) * ctx.itemsize if own.v is not None else c.total
    if c.two_die or sent >= RSV_CCU_MAX:
        return None
    return _flat(ctx, engine, "fullmesh", "CcuSchedReduceScatterVSoleMesh")


RULES = {"allreduce": _allreduce, "allgather": _allgather, "reducescatter": _reducescatter,
         "alltoall": _alltoall, "alltoallv": _alltoallv, "alltoallvc": _alltoallvc,
         "broadcast": _broadcast, "reduce": _reduce, "scatter": _scatter,
         "allgatherv": _allgatherv, "reducescatterv": _reducescatterv}
"""Each op's CCU and AIV selectors, by the op HCCL registers them for (hccl_950.op_of)."""


def choose(ctx, mode: str):
    """HCCL's kernel choice for this call under expansion `mode` (CHAINS), or None."""
    op = hccl_950.op_of(ctx)
    if op not in RULES or ctx.topo.num_ranks == 1:
        return None
    shape = hccl_950.Shape(ctx)
    if not shape.equal:
        shape.per_server = 0                  # servers of unequal size: no rule reads a size per server
    call = Call(ctx, shape)
    for engine in CHAINS[mode]:
        choice = RULES[op](ctx, call, engine)
        if choice is not None:
            return choice
    return None


def rule_choice(ctx):
    """HCCL's rule-based choice for this call on a 950: under HCCL_OP_EXPANSION_MODE=CCU_MS,
    CCU_SCHED or AIV the kernel engines' (choose), and where none takes the call the AI CPU's,
    noted as HCCL's fallback; else the AI CPU's (hccl_950.choose)."""
    mode = ctx.config.expansion
    if mode not in CHAINS:
        return hccl_950.choose(ctx)
    got = choose(ctx, mode)
    if got is not None:
        return got
    aicpu = hccl_950.choose(ctx)
    if aicpu.executor is None or ctx.topo.num_ranks == 1:     # the barrier, one rank: nothing to fall back from
        return aicpu
    engines = " or ".join(dict.fromkeys(ENGINE_OF[e] for e in CHAINS[mode]))
    why = (f"HCCL_OP_EXPANSION_MODE={mode}: HCCL's {engines} selectors take no {hccl_950._op(hccl_950.op_of(ctx))} "
           "of this call; it falls back to the AI CPU")
    return aicpu._replace(note="; ".join(n for n in (aicpu.note, why) if n))
