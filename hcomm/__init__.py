"""hcomm: the transport layer of hccl-sim.

Links, routes and ports (from `topologies`), the timing model that prices a set of per-rank step
lists on a topology (`timing.replay`), registered memory and tagged, deadline-bounded point-to-point
channels (`transports`: the protocol; in-process, socket and Ray object-store transports), and the
executor that runs one rank's steps on real buffers over any of them (`exec`). Nothing here knows what an AllReduce is.
"""
from topologies.errors import HcclError
from .steps import Copy, Recv, Send, Slice, Stage, Step
from .timing import replay
from .transports import InProcessTransport, Message, Transport
from .exec import run_schedule as execute

__all__ = ["HcclError", "Copy", "Recv", "Send", "Slice", "Stage", "Step", "replay",
           "InProcessTransport", "Message", "Transport", "execute"]
