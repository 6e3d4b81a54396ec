"""The Communicator's variable-size calls (AlltoAllV, AlltoAllVC, AllGatherV, ReduceScatterV): a
call's counts and displacements checked as HCCL checks them, and the signature the rendezvous
merges.

Counts and displacements are in rows along axis 0 (a row is x.shape[1:]). What this rank gives
goes into its signature's `local` part, which the rendezvous merges into the op's VCounts: an
AlltoAllV's rows of sends and receives, stacked and checked pair by pair
(collectives.variable.merge); an AllGatherV's or ReduceScatterV's counts and displacements,
which must be the same on every rank (collectives.gather_v.agreed).
"""
from __future__ import annotations

import math

import numpy as np

from topologies.errors import Cause, HcclError

from ..collectives.variable import VCounts, blocks
from ..config.types import dtype_name, parse_reduce_op
from ..plan.planner import Signature


class VariableSizeOps:
    """The Communicator's variable-size collectives (its other ops are on the Communicator)."""

    def all_to_all_v(self, x, send_counts, recv_counts, send_displs=None, recv_displs=None, algo=None, stream=None,
                     out=None):
        """HcclAlltoAllV: send_counts[j] rows of x (from send_displs[j]) go to rank j; the result
        holds recv_counts[i] rows from each rank i at recv_displs[i] (default: end to end in rank
        order). Counts that disagree across ranks fail on every rank."""
        return run(self, "alltoallv", x, algo, stream, out, (send_counts, recv_counts, send_displs, recv_displs))

    def all_to_all_vc(self, x, count_matrix, algo=None, stream=None, out=None):
        """HcclAlltoAllVC: count_matrix[i][j] rows go from rank i to rank j, blocks in rank order
        on both sides; every rank gives the same matrix."""
        return run(self, "alltoallvc", x, algo, stream, out, (count_matrix,))

    def all_gather_v(self, x, recv_counts, recv_displs=None, algo=None, stream=None, out=None):
        """HcclAllGatherV: rank i's x (recv_counts[i] rows) lands at recv_displs[i] (default: end
        to end in rank order) in every rank's result; every rank gives the same counts."""
        return run(self, "allgatherv", x, algo, stream, out, (recv_counts, recv_displs))

    def reduce_scatter_v(self, x, send_counts, op="sum", send_displs=None, algo=None, stream=None, out=None):
        """HcclReduceScatterV: block j of x (send_counts[j] rows at send_displs[j], default end to
        end) is reduced over every rank into rank j's result; every rank gives the same counts."""
        return run(self, "reducescatterv", x, algo, stream, out, (send_counts, op, send_displs))


class VariableCall:
    """One rank's checked variable-size call: its signature, result shape and whether its result
    must start zeroed (receive displacements that leave gaps)."""
    __slots__ = ("signature", "out_shape", "gaps")

    def __init__(self, signature, out_shape, gaps):
        self.signature, self.out_shape, self.gaps = signature, out_shape, gaps


def run(comm, name, x, algo, stream, out, counts):
    """One variable-size call on `comm`: checked here, run on the Communicator's common path, its
    result copied into `out` when given."""
    from .. import collectives as colls
    from . import group
    coll = colls.of(name)
    if group.active():                      # held until the group ends, launched after the fixed-size ops
        return group.hold_collective(comm, coll.method, lambda: run(comm, name, x, algo, stream, out, counts), None)
    comm._check_ranks_with_data(coll)
    x = comm._array(x, coll.method, coll.min_ndim)
    algo, stream = comm._algo(algo, coll.method), comm._stream(stream, coll.method)
    call = BUILDERS[name](comm, name, x, *counts, algo)
    res, target = result_arrays(comm, call, x, out, coll.method)
    redop = parse_reduce_op(call.signature.redop) if call.signature.redop is not None else None
    done = comm._collective(call.signature, x, res, redop, stream, res if target is None else target)
    if target is not None:
        np.copyto(target, res)
    return done


def alltoallv(comm, name, x, send_counts, recv_counts, send_displs, recv_displs, algo) -> VariableCall:
    """AlltoAllV: this rank's send and receive blocks, checked; its signature carries them."""
    p, rank, op = comm.size, comm.rank, comm_method(name)
    rows = x.shape[0]
    sc, sd = blocks(send_counts, send_displs, p, "send", rank, op, rows=rows)
    rc, rd = blocks(recv_counts, recv_displs, p, "recv", rank, op)
    out_rows = int(np.where(rc > 0, rd + rc, 0).max(initial=0))
    local = (tuple(sc.tolist()), tuple(sd.tolist()), tuple(rc.tolist()), tuple(rd.tolist()))
    sig = Signature(name, tuple(x.shape[1:]), dtype_name(x.dtype), None, None, algo, False, None, local)
    return VariableCall(sig, (out_rows,) + tuple(x.shape[1:]), int(rc.sum()) != out_rows)


def alltoallvc(comm, name, x, count_matrix, algo) -> VariableCall:
    """AlltoAllVC: the whole count matrix, the same on every rank; blocks in rank order."""
    p, rank, op = comm.size, comm.rank, comm_method(name)
    try:
        matrix = np.asarray(count_matrix)
        ok = matrix.shape == (p, p) and matrix.dtype.kind in "iu"
    except (TypeError, ValueError):      # ragged or not numbers: said below
        ok = False
    if not ok:
        raise HcclError("E_PARA", f"count_matrix must be {p} x {p} integers (rows rank i sends to rank j), "
                        f"got {count_matrix!r}", rank=rank, op=op, cause=Cause.BAD_INPUT)
    matrix = matrix.astype(np.int64)
    bad = np.argwhere(matrix < 0)
    if len(bad):
        i, j = (int(v) for v in bad[0])
        raise HcclError("E_PARA", f"count_matrix[{i}][{j}] = {int(matrix[i, j])} is negative", rank=rank, op=op,
                        cause=Cause.BAD_INPUT)
    blocks(matrix[rank], None, p, "send", rank, op, rows=x.shape[0])
    row = math.prod(x.shape[1:])
    sig = Signature(name, tuple(x.shape[1:]), dtype_name(x.dtype), None, None, algo, False,
                    VCounts.contiguous(matrix * row))
    return VariableCall(sig, (int(matrix[:, rank].sum()),) + tuple(x.shape[1:]), False)


def allgatherv(comm, name, x, recv_counts, recv_displs, algo) -> VariableCall:
    """AllGatherV: the blocks every rank receives, checked; x holds this rank's block."""
    p, rank, op = comm.size, comm.rank, comm_method(name)
    rc, rd = blocks(recv_counts, recv_displs, p, "recv", rank, op)
    if x.shape[0] != rc[rank]:
        raise HcclError("E_PARA", f"x has {x.shape[0]} rows but recv_counts[{rank}] = {int(rc[rank])} (this rank's "
                        "block must be its whole input)", rank=rank, op=op, cause=Cause.BAD_INPUT)
    out_rows = int(np.where(rc > 0, rd + rc, 0).max(initial=0))
    sig = Signature(name, tuple(x.shape[1:]), dtype_name(x.dtype), None, None, algo, False, None,
                    (tuple(rc.tolist()), tuple(rd.tolist())))
    return VariableCall(sig, (out_rows,) + tuple(x.shape[1:]), int(rc.sum()) != out_rows)


def reducescatterv(comm, name, x, send_counts, redop, send_displs, algo) -> VariableCall:
    """ReduceScatterV: the blocks of x every rank reduces, checked; the result is this rank's."""
    p, rank, op = comm.size, comm.rank, comm_method(name)
    sc, sd = blocks(send_counts, send_displs, p, "send", rank, op, rows=x.shape[0])
    redop = comm._redop(redop, op)
    comm._check_type(x.dtype, op, redop)
    sig = Signature(name, tuple(x.shape[1:]), dtype_name(x.dtype), redop.value, None, algo, False, None,
                    (tuple(sc.tolist()), tuple(sd.tolist())))
    return VariableCall(sig, (int(sc[rank]),) + tuple(x.shape[1:]), False)


BUILDERS = {"alltoallv": alltoallv, "alltoallvc": alltoallvc, "allgatherv": allgatherv,
            "reducescatterv": reducescatterv}


def result_arrays(comm, call: VariableCall, x, out, op):
    """(the array the op writes, the user's `out` to copy it into or None): a fresh result
    (zeroed where blocks leave gaps), or `out`'s own contents where the op writes none."""
    shape, dtype = call.out_shape, x.dtype
    if out is None:
        return (np.zeros(shape, dtype) if call.gaps else comm._empty(shape, dtype)), None
    if not isinstance(out, np.ndarray) or out.dtype != dtype or out.shape[1:] != shape[1:] or out.shape[0] < shape[0]:
        raise HcclError("E_PARA", f"out must hold at least the result's {shape[0]} rows of shape {shape[1:]} and "
                        f"dtype {dtype}, got {getattr(out, 'shape', type(out).__name__)}", rank=comm.rank, op=op,
                        cause=Cause.BAD_INPUT)
    if not out.flags.writeable:
        raise HcclError("E_PARA", "out is read-only", rank=comm.rank, op=op, cause=Cause.BAD_INPUT)
    if np.shares_memory(out, x):
        raise HcclError("E_PARA", f"{op} cannot run in place (out shares memory with the input)", rank=comm.rank,
                        op=op, cause=Cause.BAD_INPUT)
    call.out_shape = out.shape
    return np.array(out), out          # rows the op leaves alone keep out's values


def comm_method(name: str) -> str:
    from .. import collectives as colls
    return colls.of(name).method
