"""The project's own error types: every failure a user can cause is one of these, with a message that names the problem."""


class AdaLayersError(Exception):
    """Base class; the CLI prints these as one clear line instead of a traceback."""


class ConfigError(AdaLayersError):
    """A config file or override is missing, unknown or of the wrong type."""


class DataError(AdaLayersError):
    """A data file is missing or malformed (the message names the file and line)."""


class ModelError(AdaLayersError):
    """A base model cannot be found or loaded, or a head does not match its base."""


class RunError(AdaLayersError):
    """A run folder is missing a file, or a file in it was edited."""


class TrainingError(AdaLayersError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


class Cancelled(AdaLayersError):
    """Work stopped between two steps (micro-batches, decode steps) because nobody waits for its answer any
    more: every client left or every deadline passed."""
