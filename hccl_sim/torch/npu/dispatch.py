"""Every aten op on npu tensors, run by torch's CPU kernels on the tensors' host bytes.

One Python fallback on torch's PrivateUse1 key (torch.library's `fallback`) receives every op
that has a backend kernel; ops torch writes once for all devices (CompositeImplicit/Explicit:
randn, to, zeros, most views) run torch's own code, which reaches the fallback for the backend ops
they are made of. Autograd, views' bookkeeping and version counters sit above the backend key, so
they work as on any device. The fallback:

- a view (every result aliases an input, nothing written) and `set_` (a tensor onto a storage):
  the CPU kernel itself on the npu tensors, which only writes metadata over the npu storage, so the
  view shares it;
- copies across devices (`_copy_from`): a copy between host views;
- any other op: npu tensors become CPU views over their bytes (memory.host_view), a `device=npu`
  argument becomes cpu, the op runs on CPU; a result that is an input (in-place, out=) is that npu
  tensor (resized onto a new storage when the kernel resized it); a result over an input's bytes is
  a view of that npu tensor; a new result becomes a new npu storage charged to the card's HBM.
  Factories that allocate (`empty`, `empty_strided`) are charged before the host allocates, so an
  out-of-memory is raised without touching host memory.

As on a device, a tensor on another device is refused ("Expected all tensors to be on the same
device"): another card's, or a CPU tensor that is not a scalar, except where torch accepts one
(indices of `index`/`index_put`, copies).

Random ops draw from the card's own generator (a CPU generator per card, torch.npu.manual_seed):
its state is swapped into torch's default CPU generator around a seeded op that names no
generator. Seeded alike, a card and the CPU draw the same numbers.
"""
from __future__ import annotations

import torch

from . import devices, memory

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CPU = torch.device("cpu")
_COPIES = ("aten::_copy_from", "aten::_copy_from_and_resize")
_CPU_ALLOWED = ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
                "aten::_index_put_impl")     # torch takes CPU indices for a device tensor
_FACTORIES = ("aten::empty.memory_format", "aten::empty_strided")
_kinds = {}                      # op -> "view" | "copy" | "op"
_generators = {}                 # card index -> its torch.Generator


def generator(index: int) -> torch.Generator:
    g = _generators.get(index)
    if g is None:
        g = _generators[index] = torch.Generator()
    return g


def _kind(op) -> str:
    kind = _kinds.get(op)
    if kind is None:
        s = op._schema
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments)
        if s.name in _COPIES:
            kind = "copy"
        elif s.name == "aten::set_":         # a tensor onto a storage: metadata, as a view
            kind = "view"
        elif s.returns and not writes and all(r.alias_info is not None for r in s.returns):
            kind = "view"
        else:
            kind = "op"
        _kinds[op] = kind
    return kind


def _is_npu(x) -> bool:
    return isinstance(x, torch.Tensor) and x.device.type == "npu"


def _map(x, f):
    if isinstance(x, torch.Tensor):
        return f(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_map(y, f) for y in x)
    return x


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _same_device(op, args, kwargs) -> int | None:
    """The card the op's npu tensors are on (None: none), refusing a mix as a device does."""
    index, other = None, None
    for t in _tensors((args, tuple(kwargs.values()))):
        if t.device.type == "npu":
            if index is None:
                index = t.device.index
            elif t.device.index != index:
                other = t.device
        elif t.dim() > 0 and op._schema.name not in _CPU_ALLOWED:
            other = other or t.device
    if index is not None and other is not None:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"npu:{index} and {other}! (in {op._schema.name})")
    return index


def _copy(op, src, dst, non_blocking=False):
    """`_copy_from(src, dst)`: torch's copy_ across devices, between host views."""
    hs = memory.host_view(src, keep=False) if _is_npu(src) else src
    if op._schema.name.endswith("_and_resize") and dst.shape != src.shape:
        dst.resize_(src.shape)
    hd = memory.host_view(dst, keep=False) if _is_npu(dst) else dst
    hd.copy_(hs)
    return dst


def _factory_block(op, args, kwargs, index):
    """The HBM block of an allocating factory, reserved before the host allocates."""
    if op.name() not in _FACTORIES:
        return None
    size = [int(s) for s in args[0]]
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    item = torch.empty((), dtype=dtype).element_size()
    if op.name() == "aten::empty_strided":
        stride = [int(s) for s in args[1]]
        numel = 0 if 0 in size else 1 + sum((n - 1) * st for n, st in zip(size, stride))
    else:
        numel = 1
        for n in size:
            numel *= n
    return memory.reserve(index, numel * item)


def _seeded(op, args, kwargs) -> bool:
    if torch.Tag.nondeterministic_seeded not in op.tags:
        return False
    for a, v in zip(op._schema.arguments, args):
        if a.name == "generator" and v is not None:
            return False
    return kwargs.get("generator") is None


def _run_seeded(index, op, args, kwargs):
    """The op with card `index`'s generator as torch's default CPU generator."""
    default, own = torch.default_generator, generator(index)
    saved = default.get_state()
    default.set_state(own.get_state())
    try:
        return op(*args, **kwargs)
    finally:
        own.set_state(default.get_state())
        default.set_state(saved)


def fallback(op, *args, **kwargs):
    """The PrivateUse1 kernel of every op torch has no other for (see the module's docstring)."""
    kind = _kind(op)
    if kind == "view":
        return op.redispatch(_CPU_KEYS, *args, **kwargs)
    if kind == "copy":
        return _copy(op, *args, **kwargs)
    index = _same_device(op, args, kwargs)
    dev = kwargs.get("device")
    if isinstance(dev, torch.device) and dev.type == "npu":
        index = devices.check(devices.current if dev.index is None else dev.index)
        kwargs = dict(kwargs, device=_CPU)
    if index is None:            # a factory naming no device: the current card
        index = devices.current
    block = _factory_block(op, args, kwargs, index)
    try:
        out, pairs = _on_host(op, args, kwargs, index, ())
    except RuntimeError as exc:
        if "not resizable" not in str(exc):
            _drop(block, index)
            raise
        # an out= kernel resizing an argument that has bytes: it gets a resizable copy, whose
        # (new) storage the npu argument then takes, as a resize on a device moves it
        written = {id(v) for a, v in _bound(op, args, kwargs) if a.alias_info is not None and a.alias_info.is_write}
        out, pairs = _on_host(op, args, kwargs, index, written)
    except BaseException:
        _drop(block, index)
        raise
    for t, h in pairs.values():  # an out= or in-place result the kernel resized or restrided
        if (h.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() or h.size() != t.size()
                or h.stride() != t.stride() or h.storage_offset() != t.storage_offset()):
            _rebase(t, h, index)
    return _map(out, lambda o: _result(o, pairs, index, block))


def _bound(op, args, kwargs):
    """(schema argument, value) of every argument given."""
    named = list(zip(op._schema.arguments, args))
    named += [(a, kwargs[a.name]) for a in op._schema.arguments if a.name in kwargs]
    return named


def _drop(block, index):
    """Free a factory's block when the factory failed."""
    if block is not None:
        memory.unreserve(index, block)


def _on_host(op, args, kwargs, index, private):
    """Run `op` on CPU over its npu arguments' bytes (those whose id is in `private`: on resizable
    copies). Returns its result and {id(host view): (npu tensor, host view)}."""
    pairs = {}

    def host(t):
        if t.device.type != "npu":
            return t
        h = memory.host_view(t, keep=False)
        if id(t) in private:
            h = h.clone()
        pairs[id(h)] = (t, h)
        return h

    cargs = _map(args, host)
    ckw = {k: _map(v, host) for k, v in kwargs.items()}
    out = _run_seeded(index, op, cargs, ckw) if _seeded(op, args, kwargs) else op(*cargs, **ckw)
    return out, pairs


def _rebase(t, h, index):
    """Point npu tensor `t` at host tensor `h`'s storage and geometry (a kernel resized it)."""
    if h.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
        torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
            _CPU_KEYS, t, t.untyped_storage(), h.storage_offset(), h.size(), h.stride())
        return
    fresh = memory.to_npu(h, index)
    torch.ops.aten.set_.source_Storage_storage_offset.redispatch(
        _CPU_KEYS, t, fresh.untyped_storage(), h.storage_offset(), h.size(), h.stride())


def _result(o, pairs, index, block):
    if o.device.type != "cpu":
        return o
    got = pairs.get(id(o))
    if got is not None:
        return got[0]
    ptr = o.untyped_storage().data_ptr()
    if ptr and o.untyped_storage().nbytes():
        for t, h in pairs.values():      # a result over an input's bytes: a view of that npu tensor
            if h.untyped_storage().data_ptr() == ptr:
                return memory.view_on(t, o)
    return memory.to_npu(o, index, block)


def register(fallback_lib, aten_lib) -> None:
    """The fallback for PrivateUse1 (on `fallback_lib`, torch's global "_" library; a fallthrough
    for AutocastPrivateUse1), and on
    `aten_lib` as the PrivateUse1 kernel of each aten op that has both a CPU kernel and a kernel
    for every device (CompositeExplicitAutograd, e.g. native_layer_norm, native_group_norm): torch
    would run the latter on npu, whose numbers differ from the CPU kernel's in the last bits, and an
    npu run must equal a CPU run. Found in the dispatcher's table, not listed."""
    fallback_lib.fallback(fallback, "PrivateUse1")
    # torch registers no autocast kernels for PrivateUse1 (torch_npu brings its own): under
    # torch.autocast("npu") ops pass through in their own dtypes instead of failing
    fallback_lib.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in torch._C._dispatch_get_all_op_names():
        if (name.startswith("aten::") and has(name, "CPU") and has(name, "CompositeExplicitAutograd")
                and not has(name, "PrivateUse1")):
            base, _, overload = name[len("aten::"):].partition(".")
            op = getattr(getattr(torch.ops.aten, base), overload or "default")
            if not any(a.name == "device" for a in op._schema.arguments):
                aten_lib.impl(op, lambda *args, _op=op, **kwargs: fallback(_op, *args, **kwargs), "PrivateUse1")
