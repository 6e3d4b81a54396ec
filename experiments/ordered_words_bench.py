"""What ordered shared-memory words cost (hcomm.memory.ordered), per access and per control round.

1. Per access, in one process: a plain memoryview load and store of an 8-byte word (what the
   shared-memory code did before, correct on amd64 only), the `atomics` package's public view
   (load with acquire, store with release), and hcomm.memory.ordered.Words (the same patomic ops
   called from its op table): load (acquire), store (release), store_fenced.
2. Per control round: p spawned processes run --ops allgathers of 8 bytes on one control block
   (hcomm.control.shm), the time per round on rank 0 (median of 5 blocks of ops). Run it with
   PYTHONPATH at a checkout before and after the change to compare (the machine is shared: compare
   figures of one sitting).

    PYTHONPATH=. python experiments/ordered_words_bench.py [--ranks 4] [--ops 2000]
"""
import argparse
import mmap
import multiprocessing as mp
import statistics
import time
import timeit
import uuid

import atomics


def per_access(n=200_000):
    from hcomm.memory.ordered import Words
    m = mmap.mmap(-1, 4096)
    buf = memoryview(m)
    q = buf.cast("q")
    w = Words(buf)
    ctx = atomics.atomicview(buffer=buf[64:72], atype=atomics.INT)
    view = ctx.__enter__()
    mo = atomics.MemoryOrder
    g = dict(q=q, w=w, view=view, mo=mo)
    rows = [("plain memoryview load", "q[8]"), ("plain memoryview store", "q[8] = 5"),
            ("atomics view load (acquire)", "view.load(mo.ACQUIRE)"),
            ("atomics view store (release)", "view.store(5, mo.RELEASE)"),
            ("Words.load (acquire)", "w.load(8)"), ("Words.store (release)", "w.store(8, 5)"),
            ("Words.store_fenced", "w.store_fenced(8, 5)")]
    out = {}
    for name, stmt in rows:
        k = n // 20 if "view" in stmt else n
        out[name] = min(timeit.repeat(stmt, globals=g, number=k, repeat=5)) / k * 1e9
        print(f"{name:32s} {out[name]:8.0f} ns")
    ctx.__exit__(None, None, None)
    q.release()
    buf.release()
    m.close()
    return out


def _rank(session, rank, ops, out):
    from hcomm.control.shm import ControlBlock
    block = ControlBlock.attach(session, rank)
    try:
        seq, blocks = 0, []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(ops // 5):
                block.allgather(seq, b"12345678", time.monotonic() + 60)
                seq += 1
            blocks.append((time.perf_counter() - t0) / (ops // 5))
        if rank == 0:
            out.put(statistics.median(blocks))
    finally:
        block.close()


def per_round(p, ops):
    from hcomm.control.shm import ControlBlock
    session = f"owb{uuid.uuid4().hex[:8]}"
    owner = ControlBlock.create(session, p)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(session, r, ops, out)) for r in range(p)]
    try:
        for pr in procs:
            pr.start()
        got = out.get(timeout=600)
        for pr in procs:
            pr.join(60)
    finally:
        owner.close()
    print(f"control round, {p} processes: {got * 1e6:.1f} us per allgather (median of 5 blocks of {ops // 5})")
    return got


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--skip-access", action="store_true")
    a = ap.parse_args()
    if not a.skip_access:
        per_access()
    per_round(a.ranks, a.ops)
