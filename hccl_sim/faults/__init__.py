"""Faults: the user's FaultPlan and what every rank derives from it (`fault_plan`), the transfers a
communicator has made so far that corrupt entries count (`progress`), and HCCL's op retry with
its error messages (`retry`)."""
