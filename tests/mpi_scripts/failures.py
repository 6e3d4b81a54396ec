"""Under mpiexec: a mismatched call, a rank that raises and a rank that returns early are each an
HcclError on every process, never a hang, with its fields (cause, peers); of a peer's early return
and a later rank's own exception, the exception is the job's error (the root cause); a fault
plan's rank_crash (on entry, mid-op, on both data planes, in an eager op) equals the local
engine's run: the dead rank's result None on every process, the survivors' errors and clocks,
their shrunk communicator's results and times; the survivors are woken by the dead rank's loss,
not their deadline (argv: ranks per process)."""
import sys
import time

import numpy as np

import hccl_sim

K = int(sys.argv[1])


def mismatched(comm):
    comm.all_reduce(np.ones(4 if comm.rank else 5))


def diverging(comm):
    """Three repeats of one small call (the lean path's records), then the last rank makes another
    whose payload has the same length (op max for sum): the lean path hands it on, which names it."""
    x = np.ones(2, np.float32)
    for _ in range(3):
        comm.all_reduce(x)
    comm.all_reduce(x, op="max" if comm.rank == comm.size - 1 else "sum")


def late(comm):
    """Rank 1 calls past the others' deadline (HCCL_EXEC_TIMEOUT=2)."""
    if comm.rank == 1:
        time.sleep(3)
    comm.all_reduce(np.ones(4))


def raising(comm):
    comm.all_reduce(np.ones(100_000))             # over the eager size: the per-rank executor
    if comm.rank == 1:
        raise ValueError("boom on rank 1")
    comm.all_reduce(np.ones(100_000))


def early(comm):
    if comm.rank != 0:
        comm.all_reduce(np.ones(3))


def own_bug(comm):
    """Rank 1 returns at once (rank 0's error, PEER_RETURNED, comes first: a consequence); rank 2's
    own exception, a second later, is the job's error."""
    if comm.rank == 1:
        return None
    if comm.rank == 2:
        time.sleep(1.0)
        raise ZeroDivisionError("rank 2's own bug")
    comm.all_reduce(np.ones(4))


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


def crash_ops(comm, count):
    """Three AllReduces (int64, `count` elements: over the eager size, the data planes move them),
    each error with its clock and how this rank's data plane found the dead one; then, if a rank
    was lost, the survivors shrink and AllReduce on the new communicator."""
    out, causes, shrunk = [], [], None
    for _ in range(3):
        try:
            y = comm.all_reduce(np.arange(count, dtype=np.int64) * (comm.rank + 1))
            out.append(("ok", int(y.sum()), comm.last_op.end))
        except hccl_sim.HcclError as e:
            out.append((e.code, str(e), comm.clock))
            if e.__cause__ is not None:
                causes.append(str(e.__cause__))
    if comm.lost_ranks:
        new = comm.shrink()
        y = new.all_reduce(np.arange(count, dtype=np.int64) * (comm.rank + 1))
        shrunk = (new.rank, new.world_ranks, int(y.sum()), new.last_op.end)
    return out, causes, shrunk


def escaping(comm):
    for _ in range(2):
        comm.all_reduce(np.ones(20_000, dtype=np.int64))


def crashes(topo, env):
    p = topo.num_ranks
    for dead, at_step, plane, count in ((p - 1, None, "p2p", 20_000), (0, 1, "p2p", 20_000),
                                        (1, 2, "window", 20_000), (1, None, "p2p", 8)):
        plan = hccl_sim.FaultPlan().rank_crash(dead, at_op=1, at_step=at_step)
        t0 = time.monotonic()
        got = hccl_sim.run(crash_ops, topology=topo, engine="mpi", ranks_per_process=K, data_plane=plane, env=env,
                           faults=plan, args=(count,))
        took = time.monotonic() - t0
        want = hccl_sim.run(crash_ops, topology=topo, env=env, faults=plan, args=(count,))
        case = (dead, at_step, plane, count)
        assert got[dead] is None and want[dead] is None, (case, got[dead])
        assert [g and (g[0], g[2]) for g in got] == [w and (w[0], w[2]) for w in want], (case, got, want)
        for r, g in enumerate(got):
            if r != dead:
                assert g[0][1][0] == "E_TIMEOUT" and f"Cluster Exception Location[rank {dead}]" in g[0][1][1], g
                assert all(f"rank {dead}" in c for c in g[1]), (case, r, g[1])   # found by its loss
        if count > 8:                # a data plane moved data: the survivors were woken by the loss
            assert all(len(g[1]) == 1 for g in got if g), (case, [g and g[1] for g in got])
        assert took < 20, f"{case} took {took:.1f} s"
    try:
        hccl_sim.run(escaping, topology=topo, engine="mpi", ranks_per_process=K, env=env,
                     faults=hccl_sim.FaultPlan().rank_crash(p - 1, at_op=1))
    except hccl_sim.HcclError as exc:
        assert exc.code == "E_TIMEOUT" and f"Cluster Exception Location[rank {p - 1}]" in exc.reason, exc
        assert exc.rank != p - 1, exc
        assert exc.cause == "RANK_LOST" and exc.peers == (p - 1,) and exc.fault in exc.reason, exc.fields()
    else:
        raise AssertionError("escaping: no error")


def main():
    from mpi4py import MPI
    me = MPI.COMM_WORLD.Get_rank()
    p = MPI.COMM_WORLD.Get_size() * K
    topo = hccl_sim.topology("fullmesh", ranks=p)
    env = {"HCCL_EXEC_TIMEOUT": "60"}
    for fn, code, words, cause in ((mismatched, "E_PARA", "mismatched", "MISMATCH"),
                                   (diverging, "E_PARA", "mismatched", "MISMATCH"),
                                   (raising, "E_INTERNAL", "ValueError: boom on rank 1", None),
                                   (early, "E_PARA", "rank 0 returned without calling", "PEER_RETURNED"),
                                   (own_bug, "E_INTERNAL", "ZeroDivisionError: rank 2's own bug", None)):
        t0 = time.monotonic()
        try:
            hccl_sim.run(fn, topology=topo, engine="mpi", ranks_per_process=K, env=env)
        except hccl_sim.HcclError as exc:
            assert exc.code == code and words in exc.reason and exc.cause == cause, (fn.__name__, exc, exc.fields())
            assert fn is not early or exc.peers == (0,), exc.fields()
        else:
            raise AssertionError(f"{fn.__name__}: no error")
        took = time.monotonic() - t0
        assert took < 20, f"{fn.__name__} took {took:.1f} s"
        print(f"{fn.__name__} {me} {code} {took:.2f}", flush=True)
    # a late rank: with a rank per process on one node the ranks meet in a shared-memory block
    # (hcomm.control.mpi.host_block), whose waits name the ranks that have not arrived
    try:
        hccl_sim.run(late, topology=topo, engine="mpi", ranks_per_process=K, env={"HCCL_EXEC_TIMEOUT": "2"})
    except hccl_sim.HcclError as exc:
        words = "ranks [1] have not arrived by the deadline" if K == 1 else "within 2 s (HCCL_EXEC_TIMEOUT)"
        assert exc.code == "E_TIMEOUT" and words in exc.reason and exc.cause == "TIMEOUT", (str(exc), exc.fields())
    else:
        raise AssertionError("late: no error")
    print(f"late {me} named", flush=True)
    got = hccl_sim.run(aborting, topology=topo, engine="mpi", ranks_per_process=K, env=env)
    assert got[0] is None and all(g[:2] == ("E_REMOTE", True) and g[2] < 2.0 for g in got[1:]), got
    print(f"aborting {me} released", flush=True)
    t0 = time.monotonic()
    crashes(topo, env)
    print(f"crash {me} equals local {time.monotonic() - t0:.2f}", flush=True)


if __name__ == "__main__":
    main()
