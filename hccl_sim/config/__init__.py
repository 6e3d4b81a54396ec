"""What a communicator is configured by: HCCL's environment variables (`env`), HCCL_ALGO's syntax
(`hccl_algo`), and reduce ops and data types by HCCL's, nccl-tests' and numpy's names (`types`)."""
