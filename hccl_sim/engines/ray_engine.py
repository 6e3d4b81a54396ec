"""The Ray engine: one Ray actor per rank, each owning its simulated NPU, runtime and communicator.

Control plane: a hub actor of its own runs the hub; every rank keeps one socket to it and sends only
small messages (a collective's signature, entry clock and buffer names; done; p2p envelopes).
Every wait has a deadline (HCCL_EXEC_TIMEOUT), a rank that raises or returns early is reported
to the others, and a rank whose process dies closes its socket, which aborts the rest.

Data plane: a rank registers its buffers in shared memory (hcomm.shm) and gives their names at
the rendezvous; every rank then runs its 1/p share of the op's data program (hccl_sim.dataplane)
straight on all ranks' shared buffers, reading and reducing in place, and the hub releases the
ranks when every share is done: two hand-offs per op, no pickling. Ops of a few KiB travel inline
through the hub instead, which moves them itself. Results come from a pool of shared segments, a
segment being reused only once user code has dropped its array, so no rank copies results out.
Ranks on different hosts cannot share memory: there (data_plane="object", the default then)
every rank puts its input in Ray's object store and hands the reference to the hub actor by a
Ray call, the hub runs the op, and every rank fetches its result by another call, so Ray moves
the bytes between hosts. data_plane="socket" sends them over the hub's connections instead.

Simulated time comes from the same planner as every engine, so it equals the local engine's.
"""
from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection

import numpy as np

from hcomm import shm
from hcomm.transports.inprocess import STALL_S
from topologies.errors import HcclError

from ..communicator import Communicator
from ..dataplane import move_share
from ..device import Runtime
from .. import collectives as colls
from ..planner import check_signatures, make_plan, op_loops
from ..types import ReduceOp

INLINE_BYTES = 64 << 10        # ops this small travel through the hub
_POLL_S = 0.2


def _poller(conn):
    """A poll object registered once (Connection.poll builds a new selector on every call)."""
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return poller


def _recv(conn, deadline, rank, what, poller=None):
    """Receive one message before the deadline (None = no deadline)."""
    poller = poller or _poller(conn)
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise HcclError("E_TIMEOUT", f"no reply from the hub while waiting for {what} (HCCL_EXEC_TIMEOUT)", rank=rank)
        try:
            wait_ms = int(1000 * (_POLL_S if remaining is None else min(_POLL_S, remaining))) + 1
            if poller.poll(wait_ms):
                return conn.recv()
        except (EOFError, OSError):
            raise HcclError("E_REMOTE", f"lost the control connection while waiting for {what}", rank=rank)


# ---- the hub (control plane), a thread in rank 0's actor -------------------------------------------

class Hub(threading.Thread):
    def __init__(self, topo, config, size: int, accept_timeout: float):
        super().__init__(daemon=True, name="hccl-sim-hub")
        self.topo, self.config, self.size = topo, config, size
        self.server = socket.create_server(("0.0.0.0", 0))
        self.server.settimeout(accept_timeout)
        self.address = (_node_ip(), self.server.getsockname()[1])
        self.conns = {}
        self.colls = {}
        self.exited = set()
        self.failure = None
        self.p2p_sends, self.p2p_recvs = {}, {}
        self.plans = {}                 # (signature, itemsize, relative entry clocks) -> plan
        self.waiting = {}               # rank -> what it waits for at the hub (deadlock detection)
        self.last_progress = time.monotonic()
        self.objects = threading.Condition()
        self.deposits, self.results = {}, {}    # object data plane: (seq, rank) -> array

    def run(self):
        try:
            while len(self.conns) < self.size:
                sock, _ = self.server.accept()
                conn = Connection(sock.detach())
                if not conn.poll(self.server.gettimeout()):       # a peer that connects but never says hello
                    raise socket.timeout("no hello")
                rank = conn.recv()[1]
                self.conns[rank] = conn
        except (socket.timeout, OSError, EOFError):
            self._abort_all(f"only {len(self.conns)} of {self.size} ranks connected in time")
            return
        finally:
            self.server.close()
        by_fd = {conn.fileno(): (rank, conn) for rank, conn in self.conns.items()}
        poller = select.poll()
        for fd in by_fd:
            poller.register(fd, select.POLLIN)
        live = set(by_fd)
        while live:
            ready = poller.poll(int(_POLL_S * 1000))
            if not ready:
                self._check_deadlock()
            for fd, _ in ready:
                if fd not in live:
                    continue
                rank, conn = by_fd[fd]
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    live.discard(fd)
                    poller.unregister(fd)
                    if rank not in self.exited:
                        self.exited.add(rank)
                        self._fail(rank, "its process died (control connection closed)")
                    continue
                self.last_progress = time.monotonic()
                try:
                    self._handle(rank, msg)
                except Exception as exc:   # noqa: BLE001 - reported to every rank
                    self._fail(rank, f"hub error: {type(exc).__name__}: {exc}")
                if msg[0] == "exit":
                    live.discard(fd)
                    poller.unregister(fd)

    def _check_deadlock(self):
        """Every rank that has not returned waits here and nothing moved for STALL_S: tell them."""
        live = self.size - len(self.exited)
        if not self.waiting or len(self.waiting) < live or time.monotonic() - self.last_progress < STALL_S:
            return
        who = "; ".join(f"rank {r} waits for {w}" for r, w in sorted(self.waiting.items())[:8])
        for rank in list(self.waiting):
            self._send(rank, ("error", "E_TIMEOUT", f"deadlock: every rank is waiting and none can proceed ({who})"))

    def _send(self, rank, msg):
        self.waiting.pop(rank, None)
        conn = self.conns.get(rank)
        if conn is not None and rank not in self.exited:
            try:
                conn.send(msg)
            except (OSError, EOFError):
                pass

    def _abort_all(self, reason):
        for rank in list(self.conns):
            self._send(rank, ("abort", "E_REMOTE", reason))

    def _fail(self, rank, reason):
        if self.failure is None:
            self.failure = (rank, reason)
        self._abort_all(f"rank {rank} failed: {reason}")

    def _handle(self, rank, msg):
        kind = msg[0]
        if kind == "coll":
            _, seq = msg[:2]
            slot = self.colls.setdefault(seq, {"msgs": {}, "done": set()})
            slot["msgs"][rank] = msg
            self.waiting[rank] = f"{colls.of(msg[2].name).method} (collective #{seq})"
            if self.failure is not None:
                self._send(rank, ("abort", "E_REMOTE", f"rank {self.failure[0]} failed: {self.failure[1]}"))
            elif len(slot["msgs"]) == self.size:
                self._start(seq, slot)
            else:
                self._check_exited(seq, slot)
        elif kind == "done":
            self.waiting[rank] = f"the other ranks' shares of collective #{msg[1]}"
            slot = self.colls[msg[1]]
            slot["done"].add(rank)
            if len(slot["done"]) == self.size:
                for r in range(self.size):
                    self._send(r, ("release", msg[1]))
                del self.colls[msg[1]]
        elif kind == "fail":
            self._fail(rank, msg[1])
        elif kind == "exit":
            self.exited.add(rank)
            for seq, slot in list(self.colls.items()):
                self._check_exited(seq, slot)
            self._check_p2p_exit(rank)
        elif kind in ("send", "recv", "consumed"):
            self._p2p(rank, msg)

    def _check_exited(self, seq, slot):
        gone = [r for r in self.exited if r not in slot["msgs"]]
        if gone:
            sig = next(iter(slot["msgs"].values()))[2]
            opname = colls.of(sig.name).method
            for r in slot["msgs"]:
                self._send(r, ("error", "E_PARA", f"rank {gone[0]} returned without calling {opname} (collective "
                                                  f"#{seq}): ranks made different sequences of collective calls"))

    def _start(self, seq, slot):
        msgs = [slot["msgs"][r] for r in range(self.size)]
        sigs = [m[2] for m in msgs]
        problem = check_signatures(sigs)
        if problem:
            for r in range(self.size):
                self._send(r, ("error", "E_PARA", problem))
            del self.colls[seq]
            return
        clocks = [m[3] for m in msgs]
        if msgs[0][6][0] == "object":
            self._start_object(seq, sigs[0], msgs, clocks)
            return
        if msgs[0][6][0] == "inline":
            sig, itemsize, redop = sigs[0], msgs[0][4], msgs[0][5]
            base = min(clocks)
            key = (sig, itemsize, tuple(c - base for c in clocks))
            plan = self.plans.get(key)
            if plan is None:
                if len(self.plans) > 1024:
                    self.plans.clear()
                plan = self.plans[key] = make_plan(sig, self.topo, self.config, [c - base for c in clocks], itemsize)
            p = self.size
            buffers = []
            for m in msgs:
                raw = m[6][1]
                if raw is None:
                    buffers.append((None, None, None))
                    continue
                data, dt, shape, out_shape = raw
                x = np.frombuffer(data, dtype=dt).reshape(shape)
                buffers.append((x, np.empty(out_shape, dtype=dt), plan.collective.scratch(p, plan.loops, x.dtype)))
            move_share(plan, buffers, None if redop is None else ReduceOp(redop))
            info = (plan.algo, plan.nbytes, [base + e for e in plan.exits])
            for r in range(p):
                out = buffers[r][1]
                self._send(r, ("result", seq, info, None if out is None else out.tobytes()))
            del self.colls[seq]
        else:
            descs = [m[6][1] for m in msgs]
            for r in range(self.size):
                self._send(r, ("go", seq, clocks, descs))

    def deposit(self, seq, rank, refs):
        """A rank's input for collective #seq, as a Ray object (called through the hub actor)."""
        import ray
        value = ray.get(refs[0])
        with self.objects:
            self.deposits[(seq, rank)] = value
            self.objects.notify_all()

    def fetch(self, seq, rank):
        with self.objects:
            return self.results.pop((seq, rank))

    def _start_object(self, seq, sig, msgs, clocks):
        """Ranks that share no memory: inputs arrive through Ray's object store, results leave by it."""
        p = self.size
        deadline = None if not self.config.wait_timeout_s else time.monotonic() + self.config.wait_timeout_s
        with self.objects:
            while not all((seq, r) in self.deposits for r in range(p)):
                if deadline is not None and time.monotonic() > deadline:
                    for r in range(p):
                        self._send(r, ("error", "E_TIMEOUT", f"inputs of collective #{seq} did not arrive in time"))
                    return
                self.objects.wait(_POLL_S)
            inputs = [self.deposits.pop((seq, r)) for r in range(p)]
        itemsize, redop = msgs[0][4], msgs[0][5]
        plan = make_plan(sig, self.topo, self.config, clocks, itemsize)
        buffers = []
        for x, m in zip(inputs, msgs):
            out = None if x is None else np.empty(m[6][1], dtype=x.dtype)
            buffers.append((x, out, None if x is None else plan.collective.scratch(p, plan.loops, x.dtype)))
        move_share(plan, buffers, None if redop is None else ReduceOp(redop))
        with self.objects:
            for r in range(p):
                self.results[(seq, r)] = buffers[r][1]
        info = (plan.algo, plan.nbytes, plan.exits)
        for r in range(p):
            self._send(r, ("result", seq, info, None))
        del self.colls[seq]

    # point to point, relayed ------------------------------------------------------------------------
    def _p2p(self, rank, msg):
        kind = msg[0]
        if kind == "send":
            _, dst, tag, data, clock = msg
            key = (rank, dst, tag)
            self.waiting[rank] = f"rank {dst} to take its data (send)"
            waiting = self.p2p_recvs.get(key)
            if waiting:
                waiting.pop(0)
                self._send(dst, ("data", rank, tag, data, clock))
            else:
                self.p2p_sends.setdefault(key, []).append((data, clock))
        elif kind == "recv":
            _, src, tag = msg
            key = (src, rank, tag)
            self.waiting[rank] = f"data from rank {src} (recv)"
            queued = self.p2p_sends.get(key)
            if queued:
                data, clock = queued.pop(0)
                self._send(rank, ("data", src, tag, data, clock))
            elif src in self.exited:
                self._send(rank, ("error", "E_PARA", f"rank {src} returned without sending what this rank waits "
                                                     f"for (tag {tag!r})"))
            else:
                self.p2p_recvs.setdefault(key, []).append(rank)
        else:   # consumed
            _, src, tag, end = msg
            self._send(src, ("sent", rank, tag, end))

    def _check_p2p_exit(self, rank):
        for (src, dst, tag), waiters in self.p2p_recvs.items():
            if src == rank and waiters:
                self._send(dst, ("error", "E_PARA", f"rank {src} returned without sending what this rank waits for "
                                                    f"(tag {tag!r})"))


def _node_ip():
    try:
        import ray
        return ray.util.get_node_ip_address()
    except Exception:   # noqa: BLE001 - outside Ray
        return "127.0.0.1"


# ---- a rank's side ---------------------------------------------------------------------------------

class _Message:
    __slots__ = ("data", "meta", "_group", "_src", "_tag")

    def __init__(self, data, meta, group, src, tag):
        self.data, self.meta, self._group, self._src, self._tag = data, meta, group, src, tag

    def consumed(self, reply=None):
        self._group.conn.send(("consumed", self._src, self._tag, reply))


class _HubResult:
    """What the hub reports for an op it moved itself (inline and object planes)."""
    __slots__ = ("algo", "nbytes", "exits")

    def __init__(self, algo, nbytes, exits):
        self.algo, self.nbytes, self.exits = algo, nbytes, exits


class _FusedPlan:
    """A plan the hub completes during the data exchange: algo, nbytes and exits once executed."""
    __slots__ = ("call", "algo", "nbytes", "exits")

    def __init__(self, call):
        self.call = call
        self.algo = self.nbytes = self.exits = None

    def complete(self, plan):
        self.algo, self.nbytes, self.exits = plan.algo, plan.nbytes, plan.exits


class RemoteGroup:
    """What a communicator needs from its engine, over the hub and shared memory."""

    def __init__(self, rank, topo, config, hub_address, owned, attached, result_pool=None, data_plane="shm",
                 hub_actor=None):
        self.rank, self.topo, self.config, self.size = rank, topo, config, topo.num_ranks
        self.data_plane, self.hub_actor = data_plane, hub_actor
        self.result_pool = {} if result_pool is None else result_pool
        self.owned, self.attached = owned, attached
        sock = socket.create_connection(hub_address, timeout=config.connect_timeout_s)
        sock.settimeout(None)
        self.conn = Connection(sock.detach())
        self.conn.send(("hello", rank))
        self._poller = _poller(self.conn)
        self.transport = self           # point to point goes through the hub too
        self._shared = {}               # id(array) -> segment name, for arrays peers can map

    def share(self, name, arr):
        self._shared[id(arr)] = (name, weakref.ref(arr))
        return arr

    def result_array(self, shape, dtype):
        """Results live in shared segments from a pool: peers write them in place (no copy out),
        and a segment is reused only when user code no longer holds its array (or a view of it)."""
        dtype = np.dtype(dtype)
        if self.data_plane != "shm" or int(np.prod(shape, dtype=np.int64)) * dtype.itemsize <= INLINE_BYTES // 2:
            return np.empty(shape, dtype=dtype)   # small ops travel inline: nothing to share
        key = (tuple(shape), dtype.str)
        pool = self.result_pool.setdefault(key, [])
        for entry in pool:
            if sys.getrefcount(entry[1]) <= 2:     # only the pool's tuple and getrefcount's argument
                return entry[1]
        name, arr = shm.PrivateSegment.array(self.owned.session, self.rank, "result", shape, dtype)
        pool.append((name, arr))
        return self.share(name, arr)

    def _segment_of(self, arr):
        got = self._shared.get(id(arr))
        return got[0] if got is not None and got[1]() is arr else None

    def deadline(self):
        return None if not self.config.wait_timeout_s else time.monotonic() + self.config.wait_timeout_s

    def _reply(self, what, expected):
        msg = _recv(self.conn, self.deadline(), self.rank, what, self._poller)
        if msg[0] in ("abort", "error"):
            raise HcclError(msg[1], msg[2], rank=self.rank)
        if msg[0] not in expected:
            raise HcclError("E_INTERNAL", f"unexpected control message {msg[0]!r} while waiting for {what}",
                            rank=self.rank)
        return msg

    def rendezvous(self, rank, call):
        """The hub still fuses the rendezvous with the data exchange (one round trip per op); the
        plan is therefore completed by `execute`. The shared-memory control plane replaces this."""
        return _FusedPlan(call)

    def execute(self, rank, seq, pending, buffers, redop):
        call = pending.call
        plan = self._exchange(rank, seq, call.signature, call.clock, call.itemsize, buffers.input, buffers.output,
                              redop)
        pending.complete(plan)

    def _exchange(self, rank, seq, sig, clock, itemsize, x, out, redop):
        opname = colls.of(sig.name).method
        nbytes = 0 if x is None else x.nbytes + out.nbytes
        red = None if redop is None else redop.value
        if self.data_plane == "object" and nbytes > INLINE_BYTES:
            import ray
            # the ref travels through a Ray call, so Ray tracks it and moves the bytes between hosts
            ray.get(self.hub_actor.deposit.remote(seq, rank, [ray.put(np.ascontiguousarray(x))]),
                    timeout=self.config.wait_timeout_s or None)
            self.conn.send(("coll", seq, sig, clock, itemsize, red, ("object", out.shape)))
            msg = self._reply(opname, ("result",))
            algo, total, exits = msg[2]
            np.copyto(out, ray.get(self.hub_actor.fetch.remote(seq, rank), timeout=self.config.wait_timeout_s or None))
            return _HubResult(algo, total, exits)
        if nbytes <= INLINE_BYTES or self.data_plane == "socket":
            # small ops, and ranks that share no memory: the bytes travel with the control messages
            raw = None if x is None else (np.ascontiguousarray(x).tobytes(), x.dtype.str, x.shape, out.shape)
            self.conn.send(("coll", seq, sig, clock, itemsize, red, ("inline", raw)))
            msg = self._reply(opname, ("result",))
            algo, total, exits = msg[2]
            if out is not None:
                out.reshape(-1).view(np.uint8)[:] = np.frombuffer(msg[3], dtype=np.uint8)
            return _HubResult(algo, total, exits)
        p = self.size
        in_name = self._segment_of(x)
        if in_name is None:       # a host array: register it by copying into the CCL input segment
            in_name, xin = self.owned.array("input", x.shape, x.dtype)
            np.copyto(xin, x)
        out_name = self._segment_of(out)
        oview = None
        if out_name is None:
            out_name, oview = self.owned.array("output", out.shape, out.dtype)
        sc_name, sc_shape = None, None
        sc_shape = colls.of(sig.name).scratch_shape(p, op_loops(sig, p, itemsize, self.config))
        if sc_shape is not None:
            sc_name, _ = self.owned.array("scratch", sc_shape, x.dtype)
        desc = (in_name, x.shape, out_name, out.shape, sc_name, sc_shape, x.dtype.str)
        self.conn.send(("coll", seq, sig, clock, itemsize, red, ("shm", desc)))
        msg = self._reply(opname, ("go",))
        clocks, descs = msg[2], msg[3]
        plan = make_plan(sig, self.topo, self.config, clocks, itemsize)
        buffers = []
        for j, (iname, ishape, oname, oshape, sname, sshape, dt) in enumerate(descs):
            buffers.append((self.attached.array(iname, ishape, dt), self.attached.array(oname, oshape, dt),
                            None if sname is None else self.attached.array(sname, sshape, dt)))
        move_share(plan, buffers, redop, rank, p)
        self.conn.send(("done", seq))
        self._reply(opname, ("release",))
        if oview is not None:
            np.copyto(out, oview)
        # mappings of segments that are gone (replaced or freed device arrays) are dropped; the
        # persistent ones stay mapped, so their pages fault in once
        live = {name for d in descs for name in (d[0], d[2], d[4]) if name}
        self.attached.forget(keep=live | self.attached.recent)
        self.attached.recent = live
        return plan

    # the transport interface the communicator's send/recv use
    def post_view(self, src, dst, tag, view, meta=None):
        self.conn.send(("send", dst, tag, np.array(view, copy=True), meta))
        return (dst, tag)

    def wait_consumed(self, msg, deadline=None, op=None):
        return self._reply(op or "send", ("sent",))[3]

    def take(self, src, dst, tag, deadline=None, op=None):
        self.conn.send(("recv", src, tag))
        msg = self._reply(op or "recv", ("data",))
        return _Message(msg[3], msg[4], self, src, tag)

    def close(self, failure=None):
        try:
            self.conn.send(("fail", failure) if failure else ("exit",))
            if failure:
                self.conn.send(("exit",))
        except (OSError, EOFError):
            pass
        finally:
            self.conn.close()


def _rank_actor_class():
    import ray

    @ray.remote(num_cpus=0)
    class RankActor:
        """One rank: its runtime, device (HBM, streams) and shared-memory segments live across runs."""

        def __init__(self, rank, topo, config, session):
            self.rank, self.topo, self.config, self.session = rank, topo, config, session
            self.runtime = Runtime(rank, topo).init()
            self.device = self.runtime.set_device(topo.device_of[rank])

            def storage(shape, dtype):
                name, arr = shm.PrivateSegment.array(session, rank, "hbm", shape, dtype)
                self._device_arrays[id(arr)] = (name, weakref.ref(arr))
                return arr
            self._device_arrays = {}
            self.device.storage = storage
            self.result_pool = {}
            self.owned = shm.OwnedSegments(session, rank)
            self.attached = shm.AttachedSegments()

        def run(self, fn, args, kwargs, hub_address, data_plane="shm", hub_actor=None):
            group = None
            self.device.reset_timeline()
            try:
                group = RemoteGroup(self.rank, self.topo, self.config, hub_address, self.owned, self.attached,
                                    self.result_pool, data_plane, hub_actor)
                group._shared.update(self._device_arrays)
                for entries in self.result_pool.values():
                    for name, arr in entries:
                        group.share(name, arr)
                comm = Communicator(self.rank, group, self.device)
                comm.runtime = self.runtime
                try:
                    result = fn(comm, *args, **(kwargs or {}))
                finally:
                    self.device.free(comm.ccl_buffer)
            except BaseException as exc:   # noqa: BLE001 - reported to the driver and the other ranks
                if group is not None:
                    group.close(f"{type(exc).__name__}: {exc}")
                if isinstance(exc, HcclError):
                    return ("error", self.rank, exc.code, exc.reason, exc.op, "")
                return ("error", self.rank, None, str(exc), type(exc).__name__, traceback.format_exc(limit=8))
            group.close()
            return ("ok", self.rank, result)

        def info(self):
            import resource
            return {"pid": os.getpid(), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    "node": _node_ip()}

        def close(self):
            self.result_pool.clear()        # their finalizers unlink the segments
            self.owned.close()
            self.attached.close()
            leaks = self.runtime.finalize() if self.runtime.state == "ready" else []
            return leaks

    @ray.remote(num_cpus=0, max_concurrency=64)
    class HubActor:
        """The control-plane hub, in a process of its own so no rank's work delays it; its methods
        also carry the object data plane's deposits and fetches."""

        def __init__(self, topo, config):
            self.topo, self.config = topo, config
            self.hub = None

        def start_hub(self, size, accept_timeout):
            self.hub = Hub(self.topo, self.config, size, accept_timeout)
            self.hub.start()
            return self.hub.address

        def deposit(self, seq, rank, refs):
            return self.hub.deposit(seq, rank, refs)

        def fetch(self, seq, rank):
            return self.hub.fetch(seq, rank)

    return RankActor, HubActor


class RayCluster:
    """Actors for every rank of a topology, kept across runs."""

    def __init__(self, topo, config, address: str | None = None, data_plane: str | None = None):
        import ray
        if data_plane not in (None, "shm", "object", "socket"):
            raise HcclError("E_PARA", f"data_plane {data_plane!r}: expected shm, object or socket")
        self.topo, self.config = topo, config
        shm.sweep_orphans()             # segments of drivers that died on this host
        self.session = shm.new_session()
        self._started_ray = False
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS")
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
                ray.init(include_dashboard=False, log_to_driver=False)
                self._started_ray = True
        self._ray = ray
        actor_cls, hub_cls = _rank_actor_class()
        topo_ref = ray.put(topo)
        self.actors = [actor_cls.remote(r, topo_ref, config, self.session) for r in range(topo.num_ranks)]
        self.hub_actor = hub_cls.remote(topo_ref, config)
        infos = ray.get([a.info.remote() for a in self.actors], timeout=max(60, config.connect_timeout_s))
        self.pids = [i["pid"] for i in infos]
        self._closed = False
        self.nodes = sorted({i["node"] for i in infos})
        # ranks that cannot share memory exchange their bytes through Ray's object store
        self.data_plane = data_plane or ("shm" if len(self.nodes) == 1 else "object")

    def run(self, fn, args=(), kwargs=None):
        if self._closed:
            raise HcclError("E_IN_STATUS", "the Ray cluster is closed")
        ray = self._ray
        p = self.topo.num_ranks
        hub = ray.get(self.hub_actor.start_hub.remote(p, float(self.config.connect_timeout_s)), timeout=60)
        refs = [a.run.remote(fn, args, kwargs, hub, self.data_plane, self.hub_actor) for a in self.actors]
        limit = (self.config.wait_timeout_s or 10 ** 9) + self.config.connect_timeout_s + 30
        ready, pending = ray.wait(refs, num_returns=p, timeout=limit)
        outcomes = []
        for r, ref in enumerate(refs):
            if ref in pending:
                outcomes.append(("error", r, "E_TIMEOUT", "did not finish in time", "Timeout", ""))
                continue
            try:
                outcomes.append(ray.get(ref))
            except ray.exceptions.RayActorError as exc:
                outcomes.append(("error", r, "E_REMOTE", f"its actor died: {exc}", "RayActorError", ""))
            except Exception as exc:   # noqa: BLE001 - e.g. a result that does not pickle
                outcomes.append(("error", r, "E_INTERNAL", str(exc), type(exc).__name__, ""))
        errors = [o for o in outcomes if o[0] == "error"]
        if errors:
            # the root cause is the first rank whose error is not another rank's abort
            root = next((e for e in errors if e[2] != "E_REMOTE" or "actor died" in e[3]), errors[0])
            _, rank, code, text, extra, tb = root
            if code:
                raise HcclError(code, text, rank=rank, op=extra if isinstance(extra, str) and extra else None)
            raise HcclError("E_INTERNAL", f"{extra}: {text}\n{tb}".rstrip(), rank=rank)
        return [o[2] for o in outcomes]

    def close(self):
        if self._closed:
            return
        self._closed = True
        ray = self._ray
        try:
            ray.get([a.close.remote() for a in self.actors], timeout=30)
        except Exception:   # noqa: BLE001 - dead actors cannot close; their segments are cleaned below
            pass
        for a in self.actors + [self.hub_actor]:
            try:
                ray.kill(a)
            except Exception:   # noqa: BLE001
                pass
        shm.cleanup(self.session)
        if self._started_ray:
            ray.shutdown()
