"""A plain torch script under `mpirun`/`mpiexec -n N` (no torchrun): `dist.init_process_group(
backend="hccl_sim")` takes its rank and world size from MPI, and its collectives run on the MPI
engine (engines/mpi.py: the world communicator's rendezvous an MPI allgather, payloads mpi4py
buffer calls), on the topology HCCL_SIM_TOPOLOGY names (hccl_sim.engines.torchrun), on the data plane
HCCL_SIM_DATA_PLANE names ("window" or "p2p"; unset, the engine's default: "window" when every
process is on one node, else "p2p").

torch's default init method, env://, reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, which
only torchrun sets, and torch keeps its env:// handler (register_rendezvous_handler refuses a
scheme it has). So importing hccl_sim.torch in a process an MPI launcher started (MPICH/Intel
MPI's PMI_RANK/PMI_SIZE, Open MPI's OMPI_COMM_WORLD_RANK/SIZE) whose environment lacks them sets
them, as torchrun would have: RANK and WORLD_SIZE are MPI's; MPI rank 0 hosts torch's TCPStore
on a port the OS picks and broadcasts its address (MPI_Ibcast, polled against
HCCL_CONNECT_TIMEOUT), which becomes MASTER_ADDR and MASTER_PORT. torch's own env:// handler then
runs unchanged: on rank 0 it makes its store multi-tenant, so it serves from the one hosted here
(kept until then) — a real store shared by the job, so other backends (a gloo `new_group`) work
too. The import is where the processes meet: every process of the job imports hccl_sim.torch.
MASTER_ADDR/MASTER_PORT, when set, are used as they are (rank 0 hosts the store there), and an
environment torchrun made is left alone.
"""
from __future__ import annotations

import os
import socket
import struct
import time
from datetime import timedelta

from topologies.errors import HcclError

LAUNCHERS = (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"))
LOCAL_SIZES = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
LOCAL_RANKS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK")
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


def _needs_env() -> bool:
    """An MPI launcher started this process and torch's env:// would fail (no torchrun variables)."""
    return launched() is not None and not all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                         "MASTER_PORT"))


def _mpi_world():
    from ..engines.mpi import world
    return world()


def launch_env():
    """torch's env:// variables for an MPI-launched process that lacks them (see the module's
    docstring): set in os.environ; returns rank 0's TCPStore (to keep until torch's env:// store
    has taken its server over), else None. Does nothing elsewhere."""
    if not _needs_env():
        return None
    import torch.distributed as dist
    from ..config.env import Config
    comm = _mpi_world()
    rank, size = comm.Get_rank(), comm.Get_size()
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(size))
    # torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE (a torch_npu script sets its device from LOCAL_RANK)
    for name, sources in (("LOCAL_RANK", LOCAL_RANKS), ("LOCAL_WORLD_SIZE", LOCAL_SIZES)):
        given = next((os.environ[v] for v in sources if v in os.environ), None)
        if given is not None:
            os.environ.setdefault(name, given)
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return None
    connect_s = float(Config.from_env().connect_timeout_s)
    timeout = timedelta(seconds=connect_s)
    store = None
    if rank == 0:
        local = any(int(os.environ.get(v, 0)) == size for v in LOCAL_SIZES)
        host = "127.0.0.1" if local else socket.gethostbyname(socket.gethostname())
        # multi-tenant, as torch's env:// makes rank 0's: torch's then serves from this one's server
        store = dist.TCPStore(host, 0, size, is_master=True, timeout=timeout, wait_for_workers=False,
                              multi_tenant=True)
        buf = bytearray(_ADDR.pack(store.port, host.encode()))
    else:
        buf = bytearray(_ADDR.size)
    _bcast(comm, buf, time.monotonic() + connect_s)
    port, raw = _ADDR.unpack(bytes(buf))
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = raw.rstrip(b"\0").decode(), str(port)
    return store


def _bcast(comm, buf, deadline: float) -> None:
    """MPI rank 0's `buf` to every process, or E_TIMEOUT at `deadline` (a peer that never calls)."""
    req = comm.Ibcast(buf, root=0)
    while not req.Test():
        if time.monotonic() > deadline:
            raise HcclError("E_TIMEOUT", f"MPI rank {comm.Get_rank()}: the other processes did not meet to set up "
                            "torch's env:// within HCCL_CONNECT_TIMEOUT (does every process import hccl_sim.torch?)")
        time.sleep(1e-3)


def world_communicator(rank: int, size: int, topo):
    """(this process's rank on the MPI engine, a function that closes its job), for the default
    group of an MPI-launched script (the job closes at destroy_process_group, or at exit)."""
    from mpi4py import MPI
    from ..engines.mpi import PLANES, launch_world
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
    return launch_world(topo, Config.from_env(), data_plane=plane)
