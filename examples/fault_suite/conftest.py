"""Makes the project's module importable from its tests wherever pytest is started."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
