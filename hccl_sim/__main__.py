"""`python -m hccl_sim` is the `hccl-sim` command."""
import sys

from .tools.cli import main

sys.exit(main())
