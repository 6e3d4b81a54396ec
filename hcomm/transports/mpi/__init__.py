"""The MPI transport: ranks are MPI processes (or threads of them) of one job.

- `hub`: one process's MPI traffic (data frames, acknowledgements, aborts, the control allgather,
  closing) on mpi4py buffer calls;
- `rounds`: the hub's control allgather of fixed-size slots and its waits' polling policy;
- `endpoint`: a rank's Transport over the hub.
"""
from .endpoint import MpiTransport
from .hub import MpiHub, require_thread_level

__all__ = ["MpiHub", "MpiTransport", "require_thread_level"]
