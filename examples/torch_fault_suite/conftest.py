"""The project's tests find its script beside them; nothing else is needed (hccl-sim's pytest plugin
comes with the package)."""
