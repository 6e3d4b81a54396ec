"""Which emulated NPU a card index ("npu:i") is, and the process's current card.

The cards are those of the rank's server in the topology: the world communicator's once this
process has one (hccl_sim.torch's World, handed here by `attach`), before that the topology
HCCL_SIM_TOPOLOGY names, as the torch backend reads it (hccl_sim.engines.torchrun; for a process no
launcher started, WORLD_SIZE unset, the whole topology: a hardware preset is one full server), the
server RANK's. `device_count()` is how many cards that server has.

The simulated Device (hccl_sim.npu.device) whose HBM a card's tensors take is the rank's, its
communicator's `device`, when the card is the rank's; otherwise (no communicator yet: a script's
`set_device(local_rank)` and `model.to("npu")` come before `init_process_group`; or another card of
the server) a standalone Device of the topology's device model for that card, made on first use
and kept for the process. A storage frees its block on the Device it was charged to.
"""
from __future__ import annotations

import os

import torch

from topologies.errors import HcclError

_world = None                    # hccl_sim.torch's World (attach)
_topology = None                 # the topology before a communicator exists
_standalone = {}                 # card index -> the standalone Device of that card
current = 0                      # the current card (torch.npu.set_device)


def attach(world) -> None:
    """Where the rank's communicator is found (hccl_sim.torch's World)."""
    global _world
    _world = world


def attached_world():
    """hccl_sim.torch's World (attach), which makes the groups of backend "hccl"."""
    if _world is None:
        raise HcclError("E_INTERNAL", "emulated NPUs installed before hccl_sim.torch handed its World over")
    return _world


def _comm():
    return None if _world is None else _world.comm


def topology():
    """The topology the cards are read from (see the module's docstring)."""
    global _topology
    comm = _comm()
    if comm is not None:
        return comm.topology
    if _topology is None:
        from ...engines.torchrun import topology_from_env
        size = os.environ.get("WORLD_SIZE")
        _topology = topology_from_env(int(size) if size else None)
    return _topology


def _server(topo) -> int:
    comm = _comm()
    if comm is not None:
        return topo.server_of[comm.rank]
    rank = int(os.environ.get("RANK", "0") or 0)
    return topo.server_of[rank] if 0 <= rank < topo.num_ranks else 0


def _cards(topo) -> dict:
    """card index -> a rank of that card on this process's server."""
    server = _server(topo)
    return {d: r for r, (s, d) in reversed(list(enumerate(zip(topo.server_of, topo.device_of)))) if s == server}


def device_count() -> int:
    cards = _cards(topology())
    return max(cards) + 1 if cards else 0


def index_of(device, optional: bool = True) -> int:
    """The card index of `device` (an int, "npu", "npu:i", a torch.device; None: the current card),
    checked against the server's cards."""
    if device is None:
        return current
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "npu":
            raise HcclError("E_PARA", f"{device} is not an npu device")
        index = current if device.index is None else device.index
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    else:
        raise HcclError("E_PARA", f"not a device: {device!r} (an int, 'npu:i' or torch.device('npu', i))")
    return check(index)


def check(index: int) -> int:
    n = device_count()
    if not 0 <= index < n:
        raise HcclError("E_PARA", f"npu:{index}: invalid device, this emulated server has NPUs 0..{n - 1} "
                        f"(torch.npu.device_count() = {n}, topology {topology().name})")
    return index


def set_current(device) -> None:
    global current
    current = index_of(device)


def device_for(index: int):
    """The simulated Device whose HBM card `index`'s tensors take (see the module's docstring)."""
    comm = _comm()
    topo = topology()
    if comm is not None and comm.device.device_id == index and comm.device.server == _server(topo):
        return comm.device
    dev = _standalone.get(index)
    if dev is None:
        from ...npu.device import Device
        rank = _cards(topo).get(check(index))
        dev = _standalone[index] = Device(rank, topo)
    return dev


class Hooks(torch._C._acc.PrivateUse1Hooks):
    """torch's PrivateUse1 hooks: the emulated NPUs are always there."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class Guard(torch._C._acc.DeviceGuard):
    """torch's device guard for "npu". torch's Python guard answers device 0 and one device for
    every call: the current card is kept here instead (torch.npu.current_device); where torch asks
    the guard for it, see patch_default_index; the autograd engine's one device, hccl_sim.torch.npu's
    `_backward_on_calling_thread`."""

    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _indexed(d):
    """`d` with the current card's index when it is "npu" without one; anything else as it is."""
    if isinstance(d, str) and d == "npu" or isinstance(d, torch.device) and d.type == "npu" and d.index is None:
        return torch.device("npu", current)
    return d


def patch_default_index() -> None:
    """torch's C++ fills a device without an index from the device guard (`ensure_has_index` of
    `Tensor.to`, `torch.tensor`), and torch's Python guard always answers 0: "npu" would be npu:0
    whatever `torch.npu.set_device` chose. These entry points give it the current card first, as
    torch_npu's guard does. (Factories such as `torch.zeros(device="npu")` reach the dispatcher
    without an index, and dispatch.fallback takes the current card itself.)"""
    to = torch.Tensor.to

    def tensor_to(self, *args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _indexed(kwargs["device"])
        return to(self, *(_indexed(a) for a in args), **kwargs)

    tensor_to.__doc__ = to.__doc__
    torch.Tensor.to = tensor_to
    for name in ("tensor", "as_tensor"):
        made = getattr(torch, name)

        def factory(*args, _made=made, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _indexed(kwargs["device"])
            return _made(*args, **kwargs)

        factory.__doc__, factory.__name__ = made.__doc__, name
        setattr(torch, name, factory)
