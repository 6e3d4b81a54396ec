"""This process's torch side of hccl-sim, in one object the backend owns: its world communicator,
what a launched script's world opened (closed at destroy_process_group), the device timeline
active on this rank, and torch's default CPU stream (which a timeline's compute stream stands for).

torch keeps one default process group per process, so a process is one rank here: one World,
made when hccl_sim.torch is imported, whose `create` is the backend's creator torch calls for
every group; the groups it makes, and their Works and timelines, know it.
"""
from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from topologies.errors import HcclError

from ..faults.fault_plan import RankCrashed
from . import mpi_launch
from .process_group import BACKEND, ProcessGroupHcclSim


class Options:
    """pg_options of the hccl_sim backend: the communicator the group runs on."""

    def __init__(self, comm):
        self.comm = comm


class World:
    """This process's rank as torch sees it (see the module's docstring)."""

    def __init__(self):
        self.comm = None                 # this process's rank's world communicator, once there is one
        self.transport = None            # a torchrun script's endpoint (its counters), while its world is open
        self.timeline = None             # the device timeline active on this rank (hccl_sim.torch.timeline)
        self.default_cpu_stream = torch.cpu.current_stream()
        self.reported = None             # a launched script's result (hccl_sim.torch.report)
        self.failed = None               # the first HcclError an op of this rank failed with (note_failure)
        self.script_failed = False       # whether the last launched script run here failed (its exit status)
        self._close = None               # ends what a launched script's world opened
        self._launch_store = None        # rank 0's store an MPI launch hosts until torch's env:// takes it over

    def note_failure(self, exc) -> None:
        """An op of this rank failed with `exc`: the first HcclError (or the fault plan's stall of
        this rank) is kept, because torch turns the error of an op it waits for in C++ (DDP's
        gradient buckets) into a RuntimeError of its own words, and a launched script's end must
        still say which fault it was."""
        if self.failed is None and isinstance(exc, (HcclError, RankCrashed)):
            self.failed = exc

    def provide(self, launched) -> None:
        """Take a launched rank's world (hccl_sim.engines.torchrun.Launched) as this process's:
        the script's init_process_group runs on its communicator, destroy closes it."""
        self.comm, self.transport, self._close = launched.comm, launched.transport, launched.close

    def meet_launcher(self) -> None:
        """Under mpirun without torchrun's variables, set them (hccl_sim.torch.mpi_launch; every
        process of the job does it at import)."""
        self._launch_store = mpi_launch.launch_env()

    def create(self, dist_opts, pg_options, backend=BACKEND):
        """torch's backend creator (extended API): the default group's communicator comes in
        pg_options; a new_group's is made from the world's for the members (they alone call this).
        `backend` "hccl" (emulated NPUs, hccl_sim.torch.npu.distributed): the group serves npu
        tensors, and pg_options may be torch_npu's Options, whose hccl_config the group's
        communicator runs with (a split of the members with that config)."""
        def group(comm, **kw):
            pg = ProcessGroupHcclSim(comm, self, timeout=dist_opts.timeout, **kw)
            if backend != BACKEND:
                pg.serve_as(backend, ("npu",), name)
            return pg
        env, name = {}, None
        if backend != BACKEND and pg_options is not None:     # torch_npu's ProcessGroupHCCL.Options
            from .npu.distributed import Options as HcclOptions
            if not isinstance(pg_options, HcclOptions):
                raise HcclError("E_PARA", f"pg_options of backend {backend!r}: expected torch_npu's "
                                f"ProcessGroupHCCL.Options(), got {type(pg_options).__name__}")
            env, name = pg_options.env()
        if isinstance(pg_options, Options):
            return group(pg_options.comm)
        world = self.comm
        if world is None:
            # a plain script under torchrun / mpirun: dist.init_process_group(backend="hccl_sim")
            world = self._launch(dist_opts)
            return group(world.split(0, env=env) if env else world, on_shutdown=self.close)
        members = sorted(int(r) for r in dist_opts.global_ranks_in_group)
        if not members or members == list(range(world.size)):      # none: the default group's
            comm = world.split(0, env=env) if env else world
            if not members and self._close is not None:              # a launched rank's world (provide)
                return group(comm, on_shutdown=self.close)
            return group(comm)
        others = [r for r in range(world.size) if r not in set(members)]
        return group(world.shrink(exclude=others, env=env or None))

    def _launch(self, dist_opts):
        """The world communicator of a launched script: MPI's under mpirun, else torchrun's
        through torch's store."""
        from ..engines.torchrun import connect, topology_from_env
        topo = topology_from_env(dist_opts.group_size)
        mpi = mpi_launch.launched()
        if mpi is not None and mpi[1] == dist_opts.group_size:
            self.comm, self._close = mpi_launch.world_communicator(dist_opts.group_rank, dist_opts.group_size, topo)
        else:
            self.comm, self.transport, self._close = connect(dist_opts.store, dist_opts.group_rank,
                                                             dist_opts.group_size, topo)
        self._launch_store = None        # torch's store serves from its server now
        return self.comm

    def adopt(self, comm, timeout=None) -> None:
        """Make `comm` torch's default process group (hccl_sim.torch.init_process_group)."""
        k = comm.ranks_per_process
        if k > 1:
            raise HcclError("E_NOT_SUPPORT", f"hccl_sim.torch.init_process_group: this rank is one of {k} ranks run as "
                            "threads of one process (engine local, or engine mpi with ranks_per_process > 1), and "
                            "torch.distributed keeps one default process group per process, so they cannot each "
                            "have one; run torch ranks one per process: hccl_sim.run(fn, engine='ray'), engine='mpi' "
                            "under mpiexec (ranks_per_process=1), or a plain script under torchrun / mpirun",
                            rank=comm.rank)
        if dist.is_initialized():
            raise HcclError("E_PARA", "torch.distributed is already initialised in this process "
                            "(dist.destroy_process_group() first)", rank=comm.rank)
        self.comm = comm
        kw = {} if timeout is None else {"timeout": timedelta(seconds=timeout)}
        dist.init_process_group(BACKEND, store=dist.HashStore(), rank=comm.rank, world_size=comm.size,
                                pg_options=Options(comm), **kw)

    def close(self) -> None:
        """Close what the world of a launched script opened (its endpoint, its MPI job), and
        forget the world's communicator."""
        done, self._close = self._close, None
        if done is not None:
            done()
        self.comm = self.transport = None
