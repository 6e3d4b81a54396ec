"""A small user project for a fault suite: data-parallel training whose gradient sync has a
recovery path, in two versions.

`sync_with_retries` retries an AllReduce that an error CQE ended (a link down past its RDMA
retransmissions: E_REMOTE, or op retry refused: E_OPRETRY_FAIL) a few times, out of place so the
gradient is intact for the next try, and lets any other error (a lost rank: E_TIMEOUT) through.

`sync_or_local` has the bug such code often has: to keep training through a flaky link it takes
the rank's own gradient, scaled to the world size, for the sum. Without faults it is never
reached, so every ordinary test passes; under a link failure every rank quietly trains on its
own data and the replicas drift apart. `pytest --hccl-chaos N` finds it, shrinks it to one fault
and gives the line that replays it.

The weights are integers (sums are exact in any order), so a recovered run equals the fault-free
one bit for bit.
"""
import logging

import numpy as np

from hccl_sim import HcclError
from topologies import hardware

TOPOLOGY = hardware("atlas800t-a2", devices_per_server=[4, 4])   # 2 servers x 4 NPUs: HCCS inside, RoCE across
ENV = {"HCCL_OP_RETRY_ENABLE": "L1:0,L2:0",                    # op retry off: a failed link is an error CQE
       "HCCL_EXEC_TIMEOUT": "20"}
RETRYABLE = ("E_REMOTE", "E_OPRETRY_FAIL")
log = logging.getLogger("grad_sync")


def sync_with_retries(comm, grad, tries=3):
    """The sum of every rank's `grad`; an error CQE is retried (at most `tries` calls in all)."""
    for attempt in range(tries):
        try:
            return comm.all_reduce(grad, op="sum")
        except HcclError as exc:
            if exc.code not in RETRYABLE or attempt == tries - 1:
                raise
            log.warning("rank %d: %s; retrying the AllReduce", comm.rank, exc.code)


def sync_or_local(comm, grad):
    """The sum of every rank's `grad`, or, after an error CQE, this rank's own gradient times the
    world size (the bug: the ranks no longer agree)."""
    try:
        return comm.all_reduce(grad, op="sum")
    except HcclError as exc:
        if exc.code not in RETRYABLE:
            raise
        log.warning("rank %d: %s; going on with the local gradient", comm.rank, exc.code)
        return grad * comm.size


def train(comm, sync, steps=4, n=4096):
    """`steps` steps of integer SGD on this rank's shard; the final weights."""
    rng = np.random.default_rng([7, comm.rank])
    w = np.zeros(n, dtype=np.int64)
    for _ in range(steps):
        grad = rng.integers(-50, 50, size=n, dtype=np.int64) + w % 7
        w -= sync(comm, grad) // comm.size
    return w
