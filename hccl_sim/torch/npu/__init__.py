"""Emulated NPUs for unchanged torch_npu programs: `install()` makes "npu" a torch device whose
tensors live in host memory and are computed by torch's CPU kernels, `torch.npu` its runtime, and
`import torch_npu` a module of what is emulated.

Nothing happens at import: `install()` does it (idempotent), or `import hccl_sim.torch` with
HCCL_SIM_NPU=1. It refuses where a real torch_npu is importable (hccl-sim never shadows one) and
where torch's PrivateUse1 backend already has another name.

- Tensors (dispatch, memory): npu tensors are plain torch.Tensors on PrivateUse1 renamed "npu",
  over host bytes; every aten op runs through one fallback on CPU views of them, so autograd,
  optimizers, `nn.Module.to("npu")`, views written in place, `.cpu()`, `.item()`, printing and
  seeded randomness behave as on CPU, bit for bit. Their storages are charged to the card's
  simulated HBM; running out is torch_npu's OutOfMemoryError.
- `host_tensor(t)`: a CPU tensor sharing npu tensor `t`'s bytes (same shape, strides, offset,
  dtype); writes through either are seen by the other, and it keeps `t`'s storage alive. `is_npu(t)`.
- `torch.npu` and `torch_npu.npu` (runtime): devices, streams and events of the simulated Device,
  memory statistics, generators. Which Device a card is: devices.
- `torch_npu`: a module with `npu` and an extensible `torch_npu.distributed`; any other name is an
  HcclError (E_NOT_SUPPORT) "torch_npu.<name> is not emulated by hccl-sim".
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import torch

from topologies.errors import HcclError

from . import devices, dispatch, distributed, fsdp, memory, runtime
from .errors import NotEmulated

__all__ = ["install", "installed", "host_tensor", "is_npu", "NotEmulated"]

_MARK = "__hccl_sim_emulated__"
_state = {"installed": False, "library": None}


def attach(world) -> None:
    """hccl_sim.torch hands its World over: the rank's communicator holds the rank's Device."""
    devices.attach(world)


def installed() -> bool:
    return _state["installed"]


def is_npu(t) -> bool:
    """Whether `t` is a tensor on an emulated NPU."""
    return isinstance(t, torch.Tensor) and t.device.type == "npu"


def host_tensor(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over npu tensor `t`'s bytes: the same shape, strides, storage offset and dtype;
    writes through it are writes to `t` and the other way round; it keeps `t`'s storage alive.
    Resizing it is refused (its storage is not resizable)."""
    if not is_npu(t):
        got = f"a tensor on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise HcclError("E_PARA", f"host_tensor: expected a tensor on an npu device, got {got}")
    return memory.host_view(t.detach(), keep=True)


def _module(name: str, doc: str) -> types.ModuleType:
    """A module of the emulated torch_npu: names not set on it are not emulated."""
    mod = types.ModuleType(name, doc)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    setattr(mod, _MARK, True)

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise NotEmulated("E_NOT_SUPPORT", f"{name}.{attr} is not emulated by hccl-sim")

    mod.__getattr__ = __getattr__
    return mod


def _refuse_others() -> None:
    """HcclError where a real torch_npu could be imported, or torch's PrivateUse1 backend is
    someone else's."""
    loaded = sys.modules.get("torch_npu")
    if loaded is None or not isinstance(loaded.__dict__.get(_MARK), bool):
        try:
            spec = importlib.util.find_spec("torch_npu")
            # a directory named torch_npu without an __init__ (a namespace package: an examples
            # folder on sys.path, say) is no torch_npu: its spec has no origin
            where = None if spec is None or spec.origin is None else spec.origin
        except (ImportError, ValueError):        # imported already, without a spec
            where = "already imported"
        if where is not None:
            raise HcclError("E_NOT_SUPPORT", f"a real torch_npu is installed ({where}); hccl-sim will not shadow it: "
                            "run on its NPUs, or in an environment without it to emulate them")
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        raise HcclError("E_NOT_SUPPORT", f"torch's PrivateUse1 backend is already {name!r}, registered by something "
                        "other than hccl-sim; emulated NPUs cannot share the process with it")


def _backward_on_calling_thread() -> None:
    """torch's Python device guard reports one device, and the autograd engine keeps one worker
    thread per reported device, indexed by the tensors' device index: a backward on npu:3 would
    find no queue. Run every backward on the thread that calls it, as on CPU (torch's own switch
    for this, set for the call)."""
    import torch.autograd as autograd
    import torch.autograd.graph as graph
    engine = graph._engine_run_backward

    def run_backward(*args, **kwargs):
        with autograd.set_multithreading_enabled(False):
            return engine(*args, **kwargs)

    graph._engine_run_backward = autograd._engine_run_backward = run_backward


def install() -> None:
    """Make "npu" an emulated torch device, `torch.npu` its runtime and `import torch_npu` work
    (see the module's docstring). Idempotent; refused where a real torch_npu is importable."""
    if _state["installed"]:
        return
    _refuse_others()
    torch.utils.rename_privateuse1_backend("npu")
    torch.utils.generate_methods_for_privateuse1_backend()
    torch._register_device_module("npu", runtime)
    if not torch._C._acc.register_python_privateuseone_hook(devices.Hooks()):
        raise HcclError("E_INTERNAL", "torch's PrivateUse1 hooks are already registered: cannot emulate NPUs")
    if not torch._C._acc.register_python_privateuseone_device_guard(devices.Guard()):
        raise HcclError("E_INTERNAL", "torch's PrivateUse1 device guard is already registered: cannot emulate NPUs")
    libs = torch.library.Library("_", "IMPL"), torch.library.Library("aten", "IMPL")
    dispatch.register(*libs)
    _state["library"] = libs         # registrations last as long as their Library objects
    _backward_on_calling_thread()
    memory.patch_storage_constructor()
    devices.patch_default_index()
    top = _module("torch_npu", "torch_npu as hccl-sim emulates it (hccl_sim.torch.npu).")
    dist = _module("torch_npu.distributed", "torch_npu.distributed as hccl-sim emulates it: filled by the "
                   "distributed part of the emulation; names not set on it are not emulated.")
    top.npu, top.distributed = runtime, dist
    sys.modules.update({"torch_npu": top, "torch_npu.npu": runtime, "torch_npu.distributed": dist})
    distributed.install(devices.attached_world(), top, _module)
    fsdp.install()
    _state["installed"] = True
