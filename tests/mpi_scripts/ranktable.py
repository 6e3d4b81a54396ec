"""Under mpiexec: hccl_sim.init on a rank table maps MPI ranks onto its servers and devices in
order (argv: table path, ranks per process, 'ok' or 'mismatch')."""
import sys
import threading

import numpy as np

import hccl_sim


def main():
    from mpi4py import MPI
    path, k, expect = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    me, nprocs = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    table = hccl_sim.topology(path)
    if expect == "mismatch":
        try:
            hccl_sim.init(topology=path, ranks_per_process=k)
        except hccl_sim.HcclError as exc:
            print(f"MISMATCH {me} {exc.reason}", flush=True)
            return
        raise AssertionError("no error for a rank table that does not fit the job")
    comms = hccl_sim.init(topology=path, ranks_per_process=k)
    comms = comms if isinstance(comms, list) else [comms]
    assert [c.rank for c in comms] == list(range(me * k, me * k + k))
    out = {}

    def body(c):
        y = c.all_reduce(np.full(4, c.rank, dtype=np.int32))
        out[c.rank] = (int(y[0]), c.topology.server_of[c.rank], c.topology.device_of[c.rank], c.device.device_id)
    threads = [threading.Thread(target=body, args=(c,)) for c in comms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p = nprocs * k
    for r, (total, server, device, dev_id) in out.items():
        assert total == p * (p - 1) // 2
        assert (server, device) == (table.server_of[r], table.device_of[r]), (r, server, device)
        print(f"RANK {r} server {server} device {device}", flush=True)
    hccl_sim.finalize()


if __name__ == "__main__":
    main()
