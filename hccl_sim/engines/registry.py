"""The engine registry: every engine by name, what it offers, and how to launch it.

The API (`run`, `Cluster`, `simulate`), bench, the CLI, chaos and train all look engines up here
instead of comparing names: an engine's properties say what a caller may do with it.

| engine     | ranks are                              | data   | data planes (first: default)      | offers                         |
|------------|----------------------------------------|--------|-----------------------------------|--------------------------------|
| `local`    | threads of this process                | real   | central, threads                  | run, cluster, bench, chaos, train |
| `ray`      | one Ray actor process per rank         | real   | shm (one node), socket, object    | run, cluster, bench, chaos, train |
| `mpi`      | MPI processes under mpiexec (SPMD)     | real   | window (one node), p2p            | run, bench, train              |
| `timing`   | none: payload-free pricing             | none   | none                              | simulate, bench                |
| `torchrun` | a torch script's processes (torchrun)  | real   | shm (one host), socket            | torch                          |

Ray and MPI pick their default plane from where the ranks landed (every rank on one node: the
shared-memory plane); `data_plane=` forces one.
"""
from __future__ import annotations

from dataclasses import dataclass

from topologies.errors import HcclError


@dataclass(frozen=True)
class Engine:
    name: str
    summary: str                 # one line, for --help
    real_data: bool              # moves real bytes (else prices without payload)
    in_process: bool             # ranks are threads of this process (one per rank: MAX_LOCAL_RANKS)
    spmd: bool                   # every process runs the same program (under mpiexec)
    data_planes: tuple           # its planes by name; the first is the default where none is picked
    offers: tuple                # what callers may do with it: run, cluster, simulate, bench, chaos, train, torch
    settings: tuple = ()         # run()'s engine settings it takes (data_plane, ranks_per_process, address)
    launcher: str = ""           # "module:function": launch(fn, topo, config, args, kwargs, **settings)

    def __str__(self) -> str:
        return self.name

    def check_plane(self, data_plane) -> None:
        """An E_PARA unless `data_plane` is None (the engine picks) or one of the engine's planes."""
        if data_plane is not None and data_plane not in self.data_planes:
            planes = ", ".join(self.data_planes) or "none"
            raise HcclError("E_PARA", f"data_plane {data_plane!r} is invalid; expected {planes} (engine {self.name})")

    def launch(self, fn, topo, config, args=(), kwargs=None, **settings):
        """Run fn(comm, *args, **kwargs) on every rank; results by rank. `settings` left at None
        are the engine's defaults; one the engine does not take is an E_PARA naming who does."""
        given = {k: v for k, v in settings.items() if v is not None}
        for key in given:
            if key not in self.settings:
                takers = [e.name for e in ENGINES.values() if key in e.settings]
                raise HcclError("E_PARA", f"{key} is a setting of engine {' or '.join(takers)}, not of engine "
                                f"{self.name!r}")
        self.check_plane(given.get("data_plane"))
        if not self.launcher:
            raise HcclError("E_PARA", f"engine {self.name!r} does not run functions on ranks")
        import importlib
        module, _, name = self.launcher.partition(":")
        return getattr(importlib.import_module(module), name)(fn, topo, config, args, kwargs, **given)


ENGINES = {e.name: e for e in (
    Engine("local", "threads of this process, real data", True, True, False, ("central", "threads"),
           ("run", "cluster", "bench", "chaos", "train"), ("data_plane",), "hccl_sim.engines.local:run_local"),
    Engine("ray", "one Ray actor per rank, real data", True, False, False, ("shm", "socket", "object"),
           ("run", "cluster", "bench", "chaos", "train"), ("data_plane", "address"), "hccl_sim.engines.ray:run_ray"),
    Engine("mpi", "MPI processes under mpiexec, real data", True, False, True, ("window", "p2p"),
           ("run", "bench", "train"), ("data_plane", "ranks_per_process"), "hccl_sim.engines.mpi:run_mpi"),
    Engine("timing", "payload-free", False, False, False, (), ("simulate", "bench")),
    Engine("torchrun", "a torch script's processes under torchrun, real data", True, False, False, ("shm", "socket"),
           ("torch",)),
)}


def offering(use: str) -> tuple:
    """The names of the engines that offer `use`, in the registry's order."""
    return tuple(name for name, e in ENGINES.items() if use in e.offers)


def get(name, use: str, what: str | None = None) -> Engine:
    """The engine called `name`, which must offer `use` (for `what`, e.g. "--engine" or "run";
    default `use`); else an E_PARA naming the engines that do."""
    what = what or use
    names = offering(use)
    choices = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    if use in ("bench", "chaos", "train"):
        hint = f"{use} runs on {choices}"
    else:
        hint = f"{what} takes {choices}" + (" (payload-free timing: hccl_sim.simulate)" if use == "run" else "")
    engine = ENGINES.get(name) if isinstance(name, str) else None
    if engine is None:
        raise HcclError("E_PARA", f"{what}: unknown engine {name!r}; {hint}")
    if use not in engine.offers:
        raise HcclError("E_PARA", f"{what}: engine {name!r} does not offer {use}; {hint}")
    return engine
