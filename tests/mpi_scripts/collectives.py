"""Under mpiexec: every collective of the MPI engine against numpy on integer data, and its
simulated times against the local engine's, to the nanosecond (argv: ranks per process, planes)."""
import sys

import numpy as np

import hccl_sim

K = int(sys.argv[1])
PLANES = sys.argv[2].split(",")
SIZES = (12, 24_000)                  # eager (in the control allgather) and over the eager size


def fn(comm, n):
    p, r = comm.size, comm.rank
    x = (np.arange(n, dtype=np.int64) * (r + 3)) % 1009
    every = np.stack([(np.arange(n, dtype=np.int64) * (j + 3)) % 1009 for j in range(p)])
    checks, times = [], []

    def note(name, got, want):
        checks.append((name, bool(np.array_equal(got, want)) if want is not None else got is None))
        times.append((name, comm.last_op.algo, comm.last_op.start, comm.last_op.end))

    note("allreduce", comm.all_reduce(x), every.sum(0))
    note("allreduce-max", comm.all_reduce(x, op="max"), every.max(0))
    note("allgather", comm.all_gather(x), every.reshape(-1))
    note("reducescatter", comm.reduce_scatter(x), every.sum(0).reshape(p, -1)[r])
    note("broadcast", comm.broadcast(x, root=p - 1), every[p - 1])
    note("reduce", comm.reduce(x, root=1), every.sum(0) if r == 1 else None)
    note("alltoall", comm.all_to_all(x), every.reshape(p, p, -1)[:, r].reshape(-1))
    comm.barrier()
    if r == 0:
        comm.send(x[:5], dst=p - 1, tag=4)
    if r == p - 1:
        checks.append(("recv", bool(np.array_equal(comm.recv(0, tag=4), every[0, :5]))))
    sub = comm.split(r % 2)                       # ranks of one parity, over the transport's scoped views
    members = [j for j in range(p) if j % 2 == r % 2]
    got = sub.all_reduce(x)
    checks.append(("split-allreduce", bool(np.array_equal(got, every[members].sum(0)))))
    times.append(("split", sub.last_op.algo, sub.last_op.start, sub.last_op.end))
    return checks, times


def held(comm):
    """Results come from a pool (engines/mpi.py): one that user code still holds is never reused."""
    x = np.arange(300_000, dtype=np.int64) + comm.rank
    a, b = comm.all_reduce(x), comm.all_reduce(x + 1)
    keep = b.copy()
    del a
    c = comm.all_reduce(x + 2)
    v = c[5:9]                        # a view holds its result too
    del c
    d = comm.all_reduce(b)            # a result as the input (read in place on the window plane)
    e = comm.all_reduce(x * 2)
    return bool(np.array_equal(b, keep)), int(v.sum()), int(d.sum()), int(e.sum())


def main():
    from mpi4py import MPI
    p = MPI.COMM_WORLD.Get_size() * K
    topo = hccl_sim.topology("fullmesh", ranks=p, bandwidth=25e9, latency=5e-6)
    for n in SIZES:
        n -= n % (p * p)
        want = hccl_sim.run(fn, topology=topo, args=(n,))
        for plane in PLANES:
            got = hccl_sim.run(fn, topology=topo, engine="mpi", args=(n,), ranks_per_process=K, data_plane=plane)
            bad = [(rank, name) for rank, (checks, _) in enumerate(got) for name, ok in checks if not ok]
            assert not bad, f"{plane} n={n}: wrong results {bad}"
            assert [t for _, t in got] == [t for _, t in want], f"{plane} n={n}: simulated times differ from local"
    for plane in PLANES:      # on "window" the pooled results live in the shared windows, which grow
        got = hccl_sim.run(held, topology=topo, engine="mpi", ranks_per_process=K, data_plane=plane)
        assert got == hccl_sim.run(held, topology=topo) and all(g[0] for g in got), (plane, got)
    print(f"OK {MPI.COMM_WORLD.Get_rank()}", flush=True)


if __name__ == "__main__":
    main()
