"""The declared shapes hold: every implementation of a contract (Transport, ControlPlane, DataPlane,
MemoryProvider, the engine's RankGroup) provides every member its base declares, callable as the
base declares it, and no engine dispatches on which implementation it holds.

Implementations are found by walking the bases' subclasses after importing every module of
hcomm and of the engines, so a new transport, plane or group is checked without being listed."""
import ast
import importlib
import inspect
import pathlib
import pkgutil

import pytest

import hccl_sim
import hcomm
from hccl_sim.comm.rank_group import RankGroup
from hcomm.control.base import ControlPlane
from hcomm.exec.planes import DataPlane
from hcomm.memory.provider import MemoryProvider
from hcomm.transports.base import Transport

pytestmark = pytest.mark.unit

ROOT = pathlib.Path(hccl_sim.__file__).resolve().parent.parent

# the implementations that exist today: discovery must find at least these (it finds new ones too)
KNOWN = {
    Transport: {"InProcessTransport", "SocketTransport", "RayObjectTransport", "MpiTransport", "ScopedTransport",
                "WatchedTransport"},
    ControlPlane: {"ShmControl", "NodeControl", "TransportControl", "RankControl"},
    DataPlane: {"SharedPlane", "HostedPlane", "PerRankPlane"},
    MemoryProvider: {"SegmentProvider", "WindowProvider"},
    RankGroup: {"LocalGroup", "PeerGroup", "RayGroup", "MpiSubGroup", "MpiGroup", "LaunchedGroup"},
}


def _import_everything():
    for pkg in (hcomm, importlib.import_module("hccl_sim.engines")):
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(info.name)


def _concrete(base):
    _import_everything()
    found, todo = {}, [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if not inspect.isabstract(sub) and sub.__module__.split(".")[0] in ("hcomm", "hccl_sim"):
                found[sub.__name__] = sub
    return found


def _declared(base):
    """The public members `base` declares: methods (with their signatures), properties and annotated
    or assigned attributes."""
    names = {n for n in dir(base) if not n.startswith("_")}
    names |= {n for n in getattr(base, "__annotations__", {}) if not n.startswith("_")}
    return sorted(names)


def _accepts(impl_fn, base_fn) -> bool:
    """Whether `impl_fn` can be called every way `base_fn` can (positionally, with the base's
    optional parameters left out or given)."""
    base = [p for p in inspect.signature(base_fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    sig = inspect.signature(impl_fn)
    required = [p for p in base if p.default is p.empty]
    try:
        sig.bind(*[None] * len(required))
        sig.bind(*[None] * len(base))
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("base", list(KNOWN), ids=lambda b: b.__name__)
def test_every_implementation_provides_every_member(base):
    impls = _concrete(base)
    assert KNOWN[base] <= set(impls), f"{base.__name__}: not found {KNOWN[base] - set(impls)}"
    missing = []
    for name, cls in sorted(impls.items()):
        for member in _declared(base):
            declared = inspect.getattr_static(base, member, None)
            if not hasattr(cls, member) and member not in _instance_attributes(cls):
                missing.append(f"{name}.{member}")
            elif inspect.isfunction(declared):
                got = inspect.getattr_static(cls, member)
                if not inspect.isfunction(got) or not _accepts(got, declared):
                    missing.append(f"{name}.{member}{inspect.signature(got) if inspect.isfunction(got) else ''} "
                                   f"does not take {base.__name__}.{member}{inspect.signature(declared)}")
    assert not missing, "\n".join(missing)


def _instance_attributes(cls) -> set:
    """Attributes an implementation sets in its __init__ (self.x = ...), up its own hierarchy."""
    names = set()
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or not inspect.isfunction(init):
            continue
        tree = ast.parse(inspect.getsource(init).strip() if not inspect.getsource(init).startswith(" ")
                         else "if 1:\n" + inspect.getsource(init))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            for t in targets:
                for e in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name) and e.value.id == "self":
                        names.add(e.attr)
    return names


def test_the_known_members_are_instance_attributes_where_not_class_ones():
    """The attribute check above is real: a transport without `size` would be found."""
    class NoSize(Transport):
        def __init__(self):
            self.timeout_s = None
    assert "size" not in _instance_attributes(NoSize) and not hasattr(NoSize, "size")
    assert "timeout_s" in _instance_attributes(NoSize)


def test_no_engine_dispatches_on_an_implementation_type():
    """Engines and the Communicator ask a transport, control plane or data plane what it does (its
    declared members), never which class it is."""
    names = set()
    for base in KNOWN:
        names |= set(_concrete(base)) | {base.__name__}
    names -= {"RankGroup"}
    offenders = []
    for path in list((ROOT / "hccl_sim").rglob("*.py")) + list((ROOT / "hcomm" / "exec").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass") \
                    and len(node.args) == 2:
                kinds = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
                hit = {k.id for k in kinds if isinstance(k, ast.Name)} & names
                if hit:
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(hit)}")
    assert not offenders, "\n".join(offenders)


def test_a_group_holds_one_data_plane_whose_name_the_registry_lists():
    """Every engine's plane names are the registry's; a peer group's data_plane is its plane's."""
    from hccl_sim.engines.registry import ENGINES
    from hccl_sim.engines.ray.planes import PLANES as RAY
    from hccl_sim.engines import local, mpi
    assert tuple(RAY) == ENGINES["ray"].data_planes
    assert tuple(mpi.PLANES) == ENGINES["mpi"].data_planes
    assert tuple(local.PLANES) == ENGINES["local"].data_planes
    from hcomm.memory.segment_provider import SegmentProvider
    from hcomm.memory.window_provider import WindowProvider
    from hcomm.transports.mpi.endpoint import MpiTransport
    from hcomm.transports.ray_object import RayObjectTransport
    from hcomm.transports.socket import SocketTransport
    assert {SegmentProvider.plane, SocketTransport.plane, RayObjectTransport.plane} == set(ENGINES["ray"].data_planes)
    assert {WindowProvider.plane, MpiTransport.plane} == set(ENGINES["mpi"].data_planes)
    assert {SegmentProvider.plane, SocketTransport.plane} == set(ENGINES["torchrun"].data_planes)
