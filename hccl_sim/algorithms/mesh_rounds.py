"""The Ascend 950's AlltoAll and AlltoAllV: HCCL's flat mesh over every rank, 16 peers at a time
(hicann/hccl InsTempAlltoAllVMesh1D, run by InsV2AlltoAllVSoleExecutor for AicpuAllToAllSoleMesh,
...SoleMeshSingleChannel and AicpuAllToAllVSoleMesh; docs/references.md §6.13).

Every rank is one flat group, whatever the servers and SuperPoDs (TopoMatch1D). A rank exchanges
with ALLTOALLV_DIRECT_FULLMESH_CONCURRENT_SIZE = 16 peers at a time, nearest first on the rank
ring, left then right: rank - 1, rank + 1, rank - 2, rank + 2, ... (CalcCommRankSetForOneLoop;
a peer at both distances once). Round k takes distances 8k + 1 .. 8k + 8, so there are
ceil((p - 1) / 16) rounds. With each peer the rank writes its block for it into the peer's CCL
buffer slot (SendRecvWrite), and copies what the peer wrote into its own slot to its output
(PostCopy); its own block is a local copy in round 0.

Here a round is a step: a rank's transfers of round k, then (in step k + 1, beside round k + 1's
transfers) its copies of what they brought. Deviation, stated: HCCL's rounds only assign peers to
its 16 threads, each thread going on to its next peer when its own exchange is done; here a rank
starts round k + 1 when all of round k's exchanges are (the same on links of one speed). Rows:
input row j goes to rank j, output row j comes from rank j; the CCL slots are scratch row j
(AlltoAllV: each block lands in scratch where it will sit in the output).
"""
from __future__ import annotations

import numpy as np

from hcomm.program import GlobalStep, LazyStep

from .common import INPUT, OUTPUT, SCRATCH, StepBuilder

NAME = "mesh_rounds"
COLLECTIVES = ("alltoall", "alltoallv")
LEVELS = ()                           # no token asks for it: the 950's selection runs it
DESCRIPTION = "950 AlltoAll(V): the flat mesh, 16 peers at a time, nearest first (InsTempAlltoAllVMesh1D)"
STAGED = False                        # writes from the user's input, copies into the user's output
CONCURRENT = 16                       # ALLTOALLV_DIRECT_FULLMESH_CONCURRENT_SIZE (ins_temp_all_to_all_v_mesh_1D.h)
SLOT_MAX = 256 << 20                  # UB_MAX_DATA_SIZE (alg_param.h): the most one transfer moves
SLOT_ALIGN = 128                      # HCCL_MIN_SLICE_ALIGN (alg_template_base.h)
MAX_RANKS = 8192
"""The most ranks hccl-sim prices it on: p(p - 1) transfers in ceil((p - 1) / 16) steps of 16 p,
a step at a time (a SuperPoD's 8,192 ranks: 512 steps). HCCL sets no AlltoAll limit of its own;
hcomm's communicator stops at 65,536 ranks (MAX_RANKCOUNT, docs/references.md §6.13)."""


def loop_block_bytes(buffsize: int) -> int:
    """Bytes of each peer's block one loop moves: the CCL buffer cut into a slot per concurrent
    peer, at most 256 MiB, 128-byte aligned (InsV2AlltoAllVSoleExecutor::OrchestrateLoop); every
    loop runs the rounds again."""
    return max(SLOT_ALIGN, min(SLOT_MAX, buffsize // CONCURRENT // SLOT_ALIGN * SLOT_ALIGN))


def rounds(p: int) -> list:
    """The signed distances of each round, in HCCL's order: -1, +1, -2, +2, ... (16 a round)."""
    out, seen = [], set()
    for g in range(1, p):
        for d in (-g, g):
            peer = d % p
            if peer not in seen:
                seen.add(peer)
                out.append(d)
    return [out[k:k + CONCURRENT] for k in range(0, len(out), CONCURRENT)]


def _steps(p: int, add_transfers, add_copies, own_copy) -> list:
    """One step a round (its transfers, and the copies of what the round before brought), and a
    last step of copies. Each step is built when asked for (hcomm.program.LazyStep): a SuperPoD's
    512 steps of 16 p transfers are priced one at a time, never all held at once."""
    r = np.arange(p)
    ds_of = rounds(p) or [[]]

    def build(k: int) -> GlobalStep:
        b = StepBuilder()
        if k == 0:
            own_copy(b, r)
        for d in (ds_of[k - 1] if k else ()):         # what the last round brought, slot to output
            add_copies(b, r, (r - d) % p)
        for d in (ds_of[k] if k < len(ds_of) else ()):
            add_transfers(b, r, (r + d) % p)
        return b.build()
    last = len(ds_of) + (1 if ds_of[-1] else 0)
    return [LazyStep(lambda k=k: build(k)) for k in range(last)]


def alltoall(p: int, unit: int, src=INPUT, dst=OUTPUT) -> list:
    """Block j of every rank's src to rank j's dst, by rounds of 16 peers."""
    return _steps(
        p,
        lambda b, i, to: b.transfers(i, to, unit, src, to, to + 1, SCRATCH, i),
        lambda b, at, frm: b.copies(at, unit, SCRATCH, frm, frm + 1, dst, frm),
        lambda b, r: b.copies(r, unit, src, r, r + 1, dst, r))


def alltoallv(blocks, itemsize: int, src=INPUT, dst=OUTPUT) -> list:
    """AlltoAllV by the same rounds, each pair moving its own count (empty blocks move nothing).
    `blocks`: (lengths, send offsets, receive offsets), each [sender, receiver], in elements."""
    lengths, soff, doff = blocks
    p = len(lengths)

    def transfers(b, i, to):
        keep = lengths[i, to] > 0
        i, to = i[keep], to[keep]
        b.transfers(i, to, itemsize, src, soff[i, to], soff[i, to] + lengths[i, to], SCRATCH, doff[i, to])

    def copies(b, at, frm):
        keep = lengths[frm, at] > 0
        at, frm = at[keep], frm[keep]
        lo = doff[frm, at]
        b.copies(at, itemsize, SCRATCH, lo, lo + lengths[frm, at], dst, lo)

    def own(b, r):
        keep = lengths[r, r] > 0
        r = r[keep]
        b.copies(r, itemsize, src, soff[r, r], soff[r, r] + lengths[r, r], dst, doff[r, r])
    return _steps(p, transfers, copies, own)
