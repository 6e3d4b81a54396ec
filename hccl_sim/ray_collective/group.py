"""The hccl_sim backend's group: ray.util.collective's BaseGroup over a rank's Communicator.

Ray constructs it as `HcclSimGroup(world_size, rank, group_name)` inside the actor, from
init_collective_group or, for a group create_collective_group declared, from the actor's first op
on it. The constructor meets the group's other actors (engines.ray.kv_store.meet: Ray's KV, then
torchrun's connect) on the topology the process chose for the name (`configure`), else
HCCL_SIM_TOPOLOGY, else one 910B server filled by the group's ranks.

Ray hands every op its tensors wrapped in lists (one per GPU of its multi-GPU calls) and its
options types; results go into the given tensors, as Ray's contract says: allreduce, broadcast
and the root's reduce in place, allgather into the output list, reducescatter into the output
tensor, recv into the given tensor. numpy arrays and torch CPU tensors are taken as they are
(a tensor's storage as a numpy array, hccl_sim.torch.tensors), so writing the result writes the
tensor. Every wait is bounded by HCCL_EXEC_TIMEOUT (the communicator's); an op given Ray's per-op
timeout_ms is refused (E_NOT_SUPPORT), as hccl-sim has no per-op deadline.
"""
from __future__ import annotations

import atexit
import os
import sys

import numpy as np
from ray.util.collective.collective_group.base_collective_group import BaseGroup
from ray.util.collective.types import ReduceOp, unset_timeout_ms

from topologies import Topology
from topologies.errors import Cause, HcclError

from ..config.types import dtype_name
from ..engines.ray.kv_store import meet
from ..engines.torchrun import DEFAULT_TOPOLOGY, ENV, config_from_env, topology_from_spec

BACKEND = "hccl_sim"
_OPS = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min", ReduceOp.MAX: "max"}

_live: dict = {}          # group name -> this process's HcclSimGroup of that name
_chosen: dict = {}        # group name -> {"topology": ..., "env": ...} from configure()


def configure(group_name: str = "default", *, topology=None, env=None) -> None:
    """What this process's next group named `group_name` runs on (kept for later re-inits):
    `topology`, a Topology or HCCL_SIM_TOPOLOGY's form ("atlas800t-a2:servers=2", "fullmesh", a
    rank-table path), over HCCL_SIM_TOPOLOGY; `env`, HCCL's variables (HCCL_ALGO, HCCL_BUFFSIZE,
    ...) over the process's environment. Every rank of the group must choose alike."""
    if not isinstance(group_name, str) or not group_name:
        raise HcclError("E_PARA", f"configure: group_name must be a non-empty string, got {group_name!r}")
    if topology is not None and not isinstance(topology, (str, Topology)):
        raise HcclError("E_PARA", f"configure: topology must be a Topology or a preset spec string, got "
                        f"{type(topology).__name__}")
    if env is not None and not isinstance(env, dict):
        raise HcclError("E_PARA", f"configure: env must be a dict of HCCL variables, got {type(env).__name__}")
    _chosen[group_name] = {"topology": topology, "env": env}


def group(group_name: str = "default") -> "HcclSimGroup":
    """This process's live hccl_sim group of that name."""
    found = _live.get(group_name)
    if found is None:
        names = ", ".join(repr(n) for n in sorted(_live)) or "none"
        raise HcclError("E_PARA", f"no hccl_sim collective group named {group_name!r} in this process (live: {names}); "
                        "init_collective_group makes one, or the first op on a group create_collective_group declared")
    return found


def _topology(name: str, world_size: int):
    chosen = _chosen.get(name, {}).get("topology")
    started = f"collective group {name!r} has world_size {{}}"
    if chosen is None:
        return topology_from_spec(os.environ.get(ENV, DEFAULT_TOPOLOGY), world_size, started=started)
    if isinstance(chosen, str):
        return topology_from_spec(chosen, world_size, source=f"configure({name!r}, topology)", started=started)
    if chosen.num_ranks != world_size:
        raise HcclError("E_PARA", f"configure({name!r}, topology): {chosen.name} has {chosen.num_ranks} ranks but "
                        f"{started.format(world_size)}: they must be equal")
    return chosen


class HcclSimGroup(BaseGroup):
    """One rank of a ray.util.collective group on an emulated NPU; `comm` is its Communicator."""

    def __init__(self, world_size: int, rank: int, group_name: str):
        super().__init__(world_size, rank, group_name)
        topo = _topology(group_name, world_size)
        config = config_from_env(topo, _chosen.get(group_name, {}).get("env"))
        self._launched = meet(group_name, rank, world_size, topo, config)
        self.comm = self._launched.comm
        _live[group_name] = self
        # an actor that exits without destroy_collective_group (its handles gone, exit_actor) still
        # says goodbye and unlinks its segments and its rings to node peers (the transport's)
        atexit.register(self.destroy_group)

    @classmethod
    def backend(cls):
        return BACKEND.upper()            # Ray's registry keys (and its Backend attributes) are upper case

    @classmethod
    def check_backend_availability(cls) -> bool:
        return True                       # numpy is all it needs; torch tensors only when given

    def destroy_group(self):
        """Say goodbye to the peers, close the endpoint, unlink this rank's segments; once."""
        if self._launched is not None:
            launched, self._launched = self._launched, None
            if _live.get(self.group_name) is self:
                del _live[self.group_name]
            atexit.unregister(self.destroy_group)
            launched.close()

    # ---- Ray's arguments as numpy arrays --------------------------------------------------------
    def _bad(self, op: str, reason: str, code: str = "E_PARA") -> HcclError:
        return HcclError(code, reason, rank=self.rank, op=op, cause=Cause.BAD_INPUT)

    def _usable(self, op: str, options=None):
        if self._launched is None:
            raise self._bad(op, f"collective group {self.group_name!r} was destroyed")
        if options is not None and options.timeout_ms != unset_timeout_ms:
            raise self._bad(op, f"timeout_ms={options.timeout_ms}: hccl-sim bounds every wait by the communicator's "
                            "HCCL_EXEC_TIMEOUT (HCCL's own), not per op; set that instead (the process environment, "
                            "or hccl_sim.ray_collective.configure(name, env={'HCCL_EXEC_TIMEOUT': ...}))", "E_NOT_SUPPORT")
        return self.comm

    def _array(self, t, op: str, what: str) -> np.ndarray:
        """t as a numpy array (a tensor's own storage), of a type HCCL has: checked here, before any
        wait, so that a receive into a tensor no send could fill fails at once, as its send does."""
        torch = sys.modules.get("torch")         # a torch tensor exists only where torch is imported
        if isinstance(t, np.ndarray):
            x = t
        elif torch is not None and isinstance(t, torch.Tensor):
            from ..torch.tensors import as_numpy
            try:
                x = as_numpy(t)
            except HcclError as exc:
                raise self._bad(op, f"{what}: {exc.reason}") from None
        else:
            raise self._bad(op, f"{what} is a {type(t).__name__}: the hccl_sim backend takes numpy arrays and torch "
                            "CPU tensors")
        try:
            dtype_name(x.dtype)
        except HcclError as exc:
            raise self._bad(op, f"{what}: {exc.reason}") from None
        return x

    def _one(self, tensors, op: str, what: str = "tensor") -> np.ndarray:
        """The one tensor Ray wraps in a list (a list per GPU on its multi-GPU calls)."""
        if not isinstance(tensors, (list, tuple)) or len(tensors) != 1:
            raise self._bad(op, f"one {what} per rank (an emulated NPU per actor); got "
                            f"{len(tensors) if isinstance(tensors, (list, tuple)) else type(tensors).__name__}: "
                            "ray.util.collective's multi-GPU calls are not supported", code="E_NOT_SUPPORT")
        return self._array(tensors[0], op, what)

    def _blocks(self, lists, like: np.ndarray, op: str, what: str) -> list:
        """The world_size tensors of a list Ray wraps in a list, each of `like`'s shape and dtype."""
        if not isinstance(lists, (list, tuple)) or len(lists) != 1 or not isinstance(lists[0], (list, tuple)):
            raise self._bad(op, f"one list of {what}s per rank: ray.util.collective's multi-GPU calls are not "
                            "supported", code="E_NOT_SUPPORT")
        blocks = [self._array(t, op, f"{what} {i}") for i, t in enumerate(lists[0])]
        if len(blocks) != self.world_size:
            raise self._bad(op, f"{len(blocks)} {what}s for a group of {self.world_size} ranks: one per rank")
        for i, b in enumerate(blocks):
            if b.shape != like.shape or b.dtype != like.dtype:
                raise self._bad(op, f"{what} {i} has shape {b.shape} and dtype {b.dtype}; every one must have the "
                                f"tensor's shape {like.shape} and dtype {like.dtype}")
        return blocks

    def _op(self, options, op: str) -> str:
        reduce_op = ReduceOp.SUM if options is None else options.reduceOp
        if reduce_op not in _OPS:
            raise self._bad(op, f"reduce op {reduce_op!r}: expected one of ray.util.collective.ReduceOp's "
                            f"{', '.join(o.name for o in _OPS)}")
        return _OPS[reduce_op]

    # ---- ray.util.collective's ops (its options may be None, an instance or the class itself) ----
    def allreduce(self, tensor, allreduce_options=None):
        comm, x = self._usable("allreduce", allreduce_options), self._one(tensor, "allreduce")
        comm.all_reduce(x, op=self._op(allreduce_options, "allreduce"), out=x)

    def barrier(self, barrier_options=None):
        self._usable("barrier", barrier_options).barrier()

    def reduce(self, tensor, reduce_options=None):
        comm, x = self._usable("reduce", reduce_options), self._one(tensor, "reduce")
        root = 0 if reduce_options is None else reduce_options.root_rank
        comm.reduce(x, root=root, op=self._op(reduce_options, "reduce"), out=x)    # only the root's is written

    def broadcast(self, tensor, broadcast_options=None):
        comm, x = self._usable("broadcast", broadcast_options), self._one(tensor, "broadcast")
        comm.broadcast(x, root=0 if broadcast_options is None else broadcast_options.root_rank, out=x)

    def allgather(self, tensor_list, tensor, allgather_options=None):
        comm, x = self._usable("allgather", allgather_options), self._one(tensor, "allgather")
        outs = self._blocks(tensor_list, x, "allgather", "output tensor")
        got = comm.all_gather(x.reshape(-1))          # rank blocks end to end along axis 0
        for i, out in enumerate(outs):
            np.copyto(out, got[i * x.size:(i + 1) * x.size].reshape(x.shape))

    def reducescatter(self, tensor, tensor_list, reducescatter_options=None):
        comm, out = self._usable("reducescatter", reducescatter_options), self._one(tensor, "reducescatter", "output tensor")
        blocks = self._blocks(tensor_list, out, "reducescatter", "input tensor")
        # HCCL's ReduceScatter input is the rank blocks end to end: the list's tensors, in order
        flat = np.concatenate([b.reshape(-1) for b in blocks]) if blocks else out.reshape(-1)
        got = comm.reduce_scatter(flat, op=self._op(reducescatter_options, "reducescatter"))
        np.copyto(out, got.reshape(out.shape))

    def send(self, tensor, send_options):
        comm, x = self._usable("send"), self._one(tensor, "send")
        n = send_options.n_elements
        comm.send(x.reshape(-1)[:n] if n else x, dst=send_options.dst_rank)

    def recv(self, tensor, recv_options):
        comm, x = self._usable("recv"), self._one(tensor, "recv")
        n = recv_options.n_elements
        if n and not x.flags.c_contiguous:
            raise self._bad("recv", "n_elements needs a contiguous tensor (its first n elements are written)")
        target = x.reshape(-1)[:n] if n else x
        got = comm.recv(src=recv_options.src_rank)
        if got.dtype != target.dtype or got.size != target.size:
            raise self._bad("recv", f"rank {recv_options.src_rank} sent {got.size} {got.dtype} elements; the receive "
                            f"tensor takes {target.size} {target.dtype}")
        np.copyto(target, got.reshape(target.shape))
