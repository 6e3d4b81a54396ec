"""hcomm: the transport layer of hccl-sim.

Links, routes and ports (from `topologies`), the timing model that prices a set of per-rank step
lists on a topology (`timing.replay`), registered memory and zero-copy point-to-point channels
with tags and deadlines (`transport`), and the executor that runs one rank's steps on real
buffers (`executor`). Nothing here knows what an AllReduce is.
"""
from topologies.errors import HcclError
from .steps import Copy, Recv, Send, Slice, Stage, Step
from .timing import replay
from .transport import InProcessTransport, Message
from .executor import execute

__all__ = ["HcclError", "Copy", "Recv", "Send", "Slice", "Stage", "Step", "replay",
           "InProcessTransport", "Message", "execute"]
