"""The driver's side of the Ray engine: actors placed by server, the data plane chosen from where
they landed, runs launched and watched, every failure reported as one HcclError.

Placement: one placement-group bundle per server, spread over Ray nodes (STRICT_SPREAD when there
are at least as many nodes as servers), every rank actor in its server's bundle, so a `ray start`
cluster of several machines maps servers onto machines. Where every actor landed is read from
Ray's node ids (not host names): all on one node -> the shared-memory planes (control block +
shm data); otherwise the socket plane (control and data peer to peer), or `data_plane="object"`
(Ray's object store). Forcing "socket" or "object" on one node runs the cross-host path there.

Control blocks: rank 0 creates the one every rank shares on the shm plane; on the socket plane the
first rank of each Ray node creates its node's (hcomm.control.nodes: a node's ranks meet there,
one leader per node crosses).

A run: reset the control blocks, let every actor open its transport endpoint (the driver hands
out the addresses), run `fn` on every actor, and poll them while it runs: a rank that raised
is reported by the earliest error that is not a consequence of another's (an abort, a departed
peer); every rank waiting with nothing moving for STALL_S is a deadlock, told to every rank.

A fault plan's rank_crash ends the dead rank's actor process (RayGroup.die). Its death is the
plan's when the survivors' communicators met that crash: its result is None and the run's outcome
is the survivors' (their results, or their error raised), as run_local's. Any dead actor is then
replaced by a fresh one in the same placement bundle, which removes its predecessor's shared
segments (and, for a block's creator, takes the block over), so the cluster stays usable.
"""
from __future__ import annotations

import logging
import os
import time

from hcomm.memory import segments as shm
from topologies.errors import Cause, HcclError

from .. import binding
from .. import rendezvous as rdv
from hcomm.control.nodes import HostLayout
from .actors import CONTROL_SLOT_BYTES, node_block, rank_actor_class
from .planes import PLANES, choose
from .protocol import RunSpec
from hcomm.transports.watched import STALL_S

_TICK_S = 0.5                       # how often a running job is polled
_ABANDON_S = 20                     # how long the ranks of a run the driver left get to return
_START_TIMEOUT_S = 120


class RayCluster:
    """Actors for every rank of a topology, kept across runs."""

    def __init__(self, topo, config, address: str | None = None, data_plane: str | None = None):
        import ray
        if data_plane is not None and data_plane not in PLANES:
            raise HcclError("E_PARA", f"data_plane {data_plane!r}: expected one of {', '.join(PLANES)}")
        self.topo, self.config = topo, config
        self._requested = data_plane
        shm.sweep_orphans()             # segments of drivers that died on this host
        self.session = shm.new_session()
        self._started_ray = False
        self._closed = True
        self._broken = None             # why the cluster closed itself (a crashed rank it could not replace)
        self._runs = 0                  # runs so far: each run's transport endpoints are an epoch of their own
        self._pg = None
        self._blocks = {}               # creator rank -> its control block (_control_blocks)
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS")
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            quiet = dict(log_to_driver=False, logging_level=logging.WARNING)
            if address:
                ray.init(address=address, **quiet)
            else:
                os.environ.setdefault("RAY_AUTH_MODE", "disabled")
                ray.init(address="local", include_dashboard=False, **quiet)
                self._started_ray = True
        self._ray = ray
        try:
            self._start_actors()
        except BaseException:
            self.close()
            raise

    def _start_actors(self):
        ray = self._ray
        p = self.topo.num_ranks
        self._actor_cls = rank_actor_class()
        self._topo_ref = ray.put(self.topo)
        self._options = self._placement()
        self._closed = False
        self.actors = [self._new_actor(r) for r in range(p)]
        infos = self._gather([a.info.remote() for a in self.actors], "start", self._start_timeout())
        self.pids = [i.pid for i in infos]
        self.node_of = [i.node_id for i in infos]
        self.nodes = sorted(set(self.node_of))
        self.plane = choose(self._requested, len(self.nodes) == 1)
        self.data_plane = self.plane.name
        self._layout = HostLayout(self.node_of)
        self._blocks = self._control_blocks()
        self._gather([self.actors[r].create_control.remote(name, n, slot) for r, (name, n, slot) in self._blocks.items()],
                     "create its control block", 60, ranks=list(self._blocks))

    def _control_blocks(self) -> dict:
        """rank -> (session, ranks, slot bytes) of the control blocks that rank creates: rank 0's
        for every rank on the shm plane; on the socket plane, each Ray node's first rank's for the
        node's ranks (hcomm.control.nodes), where a node holds more than one."""
        if self.plane.job_block:
            return {0: (self.session, self.topo.num_ranks, CONTROL_SLOT_BYTES)}
        if not self.plane.node_blocks:
            return {}
        layout = self._layout
        return {ranks[0]: (node_block(self.session, layout, ranks[0]), len(ranks), layout.slot_bytes())
                for ranks in layout.hosts if len(ranks) > 1}

    def _new_actor(self, rank):
        return self._actor_cls.options(**self._options(rank)).remote(rank, self._topo_ref, self.config, self.session)

    def _start_timeout(self):
        return max(_START_TIMEOUT_S, self.config.connect_timeout_s)

    def _placement(self):
        """Actor options per rank: its server's placement-group bundle when Ray has several nodes."""
        ray = self._ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if len(nodes) <= 1:
            return lambda r: {}
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        servers = sorted(set(self.topo.server_of))
        index = {s: i for i, s in enumerate(servers)}
        strategy = "STRICT_SPREAD" if len(servers) <= len(nodes) else "SPREAD"
        self._pg = placement_group([{"CPU": 0.001} for _ in servers], strategy=strategy)
        try:
            ray.get(self._pg.ready(), timeout=_START_TIMEOUT_S)
        except Exception as exc:   # noqa: BLE001 - GetTimeoutError and kin, reported as one error
            raise HcclError("E_TIMEOUT", f"Ray could not place {len(servers)} servers on {len(nodes)} nodes "
                            f"({strategy}): {type(exc).__name__}: {exc}") from None

        def options(rank):
            return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
                self._pg, placement_group_bundle_index=index[self.topo.server_of[rank]])}
        return options

    def _gather(self, refs, what, timeout, ranks=None):
        """ray.get of one call per rank (of `ranks`, default all), every Ray failure an HcclError
        naming the rank."""
        ray = self._ray
        out = []
        for r, ref in zip(range(len(refs)) if ranks is None else ranks, refs):
            try:
                out.append(ray.get(ref, timeout=timeout))
            except ray.exceptions.GetTimeoutError:
                raise HcclError("E_TIMEOUT", f"rank {r}'s actor did not {what} within {timeout:g} s", rank=r) from None
            except ray.exceptions.RayError as exc:
                raise HcclError("E_REMOTE", f"rank {r}'s actor failed to {what}: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}", rank=r) from None
        return out

    # ---- runs -------------------------------------------------------------------------------------
    def run(self, fn, args=(), kwargs=None, config=None):
        """fn on every actor; `config`: this run's HCCL settings and faults (default the cluster's)."""
        if self._closed:
            raise HcclError("E_IN_STATUS", "the Ray cluster is closed" + (f": {self._broken}" if self._broken else ""))
        config = self.config if config is None else config
        plane = self.plane
        if self._blocks:
            self._gather([self.actors[r].reset_control.remote() for r in self._blocks], "reset its control block", 60,
                         ranks=list(self._blocks))
        self._runs += 1
        addresses = self._gather([a.prepare.remote(plane.name, self._runs, config) for a in self.actors],
                                 "open its transport", config.connect_timeout_s or 120)
        spec = RunSpec(self.session, plane.name, {r: a for r, a in enumerate(addresses)}, config, tuple(self.node_of),
                       binding.requested())
        actors = self.actors if plane.object_store else None
        refs = [a.run.remote(fn, args, kwargs, spec, actors) for a in self.actors]
        try:
            outcomes = self._watch(refs, config)
        except BaseException:
            self._abandon(refs)
            raise
        crashed = self._crashed(outcomes, config)
        dead = [o.rank for o in outcomes if o.died]
        if dead and not self._closed:
            self._replace(dead)
        errors = [o for o in outcomes if not o.ok and o.rank not in crashed]
        if errors:
            raise rdv.root_cause([(o.rank, o.error(), o.at) for o in errors])[1]
        return [None if o.rank in crashed else o.value for o in outcomes]

    def _abandon(self, refs):
        """The driver stopped waiting for a run (Ctrl-C, a test's time limit): end its ranks'
        waits and give them a little while to return, so the next run does not meet this one's
        ranks still inside fn; a rank still there after that closes the cluster (its actors are
        killed), which then says why."""
        ray = self._ray
        self._stop(list(range(len(refs))), "E_TIMEOUT", "the driver stopped waiting for this run")
        try:
            _, pending = ray.wait(refs, num_returns=len(refs), timeout=_ABANDON_S)
        except BaseException:       # interrupted again: no waiting now, the cluster closes
            self._broken = "the driver was interrupted while its ranks were ending a run; create a new Cluster"
            self.close()
            raise
        if pending:
            self._broken = "a run the driver stopped waiting for did not end; create a new Cluster"
            self.close()

    def _crashed(self, outcomes, config) -> set:
        """Ranks whose actor died as the fault plan said: a rank_crash of theirs that the survivors'
        communicators met (they lost that rank to it). Their result is None, as run_local's; any
        other death is an error of the run."""
        faults = config.faults
        planned = {c[0] for c in faults.crashes} if faults is not None else set()
        survivors = [o for o in outcomes if not o.died]
        met = {r for o in survivors for r in o.lost}
        return {o.rank for o in outcomes if o.died and o.rank in planned and (not survivors or o.rank in met)}

    def _replace(self, ranks):
        """Fresh actors for `ranks`, whose actors died, in the same placement bundles (so on the
        same nodes): the cluster stays usable. Each removes its predecessor's shared segments; a
        new rank 0 takes the control block over. Failing that, the cluster closes and says why."""
        ray = self._ray
        for r in ranks:
            try:
                ray.kill(self.actors[r])        # dead already: this only releases its handle
            except Exception:   # noqa: BLE001 - gone
                pass
        fresh = {}
        try:
            fresh = {r: self._new_actor(r) for r in ranks}
            infos = self._gather([fresh[r].info.remote() for r in ranks], "restart after its death",
                                 self._start_timeout(), ranks=ranks)
            for r, info in zip(ranks, infos):
                self.actors[r] = fresh[r]
                if info.node_id != self.node_of[r]:
                    raise HcclError("E_INTERNAL", f"rank {r}'s new actor landed on another Ray node", rank=r)
                self.pids[r] = info.pid
            creators = [r for r in ranks if r in self._blocks]
            self._gather([self.actors[r].adopt_control.remote(self._blocks[r][0]) for r in creators],
                         "take its control block over", 60, ranks=creators)
            attach = {r: self._block_of(r) for r in ranks}
            attach = {r: a for r, a in attach.items() if a is not None}
            self._gather([self.actors[r].attach_control.remote(*a) for r, a in attach.items()],
                         "attach its control block", 60, ranks=list(attach))
        except HcclError as exc:
            for a in fresh.values():
                try:
                    ray.kill(a)
                except Exception:   # noqa: BLE001 - gone
                    pass
            self._broken = f"rank(s) {ranks} died and could not be replaced ({exc}); create a new Cluster"
            self.close()

    def waiting(self, timeout_s: float = 30) -> list:
        """What each rank waits for now (a sentence, or None when it is not waiting), as the
        driver's stall watch reads it."""
        return [s.waiting for s in self._ray.get([a.status.remote() for a in self.actors], timeout=timeout_s)]

    def _block_of(self, rank):
        """(session, index) of the control block `rank` attaches, or None."""
        if self.plane.job_block:
            return self.session, rank
        layout = self._layout
        if not self.plane.node_blocks or len(layout.hosts[layout.host_index[rank]]) == 1:
            return None
        return node_block(self.session, layout, rank), layout.local_index[rank]

    def _watch(self, refs, config):
        """Wait for every rank's Outcome, polling for deadlocks; nothing waits past the limit."""
        ray = self._ray
        p = len(refs)
        limit = time.monotonic() + (config.wait_timeout_s or 10 ** 9) + config.connect_timeout_s + 30
        done = {}
        stalled = None                  # (progress total, since) while every running rank waits
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=_TICK_S)
            for ref in ready:
                done[refs.index(ref)] = self._outcome(refs.index(ref), ref)
            if not pending:
                break
            if time.monotonic() > limit:
                running = [refs.index(ref) for ref in pending]
                self._stop(running, "E_TIMEOUT", "the run did not finish within HCCL_EXEC_TIMEOUT + "
                           "HCCL_CONNECT_TIMEOUT + 30 s")
                ready, pending = ray.wait(pending, num_returns=len(pending), timeout=30)
                for ref in ready:
                    done[refs.index(ref)] = self._outcome(refs.index(ref), ref)
                for ref in pending:
                    done[refs.index(ref)] = _timeout_outcome(refs.index(ref))
                if pending:             # ranks still inside fn: this cluster cannot run again safely
                    self.close()
                break
            stalled = self._check_stall([refs.index(ref) for ref in pending], stalled)
        return [done[r] for r in range(p)]

    def _outcome(self, rank, ref):
        from .protocol import Outcome, died_outcome
        ray = self._ray
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            return died_outcome(rank, f"its actor died: {str(exc).splitlines()[0]}", time.time())
        except ray.exceptions.RayError as exc:      # e.g. a result that does not pickle
            return Outcome(rank, False, code="E_INTERNAL", reason=f"{type(exc).__name__}: {exc}", at=time.time())

    def _check_stall(self, running, stalled):
        ray = self._ray
        try:
            statuses = ray.get([self.actors[r].status.remote() for r in running], timeout=10)
        except ray.exceptions.RayError:
            return None                 # an actor died: its run's outcome will say so
        if any(s.waiting is None for s in statuses):
            return None
        total = sum(s.progress for s in statuses)
        now = time.monotonic()
        if stalled is None or stalled[0] != total:
            return (total, now)
        if now - stalled[1] < STALL_S:
            return stalled
        who = "; ".join(f"rank {s.rank} waits for {s.waiting}" for s in statuses[:8])
        self._stop(running, "E_TIMEOUT", f"deadlock: every rank is waiting and none can proceed ({who})")
        return None

    def _stop(self, ranks, code, message):
        """End the waits of `ranks` with HcclError(code, message); False if some did not answer."""
        ray = self._ray
        try:
            ray.get([self.actors[r].stop.remote(code, message) for r in ranks], timeout=10)
            return True
        except ray.exceptions.RayError:
            return False            # a dead or stuck actor: its outcome, or the run's limit, will say so

    @property
    def closed(self) -> bool:
        """Whether this cluster can no longer run (closed, or closed itself: `run` says why)."""
        return self._closed

    def close(self):
        if getattr(self, "_closing", False):
            return
        self._closing = True
        ray = self._ray if hasattr(self, "_ray") else None
        actors = getattr(self, "actors", [])
        if ray is not None and actors:
            try:
                ray.get([a.close.remote() for a in actors], timeout=30)
            except Exception:   # noqa: BLE001 - dead actors cannot close; their segments are cleaned below
                pass
            for a in actors:
                try:
                    ray.kill(a)
                except Exception:   # noqa: BLE001 - already gone
                    pass
        if self._pg is not None:
            try:
                from ray.util.placement_group import remove_placement_group
                remove_placement_group(self._pg)
            except Exception:   # noqa: BLE001 - the cluster may be gone
                pass
        self._closed = True
        shm.cleanup(self.session)
        if self._started_ray and ray is not None:
            ray.shutdown()


def _timeout_outcome(rank):
    from .protocol import Outcome
    return Outcome(rank, False, code="E_TIMEOUT", reason="did not finish in time", at=time.time(),
                   fields={"cause": Cause.TIMEOUT})
