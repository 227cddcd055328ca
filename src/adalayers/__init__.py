"""adalayers: side-task heads on the hidden states of a frozen transformer, all served from one forward pass."""
from adalayers.errors import AdaLayersError, ConfigError, DataError, ModelError, RunError

__version__ = "0.1.0"
__all__ = ["AdaLayersError", "ConfigError", "DataError", "ModelError", "RunError", "__version__"]
