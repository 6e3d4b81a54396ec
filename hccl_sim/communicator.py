"""The Communicator: what a rank's code calls (all_reduce, all_gather, ..., send, recv, barrier).

A collective call (1) checks its arguments locally, (2) meets the other ranks at a rendezvous
that compares every rank's call and entry clock (a mismatch is an HcclError on every rank, never
a hang) and yields the shared plan (algorithm, loops, schedules, simulated exit clocks), then
(3) moves the data by executing this rank's schedule over the group's zero-copy transport.
Engines differ only in the group object they hand the communicator (rendezvous + transport).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hcomm.executor import execute
from topologies.errors import HcclError
from topologies.validate import is_integer

from . import algorithms
from .planner import COLLECTIVE_NAMES, Signature, program_rank_steps
from .device import Device, DeviceArray, Stream, Work
from .types import ReduceOp, dtype_name, parse_reduce_op, reducer

COLLECTIVE_TAG = "coll"
MAX_REAL_ALLTOALL_RANKS = 512
"""Most ranks an AlltoAll on real data may have: p(p-1) blocks move one by one (512 ranks: 3 s
here; 1,024: 28 s). `hccl_sim.simulate` prices larger ones without payload."""
MAX_TAG = 2**31 - 1          # point-to-point tags: non-negative 32-bit ints, as MPI_TAG_UB allows at least


@dataclass(frozen=True)
class OpRecord:
    """What the last operation did on this rank, in simulated time."""
    name: str
    algo: str
    nbytes: int
    count: int
    dtype: str
    start: int          # this rank's clock at entry, ns
    end: int            # this rank's clock at exit, ns
    retries: int = 0

    @property
    def time(self) -> float:
        """This rank's simulated duration of the op, seconds."""
        return (self.end - self.start) / 1e9


class Communicator:
    """One rank's handle on a group of ranks."""

    def __init__(self, rank: int, group, device: Device | None = None):
        self.rank = rank
        self.size = group.size
        self.topology = group.topo
        self.config = group.config
        self._group = group
        self._transport = group.transport
        self._seq = 0
        self.last_op: OpRecord | None = None
        self.device = device if device is not None else Device(rank, group.topo)
        # HCCL allocates the communicator's CCL buffer, 2 x HCCL_BUFFSIZE (in + out), from HBM.
        self.ccl_buffer = self.device.malloc(2 * self.config.buffsize_bytes, tag="ccl-buffer")

    @property
    def clock(self) -> int:
        """This rank's simulated host clock, ns."""
        return self.device.clock

    def __repr__(self):
        return f"<Communicator rank {self.rank}/{self.size} on {self.topology.name}, clock {self.clock} ns>"

    # argument checks ---------------------------------------------------------------------------
    def _array(self, x, opname: str, min_ndim: int = 0) -> np.ndarray:
        if isinstance(x, DeviceArray):
            x = x.data
        if not isinstance(x, np.ndarray):
            try:
                x = np.asarray(x)
            except Exception as exc:
                raise HcclError("E_PARA", f"input is not an array: {exc}", rank=self.rank, op=opname)
        try:
            dtype_name(x.dtype)
        except HcclError as exc:
            raise HcclError("E_PARA", exc.reason, rank=self.rank, op=opname)
        if x.ndim < min_ndim:
            raise HcclError("E_PARA", f"input must have at least {min_ndim} dimension(s), got shape {x.shape}",
                            rank=self.rank, op=opname)
        return x

    def _root(self, root, opname):
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool) or not 0 <= root < self.size:
            raise HcclError("E_PARA", f"root must be a rank in [0, {self.size}), got {root!r}", rank=self.rank, op=opname)
        return int(root)

    def _redop(self, op, opname):
        try:
            return parse_reduce_op(op)
        except HcclError as exc:
            raise HcclError("E_PARA", exc.reason, rank=self.rank, op=opname)

    def _algo(self, algo, opname):
        # Checked before the rendezvous: signatures are compared (hashed) there, and a list
        # would fail as "unhashable" instead of naming the argument.
        if algo is not None and not isinstance(algo, str):
            raise HcclError("E_PARA", f"algo must be a string (an HCCL token such as 'ring' or an HCCL_ALGO "
                            f"string), got {algo!r} ({type(algo).__name__})", rank=self.rank, op=opname)
        return algo

    def _tag(self, tag, opname):
        if not is_integer(tag) or not 0 <= tag <= MAX_TAG:
            raise HcclError("E_PARA", f"tag must be an integer in [0, {MAX_TAG}], got {tag!r} ({type(tag).__name__})",
                            rank=self.rank, op=opname)
        return int(tag)

    def _stream(self, stream, opname):
        if stream is not None and not isinstance(stream, Stream):
            raise HcclError("E_PARA", f"stream must be a Stream from comm.device.stream(), got {type(stream).__name__}",
                            rank=self.rank, op=opname)
        return stream

    def _divisible(self, x, opname):
        if x.shape[0] % self.size:
            raise HcclError("E_PARA", f"input's first dimension ({x.shape[0]}) must be divisible by the number "
                            f"of ranks ({self.size})", rank=self.rank, op=opname)

    # collectives ----------------------------------------------------------------------------------
    def _empty(self, shape, dtype):
        """A result array, from the engine when it keeps results where peers can write them."""
        make = getattr(self._group, "result_array", None)
        try:
            return np.empty(shape, dtype=dtype) if make is None else make(shape, dtype)
        except MemoryError:
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            raise HcclError("E_MEMORY", f"no host memory for the op's {nbytes} B result (shape {shape}, {dtype})",
                            rank=self.rank) from None

    def all_reduce(self, x, op="sum", algo=None, stream=None):
        algo, stream = self._algo(algo, "all_reduce"), self._stream(stream, "all_reduce")
        x = self._array(x, "all_reduce")
        redop = self._redop(op, "all_reduce")
        out = self._empty(x.shape, x.dtype)
        return self._collective(Signature("allreduce", x.shape, dtype_name(x.dtype), redop.value, None, algo), x, out, redop, stream, out)

    def all_gather(self, x, algo=None, stream=None):
        """Inputs of every rank concatenated along axis 0 in rank order."""
        algo, stream = self._algo(algo, "all_gather"), self._stream(stream, "all_gather")
        x = self._array(x, "all_gather", min_ndim=1)
        out = self._empty((self.size * x.shape[0],) + x.shape[1:], x.dtype)
        return self._collective(Signature("allgather", x.shape, dtype_name(x.dtype), None, None, algo), x, out, None, stream, out)

    def reduce_scatter(self, x, op="sum", algo=None, stream=None):
        """Block `rank` of the reduction of every rank's x (x.shape[0] divisible by size)."""
        algo, stream = self._algo(algo, "reduce_scatter"), self._stream(stream, "reduce_scatter")
        x = self._array(x, "reduce_scatter", min_ndim=1)
        self._divisible(x, "reduce_scatter")
        redop = self._redop(op, "reduce_scatter")
        out = self._empty((x.shape[0] // self.size,) + x.shape[1:], x.dtype)
        return self._collective(Signature("reducescatter", x.shape, dtype_name(x.dtype), redop.value, None, algo),
                                x, out, redop, stream, out)

    def broadcast(self, x, root: int = 0, algo=None, stream=None):
        """The root's x on every rank (x gives the shape and dtype elsewhere)."""
        algo, stream = self._algo(algo, "broadcast"), self._stream(stream, "broadcast")
        x = self._array(x, "broadcast")
        root = self._root(root, "broadcast")
        out = self._empty(x.shape, x.dtype)
        return self._collective(Signature("broadcast", x.shape, dtype_name(x.dtype), None, root, algo), x, out, None, stream, out)

    def reduce(self, x, root: int = 0, op="sum", algo=None, stream=None):
        """The reduction at the root; None on the other ranks."""
        algo, stream = self._algo(algo, "reduce"), self._stream(stream, "reduce")
        x = self._array(x, "reduce")
        root = self._root(root, "reduce")
        redop = self._redop(op, "reduce")
        out = self._empty(x.shape, x.dtype)
        return self._collective(Signature("reduce", x.shape, dtype_name(x.dtype), redop.value, root, algo), x, out,
                                redop, stream, out if self.rank == root else None)

    def all_to_all(self, x, algo=None, stream=None):
        """Block j of x goes to rank j; received blocks concatenated in rank order."""
        algo, stream = self._algo(algo, "all_to_all"), self._stream(stream, "all_to_all")
        if self.size > MAX_REAL_ALLTOALL_RANKS:
            raise HcclError("E_PARA", f"{self.size} ranks are over the limit of {MAX_REAL_ALLTOALL_RANKS} for an AlltoAll "
                            "on real data (hccl_sim.communicator.MAX_REAL_ALLTOALL_RANKS); hccl_sim.simulate prices "
                            "it without payload", rank=self.rank, op="all_to_all")
        x = self._array(x, "all_to_all", min_ndim=1)
        self._divisible(x, "all_to_all")
        out = self._empty(x.shape, x.dtype)
        return self._collective(Signature("alltoall", x.shape, dtype_name(x.dtype), None, None, algo), x, out, None, stream, out)

    def barrier(self) -> None:
        self._collective(Signature("barrier", (), "uint8", None, None, None), None, None, None, None, None)

    # point to point ------------------------------------------------------------------------------
    def _peer(self, peer, opname, what):
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool) or not 0 <= peer < self.size:
            raise HcclError("E_PARA", f"{what} must be a rank in [0, {self.size}), got {peer!r}", rank=self.rank, op=opname)
        if peer == self.rank:
            raise HcclError("E_PARA", f"{what} is this rank itself", rank=self.rank, op=opname)
        return int(peer)

    def send(self, x, dst: int, tag: int = 0) -> None:
        x = self._array(x, "send")
        dst = self._peer(dst, "send", "dst")
        tag = self._tag(tag, "send")
        dev = self.device
        start = dev.clock
        msg = self._transport.post_view(self.rank, dst, ("p2p", tag), np.ascontiguousarray(x), meta=start)
        end = self._transport.wait_consumed(msg, self._transport.deadline(), "send")
        dev.clock = end + self.topology.notify_ns(dst, self.rank)
        self.last_op = OpRecord("send", "p2p", x.nbytes, x.size, dtype_name(x.dtype), start, dev.clock)

    def recv(self, src: int, tag: int = 0) -> np.ndarray:
        src = self._peer(src, "recv", "src")
        tag = self._tag(tag, "recv")
        start = self.device.clock
        msg = self._transport.take(src, self.rank, ("p2p", tag), self._transport.deadline(), "recv")
        data = np.array(msg.data, copy=True)
        ready = max(msg.meta, start) + self.topology.notify_ns(src, self.rank)
        end = ready + self.topology.route(src, self.rank).cost_ns(data.nbytes)
        msg.consumed(reply=end)
        self.device.clock = end
        self.last_op = OpRecord("recv", "p2p", data.nbytes, data.size, dtype_name(data.dtype), start, end)
        return data

    # the common path -------------------------------------------------------------------------------
    def _collective(self, sig: Signature, x, out, redop, stream, result):
        """Run a collective; with `stream`, it enters at the stream's time and returns a Work."""
        seq = self._seq
        self._seq += 1
        itemsize = x.dtype.itemsize if x is not None else 1
        dev = self.device
        queue = stream if stream is not None else dev.default_stream
        if queue.device is not dev:
            raise HcclError("E_PARA", "stream belongs to another device", rank=self.rank, op=COLLECTIVE_NAMES[sig.name])
        entry = max(queue.tail, dev.clock)
        plan, moved = self._group.rendezvous(self.rank, seq, sig, entry, itemsize, (x, out, redop))
        if not moved:
            self._move_data(plan, sig, x, out, redop)
        end = plan.exits[self.rank]
        queue.tail = end
        queue.tasks.append((COLLECTIVE_NAMES[sig.name], entry, end))
        count = 0 if x is None else x.size
        self.last_op = OpRecord(COLLECTIVE_NAMES[sig.name], plan.algo, plan.nbytes, count, sig.dtype, entry, end)
        if stream is not None:
            return Work(result, stream, end, self.last_op)
        dev.clock = max(dev.clock, end)
        return result

    def _move_data(self, plan, sig, x, out, redop):
        """Execute this rank's schedule over the transport (engines whose ranks run apart)."""
        rank, tr = self.rank, self._transport
        reduce_fn = reducer(redop) if redop is not None else None
        deadline = tr.deadline()
        opname = COLLECTIVE_NAMES[sig.name]
        if sig.name == "barrier":
            tr.register(rank, "input", _EMPTY)
            execute(program_rank_steps(plan.programs[0], self.size)[rank], rank, tr, COLLECTIVE_TAG, None, deadline, opname)
            return
        scratch = make_scratch(sig, plan, x, self.size)
        for (a, b), program in zip(plan.loops, plan.programs):
            for name, view in loop_views(sig, self.size, x, out, scratch, a, b).items():
                tr.register(rank, name, view)
            execute(program_rank_steps(program, self.size)[rank], rank, tr, COLLECTIVE_TAG, reduce_fn, deadline, opname)


def make_scratch(sig, plan, x, p):
    """The communicator-buffer area a schedule may use (ReduceScatter partials, AlltoAll bundles).

    Each loop has columns of its own, so workers sharing an op never race across loops."""
    if sig.name in ("reducescatter", "alltoall") and plan.loops:
        return np.empty((p, plan.loops[-1][1]), dtype=x.dtype)
    return None


def loop_views(sig, p, x, out, scratch, a, b) -> dict:
    """The named buffers one loop's schedule addresses: views of the user's arrays, rows = rank blocks."""
    xf, of = x.reshape(-1), out.reshape(-1)
    if sig.name not in algorithms.BLOCK_COLLECTIVES:
        return {"input": xf[a:b], "output": of[a:b]}
    if sig.name == "allgather":
        return {"input": xf[a:b].reshape(1, -1), "output": of.reshape(p, -1)[:, a:b]}
    if sig.name == "reducescatter":
        return {"input": xf.reshape(p, -1)[:, a:b], "output": of[a:b].reshape(1, -1), "scratch": scratch[:, a:b]}
    return {"input": xf.reshape(p, -1)[:, a:b], "output": of.reshape(p, -1)[:, a:b],     # alltoall
            "scratch": scratch[:, a:b]}


_EMPTY = np.empty(0, dtype=np.uint8)
