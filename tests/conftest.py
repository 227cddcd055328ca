"""Tiny random models built locally (no downloads), the path of the real data, one local Ray for the session, and
the user's cache for the real GGUF bases."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import transformers
from transformers import BertTokenizerFast

from adalayers.model.backbone import Backbone

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("ADALAYERS_DATA") or ROOT.parent / "shared" / "data")
# before _private_cache points ADALAYERS_CACHE at the session's folder: where the user's own commands keep models
USER_CACHE = os.environ.get("ADALAYERS_CACHE")
WORDS = ("the a book was written by john mary sees dog cat runs quickly big small good bad movie film "
         "great terrible is and of to in it . , ! ? she he they we love hate").split()


def tiny_tokenizer() -> BertTokenizerFast:
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] \
        + list("abcdefghijklmnopqrstuvwxyz")
    return BertTokenizerFast(vocab={tok: i for i, tok in enumerate(vocab)}, do_lower_case=True)


def tiny_model(kind: str, vocab_size: int) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(vocab_size=vocab_size, pad_token_id=0)
    if kind == "bert":
        cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                      intermediate_size=37, max_position_embeddings=128, **common)
        return transformers.BertModel(cfg)
    if kind == "roberta":
        cfg = transformers.RobertaConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                                         intermediate_size=37, max_position_embeddings=130, **common)
        return transformers.RobertaModel(cfg)
    if kind == "bart":
        cfg = transformers.BartConfig(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                                      decoder_attention_heads=2, encoder_ffn_dim=37, decoder_ffn_dim=37,
                                      max_position_embeddings=128, bos_token_id=2, eos_token_id=3,
                                      decoder_start_token_id=2, forced_eos_token_id=None, **common)
        return transformers.BartModel(cfg)
    raise ValueError(kind)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(params=["bert", "roberta", "bart"])
def backbone(request, tokenizer) -> Backbone:
    model = tiny_model(request.param, len(tokenizer))
    return Backbone(model, tokenizer, f"tiny-{request.param}")


def tiny_backbone(kind: str, tokenizer, states: str = "encoder") -> Backbone:
    return Backbone(tiny_model(kind, len(tokenizer)), tokenizer, f"tiny-{kind}", states)


needs_data = pytest.mark.skipif(not (DATA / "glue" / "CoLA" / "train.tsv").is_file(),
                                reason=f"real data not found at {DATA}")


@pytest.fixture(autouse=True)
def _config_decides_the_data_dir(monkeypatch):
    """ADALAYERS_DATA would override the data_dir of tests that write their own files; DATA keeps it."""
    monkeypatch.delenv("ADALAYERS_DATA", raising=False)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Tests never write into the user's ~/.cache/adalayers, but for the real GGUF bases' files (real_base_cache)."""
    if "ADALAYERS_CACHE" not in os.environ:
        os.environ["ADALAYERS_CACHE"] = str(tmp_path_factory.mktemp("adalayers-cache"))
    yield


@pytest.fixture
def real_base_cache(monkeypatch) -> str | None:
    """ADALAYERS_CACHE back at the user's cache (for this test and the processes it starts): the real GGUF bases
    (gemma3-270m, qwen2.5-0.5b) are joined and converted there, pinned by their sha256, once per machine as the
    user's own commands would (minutes), not once per session in the session's folder. Returns its value (None:
    ~/.cache/adalayers)."""
    if USER_CACHE is None:
        monkeypatch.delenv("ADALAYERS_CACHE", raising=False)
    else:
        monkeypatch.setenv("ADALAYERS_CACHE", USER_CACHE)
    return USER_CACHE


@pytest.fixture(scope="session")
def local_ray():
    """One local Ray for every Ray test of the session (loopback only, no dashboard, no usage stats), started by
    the first test that asks for it and stopped at the session's end; the tests that use it (or are marked `ray`)
    run last, together (pytest_collection_modifyitems), so the other tests never share the machine with an idle Ray.
    Its workers inherit the environment of that first moment (test_llamacpp_ray starts it inside its runs' cache)."""
    ray = pytest.importorskip("ray")
    from adalayers.raylocal import init_ray

    started = init_ray(num_cpus=2)
    assert ray.util.get_node_ip_address() == "127.0.0.1"  # loopback, though a test module imported Ray first
    yield ray
    if started:
        ray.shutdown()


def _uses_ray(item) -> bool:
    return item.get_closest_marker("ray") is not None or "local_ray" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)  # after pytest grouped the tests by their parametrized fixtures
def pytest_collection_modifyitems(items):
    """The tests that use local_ray (or are marked `ray`) move to the end, in their order: one Ray start serves
    them all."""
    items[:] = [i for i in items if not _uses_ray(i)] + [i for i in items if _uses_ray(i)]
