"""The Communicator's variable-size calls (AlltoAllV, AlltoAllVC): a call's counts and
displacements checked as HCCL checks them, and the signature the rendezvous merges.

Counts and displacements are in rows along axis 0 (a row is x.shape[1:]); what this rank sends
and expects goes into its signature's `local` part, which the rendezvous stacks into the op's
count matrix (collectives.variable.merge) and checks pair by pair.
"""
from __future__ import annotations

import math

import numpy as np

from topologies.errors import Cause, HcclError

from ..collectives.variable import VCounts, blocks
from ..config.types import dtype_name
from ..plan.planner import Signature


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
    coll = colls.of(name)
    comm._check_ranks_with_data(coll)
    x = comm._array(x, coll.method, coll.min_ndim)
    algo, stream = comm._algo(algo, coll.method), comm._stream(stream, coll.method)
    build = alltoallv if name == "alltoallv" else alltoallvc
    call = build(comm, name, x, *counts, algo)
    res, target = result_arrays(comm, call, x, out, coll.method)
    done = comm._collective(call.signature, x, res, None, stream, res if target is None else target)
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
