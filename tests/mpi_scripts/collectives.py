"""Under mpiexec: every collective of the MPI engine against numpy on integer data, and its
simulated times against the local engine's, to the nanosecond (argv: ranks per process, planes);
on the window plane on device arrays too (they live in the HBM window: read in place, out=
written in place, zeros once freed and allocated again, each rank's HBM a region of its own)."""
import sys

import numpy as np

import hccl_sim

K = int(sys.argv[1])
PLANES = sys.argv[2].split(",")
SIZES = (12, 24_000)                  # eager (in the control allgather) and over the eager size


def fn(comm, n, device=False):
    p, r = comm.size, comm.rank
    x = (np.arange(n, dtype=np.int64) * (r + 3)) % 1009
    if device:                        # the same input in HBM (written directly: no simulated copy time)
        d = comm.device.empty(x.shape, x.dtype)
        d.data[:] = x
        x = d
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
    note("scatter", comm.scatter(x, root=p - 1), every[p - 1].reshape(p, -1)[r])
    C = ((np.arange(p * p).reshape(p, p) * 7 + 3) % 5) * max(1, n // 12)        # rows rank i sends rank j
    xs = [(np.arange(C[i].sum(), dtype=np.int64) * (i + 3)) % 1009 for i in range(p)]
    want = np.concatenate([np.split(xs[i], np.cumsum(C[i])[:-1])[r] for i in range(p)])
    note("alltoallv", comm.all_to_all_v(xs[r], C[r], C[:, r]), want)
    note("alltoallvc", comm.all_to_all_vc(xs[r], C), want)
    idle = C.copy()
    idle[:, p - 1] = 0                # the last rank gets no rows (an idle expert), the first sends none
    idle[0, :] = 0
    ys = [(np.arange(idle[i].sum(), dtype=np.int64) * (i + 3)) % 1009 for i in range(p)]
    got = np.empty(idle[:, r].sum(), np.int64)      # into the caller's array (a torch tensor's, say)
    comm.all_to_all_v(ys[r], idle[r], idle[:, r], out=got)
    note("alltoallv-idle", got, np.concatenate([np.split(ys[i], np.cumsum(idle[i])[:-1])[r] for i in range(p)]))
    c = C.sum(axis=1)                                                            # rows of rank i's block
    note("allgatherv", comm.all_gather_v(xs[r], c), np.concatenate(xs))
    whole = (np.arange(c.sum(), dtype=np.int32) * 7) % 1009                      # int32: reduced inline on 910B
    note("reducescatterv", comm.reduce_scatter_v(whole * (r + 1), c),
         (whole * (p * (p + 1) // 2))[c[:r].sum():c[:r + 1].sum()])
    comm.barrier()
    if r == 0:
        comm.send(x.data[:5] if device else x[:5], dst=p - 1, tag=4)
    if r == p - 1:
        checks.append(("recv", bool(np.array_equal(comm.recv(0, tag=4), every[0, :5]))))
    k, j = min(n, 7), min(n, 3)
    got = comm.batch_send_recv([("send", (r + 1) % p, every[r, :k]), ("recv", (r - 1) % p, ((k,), np.int64)),
                                ("send", r, every[r, :j]), ("recv", r, ((j,), np.int64))])
    checks.append(("batch", bool(np.array_equal(got[0], every[(r - 1) % p, :k]) and np.array_equal(got[1], every[r, :j]))))
    times.append(("batch", comm.last_op.algo, comm.last_op.start, comm.last_op.end))
    with comm.group():                            # a send, a receive and a collective, launched as one
        g_recv = comm.recv((r - 1) % p)
        comm.send(every[r, :k], (r + 1) % p)
        g_sum = comm.all_reduce(every[r])
    checks.append(("group", bool(np.array_equal(g_recv.result, every[(r - 1) % p, :k])
                                 and np.array_equal(g_sum.result, every.sum(0)))))
    times.append(("group", comm.last_op.algo, comm.last_op.start, comm.last_op.end))
    sub = comm.split(r % 2)                       # ranks of one parity, over the transport's scoped views
    members = [j for j in range(p) if j % 2 == r % 2]
    got = sub.all_reduce(x)
    checks.append(("split-allreduce", bool(np.array_equal(got, every[members].sum(0)))))
    times.append(("split", sub.last_op.algo, sub.last_op.start, sub.last_op.end))
    if device:
        comm.device.free(x)
    return checks, times


def device_ops(comm, n):
    """out= a device array (in place on the window plane), an in-place op (out= the input), and a
    freed device array allocated again: it reads zeros, as np.zeros."""
    p, r = comm.size, comm.rank
    x = (np.arange(n, dtype=np.int64) * (r + 3)) % 1009
    total = sum((np.arange(n, dtype=np.int64) * (j + 3)) % 1009 for j in range(p))
    d, o = comm.device.empty(n, np.int64), comm.device.empty(n, np.int64)
    d.data[:] = x
    comm.all_reduce(d, out=o)
    checks = [bool(np.array_equal(o.data, total))]
    comm.all_reduce(d, out=d)                 # HCCL's sendBuf == recvBuf
    checks.append(bool(np.array_equal(d.data, total)))
    comm.all_gather(d, out=comm.device.empty(n * p, np.int64).data)
    checks.append(bool(np.array_equal(comm.all_reduce(o), p * total)))
    ptr = d.ptr
    comm.device.free(d)
    again = comm.device.empty(n, np.int64)
    checks.append((again.ptr == ptr, bool(not again.data.any())))
    comm.device.free(again)
    comm.device.free(o)
    return checks, comm.last_op.end


def hbm_regions(comm):
    """Device arrays at both ends of each rank's HBM region in the window (the middle only
    allocated, never written) and one just past it (host memory: the region is capped by
    hcomm.memory.window_provider.hbm_share): each intact after every rank of the process wrote its own,
    the first two in the window, the last not; the region's span (addresses here)."""
    dev = comm.device
    plane = comm._group.job.memory
    region = plane.hbm_bytes
    first = dev.empty(1000, np.int64)                  # after the communicator's CCL buffer
    middle = dev.malloc(region - 8192 - (first.ptr + 8192))
    last = dev.empty(1000, np.int64)
    beyond = dev.empty(1000, np.int64)
    for a in (first, last, beyond):
        a.data[:] = comm.rank
    comm.barrier()
    ok = all(bool((a.data == comm.rank).all()) for a in (first, last, beyond))
    placed = (plane.windows.locate(first.data) is not None and plane.windows.locate(last.data) is not None
              and plane.windows.locate(beyond.data) is None and region - 8192 <= last.ptr < region - last.nbytes)
    span = (first.data.ctypes.data, last.data.ctypes.data + last.nbytes, placed)
    for a in (first, middle, last, beyond):
        dev.free(a)
    return ok, span


def held(comm):
    """Results come from a pool (hcomm.memory.pool): one that user code still holds is never reused."""
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


def repeats(comm, n=6):
    """Small calls repeated (all but the first on the lean path, engines/eager_lane.py), one in
    place, float data, kernels moving the ranks' entry clocks apart differently each time: results
    to the bit and every op's record."""
    r = comm.rank
    x = (np.arange(4, dtype=np.float32) + 0.3) * (r + 2) / 3
    y = x.copy()
    got = []
    for k in range(n):
        comm.device.default_stream.compute(flops=((k + r) % 2) * 1e11)
        a = comm.all_reduce(x)
        comm.all_reduce(y, out=y, op="max" if k % 2 else "sum")
        got.append((a.tobytes(), y.tobytes(), tuple(comm.last_op)))
    return got


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
            if plane == "window":     # device arrays: read where they are, priced as host arrays
                got = hccl_sim.run(fn, topology=topo, engine="mpi", args=(n, True), ranks_per_process=K,
                                   data_plane=plane)
                assert got == want, f"device arrays n={n}: {got} != {want}"
    want = hccl_sim.run(repeats, topology=topo)
    for plane in PLANES:
        got = hccl_sim.run(repeats, topology=topo, engine="mpi", ranks_per_process=K, data_plane=plane)
        assert got == want, f"{plane}: repeated small ops differ from local"
    for plane in PLANES:      # on "window" the pooled results live in the shared windows, which grow
        got = hccl_sim.run(held, topology=topo, engine="mpi", ranks_per_process=K, data_plane=plane)
        assert got == hccl_sim.run(held, topology=topo) and all(g[0] for g in got), (plane, got)
    if "window" in PLANES:
        n = 24_000 - 24_000 % (p * p)
        got = hccl_sim.run(device_ops, topology=topo, engine="mpi", args=(n,), ranks_per_process=K, data_plane="window")
        assert got == hccl_sim.run(device_ops, topology=topo, args=(n,)), got
        assert all(c is True or c == (True, True) for checks, _ in got for c in checks), got
        me = MPI.COMM_WORLD.Get_rank()
        got = hccl_sim.run(hbm_regions, topology=topo, engine="mpi", ranks_per_process=K, data_plane="window")
        spans = sorted(span for ok, span in got[me * K:(me + 1) * K])
        assert all(ok for ok, _ in got) and all(s[2] for s in spans), got
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), f"HBM regions of local ranks overlap: {spans}"
    print(f"OK {MPI.COMM_WORLD.Get_rank()}", flush=True)


if __name__ == "__main__":
    main()
