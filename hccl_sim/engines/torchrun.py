"""A rank's Communicator for a plain torch script launched on its own (`torchrun`, `mpirun`):
`dist.init_process_group(backend="hccl_sim")` with no hccl_sim.run around it.

Rank and world size are the launcher's (torch hands them to the backend); the topology is
HCCL_SIM_TOPOLOGY (a preset name, optionally `name:servers=N`, or an HCCL rank-table path;
default one 910B server, as many of its NPUs as there are processes; a hardware preset without a
server count is filled in order by the processes) and must have exactly world-size ranks. The ranks find each other
through the store torch gives the backend: each rank's socket endpoint (hcomm.transports.socket)
publishes its address under hccl_sim/<session>/<rank> and reads every peer's; rendezvous is a
control block per host with one leader per host across (hcomm.control.nodes; the dissemination
allgather over the transport where no host has two ranks, or a fault plan crashes ranks), data the
per-rank executor, every wait bounded by HCCL_EXEC_TIMEOUT / HCCL_CONNECT_TIMEOUT. When every
rank is on one host (LOCAL_WORLD_SIZE == WORLD_SIZE) the world communicator's larger ops run on the
shared-memory plane instead (hcomm.exec.shared_plane over hcomm.memory's segments: each rank its
share of the data program on every rank's segments, under a session rank 0 names in the store); control and point to point stay
on loopback TCP, sub-communicators (new_group) on the per-rank executor. A job across hosts runs
the per-rank executor, and the ranks of one host (torchrun's GROUP_RANK) keep their buffers in
their segments and read each other's slices in place; only bytes between hosts cross TCP.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
from typing import Callable, NamedTuple

from topologies.errors import HcclError

from .peer_group import PeerGroup

DEFAULT_TOPOLOGY = "atlas800t-a2"
ENV = "HCCL_SIM_TOPOLOGY"
FAULTS_ENV = "HCCL_SIM_FAULTS"
"""A fault plan file (FaultPlan.save's YAML) the launched job's first attempt meets."""
CRASH_EXIT_STATUS = 70             # the exit status of a rank process the fault plan kills (EX_SOFTWARE)


def topology_from_env(world_size: int | None):
    """The topology HCCL_SIM_TOPOLOGY names, checked against the launcher's world size; None: a
    process no launcher started (an emulated NPU's device count), the whole topology the name gives
    (a hardware preset without a server count: one full server)."""
    return topology_from_spec(os.environ.get(ENV, DEFAULT_TOPOLOGY), world_size)


def topology_from_spec(spec: str, world_size: int | None, source: str = ENV,
                       started: str = "the launcher started {} (WORLD_SIZE)"):
    """The topology `spec` names (HCCL_SIM_TOPOLOGY's form: a preset name, optionally
    `name:servers=N`, or an HCCL rank-table path), checked against the world size (None: not
    checked, a hardware preset is one full server); `source` names where the spec came from in
    errors, `started` what set the world size."""
    import topologies
    if not isinstance(spec, str) or not spec:
        raise HcclError("E_PARA", f"{source}={spec!r}: expected a preset name (optionally name:key=N,...) or an HCCL "
                        "rank-table path")
    name, _, rest = spec.partition(":")
    params = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not value.isdigit():
            raise HcclError("E_PARA", f"{source}={spec!r}: parameters are name=integer pairs after ':', e.g. "
                            "atlas800t-a2:servers=2")
        params[key] = int(value)
    if os.path.exists(name) or name.endswith(".json"):
        if params:
            raise HcclError("E_PARA", f"{source}={spec!r}: a rank table takes no parameters")
        topo = topologies.load(name)
    elif name.lower() in topologies.SYNTHETIC_PRESETS and world_size is not None:
        topo = topologies.load(name, **({"ranks": world_size} | params))
    elif world_size is None:
        return topologies.load(name, **params)
    elif not params and name.lower() in topologies.HARDWARE_PRESETS + tuple(topologies.ALIASES):
        # no server count given: the launcher's processes fill servers of the preset in order
        topo = topologies.presets.filled(name, world_size)
    else:
        topo = topologies.load(name, **params)
    if world_size is not None and topo.num_ranks != world_size:
        raise HcclError("E_PARA", f"{source}={spec!r} has {topo.num_ranks} ranks but {started.format(world_size)}: "
                        "they must be equal")
    return topo


class LaunchedPeers(PeerGroup):
    """A launched script's group over the peer transport: a rank the fault plan crashes ends its
    process at once, as a crashed one does (no goodbye; its peers find its connections closed),
    and so do its sub-communicators' ranks."""
    engine = "torchrun"

    def _end_rank(self, rank) -> None:
        os._exit(CRASH_EXIT_STATUS)

    def _subgroup(self, sub_rank, topo, config, control, transport):
        return LaunchedPeers(sub_rank, topo, config, control, transport)


class LaunchedGroup(LaunchedPeers):
    """A launched script's world group with the rank's segments (`memory`, a SegmentProvider):
    every rank on one host, the shared-memory data plane over them; some of them (a job across
    hosts), the per-rank executor with the buffers in them, so that the ranks of one host read
    each other's slices in place (hcomm.transports.socket, share_host)."""
    engine = "torchrun"

    def __init__(self, rank, topo, config, control, transport, memory, host_ranks=None, block_owner=None):
        super().__init__(rank, topo, config, control, transport)
        self.memory, self._block_owner = memory, block_owner
        if host_ranks is None:               # every rank on this host
            self._use_shared_plane(memory)
        else:
            self.share_host(memory, host_ranks)

    def close(self):
        """Unlink this rank's segments (its peers have left the last op: destroy_process_group,
        or the interpreter's exit); once."""
        if self.memory is not None:
            self.control.leave()             # peers still waiting in the host's block learn it at once
            self.control.close()
            if self._block_owner is not None:
                self._block_owner.close()
            self.memory.close()
            self.memory = None


class Launched(NamedTuple):
    """A launched script's world rank: its Communicator, the transport it connected with (its
    counters), and `close()`, which ends what the launch opened (see `connect`)."""
    comm: object
    transport: object
    close: Callable[[], None]


def config_from_env(topo, env=None):
    """The launched rank's Config: HCCL's variables, and HCCL_SIM_FAULTS's plan on the job's first
    attempt (torchrun's TORCHELASTIC_RESTART_COUNT 0): a plan is what goes wrong in one run of the
    job, and an elastic restart starts it again on hardware that works (a crashed process is
    started anew, a flapping link has been repaired)."""
    from ..config.env import Config
    from ..faults.fault_plan import FaultPlan
    from ..plan.faulted import with_faults
    config = Config.from_env(env)
    path = os.environ.get(FAULTS_ENV)
    if path and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) == 0:
        config = with_faults(topo, config, FaultPlan.load(path))
    return config


def connect(store, rank: int, size: int, topo, env=None, timeout_s: float | None = None, config=None,
            session: str | None = None, local: bool | None = None, node: str | None = None,
            host: str | None = None) -> Launched:
    """This rank's world, its peers found through `store`. Its `close()` says goodbye to the
    peers (their waits on this rank end at once), closes the transport, then the group's
    shared-memory plane, if any. `config`: the run's Config (default: `config_from_env`);
    `session`: the shared-memory session its segments are named for (default: one rank 0 makes;
    a launcher that cleans up after the job gives its own). Where the ranks are, when the launcher
    knows it otherwise than torchrun's variables say (a Ray actor): `local`, every rank on this
    host (default LOCAL_WORLD_SIZE == WORLD_SIZE); `node`, this rank's host as its peers compare it
    (default GROUP_RANK, else the host name); `host`, the address its endpoint listens on across
    hosts (default the host name's)."""
    from .bootstrap import communicator, start_runtime
    from hcomm.control.transport import TransportControl
    from hcomm.transports.socket import SocketTransport
    if config is None:
        config = config_from_env(topo, env)
    if local is None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", size)) == size
    if local:
        host = "127.0.0.1"
    elif host is None:
        host = socket.gethostbyname(socket.gethostname())
    transport = SocketTransport(rank, size, config.wait_timeout_s, connect_timeout_s=float(config.connect_timeout_s),
                                host=host)
    key = "hccl_sim/addr/"
    if node is None:
        node = os.environ.get("GROUP_RANK") or socket.gethostname()  # torchrun's node: its ranks share a host
    store.set(f"{key}{rank}", json.dumps(list(transport.address) + [node]))
    try:
        found = {r: json.loads(store.get(f"{key}{r}")) for r in range(size)}
    except RuntimeError as exc:          # torch's store raises RuntimeError on its own timeout
        transport.close()
        raise HcclError("E_TIMEOUT", f"rank {rank}: peers did not publish their addresses in the store: {exc}") \
            from None
    transport.start({r: (host_, port) for r, (host_, port, _) in found.items()}, eager=False)
    here = [r for r, (_, _, n) in found.items() if n == node]
    if local or len(here) > 1:
        from hcomm.memory import segments as shm
        from hcomm.memory.segment_provider import SegmentProvider
        if session is None:
            if rank == 0:
                store.set("hccl_sim/shm_session", shm.new_session())
            session = store.get("hccl_sim/shm_session").decode()
        crashes = config.faults is not None and config.faults.crashes
        control, owner = (TransportControl(transport, rank, size), None) if crashes else \
            host_control(store, session, [found[r][2] for r in range(size)], rank, transport,
                         float(config.connect_timeout_s))
        memory = SegmentProvider(session, rank)
        group = LaunchedGroup(rank, topo, config, control, transport, memory, host_ranks=None if local else here,
                              block_owner=owner)
        atexit.register(group.close)       # a script that raised never reaches destroy_process_group
    else:
        group = LaunchedPeers(rank, topo, config, TransportControl(transport, rank, size), transport)

    def close():
        group.exit(rank)
        transport.close()
        group.close()
        atexit.unregister(group.close)     # a process that connects again and again keeps no closed group
    return Launched(communicator(rank, group, start_runtime(rank, topo)), transport, close)


def host_control(store, session: str, host_of, rank: int, transport, timeout_s: float):
    """(this rank's control plane, the control block it created or None): each host's ranks meet
    in a control block of their own, one leader per host across (hcomm.control.nodes). A host's
    first rank creates its block and waits until every rank of the host has attached, so that
    its handle's unlinking at the end cannot come before a peer's attach; the others attach once
    the store says it exists."""
    import time
    from hcomm.control.nodes import HostLayout, NodeControl
    from hcomm.control.shm import ControlBlock
    layout = HostLayout(host_of)
    k = layout.host_index[rank]
    ranks = layout.hosts[k]
    if len(ranks) == 1:
        return NodeControl(None, transport, rank, layout), None
    name, owner = f"{session}_node{k}", None
    try:
        if rank == ranks[0]:
            owner = ControlBlock.create(name, len(ranks), layout.slot_bytes())
            store.set(f"hccl_sim/block/{k}", "1")
        else:
            store.get(f"hccl_sim/block/{k}")
        block = ControlBlock.attach(name, layout.local_index[rank])
        attached = store.add(f"hccl_sim/attached/{k}", 1)
        deadline = time.monotonic() + timeout_s
        while owner is not None and attached < len(ranks):
            if time.monotonic() > deadline:
                raise HcclError("E_TIMEOUT", f"rank {rank}: the ranks of its host did not attach its control block "
                                f"within {timeout_s:g} s", rank=rank)
            time.sleep(0.01)
            attached = store.add(f"hccl_sim/attached/{k}", 0)
    except RuntimeError as exc:          # torch's store raises RuntimeError on its own timeout
        if owner is not None:
            owner.close()
        raise HcclError("E_TIMEOUT", f"rank {rank}: its host's control block was not made in time: {exc}") from None
    except HcclError:
        if owner is not None:
            owner.close()
        raise
    return NodeControl(block, transport, rank, layout), owner
