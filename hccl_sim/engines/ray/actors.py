"""The rank actor: one Ray actor per rank, owning its simulated NPU (runtime, device, HBM), its
shared-memory segments and, for each run, its endpoint of the peer transport.

The actor is threaded: `run` blocks in the user's function while peers' deliveries (the object
plane's mailbox), the driver's status polls and its deadlock notice run on other threads. A rank
the fault plan crashes never returns from `run`: its process exits (RayGroup.die), and the
driver puts a fresh actor in its place.
"""
from __future__ import annotations

import os
import sys
import time
import traceback

from hcomm.memory import segments as shm
from hcomm.transports.ray_object import RayMailbox

from topologies.errors import HcclError

from hcomm.control.nodes import HostLayout, NodeControl
from hcomm.control.shm_plane import ShmControl
from hcomm.control.transport import TransportControl
from .. import binding
from ..bootstrap import communicator, start_runtime
from .group import RayGroup
from .planes import PLANES
from .protocol import Outcome, RankInfo, RankStatus
from ...faults.fault_plan import RankStalled
from hcomm.memory.segment_provider import SegmentProvider
from hcomm.transports.watched import RankWatch

CONTROL_SLOT_BYTES = 68 << 10
_SWITCH_INTERVAL_S = 50e-6      # room for an inline op's input (group.INLINE_BYTES) and its framing


def _node():
    import ray
    ctx = ray.get_runtime_context()
    return ctx.get_node_id(), ray.util.get_node_ip_address()


class RankActorBase(RayMailbox):
    """One rank: its runtime, device (HBM, streams) and shared-memory segments live across runs."""

    def __init__(self, rank, topo, config, session):
        self.rank, self.topo, self.config, self.session = rank, topo, config, session
        # the peer transports hand every message between threads (sender, reader, rank): with
        # CPython's default 5 ms GIL switch interval each hand-off can wait that long
        sys.setswitchinterval(min(sys.getswitchinterval(), _SWITCH_INTERVAL_S))
        # a predecessor that crashed (a fault plan's rank_crash) left its segments on this host:
        # this actor replaces it in the same placement bundle, so it is the one that can remove them
        shm.cleanup_rank(session, rank)
        self.shared = SegmentProvider(session, rank)
        self.runtime = start_runtime(rank, topo, self.shared.device_storage)
        self.device = self.runtime.device
        self.hcomm_transport = None        # this run's endpoint (RayMailbox delivers into it)
        self.watch = RankWatch()
        self._block_owner = None           # a control block, in the actor that creates it
        self._block = None                 # this rank's handle on its control block (kept across runs)
        self._control = None               # this run's control plane

    def info(self) -> RankInfo:
        import resource
        node_id, ip = _node()
        return RankInfo(self.rank, os.getpid(), node_id, ip, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

    # ---- the control block of this rank's host: every rank's on the shm plane, a Ray node's on
    # ---- the socket plane (hcomm.control.nodes); `name` is its session, under the actor's --------
    def create_control(self, name: str, size: int, slot_bytes: int = CONTROL_SLOT_BYTES) -> None:
        from hcomm.control.shm import ControlBlock
        self._block_owner = ControlBlock.create(name, size, slot_bytes)

    def reset_control(self) -> None:
        self._block_owner.reset()

    def adopt_control(self, name: str) -> None:
        """Take a control block over from this rank's crashed predecessor, which created it."""
        from hcomm.control.shm import ControlBlock
        self._block_owner = ControlBlock.adopt(name)

    # ---- one run ---------------------------------------------------------------------------------
    def prepare(self, data_plane: str, epoch: int = 0, config=None):
        """This run's peer transport endpoint (`epoch`: the run's number, the same on every rank;
        its waits bounded by `config`, default the actor's); returns its address (socket plane) or None."""
        config = self.config if config is None else config
        size = self.topo.num_ranks
        if self.hcomm_transport is not None:      # left by a run that never finished here
            self.hcomm_transport.close()
            self.hcomm_transport = None
        plane = PLANES[data_plane]
        if plane.object_store:
            from hcomm.transports.ray_object import RayObjectTransport
            self.hcomm_transport = RayObjectTransport(self.rank, size, config.wait_timeout_s, epoch)
            return None
        from hcomm.transports.socket import SocketTransport
        host = _node()[1] if plane.node_address else "127.0.0.1"    # peers on other hosts must reach it
        self.hcomm_transport = SocketTransport(self.rank, size, config.wait_timeout_s,
                                               connect_timeout_s=float(config.connect_timeout_s), host=host)
        return self.hcomm_transport.address

    def run(self, fn, args, kwargs, spec, actors=None) -> Outcome:
        transport = self.hcomm_transport
        group = None
        self.device.reset_timeline()
        self.watch = RankWatch()
        try:
            plane = PLANES[spec.data_plane]
            if plane.object_store:
                transport.start(actors)
            else:
                transport.start(spec.peers, eager=False)
            control = self._open_control(spec, transport)
            config = self.config if spec.config is None else spec.config
            group = RayGroup(self.rank, self.topo, config, plane, control, transport, self.watch,
                             self.shared)
            if plane.host_peers_in_place:
                self._share_host(spec, group)
            comm = communicator(self.rank, group, self.runtime)
            if spec.nodes:
                layout = HostLayout(spec.nodes)         # the rank's index among its node's ranks, and their number
                binding.bind_rank_thread(layout.local_index[self.rank],
                                         len(layout.hosts[layout.host_index[self.rank]]), spec.bind)
            try:
                value = fn(comm, *args, **(kwargs or {}))
            finally:
                self.device.free(comm.ccl_buffer)
        except RankStalled:            # the plan stalled it (a crash's process has exited already)
            group.exit(self.rank)
            self._finish(transport)
            return Outcome(self.rank, True, value=None, lost=_lost(group))
        except BaseException as exc:   # noqa: BLE001 - reported to the driver and the other ranks
            at = time.time()
            if group is not None:
                try:
                    group.fail(self.rank, exc)
                except HcclError:
                    pass            # the control plane is already closed or aborted: peers know
            self._finish(transport)
            if isinstance(exc, HcclError):
                return Outcome.failed(self.rank, exc, at, lost=_lost(group))
            return Outcome(self.rank, False, reason=str(exc), error_type=type(exc).__name__,
                           traceback=traceback.format_exc(limit=8), at=at, lost=_lost(group))
        group.exit(self.rank)
        self._finish(transport)
        return Outcome(self.rank, True, value=value, lost=_lost(group))

    def _share_host(self, spec, group):
        """Ranks on this rank's Ray node read each other's slices in place (the rank's segments);
        the others get bytes over TCP."""
        here = [r for r, node in enumerate(spec.nodes) if node == spec.nodes[self.rank]] if spec.nodes else []
        if len(here) > 1:
            group.share_host(self.shared, here)

    def _open_control(self, spec, transport):
        """The shared control block on the shm plane; on the socket plane the block of this rank's
        Ray node with one leader per node across (hcomm.control.nodes), but for a run whose fault
        plan crashes ranks (their deaths are found by the transport, whose control plane is then
        the peers' allgather); the peer transport's allgather on the object plane. Blocks are
        attached once and kept across runs."""
        plane = PLANES[spec.data_plane]
        if plane.job_block:
            self.attach_control(spec.session, self.rank)
            self._control = ShmControl(self._block)
            return self._control
        layout = HostLayout(spec.nodes) if plane.node_blocks and spec.nodes else None
        config = self.config if spec.config is None else spec.config
        crashes = config.faults is not None and config.faults.crashes
        if layout is None or crashes:
            self._control = TransportControl(transport, self.rank, self.topo.num_ranks)
            return self._control
        if len(layout.hosts[layout.host_index[self.rank]]) > 1:
            self.attach_control(node_block(spec.session, layout, self.rank), layout.local_index[self.rank])
        self._control = NodeControl(self._block, transport, self.rank, layout)
        return self._control

    def attach_control(self, name: str, index: int) -> None:
        """Attach this rank to its host's control block as `index` (once; kept across runs). The
        driver calls it on an actor replacing a crashed one before the next run: until then the
        block names the dead process for this rank, and a peer arriving first would take it for a
        death in that run."""
        if self._block is None:
            from hcomm.control.shm import ControlBlock
            self._block = ControlBlock.attach(name, index)

    def _finish(self, transport):
        if self._control is not None:
            self._control.leave()       # ranks still waiting for this one learn it has returned
            self._control = None
        if transport is not None:
            transport.close()
        self.hcomm_transport = None

    def status(self) -> RankStatus:
        what, progress = self.watch.snapshot()
        return RankStatus(self.rank, what, progress)

    def stop(self, code: str, message: str) -> None:
        """The driver ends this rank's waits (a deadlock, or the run's time limit)."""
        if self._control is not None:
            try:
                self._control.abort(code, message)
            except HcclError:
                pass                # already closed: nothing waits on it
        tr = self.hcomm_transport
        if tr is not None:
            tr.abort(code, message)

    def close(self):
        leaks = self.runtime.finalize() if self.runtime.state == "ready" else []
        if self._block is not None:
            self._block.close()
            self._block = None
        if self._block_owner is not None:
            self._block_owner.close()
            self._block_owner = None
        self.shared.close()
        return leaks


def _lost(group):
    """The job's ranks the fault plan crashed in this rank's communicators' ops."""
    return () if group is None else tuple(sorted(group.lost_world))


def node_block(session: str, layout, rank: int) -> str:
    """The session of the control block of `rank`'s Ray node (under the run's session, so that
    cleaning the session removes it)."""
    return f"{session}_node{layout.host_index[rank]}"


def rank_actor_class():
    import ray
    return ray.remote(num_cpus=0, max_concurrency=8)(RankActorBase)
