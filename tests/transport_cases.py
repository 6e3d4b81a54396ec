"""What the transport tests run on every rank, in a module light enough for spawned processes to
import quickly (no pytest, no Ray): the cases (real programs, integer inputs, numpy's answers) and
the body of a spawned socket rank."""
import multiprocessing as mp

import numpy as np

from hccl_sim.algorithms import flat_program
from hcomm.exec import run_schedule as execute
from hcomm.program import rank_steps
from hcomm.transports.socket import SocketTransport

SPAWN = mp.get_context("spawn")
CASES = [(coll, algo) for algo in ("ring", "H-D_R", "NHR") for coll in ("allreduce", "allgather")]
SIZES = (2, 3, 4, 5)


# ---- the programs, their inputs and numpy's answers ------------------------------------------------

def case_input(coll, p, rank):
    n = 5 * p + 3 if coll == "allreduce" else 3 * p + 1
    return np.arange(n, dtype=np.int64) * (rank + 1) + 1000 * rank


def case_buffers(coll, p, rank):
    x = case_input(coll, p, rank)
    if coll == "allreduce":
        return {"input": x, "output": np.zeros_like(x)}
    return {"input": x.reshape(1, -1), "output": np.zeros((p, x.size), dtype=np.int64)}


def case_expected(coll, p):
    xs = [case_input(coll, p, r) for r in range(p)]
    return np.sum(xs, axis=0) if coll == "allreduce" else np.stack(xs)


def case_steps(coll, algo, p):
    n = case_input(coll, p, 0).size
    return rank_steps(flat_program(coll, algo, p, n, 8), p)


def run_cases(transport, rank, p):
    """Every case on one rank over `transport`: {(coll, algo): this rank's output}."""
    out = {}
    for i, (coll, algo) in enumerate(CASES):
        buffers = case_buffers(coll, p, rank)
        for name, array in buffers.items():
            transport.register(rank, name, array)
        execute(case_steps(coll, algo, p)[rank], rank, transport, ("case", i), np.add, transport.deadline(), coll)
        out[(coll, algo)] = buffers["output"]
    return out


def check_outputs(outputs, p):
    assert len(outputs) == p
    for coll, algo in CASES:
        want = case_expected(coll, p)
        for rank in range(p):
            assert np.array_equal(outputs[rank][(coll, algo)], want), (coll, algo, p, rank)


def socket_rank(rank, p, scenario, conn, timeout_s):
    """A spawned rank: bootstrap through the parent over `conn`, run `scenario`, report on `conn`."""
    tr = SocketTransport(rank, p, timeout_s=timeout_s, connect_timeout_s=30)
    try:
        conn.send(tr.address)
        tr.start(conn.recv())
        if scenario == "cases":
            conn.send(run_cases(tr, rank, p))
        elif scenario == "serve":                # wait for the parent's word (or to be killed)
            if conn.poll(60) and conn.recv() == "exit":
                tr.mark_exited(rank)
                conn.poll(60)
    except BaseException as exc:
        conn.send(exc)
    finally:
        tr.close()


def listening_rank(rank, p, conn):
    """A spawned rank that only listens (it connects nowhere): for a peer that watches it die."""
    tr = SocketTransport(rank, p, timeout_s=60, connect_timeout_s=30)
    try:
        conn.send(tr.address)
        conn.poll(60)
    finally:
        tr.close()


def host_rank(rank, p, session, conn):
    """A spawned rank sharing the host with the parent's (its rings made, buffers in its segments)
    that takes no part in any op: it waits to be killed."""
    from hcomm.memory.segment_provider import SegmentProvider
    tr = SocketTransport(rank, p, timeout_s=60, connect_timeout_s=30)
    memory = SegmentProvider(session, rank)
    try:
        conn.send(tr.address)
        tr.start(conn.recv(), eager=False)
        tr.share_host(memory, range(p))
        conn.send("ready")
        conn.poll(60)
    finally:
        tr.close()
        memory.close()
