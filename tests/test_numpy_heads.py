"""The numpy heads (adalayers.infer.numpy_heads) against the torch modules on random weights: every head kind,
the mixer fed layer by layer and all layers at once, several heads batched, an ensemble, a run folder read
without torch. The torch side is the obvious, slow reference: each SideTask's own tap() and end()/read()."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from adalayers.config import Config
from adalayers.infer import numpy_heads as nh
from adalayers.infer.layer_mix import LayerMix
from adalayers.infer.numpy_runs import ensemble, load_task, task_from_state
from adalayers.model.sidetask import SideTask

L, D = 5, 24
TOL = 1e-4


def make(kind: str, k: int = 16, pooling: str = "mean", seed: int = 0, bos: bool = False, **mixer) -> SideTask:
    cfg = Config()
    cfg.head.kind, cfg.mixer.k, cfg.head.num_heads, cfg.head.pooling = kind, k, 2, pooling
    cfg.head.dim_feedforward, cfg.head.encoder_layers = 32, 2
    cfg.mixer.cutoff = 0.05
    for name, value in mixer.items():
        setattr(cfg.mixer, name, value)
    if kind == "regression":
        cfg.head.target_mean, cfg.head.target_std = 2.5, 1.5
    torch.manual_seed(seed)
    task = SideTask(cfg, L, D, [] if kind == "regression" else ["a", "b", "c"], bos=bos).eval()
    with torch.no_grad():
        task.mixer.p.copy_(torch.randn(L) * 0.05)  # some layers under the cutoff, some kept
        for p in task.head.parameters():  # LayerNorm weights away from 1 and biases away from 0
            p.add_(torch.randn_like(p) * 0.1)
    return task


def to_numpy(task: SideTask) -> nh.Task:
    state = {n: p.detach().numpy() for n, p in task.named_parameters()}
    return task_from_state(task.cfg, task.labels, state, task.skip_bos, L, D)


def reference(task: SideTask, states: list[torch.Tensor], mask: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        task.begin()
        for i, z in enumerate(states):
            task.tap(i, z)
        return task.read(task.take(), mask).numpy()


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    states = [torch.randn(3, 7, D, generator=g) * 2 for _ in range(L)]
    mask = torch.ones(3, 7, dtype=torch.bool)
    mask[1, :3] = False  # left padding, as generation's prompts
    mask[2, :5] = False
    return states, mask


def numpy_accs(tasks: list[nh.Task], states, mask, all_at_once: bool) -> list[np.ndarray]:
    """The LayerMix over the real tokens only (as llama.cpp hands them), spread back to (B, T, k)."""
    keep = mask.numpy()
    mix = LayerMix(tasks)
    mix.begin(int(keep.sum()))
    zs = [z.numpy()[keep] for z in states]
    if all_at_once:
        mix.add_layers(list(range(L)), np.stack(zs))
    else:
        for i, z in enumerate(zs):
            mix.add(i, z)
    out = []
    for acc in mix.take():
        full = np.zeros((*keep.shape, acc.shape[-1]), np.float32)
        full[keep] = acc
        out.append(full)
    return out


KINDS = [("sequence", "mean"), ("sequence", "max"), ("sequence", "first"), ("regression", "last"), ("token", "mean")]


@pytest.mark.parametrize("kind,pooling", KINDS)
@pytest.mark.parametrize("all_at_once", [False, True])
def test_each_head_kind_equals_torch(kind, pooling, all_at_once):
    task = make(kind, pooling=pooling, seed=3, bos=True)
    states, mask = batch(1)
    mine = to_numpy(task)
    assert 0 < len(mine.proj) < L  # the cutoff left some layers out
    acc = numpy_accs([mine], states, mask, all_at_once)[0]
    got = mine.read(acc, mask.numpy())
    want = reference(task, states, mask)
    if kind == "token":
        seen = task.seen(mask).numpy()
        got, want = got[seen], want[seen]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def test_mixer_options_equal_torch():
    """gelu_after_sum, no positions, a pinned layer."""
    task = make("sequence", seed=4, gelu_after_sum=True, positional=False, pin_layer=2)
    states, mask = batch(2)
    mine = to_numpy(task)
    assert list(mine.proj) == [2]
    got = mine.read(numpy_accs([mine], states, mask, False)[0], mask.numpy())
    np.testing.assert_allclose(got, reference(task, states, mask), atol=TOL, rtol=0)


def test_many_heads_batched_equal_each_alone():
    tasks = [make("sequence", 16, "mean", 1), make("sequence", 16, "max", 2), make("regression", 16, "last", 3),
             make("token", 16, seed=5), make("sequence", 8, seed=6)]
    states, mask = batch(3)
    mine = [to_numpy(t) for t in tasks]
    for all_at_once in (False, True):
        assert_read_all_equals_torch(tasks, mine, states, mask, all_at_once)


def assert_read_all_equals_torch(tasks: list[SideTask], mine: list[nh.Task], states, mask, all_at_once: bool) -> None:
    """read_all of the numpy tasks fed by one LayerMix equals each torch SideTask's own read (token tasks: on the
    real tokens)."""
    outs = nh.read_all(mine, numpy_accs(mine, states, mask, all_at_once), mask.numpy())
    for t, got in zip(tasks, outs):
        want = reference(t, states, mask)
        if t.kind == "token":
            seen = mask.numpy()
            got, want = got[seen], want[seen]
        np.testing.assert_allclose(got, want, atol=TOL, rtol=0)


def probe(kind: str, layer: int, pooling: str, seed: int) -> SideTask:
    """A probe head (head.type probe: identity W on one pinned layer) of random linear weights."""
    from types import SimpleNamespace

    from adalayers.recipes.probes import probe_task

    cfg = Config()
    cfg.head.kind = kind
    torch.manual_seed(seed)
    labels = ["a", "b", "c"]
    base = SimpleNamespace(hidden_size=D, num_layers=L, adds_bos=False, device="cpu")
    return probe_task(cfg, base, labels, layer, pooling, torch.randn(3, D), torch.randn(3))


def test_probes_beside_mixer_heads_equal_torch():
    """Probes (their own group in the LayerMix: no d x d identity product) read beside mixer heads, two probes on
    one layer, fed layer by layer and all layers at once."""
    tasks = [probe("sequence", 2, "last", 1), make("sequence", 16, "mean", 2), probe("sequence", 2, "mean", 3),
             probe("token", 4, "mean", 4), make("token", 16, seed=5)]
    states, mask = batch(4)
    mine = [to_numpy(t) for t in tasks]
    for all_at_once in (False, True):
        assert LayerMix(mine).groups == {(D, True): [0, 2, 3], (16, False): [1, 4]}  # the probes' own group
        assert_read_all_equals_torch(tasks, mine, states, mask, all_at_once)


def test_ensemble_equals_torch(tmp_path):
    from adalayers.model.ensemble import EnsembleTask

    members = [make("sequence", 16, seed=s) for s in (7, 8, 9)]
    ens = EnsembleTask(members).eval()
    states, mask = batch(4)
    mine = ensemble([to_numpy(m) for m in members])
    acc = numpy_accs([mine], states, mask, True)[0]
    with torch.no_grad():
        want = ens(states, mask).numpy()
    np.testing.assert_allclose(nh.read_all([mine], [acc], mask.numpy())[0], want, atol=TOL, rtol=0)


def test_gelu_is_the_exact_one():
    """x Phi(x) to float32 precision (math.erfc in float64 as the truth), the compiled kernel's edges (signed
    zeros, subnormals, the flushed tail, inf, NaN) and any shape; torch's float32 GELU is itself off by up to 1e-6
    in the negative tail, so against it the bound is absolute."""
    import math

    x = np.linspace(-14, 14, 100001, dtype=np.float32)  # past -13: Phi below float32's normal range, flushed to 0
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in x.astype(np.float64)])
    np.testing.assert_allclose(nh.gelu(x), exact, rtol=1e-5, atol=1e-30)
    np.testing.assert_allclose(nh.gelu(x), torch.nn.functional.gelu(torch.from_numpy(x)).numpy(), atol=2e-6, rtol=0)
    special = np.array([0.0, -0.0, 1e-40, -1e-40, 100.0, -100.0, np.inf, np.nan], np.float32)
    got = nh.gelu(special)
    assert np.array_equal(got[:6], np.float32([0.0, 0.0, 5e-41, -5e-41, 100.0, 0.0])) and got[6] == np.inf and np.isnan(got[7])
    z = np.random.default_rng(0).standard_normal((19, 3, 64))  # float64, not contiguous: float32 out, same shape
    assert nh.gelu(z[:, ::2]).dtype == np.float32 and nh.gelu(z[:, ::2]).shape == (19, 2, 64)
    np.testing.assert_allclose(nh.gelu(z[:, ::2]), torch.nn.functional.gelu(torch.from_numpy(z[:, ::2])).numpy(),
                               atol=1e-6, rtol=0)


def test_a_steps_few_rows_mix_in_the_compiled_kernel_as_layer_by_layer():
    """LayerMix.add_layers on at most mix_kernel.ROWS rows (one compiled call a group) and on more (the BLAS
    product) against add() layer by layer (numpy's path, held to torch above): two groups of heads (k 16 and 8),
    some layers under a head's cutoff, a probe group beside them."""
    import numba

    from adalayers.infer import kernel_threads
    from adalayers.infer.mix_kernel import ROWS

    tasks = [to_numpy(make("sequence", seed=s)) for s in range(3)] + [to_numpy(make("sequence", k=8, seed=3))]
    assert any(len(t.proj) < L for t in tasks)  # a layer some head does not read: its weight is 0 in the stack
    tasks.append(to_numpy(probe("sequence", 2, "mean", 6)))
    rng = np.random.default_rng(5)
    for threads in (1, 2):  # the kernel's layers split among numba's threads (kernel_threads.use) or not
        kernel_threads.use(threads)
        for n in (1, 5, ROWS, ROWS + 3):
            z = (rng.standard_normal((L, n, D)) * 2).astype(np.float32)
            fused, layered = LayerMix(tasks), LayerMix(tasks)
            fused.begin(n)
            fused.add_layers(list(range(L)), z)
            layered.begin(n)
            for i in range(L):
                layered.add(i, z[i])
            for a, b in zip(fused.take(), layered.take()):
                np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
    kernel_threads.use(numba.config.NUMBA_NUM_THREADS)


def test_the_inline_exponential_is_exp_to_float32_precision():
    """fast_exp.exp_neg (GELU's and the incremental reads' e^y, y <= 0) against math.exp in float64: relative
    error within 2 float32 ulps down to -87, exactly 1 at 0, 0 below -87 (flushed) and at -inf, NaN at NaN."""
    import math

    from adalayers.infer.fast_exp import exp_neg_array

    y = np.concatenate([np.linspace(-87, 0, 200001, dtype=np.float32), np.float32([-1e-30, -0.0, 0.0])])
    got = exp_neg_array(y, np.empty_like(y))
    exact = np.array([math.exp(v) for v in y.astype(np.float64)])
    np.testing.assert_allclose(got, exact, rtol=2.4e-7, atol=0)
    assert got[-1] == got[-2] == 1.0
    tail = np.float32([-87.01, -100.0, -1e30, -np.inf])
    assert not exp_neg_array(tail, np.empty_like(tail)).any()
    nan = np.float32([np.nan])  # a NaN score stays NaN, so that a head fed NaN states fails loudly (its read's check)
    assert np.isnan(exp_neg_array(nan, np.empty_like(nan))).all()


def test_run_folder_loads_without_torch(tmp_path):
    """A run folder written by training's own writer, read in a process where torch cannot be imported."""
    from adalayers.store import run as runlib

    task = make("sequence", seed=11, bos=True)

    class Base:  # what save_config reads of a base
        name, num_layers, hidden_size, is_causal, adds_bos, states = "tiny", L, D, True, True, "decoder"

        def fingerprint(self):
            return "f" * 16

        def num_parameters(self):
            return 1
    sha = runlib.save_head(tmp_path, task)
    runlib.save_config(tmp_path, task.cfg, task.labels, Base(), sha)
    states, mask = batch(5)
    np.save(tmp_path / "states.npy", torch.stack(states).numpy())
    np.save(tmp_path / "mask.npy", mask.numpy())
    code = (f"import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None\n"
            f"import numpy as np\nfrom adalayers.infer.layer_mix import LayerMix\n"
            f"from adalayers.infer.numpy_runs import load_task\n"
            f"t = load_task({str(tmp_path)!r})[0]\nz = np.load({str(tmp_path / 'states.npy')!r})\n"
            f"m = np.load({str(tmp_path / 'mask.npy')!r})\nmix = LayerMix([t]); mix.begin(int(m.sum()))\n"
            f"mix.add_layers(list(range(z.shape[0])), z[:, m])\nacc = np.zeros((*m.shape, t.k), np.float32)\n"
            f"acc[m] = mix.take()[0]\nnp.save({str(tmp_path / 'out.npy')!r}, t.read(acc, m))\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), reference(task, states, mask), atol=TOL, rtol=0)
    assert load_task(tmp_path)[0].skip_bos


def test_attention_in_chunks_of_rows_equals_all_rows_at_once(monkeypatch):
    """attention() takes the rows in chunks when their scores would pass SCORE_BYTES: the same numbers, to the
    last bit (each row's attention is its own), for stacked heads, a ragged mask and a row without keys."""
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((3, 7, 11, 3 * 8)).astype(np.float32)
    keys = rng.random((7, 11)) < 0.7
    keys[2] = False
    whole = nh.attention(qkv, keys, 2)
    monkeypatch.setattr(nh, "SCORE_BYTES", 3 * 2 * 11 * 11 * 4 * 2)  # two rows a chunk: chunks of 2, 2, 2, 1
    calls = []
    real = np.concatenate
    monkeypatch.setattr(nh.np, "concatenate", lambda parts, **kw: calls.append(len(parts)) or real(parts, **kw))
    chunked = nh.attention(qkv, keys, 2)
    assert calls == [4]
    assert np.array_equal(whole, chunked)


def test_the_position_table_gives_position_tables_bits_as_it_grows():
    """PositionTable (the incremental reads' positions, computed once) against position_table on the same positions:
    the same bits, before and after it grows past its first 256 rows, for positions in any shape and order."""
    table = nh.PositionTable(10)
    for pos in (np.array([0]), np.arange(5, 40), np.array([255, 3, 256]), np.arange(700, 900).reshape(4, 50),
                np.array([2047, 0])):
        assert np.array_equal(table(pos), nh.position_table(pos, 10))
    assert len(table(np.array([1]))) == 1 and table(np.zeros(0, np.int64)).shape == (0, 10)
