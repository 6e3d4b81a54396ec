"""A plain torch script under `mpirun`/`mpiexec -n N` (no torchrun): `dist.init_process_group(
backend="hccl_sim")` takes its rank and world size from MPI, and its collectives run on the MPI
engine (engines/mpi.py: the world communicator's rendezvous an MPI allgather, payloads mpi4py
buffer calls), on the topology HCCL_SIM_TOPOLOGY names (hccl_sim.engines.torchrun), on the data plane
HCCL_SIM_DATA_PLANE names ("window" or "p2p"; unset, the engine's default: "window" when every
process is on one node, else "p2p").

torch's default init method, env://, needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which
only torchrun sets. Importing hccl_sim.torch wraps torch's env:// handler: in a process that an
MPI launcher started (MPICH/Intel MPI's PMI_RANK/PMI_SIZE, Open MPI's OMPI_COMM_WORLD_RANK/SIZE)
and whose environment lacks them, the rank and world size are MPI's, and MPI rank 0 hosts
torch's TCPStore on a port the OS picks and broadcasts its address (MPI_Ibcast, polled against
HCCL_CONNECT_TIMEOUT) — a real store shared by the job, so other backends (a gloo `new_group`)
work too. Everywhere else torch's handler runs unchanged. MASTER_ADDR/MASTER_PORT, when set,
are used as they are (rank 0 hosts the store there).
"""
from __future__ import annotations

import os
import socket
import struct
import time
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from topologies.errors import HcclError

LAUNCHERS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))
LOCAL_SIZES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
_ADDR = struct.Struct("<H64s")        # port, host name (NUL-padded)
PLANE_ENV = "HCCL_SIM_DATA_PLANE"     # the MPI engine's data plane for a launched script (unset: its default)


def launched() -> tuple | None:
    """(rank, size) an MPI launcher gave this process in its environment, or None."""
    for rank, size in LAUNCHERS:
        if rank in os.environ and size in os.environ:
            try:
                return int(os.environ[rank]), int(os.environ[size])
            except ValueError:
                raise HcclError("E_PARA", f"{rank}={os.environ[rank]!r} / {size}={os.environ[size]!r}: the MPI "
                                "launcher's rank and size are integers") from None
    return None


def _needs_mpi(url: str) -> bool:
    """torch's env:// would fail here (no RANK/WORLD_SIZE/MASTER_* from torchrun) and MPI knows."""
    if launched() is None:
        return False
    query = parse_qs(urlparse(url).query)
    have_rank = "rank" in query or "RANK" in os.environ
    have_size = "world_size" in query or "WORLD_SIZE" in os.environ
    have_addr = "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ
    return not (have_rank and have_size and have_addr)


def _mpi_world():
    from ..engines.mpi import world
    return world()


def _mpi_rendezvous(url: str, timeout: timedelta):
    """(store, rank, world size) for an MPI-launched process; a generator, as torch's handlers are."""
    import torch.distributed as dist
    from ..config.env import Config
    comm = _mpi_world()
    rank, size = comm.Get_rank(), comm.Get_size()
    query = {k: int(v[-1]) for k, v in parse_qs(urlparse(url).query).items() if k in ("rank", "world_size")}
    if query.get("rank", rank) != rank or query.get("world_size", size) != size:
        raise HcclError("E_PARA", f"init_process_group(rank={query.get('rank')}, world_size={query.get('world_size')}) "
                        f"under mpirun: MPI made this process rank {rank} of {size}")
    deadline = time.monotonic() + float(Config.from_env().connect_timeout_s)
    fixed = "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ
    store = None
    if fixed:
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    elif rank == 0:
        local = any(int(os.environ.get(v, 0)) == size for v in LOCAL_SIZES)
        host = "127.0.0.1" if local else socket.gethostbyname(socket.gethostname())
        store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False)
        port = store.port
    buf = bytearray(_ADDR.pack(port, host.encode()) if rank == 0 and not fixed else _ADDR.size)
    if not fixed:
        _bcast(comm, buf, deadline)
        port, raw = _ADDR.unpack(bytes(buf))
        host = raw.rstrip(b"\0").decode()
    if store is None:
        store = dist.TCPStore(host, port, size, is_master=fixed and rank == 0, timeout=timeout,
                              wait_for_workers=False)
    yield store, rank, size
    raise RuntimeError("hccl_sim: an MPI job cannot re-rendezvous (its ranks are fixed at launch)")


def _bcast(comm, buf, deadline: float) -> None:
    """MPI rank 0's `buf` to every process, or E_TIMEOUT at `deadline` (a peer that never calls)."""
    req = comm.Ibcast(buf, root=0)
    while not req.Test():
        if time.monotonic() > deadline:
            raise HcclError("E_TIMEOUT", f"MPI rank {comm.Get_rank()}: the other processes did not join torch's "
                            "rendezvous within HCCL_CONNECT_TIMEOUT (did every process call init_process_group?)")
        time.sleep(1e-3)


def install() -> None:
    """Wrap torch's env:// rendezvous handler (once per process)."""
    import importlib
    rdv = importlib.import_module("torch.distributed.rendezvous")   # the module (the package exports a function of that name)
    # torch offers register_rendezvous_handler but refuses to replace a scheme: the handler table
    # is where the env:// entry lives
    handlers = rdv._rendezvous_handlers
    torch_env = handlers["env"]
    if getattr(torch_env, "_hccl_sim", False):
        return

    def env_or_mpi(url, timeout=rdv.default_pg_timeout, **kwargs):
        if _needs_mpi(url):
            return _mpi_rendezvous(url, timeout)
        return torch_env(url, timeout=timeout, **kwargs)
    env_or_mpi._hccl_sim = True
    handlers["env"] = env_or_mpi


def world_communicator(rank: int, size: int, topo):
    """This process's rank on the MPI engine, for the default group of an MPI-launched script
    (the job closes at destroy_process_group, or at exit)."""
    from mpi4py import MPI
    from ..engines.mpi import PLANES, init_mpi
    from ..config.env import Config
    comm = _mpi_world()
    if (comm.Get_rank(), comm.Get_size()) != (rank, size):
        raise HcclError("E_PARA", f"torch made this process rank {rank} of {size}, MPI rank {comm.Get_rank()} of "
                        f"{comm.Get_size()}: under mpirun they must be the same")
    if MPI.Query_thread() < MPI.THREAD_SERIALIZED:
        raise HcclError("E_NOT_SUPPORT", "the hccl_sim process group calls MPI from its worker thread, which needs "
                        "MPI_THREAD_SERIALIZED or more (mpi4py.rc.thread_level)")
    plane = os.environ.get(PLANE_ENV) or None
    if plane is not None and plane not in PLANES:
        raise HcclError("E_PARA", f"{PLANE_ENV}={plane!r}: expected one of {', '.join(PLANES)} (or unset: the MPI "
                        "engine's default)")
    return init_mpi(topo, Config.from_env(), data_plane=plane)
