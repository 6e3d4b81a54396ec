"""What a hccl_sim ProcessGroup's ops return and where they run: torch Works over futures, and the
group's one worker thread.

Every op of a group is a job on the group's worker, in the order torch issued them (so every rank
issues its ops to hccl-sim in issue order, asynchronous or not, and one thread alone uses the
rank's Communicator). A collective's job runs it and completes its Work. A send or receive's job
only starts it (Communicator.isend / irecv) and leaves its Request pending: the worker tests its
pending Requests after every job and, with nothing else to do, until they complete, so transfers
issued in any order complete as gloo's do (a batch of isends and irecvs never deadlocks).

A job never runs on the thread that waits for it, though that would save a hand-off: the
program's thread has torch modes of its own (a device timeline's took an op's AVG divide for a
read of its output and waited for the op's own end), and a wait bounded by a timeout must
return while its op still waits for its peers (docs/design.md, torch contract).
"""
from __future__ import annotations

import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist

from topologies.errors import Cause, HcclError

_IDLE_SLICE_S = 0.002         # longest sleep of a worker with Requests pending and no job


class FutureWork(dist.Work):
    """A torch Work over a torch Future the worker completes. torch's `_create_work_from_future`
    drops a failed future's exception (its wait() returns True), so a failed op would pass
    unnoticed: here wait() and get_future().wait() raise the HcclError, `exception()` returns it."""

    def __init__(self, fut, world, request=None, timeout_s=None):
        super().__init__()
        self.sim = None                  # when the op ends in simulated time, under a timeline
        self._world = world              # the process's World: the timeline that waits for the op
        self._fut = fut
        self._chained = None             # get_future's
        self._request = request          # a receive's Request: the source rank it took from
        self._timeout_s = timeout_s      # the group's timeout: what a wait() without one waits at most
        self._kept_in = None             # the Worker's `kept` while C++ alone holds this Work
        self._done = threading.Event()
        fut.add_done_callback(lambda _: self._done.set())

    def wait(self, timeout=None):
        explicit = timeout is not None and timeout != timedelta(0)
        seconds = (timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)) if explicit \
            else self._timeout_s
        if seconds is not None and not self._done.wait(seconds):
            raise dist.DistBackendError(f"hccl_sim: Timed out after {seconds:g} s waiting for the op to complete "
                                        f"({'Work.wait' if explicit else 'the process group'}'s timeout)")
        try:
            self._fut.wait()             # raises what the op raised
        except _Stopped as stopped:
            raise stopped.stop from None
        finally:
            if self._kept_in is not None:
                self._kept_in.pop(id(self), None)
                self._kept_in = None
        if self.sim is not None:         # the compute stream waits for it, as on an NPU
            tl = self._world.timeline
            if tl is not None:
                tl.join(self.sim)
        return True

    def get_future(self):
        """The op's future as C++ callers (DDP's reducer, torch's comm hooks) need it: a failed op is
        an error of the future itself, which they raise as a RuntimeError of its words (a Python
        future's set_exception is only a result they would take for tensors, and crash on). Its
        Python wait() raises that RuntimeError too; Work.wait() raises the HcclError itself."""
        if self._chained is None:
            self._chained = self._fut.then(_unwrapped)
        return self._chained

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        return self._fut.done() and self.exception() is None

    def exception(self):
        if not self._fut.done():
            return None
        try:
            self._fut.value()
        except Exception as exc:          # noqa: BLE001 - what the op raised is the answer
            return exc
        return None

    def _source_rank(self):
        if self._request is None:
            raise HcclError("E_PARA", "only a receive's Work has a source rank")
        self._fut.wait()
        return self._request.source


class _Stopped(Exception):
    """Carries the fault plan's stop of this rank (RankStalled, a BaseException so that the rank's
    own handlers cannot outlive it) through a torch future, which takes only Exceptions; a Work's
    wait() raises what it carries."""

    def __init__(self, stop):
        super().__init__(str(stop))
        self.stop = stop


def _fail(fut, exc) -> None:
    """Complete a Work's future with the op's failure."""
    fut.set_exception(exc if isinstance(exc, Exception) else _Stopped(exc))


def _error_of(fut):
    """What a completed Work future failed with (the stop it carries, for a stall), or None."""
    try:
        fut.value()
    except _Stopped as stopped:
        return stopped.stop
    except Exception as exc:          # noqa: BLE001 - what the op raised is the answer
        return exc
    return None


def _unwrapped(fut):
    """A Work future's value, or the error the op failed with raised (see FutureWork.get_future)."""
    return fut.value()


class Deferred:
    """What a job returns to leave its Work pending on a Communicator Request: `finish(request)`
    gives the Work's result once the Request is complete; `failed(exc)`, if given, is told when
    it fails instead."""
    __slots__ = ("request", "finish", "failed")

    def __init__(self, request, finish, failed=None):
        self.request, self.finish, self.failed = request, finish, failed


class Worker:
    """One thread running a group's jobs in issue order, and moving its pending Requests on."""

    def __init__(self, name, world, timeout_s=None):
        self.world = world               # the process's World, which the group's Works know
        self.timeout_s = timeout_s       # the group's timeout, if torch gave one
        self._jobs = queue.SimpleQueue()
        self._pending = []               # (Deferred, Future or None), in issue order
        self.issued = 0                  # jobs submitted so far (the group's sequence number)
        self._collecting = None          # the Works submitted since collect(), while coalescing
        self.kept = {}                   # id -> Work held for a C++ caller's wait (keep_until_waited)
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=f"hccl-torch-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn, receive=False) -> FutureWork:
        """Run fn() on the worker; the Work completes with what it returns (or, when it returns
        a Deferred, with its finish once its Request completes). `receive`: the Work of a
        receive, which knows its source rank."""
        if self._stopped:
            raise HcclError("E_PARA", "this process group was destroyed (dist.destroy_process_group): its ops can no "
                            "longer run; a module that kept the group from before (torch.distributed.nn.functional's "
                            "default group is the one at its import) must be given the new group", cause=Cause.BAD_INPUT)
        fut = torch.futures.Future()
        self.issued += 1
        holder = [] if receive else None
        self._jobs.put((fn, fut, holder))
        work = FutureWork(fut, self.world, _SourceOf(holder) if receive else None, self.timeout_s)
        if self._collecting is not None:
            self._collecting.append(fut)
        return work

    def held(self):
        """(future, Work) of an op held for a later job (torch_npu's _group_start), which completes
        the future with `complete`."""
        fut = torch.futures.Future()
        self.issued += 1
        work = FutureWork(fut, self.world, None, self.timeout_s)
        if self._collecting is not None:
            self._collecting.append(fut)
        return fut, work

    def complete(self, fut, value=None, error=None) -> None:
        """Complete a held op's future with its value, or fail it (once)."""
        if fut.done():
            return
        if error is None:
            fut.set_result(value)
        else:
            self.world.note_failure(error)
            _fail(fut, error)

    def keep_until_waited(self, work: FutureWork) -> FutureWork:
        """Hold `work` until it is waited: a Work handed to C++ without torch's holder (a
        dispatcher kernel's result) keeps its Python part only while Python refers to it, and once
        that part is gone C++'s wait() runs the base Work's, which nothing ever completes (it
        hung whenever the op finished before the caller waited)."""
        work._kept_in = self.kept
        self.kept[id(work)] = work
        return work

    def collect(self) -> None:
        """Keep the Works submitted from now on, for `collected` (torch's start of coalescing)."""
        self._collecting = []

    def collected(self) -> FutureWork:
        """One Work over those submitted since `collect`: done when all are, failed as the first
        that failed (torch's end of coalescing)."""
        futs, self._collecting = self._collecting or [], None
        fut = torch.futures.Future()
        pending = [len(futs)]
        # a future already complete runs its callback here, on the issuing thread, while the
        # worker completes the others on its own: the count is one lock's (an unguarded `-= 1`
        # from both threads lost a decrement and left the Work waiting forever)
        counting = threading.Lock()

        def one_done(_):
            with counting:
                pending[0] -= 1
                last = pending[0] == 0
            if last:
                failed = next((f for f in futs if _error_of(f) is not None), None)
                if failed is None:
                    fut.set_result([])
                else:
                    _fail(fut, _error_of(failed))
        if not futs:
            fut.set_result([])
        for f in futs:
            f.add_done_callback(one_done)
        return FutureWork(fut, self.world, None, self.timeout_s)

    def _loop(self):
        delay = 0.0
        while True:
            try:
                job = self._jobs.get(timeout=delay) if self._pending else self._jobs.get()
            except queue.Empty:
                job = ()
            if job is None:
                self._fail_pending(HcclError("E_INTERNAL", "the process group was shut down with this transfer "
                                             "pending", cause=Cause.BAD_INPUT))
                return
            if job:
                self._run(*job)
                delay = 0.0
            if self._pending and not self._progress():
                delay = min(_IDLE_SLICE_S, delay * 2 + 1e-4)

    def _run(self, fn, fut, holder):
        try:
            value = fn()
        except BaseException as exc:    # noqa: BLE001 - handed to whoever waits on the Work
            self.world.note_failure(exc)
            _fail(fut, exc)
            return
        if isinstance(value, Deferred):
            if holder is not None:
                holder.append(value.request)
            self._pending.append((value, fut))
        elif fut is not None:
            fut.set_result(value)

    def _progress(self) -> bool:
        """Test the pending Requests in issue order; whether any completed."""
        moved = False
        for item in list(self._pending):
            deferred, fut = item
            try:
                done = deferred.request.test()
                if not done:
                    late = deferred.request.timed_out()
                    if late is not None:
                        raise late
                    continue
                value = deferred.finish(deferred.request)
            except BaseException as exc:   # noqa: BLE001 - handed to whoever waits on the Work
                self.world.note_failure(exc)
                self._pending.remove(item)
                if deferred.failed is not None:
                    deferred.failed(exc)
                if fut is not None:
                    _fail(fut, exc)
                moved = True
                continue
            self._pending.remove(item)
            if fut is not None:
                fut.set_result(value)
            moved = True
        return moved

    def settle(self, deferred):
        """Keep a Request whose Work has completed already (a send, buffered) until it is done,
        for its record and the rank's clock."""
        self._pending.append((deferred, None))

    def _fail_pending(self, exc):
        for deferred, fut in self._pending:
            if deferred.failed is not None:
                deferred.failed(exc)
            if fut is not None and not fut.done():
                _fail(fut, exc)
        self._pending.clear()

    def stop(self):
        self._stopped = True
        self._jobs.put(None)
        self._thread.join(timeout=30)


class _SourceOf:
    """A receive's Request as the worker starts it (the Work exists before the job runs)."""
    __slots__ = ("_holder",)

    def __init__(self, holder):
        self._holder = holder

    @property
    def source(self):
        return self._holder[0].source if self._holder else None
