"""Under mpiexec (every process on this one node): which data plane the MPI engine picks. With no
data_plane, run() and init() run on "window" (every process shares the node), the same on every
process and rank; data_plane="p2p" forces point to point (sub-communicators: "p2p" on both).
Each process prints "OK <its MPI rank>"."""
import sys

import numpy as np

import hccl_sim

K = int(sys.argv[1])


def fn(comm):
    y = comm.all_reduce(np.ones(40_000, dtype=np.int64))    # past the eager size: on the data plane
    sub = comm.split(comm.rank % 2)
    return comm.data_plane, sub.data_plane, comm._group.job.data_plane, int(y.sum())


def main():
    from mpi4py import MPI
    from hccl_sim.engines.mpi import default_plane
    p = MPI.COMM_WORLD.Get_size() * K
    topo = hccl_sim.topology("fullmesh", ranks=p)
    assert default_plane() == "window", default_plane()
    whole = p * 40_000
    got = hccl_sim.run(fn, topology=topo, engine="mpi", ranks_per_process=K)
    assert got == [("window", "p2p", "window", whole)] * p, got
    got = hccl_sim.run(fn, topology=topo, engine="mpi", ranks_per_process=K, data_plane="p2p")
    assert got == [("p2p", "p2p", "p2p", whole)] * p, got
    try:
        hccl_sim.run(fn, topology=topo, engine="mpi", ranks_per_process=K, data_plane="shm")
    except hccl_sim.HcclError as exc:
        assert exc.code == "E_PARA" and "data_plane 'shm'" in exc.reason, exc
    else:
        raise AssertionError("data_plane 'shm' on engine mpi: no error")
    comms = hccl_sim.init(topology=topo, ranks_per_process=K)
    comms = comms if isinstance(comms, list) else [comms]
    assert [c.data_plane for c in comms] == ["window"] * K, [c.data_plane for c in comms]
    hccl_sim.finalize()
    print(f"OK {MPI.COMM_WORLD.Get_rank()}", flush=True)


if __name__ == "__main__":
    main()
