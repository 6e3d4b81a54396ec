"""A rank's handle on its group: the Communicator (`communicator`), what its last op did (`record`),
and sub-communicators made by split and shrink (`split`)."""
