"""One rank of a torch script launched by hccl_sim.torch.launch under torchrun
(`python -m torch.distributed.run ... -m hccl_sim.torch.script_rank JOB`).

The rank's world communicator is connected first, through torchrun's store (the agent's, under a
prefix of the attempt, so that an elastic restart's ranks meet afresh), on the first attempt's
Config (its fault plan) or, on a restart, the fault-free one; this process's World takes it, and
the job's rank function (hccl_sim.torch.scripts.Script, perhaps wrapped by a fault suite's
recorder) runs. How it ended goes to JOB/rank<r>.<attempt>.pkl: its value, its error, or that the
plan stalled it. A rank the plan crashes leaves nothing: its process ends at once
(engines.torchrun.LaunchedPeers). A stalled rank stays alive and still until torchrun stops it. A
rank torchrun stops (SIGTERM) before it has ended finishes first, so that its end says how the
failure met it.
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

END_VALUE, END_ERROR, END_STALLED = "value", "error", "stalled"
STALL_LIMIT_MARGIN_S = 60
"""A stalled rank waits for torchrun to stop it at most HCCL_EXEC_TIMEOUT + this (wall s)."""


def main(job_dir: str) -> int:
    import torch.distributed as dist
    import hccl_sim.torch
    from topologies.errors import HcclError
    from ..engines.torchrun import connect
    from ..faults.fault_plan import RankStalled
    from .scripts import JOB_FILE, RESULT_FILE
    job = pickle.loads((Path(job_dir) / JOB_FILE).read_bytes())
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    config = job["config"] if attempt == 0 else job["clean"]
    out = Path(job_dir) / RESULT_FILE.format(rank=rank, attempt=attempt)

    ended = []

    def end(*what):
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(what))
        tmp.replace(out)                 # whole or not at all: torchrun may stop this process any time
        ended.append(what[0])

    def stopped(signum, frame):
        """torchrun stops the job's other ranks as soon as one fails (a crash the plan made, its
        peer's error), often before they have met the failure themselves: a rank still running
        its script goes on to its own end (the lost peer's error, within its waits' deadlines;
        torchrun kills what is left after its own grace period); one that has ended exits."""
        if ended:
            os._exit(0)
    signal.signal(signal.SIGTERM, stopped)
    timeout = timedelta(seconds=float(config.connect_timeout_s))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), size, False, timeout=timeout)
    store = dist.PrefixStore(f"hccl_sim/attempt{attempt}/", store)
    world = hccl_sim.torch.world()
    try:
        world.provide(connect(store, rank, size, job["topology"], config=config,
                              session=f"{job['session']}-{attempt}"))
        end(END_VALUE, job["fn"](world.comm))
        # a fault suite's recorder returns a failed script's error as data; torchrun must still
        # see the rank fail (to stop the job, or restart it)
        code = 1 if world.script_failed else 0
    except RankStalled:
        end(END_STALLED)
        time.sleep((config.exec_timeout_s or 0) + STALL_LIMIT_MARGIN_S)    # alive, launching nothing
        return 0
    except HcclError as exc:
        end(END_ERROR, exc, time.time())
        code = 1
    except Exception as exc:   # noqa: BLE001 - the rank's end, reported as the engines report one
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
        end(END_ERROR, HcclError("E_INTERNAL", f"{type(exc).__name__}: {exc}\n{text}".rstrip(), rank=rank),
            time.time())
        code = 1
    world.close()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
