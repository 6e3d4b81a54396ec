"""Control planes: the allgather of small payloads that every rendezvous is, with abort, leave
and close. One shape (`base.ControlPlane`, every member declared), four implementations:

| module      | ranks                                   | how                                                  |
|-------------|-----------------------------------------|------------------------------------------------------|
| `shm`, `shm_plane` | processes on one host            | sequence slots in a shared segment, futex waits      |
| `nodes`     | processes on several hosts              | a block per host, its leader in an allgather across  |
| `mpi`       | MPI processes (threads of them)         | one MPI allgather of fixed slots per process (persistent) |
| `transport` | anything with a peer transport          | a dissemination allgather, ceil(log2 p) rounds        |

Every wait takes a deadline and fails with the HcclError the waiting rank should see.

`rounds.GroupRounds` numbers a group's rounds over any of them (the rendezvous and a data
plane's rounds take numbers from one sequence) and gives each its deadline.
"""
