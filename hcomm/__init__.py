"""hcomm: the layer of hccl-sim that moves bytes and prices them.

- Schedules: the step vocabulary (`steps`) and programs, every rank's steps at once as arrays per
  global step (`program`).
- Pricing: the CostModel, one per (topology content, link state), which owns every cache built
  from prices (`cost`); link state in time and retransmission (`link_state`); the event-driven
  reference replay (`timing.replay`) and the vectorised engine (`vtiming`, `vcontention`).
- Moving bytes: the Transport protocol and its implementations, tagged and deadline-bounded, one
  module each (`transports`: in-process, socket, Ray object store, MPI; the peer endpoint they
  share; a sub-communicator's scoped view); every byte mover, over a DataProgram (`exec`: the
  central share of a whole op's serial data program, the per-rank executor that runs one rank's
  steps over any transport, the shared-memory plane, the small-op result path).
- Memory and control: shared memory (`memory`: POSIX segments, MPI-3 windows, a provider over
  each for the shared plane, the result pool), and the control planes, the allgather every
  rendezvous is (`control`: shared memory, MPI, over a peer transport); the MPI transport is a
  folder (`transports/mpi`: endpoint, hub, rounds).

Nothing here knows what an AllReduce is, or which engine placed the ranks.
"""
from topologies.errors import HcclError
from .steps import Copy, RankStep, Recv, Send, Slice, Stage
from .timing import replay
from .transports import InProcessTransport, Message, Transport
from .exec import run_schedule as execute

__all__ = ["HcclError", "Copy", "Recv", "Send", "Slice", "Stage", "RankStep", "replay",
           "InProcessTransport", "Message", "Transport", "execute"]
