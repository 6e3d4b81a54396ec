"""Which blocking wake-up the shared-memory control plane should use: a futex on a shared word,
or a named FIFO in /dev/shm (a pipe reachable by name). Two spawned processes ping-pong a counter
--iters times, each blocking until the other's write; prints the median round trip of each.

    python experiments/shm_wait_pingpong.py
"""
import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import time

from hcomm.memory import segments as shm
from hcomm.control.shm import _FUTEX_WAIT, _FUTEX_WAKE, _L, _SYS_FUTEX, _Mapping, _syscall


def _futex_side(name, me, iters, rounds):
    seg = _Mapping(name)
    q = seg.buf.cast("q")
    probe = ctypes.c_char.from_buffer(seg.buf)
    base = ctypes.addressof(probe)
    del probe
    times = []
    for i in range(iters):
        t0 = time.perf_counter()
        if me == 0:
            q[0] = 2 * i + 1
            _syscall(_L(_SYS_FUTEX), _L(base), _L(_FUTEX_WAKE), _L(1), None, None, _L(0))
        while True:                              # wait for the other side's step
            seen = q[0]                          # one read: compared here and by the kernel
            if seen == 2 * i + 2 - me:
                break
            _syscall(_L(_SYS_FUTEX), _L(base), _L(_FUTEX_WAIT), _L(seen), None, None, _L(0))
        if me == 1:
            q[0] = 2 * i + 2
            _syscall(_L(_SYS_FUTEX), _L(base), _L(_FUTEX_WAKE), _L(1), None, None, _L(0))
        times.append(time.perf_counter() - t0)
    q.release()
    seg.close()
    if me == 0:
        rounds.put(times)


def _fifo_side(paths, me, iters, rounds):
    # open order matters: a FIFO open blocks until its other end is opened
    if me == 0:
        w = os.open(paths[0], os.O_WRONLY)
        r = os.open(paths[1], os.O_RDONLY)
    else:
        r = os.open(paths[0], os.O_RDONLY)
        w = os.open(paths[1], os.O_WRONLY)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        if me == 0:
            os.write(w, b"x")
            os.read(r, 1)
        else:
            os.read(r, 1)
            os.write(w, b"x")
        times.append(time.perf_counter() - t0)
    os.close(r)
    os.close(w)
    if me == 0:
        rounds.put(times)


def run(kind, iters):
    ctx = mp.get_context("spawn")
    session = shm.new_session()
    rounds = ctx.Queue()
    if kind == "futex":
        seg = _Mapping(f"{shm.PREFIX}{session}_pingpong", 64)
        args = [(seg.name, me, iters, rounds) for me in (0, 1)]
        target = _futex_side
    else:
        paths = [f"/dev/shm/{shm.PREFIX}{session}_fifo{i}" for i in (0, 1)]
        for path in paths:
            os.mkfifo(path, 0o600)
        args = [(paths, me, iters, rounds) for me in (0, 1)]
        target = _fifo_side
    procs = [ctx.Process(target=target, args=a) for a in args]
    try:
        for p in procs:
            p.start()
        times = rounds.get(timeout=120)
        for p in procs:
            p.join(timeout=30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        if kind == "futex":
            seg.close()
        shm.cleanup(session)
    return statistics.median(times[iters // 10:]) * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    print(f"# load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for kind in ("futex", "fifo", "futex", "fifo"):
        print(f"{kind:>6} round trip median {run(kind, args.iters):7.1f} us")


if __name__ == "__main__":
    main()
