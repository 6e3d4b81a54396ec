"""The Communicator: what a rank's code calls (all_reduce, all_gather, ..., send, recv, barrier).

A collective call goes through three steps:
1. it checks its arguments locally;
2. it meets the other ranks at the group's rendezvous, which compares every rank's call and
   entry clock (a mismatch is an HcclError on every rank, never a hang) and yields the shared
   plan (algorithm, loops, programs, simulated exit clocks);
3. the group's `execute` moves the data, by one of the engine contract's two executors: the
   central data program (a share of the op's serial data program over every rank's buffers, for
   ranks that share memory) or the per-rank executor (this rank's own schedule over an hcomm
   Transport, for ranks that share none). Small ops on engines with an eager size carry their
   input with the call and need no exchange in step 3.
The communicator moves no bytes itself: engines differ only in the group they hand it (the engine
contract, comm/rank_group.py). Point-to-point calls (comm/p2p_calls.py) use the group's transport
directly, priced by the same cost model as collectives.
"""
from __future__ import annotations

import math
import numpy as np

from hcomm.exec.p2p import Endpoint
from topologies.errors import Cause, HcclError
from topologies.validate import is_integer

from .. import collectives as colls
from . import split as subcomm
from . import group
from .record import LoggedOp, OpRecord
from .fault_hooks import FaultHooks
from .p2p_calls import PointToPointOps
from .variable_calls import VariableSizeOps
from .rank_group import Call, RankBuffers

from ..faults.fault_plan import RankStalled, lost_fields
from ..plan.costs import effective_cost
from ..plan.faulted import NEVER_NS, LinkSetupFailed
from ..plan.planner import Signature
from ..npu.device import Device, DeviceArray, Stream, Work
from ..config.types import check_type, dtype_name, parse_reduce_op

COLLECTIVE_TAG = "coll"
_new = tuple.__new__         # a NamedTuple from a tuple of its fields, without keyword handling
MAX_TAG = 2**31 - 1          # point-to-point tags: non-negative 32-bit ints, as MPI_TAG_UB allows at least
# every barrier's signature: one object, so a group's caches keyed by it (peer_group's payload heads) hit
_BARRIER = Signature("barrier", (), "uint8", None, None, None)
_BARRIER_OP = colls.of("barrier").method


class Communicator(VariableSizeOps, PointToPointOps, FaultHooks):
    """One rank's handle on a group of ranks."""

    def __init__(self, rank: int, group, device: Device | None = None, keep_init_error: bool = False):
        self.rank = rank
        self.size = group.size
        self.topology = group.topo
        self.config = group.config
        self._group = group
        self._p2p = Endpoint(group.transport, rank, group.size)   # point to point's byte moves (hcomm)
        self.cost = effective_cost(group.topo, group.config)   # prices point-to-point ops like collectives
        self._seq = 0
        self.scope = ""                      # unique in the job: "" for the world, derived for split/shrink
        self.world_ranks = tuple(range(self.size))   # the job's rank of each of this communicator's ranks
        self._shrinks = 0
        self._aborted = False
        self._lost = None                    # (rank, ns, label) of a rank this communicator lost
        self._checked = {}                   # a call's arguments -> their checked form (see _call)
        # results smaller than this are plain host arrays, made here (comm/rank_group.py)
        self._plain_bytes = group.plain_result_bytes
        self._p2p_sent, self._p2p_received = {}, {}   # sends to each peer, receives from each peer, so far
        self.last_op: OpRecord | None = None
        # a list every op of this rank's is logged to (LoggedOp), shared with the communicators split
        # from this one; None: not kept (hccl_sim.testing sets it on the ranks of a test's runs)
        self.op_log: list | None = None
        self.runtime = None                  # the rank's Runtime, where an engine started one (engines.bootstrap)
        self.device = device if device is not None else Device(rank, group.topo)
        self._exchange = False               # a bootstrap exchange (comm.split's gathers) is in progress
        self._init_error = None
        # HCCL allocates the communicator's CCL buffer, 2 x HCCL_BUFFSIZE (in + out), from HBM.
        try:
            self.ccl_buffer = self.device.malloc(2 * self.config.buffsize_bytes, tag="ccl-buffer")
        except HcclError as exc:
            # `keep_init_error` (a communicator comm.split makes): its init exchange tells the other
            # members, who would otherwise wait for this rank in it (comm/split.py)
            if not keep_init_error or exc.code != "E_MEMORY":
                raise
            self.ccl_buffer, self._init_error = None, exc

    @property
    def data_plane(self) -> str | None:
        """The data plane this communicator's larger ops run on, by its engine's name for it (README,
        "Engines"): central or threads on local; shm, socket or object on ray; window or p2p on mpi
        (a sub-communicator: p2p); shm or peer for a torchrun script; peer for a sub-communicator
        on ray or torchrun (the per-rank executor over the job's transport)."""
        return self._group.data_plane

    @property
    def wait_timeout(self) -> float | None:
        """How long, in seconds, one of this communicator's waits may last (HCCL_EXEC_TIMEOUT, as
        its transport applies it); None: no limit."""
        return self._p2p.timeout_s

    @property
    def ranks_per_process(self) -> int:
        """How many ranks of the job are threads of this rank's process (1: a process per rank)."""
        return self._group.ranks_per_process

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
                raise HcclError("E_PARA", f"input is not an array: {exc}", rank=self.rank, op=opname,
                                cause=Cause.BAD_INPUT)
        try:
            dtype_name(x.dtype)
        except HcclError as exc:
            raise HcclError("E_PARA", exc.reason, rank=self.rank, op=opname, cause=Cause.BAD_INPUT)
        self._check_type(x.dtype, opname)
        if x.ndim < min_ndim:
            raise HcclError("E_PARA", f"input must have at least {min_ndim} dimension(s), got shape {x.shape}",
                            rank=self.rank, op=opname, cause=Cause.BAD_INPUT)
        return x

    def _check_type(self, dtype, opname: str, redop=None) -> None:
        """E_NOT_SUPPORT, HCCL's message, where this device takes no `dtype` for the op (type_rules)."""
        try:
            check_type(dtype, self.topology.device_model.data_types, "", redop)
        except HcclError as exc:
            raise HcclError(exc.code, exc.reason, rank=self.rank, op=opname, cause=Cause.BAD_INPUT) from None

    def _root(self, coll, root):
        """The call's root, checked as hccl_sim.simulate checks it (Collective.checked_root)."""
        try:
            return coll.checked_root(root, self.size)
        except HcclError as exc:
            raise HcclError("E_PARA", exc.reason, rank=self.rank, op=coll.method, cause=Cause.BAD_INPUT) from None

    def _redop(self, op, opname):
        try:
            return parse_reduce_op(op)
        except HcclError as exc:
            raise HcclError("E_PARA", exc.reason, rank=self.rank, op=opname, cause=Cause.BAD_INPUT)

    def _algo(self, algo, opname):
        # Checked before the rendezvous: signatures are compared (hashed) there, and a list
        # would fail as "unhashable" instead of naming the argument.
        if algo is not None and not isinstance(algo, str):
            raise HcclError("E_PARA", f"algo must be a string (an HCCL token such as 'ring' or an HCCL_ALGO "
                            f"string), got {algo!r} ({type(algo).__name__})", rank=self.rank, op=opname,
                            cause=Cause.BAD_INPUT)
        return algo

    def _tag(self, tag, opname):
        if not is_integer(tag) or not 0 <= tag <= MAX_TAG:
            raise HcclError("E_PARA", f"tag must be an integer in [0, {MAX_TAG}], got {tag!r} ({type(tag).__name__})",
                            rank=self.rank, op=opname, cause=Cause.BAD_INPUT)
        return int(tag)

    def _stream(self, stream, opname):
        if stream is not None and not isinstance(stream, Stream):
            raise HcclError("E_PARA", f"stream must be a Stream from comm.device.stream(), got {type(stream).__name__}",
                            rank=self.rank, op=opname, cause=Cause.BAD_INPUT)
        return stream

    # collectives ----------------------------------------------------------------------------------
    def _empty(self, shape, dtype):
        """A result array from the engine (which may keep results where peers can write them)."""
        try:
            return self._group.result_array(shape, dtype)
        except MemoryError:
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            raise HcclError("E_MEMORY", f"no host memory for the op's {nbytes} B result (shape {shape}, {dtype})",
                            rank=self.rank) from None

    def _out(self, out, shape, dtype, x, opname):
        """The user's result array for out=, checked; and whether it aliases the input (in place)."""
        target = out.data if isinstance(out, DeviceArray) else out
        if not isinstance(target, np.ndarray):
            raise HcclError("E_PARA", f"out must be a numpy array (or a device array), got {type(out).__name__}",
                            rank=self.rank, op=opname, cause=Cause.BAD_INPUT)
        if target.shape != tuple(shape) or target.dtype != dtype:
            raise HcclError("E_PARA", f"out must have the result's shape {tuple(shape)} and dtype {dtype}, got "
                            f"shape {target.shape} and dtype {target.dtype}", rank=self.rank, op=opname,
                            cause=Cause.BAD_INPUT)
        if not target.flags.writeable:
            raise HcclError("E_PARA", "out is read-only", rank=self.rank, op=opname, cause=Cause.BAD_INPUT)
        return target, bool(np.shares_memory(target, x))

    def _check_ranks_with_data(self, coll):
        if coll.max_ranks_with_data is not None and self.size > coll.max_ranks_with_data:
            raise HcclError("E_PARA", f"{self.size} ranks are over the limit of {coll.max_ranks_with_data} for "
                            f"{coll.method} on real data (collectives.{type(coll).__name__}.max_ranks_with_data); "
                            "hccl_sim.simulate prices it without payload", rank=self.rank, op=coll.method,
                            cause=Cause.BAD_INPUT)

    def _call(self, name, x, op=None, root=None, algo=None, stream=None, out=None):
        """Check one collective call locally, then run it (collectives.py says what each one is).

        A call repeating an earlier one's arguments (a training loop) reuses that call's checked
        form: the checks depend only on the name, shape, dtype, op, root and algo.

        `out`: the user's result array. The op runs into the engine's result array (peers may
        write there) and the result is copied into `out` once this rank's part is done: its input
        has then been read by every peer (zero-copy sends complete when consumed), so `out=x`
        (in place, HCCL's sendBuf == recvBuf) is safe. HCCL cannot retry an in-place op."""
        if group.active():                  # held until the group ends (comm.group())
            coll = colls.of(name)
            return group.hold_collective(self, coll.method, lambda: self._call(name, x, op, root, algo, stream, out),
                                         coll.group_volume(getattr(x, "nbytes", 0), self.size))
        data = x.data if isinstance(x, DeviceArray) else x
        # out=x (in place, torch's every op) repeats as the call without out= does, then copies
        inplace = out is x and out is not None and type(data) is np.ndarray and data.flags.writeable
        if type(data) is np.ndarray and (out is None or inplace):
            try:
                key = (name, data.shape, data.dtype, op, root, algo, inplace)
                checked = self._checked.get(key)
            except TypeError:               # an unhashable argument: the checks below name it
                key = checked = None
            if checked is not None:
                coll, redop, root, out_shape, sig, nbytes, eager = checked
                res = np.empty(out_shape, data.dtype) if nbytes < self._plain_bytes else self._empty(out_shape, data.dtype)
                result = coll.result(data if inplace else res, self.rank, root)
                if eager and stream is None and self.config.faults is None and not self._aborted \
                        and self._lost is None:
                    done = self._eager(coll.method, sig, data, res, result)
                else:
                    if stream is not None:
                        self._stream(stream, coll.method)
                    done = self._collective(sig, data, res, redop, stream, result)
                if inplace and coll.result(res, self.rank, root) is not None:
                    np.copyto(data, res)
                return done
        else:
            key = None
        coll = colls.of(name)
        algo, stream = self._algo(algo, coll.method), self._stream(stream, coll.method)
        self._check_ranks_with_data(coll)
        x = self._array(x, coll.method)
        problem = coll.check_input(x.shape, self.size)
        if problem:
            raise HcclError("E_PARA", problem, rank=self.rank, op=coll.method, cause=Cause.BAD_INPUT)
        redop = self._redop(op, coll.method) if coll.reducing else None
        if redop is not None:
            self._check_type(x.dtype, coll.method, redop)
        root = self._root(coll, root)
        out_shape = coll.output_shape(x.shape, self.size)
        target, inplace = (None, False) if out is None else self._out(out, out_shape, x.dtype, x, coll.method)
        sig = Signature(name, x.shape, dtype_name(x.dtype), None if redop is None else redop.value, root, algo,
                        inplace)
        if target is not None and not inplace and coll.result(target, self.rank, root) is not None \
                and self._group.writes_in_place(target):
            # peers can write `out` where it is (a device array in shared memory): no copy out
            return self._collective(sig, x, target, redop, stream, coll.result(target, self.rank, root))
        res = self._empty(out_shape, x.dtype)
        if key is not None:
            if len(self._checked) >= 256:
                self._checked.clear()
            self._checked[key] = (coll, redop, root, out_shape, sig, math.prod(out_shape) * x.dtype.itemsize,
                                  coll.eager and x.nbytes <= self._group.eager_bytes)
        if target is None:
            return self._collective(sig, x, res, redop, stream, coll.result(res, self.rank, root))
        done = self._collective(sig, x, res, redop, stream, coll.result(target, self.rank, root))
        if coll.result(res, self.rank, root) is not None:
            np.copyto(target, res)
        return done

    def all_reduce(self, x, op="sum", algo=None, stream=None, out=None):
        return self._call("allreduce", x, op=op, algo=algo, stream=stream, out=out)

    def all_gather(self, x, algo=None, stream=None, out=None):
        """Inputs of every rank concatenated along axis 0 in rank order."""
        return self._call("allgather", x, algo=algo, stream=stream, out=out)

    def reduce_scatter(self, x, op="sum", algo=None, stream=None, out=None):
        """Block `rank` of the reduction of every rank's x (x.shape[0] divisible by size)."""
        return self._call("reducescatter", x, op=op, algo=algo, stream=stream, out=out)

    def broadcast(self, x, root: int = 0, algo=None, stream=None, out=None):
        """The root's x on every rank (x gives the shape and dtype elsewhere)."""
        return self._call("broadcast", x, root=root, algo=algo, stream=stream, out=out)

    def reduce(self, x, root: int = 0, op="sum", algo=None, stream=None, out=None):
        """The reduction at the root; None on the other ranks."""
        return self._call("reduce", x, op=op, root=root, algo=algo, stream=stream, out=out)

    def all_to_all(self, x, algo=None, stream=None, out=None):
        """Block j of x goes to rank j; received blocks concatenated in rank order."""
        return self._call("alltoall", x, algo=algo, stream=stream, out=out)

    def scatter(self, x, root: int = 0, algo=None, stream=None, out=None):
        """HcclScatter: block j of the root's x (x.shape[0] divisible by the size) on rank j; x
        gives the shape and dtype elsewhere."""
        return self._call("scatter", x, root=root, algo=algo, stream=stream, out=out)

    def group(self):
        """`with comm.group():` HcclGroupStart / HcclGroupEnd: the sends, receives and collectives
        issued inside it (on any communicator) are launched when the outermost group ends, each
        call returning a Pending for its result (hccl_sim.comm.group)."""
        return group.GroupedLaunch(self)

    def barrier(self, stream=None):
        """HcclBarrier; with `stream`, a Work (it enters at the stream's time, as a collective does)."""
        if group.active():
            group.refuse(self, "barrier", "HCCL's group launches no barrier")
        if stream is None and self.config.faults is None and not self._aborted and self._lost is None:
            return self._eager(_BARRIER_OP, _BARRIER, None, None, None)
        return self._collective(_BARRIER, None, None, None, self._stream(stream, "barrier"), None)

    # communicators from communicators -----------------------------------------------------------------
    def split(self, color, key: int = 0, env=None):
        """The communicator of the ranks that gave the same `color` (None: opt out, get None), ordered
        by (key, rank); every rank calls it (ncclCommSplit; hccl_sim.comm.split). `env`: HCCL_*
        variables the new communicator runs with instead of this one's (HcclCreateSubCommConfig's
        config: HCCL_BUFFSIZE, HCCL_ALGO, HCCL_EXEC_TIMEOUT, ...)."""
        self._check_usable("split")
        if group.active():
            group.refuse(self, "split", "communicator management is not grouped with communication")
        return subcomm.split(self, color, key, env)

    def shrink(self, exclude=None, env=None):
        """The survivors' communicator: every rank but `exclude` and the ranks this communicator
        lost, renumbered in rank order; called by the survivors only (ncclCommShrink)."""
        if group.active():
            group.refuse(self, "shrink", "communicator management is not grouped with communication")
        return subcomm.shrink(self, exclude, env)

    def abort(self) -> None:
        """Fail every pending and later op of this communicator on every rank (ncclCommAbort); its
        ranks may go on with comm.shrink()."""
        if not self._aborted:
            self._aborted = True
            self._group.abort(self.rank, f"rank {self.rank} aborted the communicator (comm.abort())")

    @property
    def lost_ranks(self) -> frozenset:
        """Ranks of this communicator known dead (a crash the fault plan put in one of its ops)."""
        return frozenset() if self._lost is None else frozenset({self._lost[0]})

    def _check_usable(self, opname):
        if self._aborted:
            raise HcclError("E_PARA", "this communicator was aborted on this rank (comm.abort()): make a new one "
                            "with comm.shrink()", rank=self.rank, op=opname)

    # the common path -------------------------------------------------------------------------------
    def _collective(self, sig: Signature, x, out, redop, stream, result):
        """Run a collective; with `stream`, it enters at the stream's time and returns a Work.

        The engine contract (comm/rank_group.py): a rendezvous that yields the plan, then the
        execution that moves this rank's data. A loop of small ops runs this path thousands of
        times a second, so it builds its tuples directly (tuple.__new__ skips NamedTuple's
        keyword handling, half the cost) and reads nothing twice."""
        seq = self._seq
        self._seq = seq + 1
        dev = self.device
        queue = dev.default_stream if stream is None else stream
        opname = colls.of(sig.name).method
        if queue.device is not dev:
            raise HcclError("E_PARA", "stream belongs to another device", rank=self.rank, op=opname,
                            cause=Cause.BAD_INPUT)
        if self._aborted:
            self._check_usable(opname)
        if self._lost is not None:
            raise HcclError("E_TIMEOUT", f"rank {self._lost[0]} of this communicator was lost at "
                            f"{self._lost[1] / 1e9:.6f} s ({self._lost[2]}): no collective can complete on it",
                            rank=self.rank, op=opname, **lost_fields(self._lost))
        entry = queue.tail if queue.tail > dev.clock else dev.clock
        faults = self.config.faults
        stalled = None
        if faults is not None:
            entry += faults.straggle_ns(self.rank, seq)     # a straggler enters late
            if faults.stalls:
                stalled = faults.stall_of(self.rank, seq, entry)
        group = self._group
        if x is None:
            itemsize, eager = 1, None
        else:
            itemsize = x.dtype.itemsize
            # inputs of one shape travel with the calls (each rank then computes its own result)
            eager = x if x.nbytes <= group.eager_bytes and colls.of(sig.name).eager else None
        progress = group.fault_progress if faults is not None else None
        if progress is not None and progress.carries:
            sent = progress.sent_by(self.rank, self._p2p_sent, self._setup_word(seq, entry) if progress.pressures else 0)
        else:
            sent = ()
        try:
            # a stalled rank never enters: its peers' plan finds them waiting past HCCL_EXEC_TIMEOUT
            plan = group.rendezvous(self.rank, _new(Call, (seq, sig, NEVER_NS if stalled else entry, itemsize,
                                                           eager, sent)))
        except HcclError as exc:
            if stalled:
                raise RankStalled(self.rank, entry, opname) from None
            if isinstance(exc, LinkSetupFailed):    # an hbm_pressure starved the link setup: this rank's side
                mine = exc.for_rank(self.rank, entry)
                dev.clock = max(dev.clock, mine.time_ns)
                raise mine from None
            if exc.time_ns is not None:     # a failure the plan priced (an error CQE): this rank's
                dev.clock = max(dev.clock, entry, exc.time_ns)  # clock moves on to when it was found
            raise
        if stalled:                         # alone in its communicator: nobody waits for it
            raise RankStalled(self.rank, entry, opname)
        buffers = _new(RankBuffers, (x, out, None))
        if faults is not None and faults.crashes:
            self._meet_crash(faults, plan, seq, opname, buffers, redop)
        group.execute(self.rank, seq, plan.data, buffers)
        end = self._done(opname, plan, seq, sig, x, queue, entry, plan.exit_of(self.rank), stream is None)
        return result if stream is None else Work(result, stream, end, self.last_op)

    def _eager(self, opname, sig, x, out, result):
        """A repeated call whose input travels with it (_call's checked form says so), or a
        barrier (`x` None); no stream, no fault plan: the group's eager_op, which runs both phases
        in one, on a lean path where the group has one (engines/eager_lane.py)."""
        seq = self._seq
        self._seq = seq + 1
        dev = self.device
        queue = dev.default_stream
        entry = queue.tail if queue.tail > dev.clock else dev.clock
        try:
            plan, end = self._group.eager_op(self.rank, _new(Call, (seq, sig, entry, 1 if x is None else x.dtype.itemsize,
                                                                    x, ())), out)
        except HcclError as exc:
            if exc.time_ns is not None:     # a late peer's E_TIMEOUT: this rank's clock moves on to it
                dev.clock = max(dev.clock, entry, exc.time_ns)
            raise
        self._done(opname, plan, seq, sig, x, queue, entry, end, True)
        return result

    def _done(self, opname, plan, seq, sig, x, queue, entry, end, host: bool) -> int:
        """Record a finished op: its stream's tail and task, last_op, the op log, and with `host`
        (no stream given) the host clock; returns `end`."""
        if host and end > self.device.clock:
            self.device.clock = end
        queue.tail = end
        queue.tasks.append((opname, entry, end))
        self.last_op = _new(OpRecord, (opname, plan.algo, plan.nbytes, 0 if x is None else x.size, sig.dtype, entry,
                                       end, plan.retries, plan.notes))
        if self.op_log is not None:
            self.op_log.append(LoggedOp(self.scope, self.world_ranks, seq, self.last_op))
        return end
