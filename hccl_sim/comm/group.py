"""`with comm.group():` (HCCL's HcclGroupStart / HcclGroupEnd, framework/group/hccl_group.cc):
the sends, receives and collectives a rank issues inside the group are held and launched when
the outermost group ends.

As HCCL does it: the group is the calling thread's (a rank's), it nests (only the outermost end
launches), and it spans every communicator used inside it; at the end, communicator by
communicator in the order they were first used, all point-to-point calls run as one
BatchSendRecv, then the collectives: the fixed-size ones by data volume, largest first
(calcOpDataVolume: the input's bytes, ReduceScatter's and Scatter's output bytes; a stable
sort), then the variable-size ones in issue order (their volume differs by rank). Every call
inside the group returns a `Pending`, whose result is there once the group has ended.

Where hccl-sim is stricter than HCCL, which returns success from HcclGroupEnd whatever happened:
the first failure is raised at the group's end (the calls after it are not launched); a group
left by an exception launches nothing. What HCCL does not group is E_NOT_SUPPORT inside one:
barriers (doLaunches has no case for them), BatchSendRecv ("may not be called inside a P2P
group"), communicator management (split, shrink), and any group on 910A. A group's send and
receive carry no tag (HCCL's have none): only tag 0.
"""
from __future__ import annotations

import threading

from topologies.errors import Cause, HcclError

from ..npu.device import Work

class _ThreadGroups(threading.local):
    """This thread's group nesting (HCCL's thread-local depth) and, while inside, its held calls."""
    depth = 0
    held = None


_state = _ThreadGroups()


def active() -> bool:
    """Whether this thread is inside a group."""
    return _state.depth > 0


class Pending:
    """What a call inside `comm.group()` returns: `wait()` (or `.result`) gives its result once
    the group has ended (a Work's, waited for, when the call had a stream)."""
    __slots__ = ("op", "_done", "_value")

    def __init__(self, op: str):
        self.op, self._done, self._value = op, False, None

    def is_completed(self) -> bool:
        return self._done

    def wait(self):
        if not self._done:
            raise HcclError("E_PARA", f"{self.op} was issued inside comm.group(): its result is there once the group "
                            "has ended")
        value = self._value
        return value.wait() if isinstance(value, Work) else value

    @property
    def result(self):
        return self.wait()

    def _set(self, value):
        self._done, self._value = True, value


class _Held:
    """The calls one communicator has held in the group."""
    __slots__ = ("p2p", "collectives")

    def __init__(self):
        self.p2p, self.collectives = [], []


class GroupedLaunch:
    """The context manager `comm.group()` returns."""

    def __init__(self, comm):
        self.comm = comm

    def __enter__(self):
        if not self.comm.topology.device_model.group_calls:
            raise HcclError("E_NOT_SUPPORT", "comm.group() does not run on 910A: HCCL's group calls are not supported "
                            "on Atlas training series (HcclGroupStart)", rank=self.comm.rank, op="group")
        depth = _state.depth
        if depth == 0:
            _state.held = {}                  # communicator -> _Held, in the order first used
        _state.depth = depth + 1
        return self

    def __exit__(self, kind, exc, tb):
        _state.depth -= 1
        if _state.depth:
            return False
        held, _state.held = _state.held, None
        if kind is None:
            for comm, calls in held.items():
                launch(comm, calls)
        return False


def _held(comm) -> _Held:
    got = _state.held.get(comm)
    if got is None:
        got = _state.held[comm] = _Held()
    return got


def refuse(comm, op: str, what: str):
    """E_NOT_SUPPORT for a call HCCL does not group."""
    raise HcclError("E_NOT_SUPPORT", f"{op} inside comm.group(): {what}", rank=comm.rank, op=op,
                    cause=Cause.BAD_INPUT)


def hold_collective(comm, op: str, run, volume) -> Pending:
    """Hold a collective (`run()` launches it); `volume`: its data volume, None for a
    variable-size op (launched after the others, in issue order)."""
    pending = Pending(op)
    _held(comm).collectives.append((volume, run, pending))
    return pending


def hold_p2p(comm, op: str, kind: str, peer: int, array, tag: int) -> Pending:
    if tag != 0:
        raise HcclError("E_PARA", f"{op} inside comm.group() with tag {tag}: a group's sends and receives carry no "
                        "tag (HCCL's have none); use tag 0", rank=comm.rank, op=op, cause=Cause.BAD_INPUT)
    pending = Pending(op)
    _held(comm).p2p.append((kind, peer, array, pending))
    return pending


def launch(comm, calls: _Held) -> None:
    """One communicator's held calls: the point-to-point ones as one batch, then the collectives."""
    from .p2p import run_batch
    if calls.p2p:
        done = run_batch(comm, [(kind, peer, arr) for kind, peer, arr, _ in calls.p2p], any_size=True)
        for (_, _, _, pending), item in zip(calls.p2p, done):      # the batch keeps the items' order
            pending._set(item.result())
    fixed = [c for c in calls.collectives if c[0] is not None]
    variable = [c for c in calls.collectives if c[0] is None]
    for _, run, pending in sorted(fixed, key=lambda c: -c[0]) + variable:
        pending._set(run())
