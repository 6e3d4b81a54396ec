"""What HCCL's CCU and AIV selectors on the Ascend 950 read of a call, and the gates they share
(hicann/hccl @09300b70, src/ops/<op>/selector/*_auto_selector.cc and auto_selector_base.{h,cc};
docs/references.md §6.14): the engines each HCCL_OP_EXPANSION_MODE tries, the level0 mesh type,
the size, rank and type limits, and the Choice a match makes (one CCU or AIV kernel per
CCL-buffer loop). The per-op rules are selection.hccl_950_kernels.

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
from .hccl_950 import MiB

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


def flat(ctx, engine, algo, name, notes=()):
    """HCCL's `name` as one `engine` kernel running `algo` over every rank."""
    return hccl_950._flat(ctx, algo, name, notes)._replace(expansion=ENGINE_OF[engine])


def levels(ctx, engine, name, s, l1="NHR"):
    """HCCL's `name` as `engine` kernels running the levels (the mesh, then `l1` among servers;
    a ParallelMeshNHR split as the AI CPU's)."""
    split = hccl_950.modelled_split(ctx, s, name)
    choice = hccl_950._levels(name, s, split=split)
    if l1 == "fullmesh":
        choice = choice._replace(level1="fullmesh")
    return choice._replace(expansion=ENGINE_OF[engine])


def mesh_by_type(c: Call, regular: str, other: str) -> Optional[str]:
    """HCCL's Mesh1D rule: TWO_DIE_REGULAR runs `regular`, TWO_DIE_NOT_REGULAR nothing, else `other`."""
    if c.mesh_type == "TWO_DIE_REGULAR":
        return regular
    return None if c.mesh_type == "TWO_DIE_NOT_REGULAR" else other


def two_rank_detour(c: Call, limit: int) -> bool:
    """Two ranks behind a two-level network with `limit` or more: HCCL keeps them on the AI CPU."""
    return c.s.two_level_net and c.s.n == 2 and c.s.d >= limit


def ccu_reduces(c: Call) -> bool:
    """Every CCU selector refuses strict order, PROD and 64-bit types for a reduction."""
    return not (c.strict or c.redop == "prod" or c.dtype in WIDE)


def aiv_fits(c: Call, reducing: bool = False, max_ranks: int = AIV_MAX_RANKS, sized: bool = True) -> bool:
    """The AIV selectors' common gates: at most `max_ranks`, fewer than three levels, no strict
    order, PROD, uint64 or fp64 for a reduction, under 8 MiB per rank and 16 CCL buffers."""
    if c.s.n > max_ranks or c.s.L >= 3:
        return False
    if reducing and (c.strict or c.redop == "prod" or c.dtype in ("uint64", "float64")):
        return False
    return not sized or (c.total < AIV_MAX_PER_RANK * c.s.n and c.total <= c.buffsize * AIV_MAX_CCL_LOOPS)


def rooted_caps(c: Call) -> bool:
    """Broadcast's and Reduce's CCU_SCHED caps over a SuperPoD: 64 MiB under 64 ranks, 1 MiB per
    rank from 64."""
    s = c.s
    return (s.n < 64 and s.d > 64 * MiB) or (s.n >= 64 and s.d / s.n > MiB)
