"""ray.util.collective on emulated NPUs: importing this module registers the backend "hccl_sim" with
Ray's collective backend registry (ray.util.collective.register_collective_backend), so a Ray
program's

    col.init_collective_group(world_size, rank, backend="hccl_sim", group_name="g")   # in each actor
    col.create_collective_group(actors, world_size, ranks, backend="hccl_sim", group_name="g")  # driver

and its allreduce, allgather, reducescatter, broadcast, reduce, send, recv and barrier run on
emulated Ascend NPUs (ReduceOp SUM, PRODUCT, MIN, MAX; numpy arrays and torch CPU tensors, results
written into the given tensors), each op priced in simulated time: `last_op(group_name)` is the
rank's record of its last op (hccl_sim's OpRecord: .name .algo .nbytes .start .end .time).

Ray's rule is that every process that makes or joins a group has the backend registered: the
driver and each actor import this module (an actor class defined in a module that imports it
does), or the job registers it in every worker: `ray.init(runtime_env={"worker_process_setup_hook":
"hccl_sim.ray_collective.register"})`.

The topology: `configure(group_name, topology=...)` in the actor before the group is made, else
HCCL_SIM_TOPOLOGY in the actor's environment (as a torchrun script's), else one 910B server
(atlas800t-a2) filled by the group's ranks; it must have the group's world size. The ranks of a
group meet through Ray's internal key-value store and connect as torchrun's ranks do
(hccl_sim.engines.ray.kv_store): on one Ray node, the shared-memory plane; across nodes, TCP
between nodes and the node's ranks reading each other in place. destroy_collective_group closes
the rank's endpoint and unlinks its segments (so does the actor's exit).
"""
from __future__ import annotations

from topologies.errors import HcclError


def register() -> None:
    """Register the backend with this process's ray.util.collective (done at import; again is a
    no-op). E_NOT_SUPPORT on a Ray without the backend registry."""
    try:
        from ray.util.collective import register_collective_backend
        from ray.util.collective.backend_registry import BackendRegistry
    except ImportError as exc:
        import ray
        raise HcclError("E_NOT_SUPPORT", f"Ray {ray.__version__} has no ray.util.collective backend registry "
                        f"(register_collective_backend in ray.util.collective, BackendRegistry in "
                        f"ray.util.collective.backend_registry: {exc}), which the hccl_sim backend registers "
                        "with; install a Ray that has it (2.60 does)") from None
    from .group import BACKEND, HcclSimGroup
    registry = BackendRegistry()
    if registry.is_registered(BACKEND):
        if registry.get(BACKEND) is not HcclSimGroup:
            raise HcclError("E_PARA", f"ray.util.collective already has a backend {BACKEND.upper()!r}: "
                            f"{registry.get(BACKEND).__qualname__}, not hccl_sim's")
        return
    register_collective_backend(BACKEND, HcclSimGroup)


register()

from .group import BACKEND, HcclSimGroup, configure, group  # noqa: E402 - after the registry check names what is missing


def last_op(group_name: str = "default"):
    """This rank's record of its last op in the group (Communicator.last_op: .time its simulated
    seconds, .start/.end its clock in ns, .algo what ran); None before the first."""
    return group(group_name).comm.last_op


def communicator(group_name: str = "default"):
    """This rank's Communicator of the group (its clock, device, topology, records)."""
    return group(group_name).comm


__all__ = ["BACKEND", "register", "configure", "last_op", "communicator", "group", "HcclSimGroup"]
