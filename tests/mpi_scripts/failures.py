"""Under mpiexec: a mismatched call, a rank that raises and a rank that returns early are each an
HcclError on every process, never a hang; a rank_crash is refused (argv: ranks per process)."""
import sys
import time

import numpy as np

import hccl_sim

K = int(sys.argv[1])


def mismatched(comm):
    comm.all_reduce(np.ones(4 if comm.rank else 5))


def raising(comm):
    comm.all_reduce(np.ones(100_000))             # over the eager size: the per-rank executor
    if comm.rank == 1:
        raise ValueError("boom on rank 1")
    comm.all_reduce(np.ones(100_000))


def early(comm):
    if comm.rank != 0:
        comm.all_reduce(np.ones(3))


def aborting(comm):
    """Rank 0 aborts the world communicator and stays busy: the others' next op fails at once."""
    comm.all_reduce(np.ones(4))
    if comm.rank == 0:
        comm.abort()
        time.sleep(3)
        return None
    t0 = time.monotonic()
    try:
        comm.all_reduce(np.ones(4))
    except hccl_sim.HcclError as exc:
        return exc.code, "rank 0 aborted the communicator" in exc.reason, time.monotonic() - t0
    return "no error"


def main():
    from mpi4py import MPI
    me = MPI.COMM_WORLD.Get_rank()
    p = MPI.COMM_WORLD.Get_size() * K
    topo = hccl_sim.topology("fullmesh", ranks=p)
    env = {"HCCL_EXEC_TIMEOUT": "60"}
    for fn, code, words in ((mismatched, "E_PARA", "mismatched"), (raising, "E_INTERNAL", "ValueError: boom on rank 1"),
                            (early, "E_PARA", "rank 0 returned without calling")):
        t0 = time.monotonic()
        try:
            hccl_sim.run(fn, topology=topo, engine="mpi", ranks_per_process=K, env=env)
        except hccl_sim.HcclError as exc:
            assert exc.code == code and words in exc.reason, (fn.__name__, exc)
        else:
            raise AssertionError(f"{fn.__name__}: no error")
        took = time.monotonic() - t0
        assert took < 20, f"{fn.__name__} took {took:.1f} s"
        print(f"{fn.__name__} {me} {code} {took:.2f}", flush=True)
    got = hccl_sim.run(aborting, topology=topo, engine="mpi", ranks_per_process=K, env=env)
    assert got[0] is None and all(g[:2] == ("E_REMOTE", True) and g[2] < 2.0 for g in got[1:]), got
    print(f"aborting {me} released", flush=True)
    crash = hccl_sim.FaultPlan().rank_crash(0, at_op=0)
    try:
        hccl_sim.run(mismatched, topology=topo, engine="mpi", ranks_per_process=K, faults=crash)
    except hccl_sim.HcclError as exc:
        assert exc.code == "E_NOT_SUPPORT" and "rank_crash" in exc.reason, exc
        print(f"crash {me} refused", flush=True)


if __name__ == "__main__":
    main()
