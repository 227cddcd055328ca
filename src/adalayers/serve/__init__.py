"""Serving trained side tasks: SideTasks (one base pass, many heads) and the HTTP app."""


def __getattr__(name):  # lazy: the CLI imports adalayers.cli.serve without loading torch
    if name == "SideTasks":
        from adalayers.infer.sidetasks import SideTasks
        return SideTasks
    raise AttributeError(name)


__all__ = ["SideTasks"]
