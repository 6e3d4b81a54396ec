"""The user's commands: the CLI (`cli`), the nccl-tests / hccl_test style benchmark (`bench`) and
Chrome traces (`trace`)."""
