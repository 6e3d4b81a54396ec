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
branches for MESH_1D_CLOS (UBX, PCIe mixes) and CLOS level0s, and the 960's, are not read. What
the rules read of a call, and the gates they share: selection.hccl_950_gates.
"""
from __future__ import annotations

from . import hccl_950
from .hccl_950_gates import (AIV_MAX_RANKS_V, CCU_MAX_RANKS, CHAINS, ENGINE_OF, KiB, SMALL, WIDE, Call, aiv_fits,
                             ccu_reduces, flat, levels, mesh_by_type, rooted_caps, two_rank_detour)
from .hccl_950 import MiB


# ---- AllReduce (all_reduce_auto_selector.cc) ---------------------------------------------------
def _allreduce(ctx, c: Call, engine: str):
    s = c.s
    if engine == "AIV":
        if not aiv_fits(c, reducing=True):
            return None
        one_shot = s.d < (128 * KiB if s.n <= 8 else SMALL)      # AR_AIV_SMALL_IN_BOARD within a board of 8
        return flat(ctx, engine, "mesh_oneshot" if one_shot else "fullmesh",
                    "AivAllReduceSoleMeshOneShot" if one_shot else "AivAllReduceSoleMeshTwoShot")
    if not ccu_reduces(c):
        return None
    if engine == "CCU_MS":
        if s.L > 1 or c.dtype == "int8" or c.inplace or two_rank_detour(c, 8 * MiB):
            return None
        small = s.d < SMALL
        name = mesh_by_type(c, "CcuMSAllReduceSoleMesh2Die" if small else "CcuMSAllReduceSequenceMesh2Die",
                            "CcuMSAllReduceSoleMeshOneShot" if small else "CcuMSAllReduceSoleMesh")
        return None if name is None else flat(ctx, engine, "mesh_oneshot" if small else "fullmesh", name)
    # CCU_SCHED
    if s.L >= 3 or c.inplace:
        return None
    if s.L == 2:
        if c.level1_nhr or s.per_server == 1:
            return flat(ctx, engine, "NHR", "CcuSchedAllReduceSoleNHR")
        if c.two_die:
            return None
        int8 = c.dtype == "int8"
        if (s.d <= 32 * MiB and s.n > 64) or (s.d <= 16 * MiB and s.n >= 64 and not int8):
            return levels(ctx, engine, "CcuSchedAllReduceSequenceMeshMesh", s, l1="fullmesh")
        if s.d <= SMALL and s.n <= 64 and not int8:
            return flat(ctx, engine, "fullmesh", "CcuSchedAllReduceSoleMesh")
        if s.d <= 64 * MiB and s.n < 64 and not int8:
            return levels(ctx, engine, "CcuSchedAllReduceSequenceMeshMesh", s, l1="fullmesh")
        if s.d <= 64 * MiB and not int8:
            return levels(ctx, engine, "CcuSchedAllReduceParallelMeshNHR", s)
        return None
    if c.dtype == "int8" or s.d * 8 / s.n ** 2 > 8 * MiB or c.mesh_type == "TWO_DIE_NOT_REGULAR":
        return None
    if c.mesh_type == "TWO_DIE_REGULAR":
        small = s.d < SMALL
        return flat(ctx, engine, "mesh_oneshot" if small else "fullmesh",
                    "CcuSchedAllReduceSoleMesh2Die" if small else "CcuSchedAllReduceSequenceMesh2Die")
    return flat(ctx, engine, "fullmesh", "CcuSchedAllReduceSoleMesh")


# ---- AllGather and ReduceScatter (all_gather_ / reduce_scatter_auto_selector.cc) ---------------
def _allgather(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":
        if s.L > 1 or c.inplace or two_rank_detour(c, 4 * MiB):
            return None
        name = mesh_by_type(c, "CcuMSAllGatherSoleMesh2Die", "CcuMSAllGatherSoleMesh")
        return None if name is None else flat(ctx, engine, "fullmesh", name)
    if engine == "CCU_SCHED":
        if s.L >= 3:
            return None
        if s.L == 2:
            if c.inplace or s.n > CCU_MAX_RANKS:
                return None
            if c.level1_nhr:
                return flat(ctx, engine, "NHR", "CcuSchedAllGatherSoleNHR")
            if c.two_die:
                return None
            if s.per_server == 1:
                return flat(ctx, engine, "NHR", "CcuSchedAllGatherSoleNHR")
            if s.n <= 8:
                if s.d <= MiB:
                    return flat(ctx, engine, "fullmesh", "CcuSchedAllGatherSoleMesh")
            elif s.d < 128 * KiB and s.n <= 32:
                return flat(ctx, engine, "fullmesh", "CcuSchedAllGatherSoleMesh")
            elif s.d < 4 * MiB and c.frames <= 16:
                return levels(ctx, engine, "CcuSchedAllGatherSequenceMeshMesh", s, l1="fullmesh")
            if c.frames <= 16:
                return levels(ctx, engine, "CcuSchedAllGatherParallelMeshNHR", s)
            return flat(ctx, engine, "NHR", "CcuSchedAllGatherSoleNHR")
        if c.mesh_type != "TWO_DIE_REGULAR" and two_rank_detour(c, 4 * MiB):
            return None
        name = mesh_by_type(c, "CcuSchedAllGatherSoleMesh2Die", "CcuSchedAllGatherSoleMesh")
        return None if name is None else flat(ctx, engine, "fullmesh", name)
    if not aiv_fits(c):
        return None
    return flat(ctx, engine, "fullmesh", "AivAllGatherSoleMesh")


def _reducescatter(ctx, c: Call, engine: str):
    s = c.s
    if engine == "AIV":
        return flat(ctx, engine, "fullmesh", "AivReduceScatterSoleMesh") if aiv_fits(c, reducing=True) else None
    if not ccu_reduces(c):
        return None
    if engine == "CCU_MS":
        if s.L > 1 or c.dtype == "int8" or c.inplace or two_rank_detour(c, 4 * MiB):
            return None
        name = mesh_by_type(c, "CcuMSReduceScatterSoleMesh2Die", "CcuMSReduceScatterSoleMesh")
        return None if name is None else flat(ctx, engine, "fullmesh", name)
    # CCU_SCHED
    if s.L >= 3 or c.inplace:
        return None
    if s.L == 2:
        total = s.d * s.n
        if s.d >= 32 * MiB:
            return None
        if c.level1_nhr or s.per_server == 1:
            return flat(ctx, engine, "NHR", "CcuSchedReduceScatterSoleNHR")
        if c.dtype == "int8":
            return None
        if s.n == 16 and c.frames == 2 and 4 * MiB <= total <= 16 * MiB:     # "2*8p", RS_CCU_2DIE_*
            return flat(ctx, engine, "fullmesh", "CcuSchedReduceScatterSoleMesh2Die")
        if total < SMALL and s.n < 64:
            return flat(ctx, engine, "fullmesh", "CcuSchedReduceScatterSoleMesh")
        if c.frames <= 16 and ((total < 16 * MiB and s.n < 64) or (total <= 16 * MiB and s.n == 64)):
            return levels(ctx, engine, "CcuSchedReduceScatterSequenceMeshMesh", s, l1="fullmesh")
        if c.frames <= 16 and total <= 128 * MiB and s.n == 64:
            return levels(ctx, engine, "CcuSchedReduceScatterParallelMeshNHR", s)
        if c.frames > 16:
            return flat(ctx, engine, "NHR", "CcuSchedReduceScatterSoleNHR")
        return None
    if c.dtype == "int8" or s.d * 8 / s.n >= 8 * MiB:
        return None
    name = mesh_by_type(c, "CcuSchedReduceScatterSoleMesh2Die", "CcuSchedReduceScatterSoleMesh")
    return None if name is None else flat(ctx, engine, "fullmesh", name)


# ---- AlltoAll, AlltoAllV, AlltoAllVC (alltoall*_auto_selector.cc) ------------------------------
def _alltoall(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":                  # no AlltoAll on CCU_MS: CCU_SCHED next
        return None
    if engine == "CCU_SCHED":
        if s.L >= 3 or c.inplace:
            return None
        if s.L > 1:
            return None if s.n > CCU_MAX_RANKS else flat(ctx, engine, "fullmesh", "CcuSchedAllToAllSoleMeshMultiLink")
        name = mesh_by_type(c, "CcuSchedAllToAllSoleMesh2Die", "CcuSchedAllToAllSoleMesh")
        return None if name is None else flat(ctx, engine, "fullmesh", name)
    return flat(ctx, engine, "fullmesh", "AivAllToAllSoleMesh") if aiv_fits(c) else None


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
            return flat(ctx, engine, "fullmesh", "CcuSchedAllToAllVSoleMesh" if s.n <= 4
                        else "CcuSchedAllToAllVSoleMeshMultiLink")
        name = mesh_by_type(c, "CcuSchedAllToAllVSoleMesh2Die", "CcuSchedAllToAllVSoleMesh")
        return None if name is None else flat(ctx, engine, "fullmesh", name)
    return flat(ctx, engine, "fullmesh", "AivAllToAllVSoleMesh") if aiv_fits(
        c, max_ranks=AIV_MAX_RANKS_V, sized=False) else None


def _alltoallvc(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":
        return None
    if engine == "CCU_SCHED":               # one level only
        return None if s.L > 1 else flat(ctx, engine, "fullmesh", "CcuSchedAllToAllVCSoleMesh")
    return flat(ctx, engine, "fullmesh", "AivAllToAllVSoleMesh") if aiv_fits(
        c, max_ranks=AIV_MAX_RANKS_V, sized=False) else None


# ---- Broadcast, Reduce, Scatter (broadcast_ / reduce_ / scatter_auto_selector.cc) -------------


def _broadcast(ctx, c: Call, engine: str):
    s = c.s
    if engine == "CCU_MS":
        if s.L > 1 or c.two_die:
            return None
        return flat(ctx, engine, "fullmesh", "CcuMSBroadcastSoleMesh")
    if engine == "CCU_SCHED":
        if s.L >= 3:
            return None
        if s.L == 2:
            if rooted_caps(c):
                return None
            if c.level1_nhr or s.per_server == 1:
                return flat(ctx, engine, "NHR", "CcuSchedBroadcastSoleNHR")
            if c.two_die:
                return None
            per = s.d / s.n
            if per <= 16 * KiB and s.n <= 64:
                return flat(ctx, engine, "fullmesh", "CcuSchedBroadcastSoleMesh")
            if (per <= 4 * MiB and s.n < 64) or (per <= MiB and s.n >= 64):
                return flat(ctx, engine, "NHR", "CcuSchedBroadcastSoleNHR")
            return levels(ctx, engine, "CcuSchedBroadcastParallelMeshNHR", s)
        return None if c.two_die else flat(ctx, engine, "fullmesh", "CcuSchedBroadcastSoleMesh")
    return flat(ctx, engine, "fullmesh", "AivBroadcastSoleMesh") if aiv_fits(c) else None


def _reduce(ctx, c: Call, engine: str):
    s = c.s
    if engine == "AIV":
        return flat(ctx, engine, "mesh_oneshot", "AivReduceSoleMesh") if aiv_fits(c, reducing=True) else None
    if c.redop == "prod" or c.dtype in WIDE:        # CCU_MS and CCU_SCHED alike
        return None
    int8 = c.dtype == "int8"
    if engine == "CCU_MS":
        if s.L > 1 or int8 or c.two_die or s.d >= 8 * MiB:
            return None
        return flat(ctx, engine, "mesh_oneshot", "CcuMSReduceSoleMesh")
    # CCU_SCHED
    if s.L >= 3:
        return None
    if s.L == 2:
        if rooted_caps(c):
            return None
        if c.level1_nhr:
            return flat(ctx, engine, "NHR", "CcuReduceNHR1DMem2Mem")
        if s.per_server == 1:
            return flat(ctx, engine, "NHR", "CcuSchedReduceSoleNHR")
        if c.two_die or int8:
            return None
        if s.d / s.n <= 256 * KiB:
            return flat(ctx, engine, "NHR", "CcuSchedReduceSoleNHR")
        return levels(ctx, engine, "CcuSchedReduceParallelMeshNHR", s)
    if c.two_die or (s.n < 8 and s.d >= 8 * MiB) or s.d > 16 * MiB or int8:
        return None
    return flat(ctx, engine, "fullmesh", "CcuSchedReduceSoleMeshTwoShot")


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
                return flat(ctx, engine, "NHR", "CcuSchedScatterSoleNHR")
            if c.two_die:
                return None
            return levels(ctx, engine, "CcuSchedScatterParallelMeshNHR", s)
        if c.inplace or c.two_die:
            return None
        return flat(ctx, engine, "fullmesh", "CcuSchedScatterSoleMesh")
    return flat(ctx, engine, "fullmesh", "AivScatterSoleMesh") if aiv_fits(c) else None


# ---- AllGatherV, ReduceScatterV (all_gather_v_ / reduce_scatter_v_auto_selector.cc) -----------
def _allgatherv(ctx, c: Call, engine: str):
    # CCU_SCHED alone, on one level, not in place; no CCU_MS or AIV AllGatherV
    if engine != "CCU_SCHED" or c.s.L > 1 or c.inplace:
        return None
    return flat(ctx, engine, "fullmesh", "CcuSchedAllGatherVSoleMesh")


RSV_CCU_MAX = 32 * MiB          # RSV_CCU_8P_MIN_DATA_SIZE: a rank's whole input


def _reducescatterv(ctx, c: Call, engine: str):
    # CCU_MS's mesh rule matches nothing; CCU_SCHED on one level, under 32 MiB of input per rank
    if engine != "CCU_SCHED" or c.s.L > 1 or c.inplace or not ccu_reduces(c) or c.dtype == "int8":
        return None
    own = ctx.own_signature
    sent = int(own.v.counts.sum(axis=1).max()) * ctx.itemsize if own.v is not None else c.total
    if c.two_die or sent >= RSV_CCU_MAX:
        return None
    return flat(ctx, engine, "fullmesh", "CcuSchedReduceScatterVSoleMesh")


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
