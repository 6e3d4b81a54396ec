"""Bad input and mismatched calls become HcclError on every rank, never a hang."""
import numpy as np
import pytest

import hccl_sim
from hccl_sim import HcclError
from hccl_sim.engines.local import run_local
from hccl_sim.config.env import Config

pytestmark = pytest.mark.timeout(60)


def run_collect(fn, p=4, data_plane="central"):
    """Run fn on every rank and return every rank's exception (or None)."""
    errors = [None] * p

    def wrapper(comm):
        try:
            return fn(comm)
        except HcclError as exc:
            errors[comm.rank] = exc
            raise
    with pytest.raises(HcclError) as info:
        run_local(wrapper, hccl_sim.topology("fullmesh", ranks=p), Config(), data_plane=data_plane)
    return info.value, errors


MISMATCHES = {
    "count": lambda c: c.all_reduce(np.ones(4 + (c.rank == 2))),
    "dtype": lambda c: c.all_reduce(np.ones(4, dtype=np.float32 if c.rank else np.float16)),
    "reduce op": lambda c: c.all_reduce(np.ones(4), op="max" if c.rank == 1 else "sum"),
    "root": lambda c: c.broadcast(np.ones(4), root=c.rank % 2),
    "collective": lambda c: c.all_gather(np.ones(4)) if c.rank == 3 else c.all_reduce(np.ones(4)),
    "algorithm": lambda c: c.all_reduce(np.ones(4), algo="ring" if c.rank else "H-D_R"),
}


@pytest.mark.local
@pytest.mark.parametrize("what", MISMATCHES)
@pytest.mark.parametrize("data_plane", ["central", "threads"])
def test_mismatched_calls_fail_on_every_rank(what, data_plane):
    first, errors = run_collect(MISMATCHES[what], data_plane=data_plane)
    assert first.code == "E_PARA"
    for rank, exc in enumerate(errors):
        assert exc is not None and exc.code == "E_PARA" and exc.rank == rank
        assert "mismatched collective calls" in str(exc) and f"rank {rank}" in str(exc)


@pytest.mark.local
def test_rank_returning_early_releases_the_others():
    first, errors = run_collect(lambda c: None if c.rank == 1 else c.all_reduce(np.ones(3)))
    assert "rank 1 returned without calling all_reduce" in str(first)
    assert all(errors[r] is not None for r in (0, 2, 3))


@pytest.mark.local
def test_exception_on_one_rank_reaches_caller_and_releases_others():
    def fn(comm):
        if comm.rank == 2:
            raise ZeroDivisionError("boom")
        comm.all_reduce(np.ones(3))
    with pytest.raises(HcclError) as info:
        hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=4))
    assert info.value.rank == 2 and "ZeroDivisionError: boom" in str(info.value)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


@pytest.mark.local
def test_recv_from_rank_that_never_sends():
    first, _ = run_collect(lambda c: c.recv(0) if c.rank == 1 else None, p=2)
    assert first.rank == 1 and "rank 0 returned without sending" in str(first)


@pytest.mark.local
def test_exec_timeout_bounds_waits():
    """A rank stuck in user code: the others give up after HCCL_EXEC_TIMEOUT seconds."""
    import time

    def fn(comm):
        if comm.rank == 0:
            time.sleep(3)
        return comm.all_reduce(np.ones(2))
    with pytest.raises(HcclError) as info:
        hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=2), env={"HCCL_EXEC_TIMEOUT": "1"})
    assert info.value.code == "E_TIMEOUT" and "HCCL_EXEC_TIMEOUT" in str(info.value)


BAD_ARGS = [
    (lambda c: c.reduce_scatter(np.ones(5)), "divisible by the number of ranks"),
    (lambda c: c.all_to_all(np.ones(6)), "divisible by the number of ranks"),
    (lambda c: c.broadcast(np.ones(2), root=4), "root must be an integer in"),
    (lambda c: c.reduce(np.ones(2), root=-1), "root must be an integer in"),
    (lambda c: c.all_reduce(np.ones(2, dtype=np.complex64)), "unsupported data type"),
    (lambda c: c.all_reduce(np.ones(2), op="avg"), "unsupported reduce op"),
    (lambda c: c.all_reduce(np.ones(2), algo="fastest"), "unknown algorithm"),
    (lambda c: c.all_reduce(np.ones(2), algo="level0:NA;level1:Ring"), "unknown algorithm 'Ring'"),
    (lambda c: c.all_gather(np.float32(1)), "at least 1 dimension"),
    (lambda c: c.send(np.ones(2), dst=c.rank), "this rank itself"),
    (lambda c: c.recv(src=9), "src must be a rank"),
    (lambda c: c.all_reduce(np.array(["a", "b"])), "unsupported data type"),
]


@pytest.mark.local
@pytest.mark.parametrize("fn,message", BAD_ARGS)
def test_bad_arguments(fn, message):
    with pytest.raises(HcclError, match=message) as info:
        hccl_sim.run(fn, topology=hccl_sim.topology("fullmesh", ranks=4))
    assert info.value.code == "E_PARA" and info.value.rank is not None


@pytest.mark.unit
def test_bad_engine_and_topology_arguments():
    with pytest.raises(HcclError, match="unknown engine"):
        hccl_sim.run(lambda c: None, engine="warp")
    with pytest.raises(HcclError, match=r"8 ranks but the MPI job has 1 processes .*mpiexec -n 8"):
        hccl_sim.run(lambda c: None, engine="mpi")          # a single process, not under mpiexec -n 8
    with pytest.raises(HcclError, match="unknown topology"):
        hccl_sim.topology("dgx-h100")
    with pytest.raises(HcclError, match="ranks=N is required"):
        hccl_sim.topology("ring")
    with pytest.raises(HcclError, match="unknown parameter"):
        hccl_sim.topology("atlas800t-a2", ranks=8)
    with pytest.raises(HcclError, match="bandwidth must be a number >= 1000"):
        hccl_sim.topology("fullmesh", ranks=4, bandwidth=0)
    with pytest.raises(HcclError, match="unknown collective"):
        hccl_sim.simulate("allscatter", 8)
    with pytest.raises(HcclError, match="avg"):
        hccl_sim.simulate("allreduce", 8, redop="avg")
    with pytest.raises(HcclError, match="nbytes"):
        hccl_sim.simulate("allreduce", -1)


@pytest.mark.unit
def test_error_codes_are_hccl_results():
    exc = HcclError("E_TIMEOUT", "x", rank=3, op="all_reduce")
    assert exc.value == 9 and "rank 3" in str(exc) and "all_reduce" in str(exc)
    with pytest.raises(ValueError):
        HcclError("E_NOPE", "x")


DEADLOCKS = {
    "both receive first": lambda c: c.recv(1 - c.rank) if c.rank < 2 else None,
    "collective against a receive": lambda c: c.all_reduce(np.ones(2)) if c.rank == 0 else c.recv(0),
    "everyone sends, nobody receives": lambda c: c.send(np.ones(2), (c.rank + 1) % 3),
}


@pytest.mark.local
@pytest.mark.parametrize("case", DEADLOCKS)
def test_deadlock_is_an_error_not_a_hang(case):
    """With the default 1836 s HCCL_EXEC_TIMEOUT, a deadlock among ranks still ends in seconds."""
    import time
    t0 = time.monotonic()
    with pytest.raises(HcclError, match="deadlock: every rank is waiting") as info:
        hccl_sim.run(DEADLOCKS[case], topology=hccl_sim.topology("fullmesh", ranks=3))
    assert info.value.code == "E_TIMEOUT" and time.monotonic() - t0 < 20
