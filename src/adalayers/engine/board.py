"""Optional TensorBoard scalars (train.tensorboard: true): one point per epoch under <run>/tensorboard.

Written: train_loss, lr, every numeric validation metric, and each layer weight of an AdaLayers
mixer (layer_weights/<i>). Needs the `tensorboard` package (pip install 'adalayers[tensorboard]').
"""
from __future__ import annotations

from pathlib import Path

from adalayers.errors import ConfigError


class Board:
    def __init__(self, run_dir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("train.tensorboard: true needs the tensorboard package "
                              "(pip install 'adalayers[tensorboard]')") from None
        self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))

    def epoch(self, entry: dict) -> None:
        step = entry["epoch"]
        for key in ("train_loss", "lr"):
            if isinstance(entry.get(key), (int, float)):
                self.writer.add_scalar(key, entry[key], step)
        for name, value in (entry.get("validation") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"validation/{name}", value, step)
        for i, w in enumerate(entry.get("layer_weights") or []):
            self.writer.add_scalar(f"layer_weights/{i}", w, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
