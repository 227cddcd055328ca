"""What every strategy is: a name, a config section (adalayers.settings.Section), and `train(...) -> Trained`.

Strategies trained by the generic harness (everything but the AdaLayers recipe) only write
`build(cfg, backbone, data) -> model`; HarnessStrategy trains it, saves its trained tensors and
config to the run folder, and `adalayers.lab.strategies.saved.load_run` rebuilds it from there (the
adapter ablation needs that).
"""
from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from adalayers.store import run as runlib
from adalayers.lab.strategies.harness import OptimConfig, SharedPassModel, Trained, count_trainable, train_and_score

TRAINED = "trainable.safetensors"
META = "strategy.json"


class Strategy:
    Config: type = OptimConfig
    arg_field: str | None = None      # "name:N" puts N into this config field
    shares_base_pass: bool = True     # can ride the main model's own forward pass
    trains_base: bool = False         # changes (a copy of) the base's own weights

    def __init__(self, spec: str, conf):
        self.spec, self.conf = spec, conf

    def train(self, cfg, backbone, data, encoded, out: Path) -> Trained:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"spec": self.spec, "strategy": type(self).__name__, "config": self.conf.to_dict(),
                "shares_base_pass": self.shares_base_pass, "trains_base": self.trains_base}


class HarnessStrategy(Strategy):
    def build(self, cfg, backbone, data):
        raise NotImplementedError

    def effective_params(self, model) -> int:
        return count_trainable(model)

    def train(self, cfg, backbone, data, encoded, out: Path) -> Trained:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        model = self.build(cfg, backbone, data)
        if isinstance(model, SharedPassModel):  # a frozen base: its hidden states come from the cache
            from adalayers.recipes.service import make_source

            model.use_source(make_source(cfg, backbone, data, encoded))
        s = train_and_score(model, data, encoded, cfg, self.conf, out, backbone.device, self.spec)
        from adalayers.engine import distributed

        if distributed.is_main():  # under torchrun: rank 0 writes
            save_run(out, self, model, cfg, data, backbone)
        distributed.barrier()
        return Trained(s["results"], self.effective_params(model), s["train_seconds"], s["epochs"],
                       s["best_epoch"], model.infer, self.extra(model))

    def extra(self, model) -> dict:
        return {}


def save_run(out: Path, strategy: Strategy, model, cfg, data, backbone) -> None:
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.named_parameters() if v.requires_grad}
    tensors.update({k: v.detach().cpu().contiguous() for k, v in model.named_buffers() if k.endswith("keep")})
    save_file(tensors, str(out / TRAINED))
    runlib.write_json(out / META, {**strategy.describe(), "run_config": cfg.to_dict(), "labels": data.labels,
                                   "task": data.name, "kind": data.kind, "main_metric": data.main_metric,
                                   "base": {"name": backbone.name, "fingerprint": backbone.fingerprint()},
                                   "checksums": {TRAINED: runlib.sha256(out / TRAINED)}})
