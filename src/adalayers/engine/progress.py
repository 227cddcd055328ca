"""Progress and messages: `bar` and `setup_logging` live in adalayers.progress (no torch there: the CLI and
the torch-free serving path set up logging without importing the engine); re-exported here for the engine."""
from adalayers.progress import bar, setup_logging  # noqa: F401
