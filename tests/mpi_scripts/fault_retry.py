"""Under mpiexec: a RoCE link flap past the retransmission budget, retried (HCCL_OP_RETRY_ENABLE L1):
results, retries and simulated times equal to the local engine's."""
import numpy as np

import hccl_sim


def fn(comm):
    x = (np.arange(30_000, dtype=np.int64) * (comm.rank + 1)) % 997
    y = comm.all_reduce(x)
    return int(y.sum()), comm.last_op.retries, comm.last_op.end


def main():
    from mpi4py import MPI
    topo = hccl_sim.topology("atlas800t-a2", servers=2)
    plan = hccl_sim.FaultPlan().link_flap(1, 9, at=0.0, duration=0.01)
    env = {"HCCL_RDMA_TIMEOUT": "5", "HCCL_RDMA_RETRY_CNT": "1", "HCCL_OP_RETRY_ENABLE": "L1:1",
           "HCCL_OP_RETRY_PARAMS": "MaxCnt:1,HoldTime:20,IntervalTime:0"}
    k = topo.num_ranks // MPI.COMM_WORLD.Get_size()
    got = hccl_sim.run(fn, topology=topo, engine="mpi", faults=plan, env=env, ranks_per_process=k)
    assert got == hccl_sim.run(fn, topology=topo, faults=plan, env=env), got
    assert {r[1] for r in got} == {1} and min(r[2] for r in got) > 20_000_000, got
    print(f"OK {MPI.COMM_WORLD.Get_rank()}", flush=True)


if __name__ == "__main__":
    main()
