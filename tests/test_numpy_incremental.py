"""The incremental per-step sequence-head reads (adalayers.infer.numpy_incremental) against the full read
(numpy_heads.read_all on the whole text so far, a left-padded batch), the slow obvious reference: random heads,
random F, several steps, sequences of unequal lengths joining and leaving, skip_bos, the mixer's options, an
ensemble, two head shapes, probes of each pooling."""
import numpy as np
import pytest

from adalayers.infer import numpy_heads as nh
from adalayers.infer.numpy_incremental import IncrementalReads
from adalayers.infer.numpy_runs import ensemble

D = 12


def seq_task(rng, k: int, pooling: str, kind: str = "sequence", num_heads: int = 2, **opts) -> nh.Task:
    def r(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    c = 1 if kind == "regression" else 3
    head = nh.SequenceHead(num_heads, r(3 * k, k), r(3 * k), r(k, k), r(k), r(c, k), r(c), pooling,
                           (2.5, 1.5) if kind == "regression" else None)
    return nh.Task(kind, [] if kind == "regression" else ["a", "b", "c"], np.ones(1, np.float32),
                   {0: r(k, D)}, head, **opts)


def probe_task(rng, k: int, pooling: str, kind: str = "sequence", **opts) -> nh.Task:
    c = 1 if kind == "regression" else 3
    head = nh.ProbeHead(rng.standard_normal((c, k)).astype(np.float32), rng.standard_normal(c).astype(np.float32),
                        pooling, (2.5, 1.5) if kind == "regression" else None)
    return nh.Task(kind, [] if kind == "regression" else ["a", "b", "c"], np.ones(1, np.float32),
                   {0: np.eye(k, D, dtype=np.float32)}, head, positional=False, **opts)


def tasks(rng) -> list[nh.Task]:
    out = [seq_task(rng, 16, p) for p in ("mean", "max", "first", "last")]
    out += [seq_task(rng, 16, "mean", "regression"), seq_task(rng, 16, "max", skip_bos=True),
            seq_task(rng, 16, "last", skip_bos=True), seq_task(rng, 8, "mean", num_heads=4, gelu_after_sum=True),
            seq_task(rng, 8, "first", num_heads=4, positional=False)]
    out.append(ensemble([seq_task(rng, 16, "mean"), seq_task(rng, 16, "max")]))
    out += [probe_task(rng, D, p) for p in ("mean", "max", "first", "last")]
    out += [probe_task(rng, D, "mean", "regression"), probe_task(rng, D, "last", skip_bos=True),
            probe_task(rng, D, "mean", skip_bos=True), probe_task(rng, 8, "max", gelu_after_sum=True)]
    out.append(ensemble([probe_task(rng, D, "mean"), probe_task(rng, D, "mean")]))
    return out


def full_read(ts, rows: dict, seqs: list, rng, skip_bos=None) -> list[np.ndarray]:
    """read_all on the sequences' whole texts, left-padded (garbage in the padding) into one batch."""
    width = max(len(rows[s][0]) for s in seqs) + 2
    mask = np.zeros((len(seqs), width), bool)
    accs = [rng.standard_normal((len(seqs), width, rows[seqs[0]][j].shape[-1])).astype(np.float32) * 5
            for j in range(len(ts))]
    for b, s in enumerate(seqs):
        n = len(rows[s][0])
        mask[b, width - n:] = True
        for j in range(len(ts)):
            accs[j][b, width - n:] = rows[s][j]
    return nh.read_all(ts, accs, mask, skip_bos)


def width_of(t: nh.Task) -> int:
    return t.k * (len(t.members) or 1)


@pytest.mark.parametrize("skip_bos", [None, False, True])
def test_steps_equal_the_full_read(skip_bos):
    """Sequences of unequal prompts join at different steps and leave; every step's answers are the full read's."""
    rng = np.random.default_rng(0)
    ts = tasks(rng)
    reads = IncrementalReads(ts, skip_bos)
    rows: dict = {}
    joins = {0: {"a": 5, "b": 2}, 2: {"c": 7}, 4: {"d": 3}}  # step -> new sequences and their prompt lengths
    leaves = {3: "a", 6: "c"}
    active: list = []
    for step in range(9):
        if step in leaves:
            reads.drop(leaves[step])
            active.remove(leaves[step])
        new = joins.get(step, {})
        active += list(new)
        counts = [new.get(s, 1) for s in active]
        fresh = [[rng.standard_normal((n, width_of(t))).astype(np.float32) for t in ts] for n in counts]
        for s, f in zip(active, fresh):
            rows[s] = f if s in new else [np.concatenate([a, b]) for a, b in zip(rows[s], f)]
        got = reads.step(active, [np.concatenate([f[j] for f in fresh]) for j in range(len(ts))], counts)
        want = full_read(ts, rows, active, rng, skip_bos)
        for t, g, w in zip(ts, got, want):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())),
                                       err_msg=f"{t.kind} {t.head.pooling if not t.members else 'ensemble'}")
    assert sorted(reads.sequences) == ["b", "d"]


def test_wide_heads_on_one_or_two_kernel_threads():
    """Heads of the configs' width (k 64, 8 attention heads: the compiled read's output blocks split among
    threads) read the same on one and two kernel threads (kernel_threads.use: each (head, block) or (head,
    attention head) pair is computed alike whatever thread takes it), and as the full read."""
    import numba

    from adalayers.infer import kernel_threads

    rng = np.random.default_rng(2)
    ts = [seq_task(rng, 64, p, num_heads=8) for p in ("mean", "max", "first", "last")]
    new = [[rng.standard_normal((n, 64)).astype(np.float32) for _ in ts] for n in (6, 1, 1, 1)]
    got = {}
    for threads in (1, 2):
        kernel_threads.use(threads)
        reads = IncrementalReads(ts)
        for rows in new:
            got[threads] = reads.step(["x"], rows, [len(rows[0])])
    kernel_threads.use(numba.config.NUMBA_NUM_THREADS)
    whole = {"x": [np.concatenate([rows[j] for rows in new]) for j in range(len(ts))]}
    for one, two, want in zip(got[1], got[2], full_read(ts, whole, ["x"], rng)):
        np.testing.assert_array_equal(one, two)
        np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())))


def test_long_text_one_row_at_a_time():
    """Many steps on one sequence (the online softmax's rescaling over a long text), against the full read."""
    rng = np.random.default_rng(1)
    ts = [seq_task(rng, 16, "mean"), seq_task(rng, 16, "max", skip_bos=True), probe_task(rng, 16, "mean")]
    reads = IncrementalReads(ts)
    rows = {"x": [np.zeros((0, 16), np.float32)] * 3}
    for step in range(60):
        new = [rng.standard_normal((1, 16)).astype(np.float32) * (1 + step / 10) for _ in ts]
        rows["x"] = [np.concatenate([a, b]) for a, b in zip(rows["x"], new)]
        got = reads.step(["x"], new, [1])
    for g, w in zip(got, full_read(ts, rows, ["x"], rng)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def test_no_seen_token_yet_is_the_full_read_of_its_rows():
    """With skip_bos a sequence that so far holds only its BOS is read by the full read; then incrementally."""
    rng = np.random.default_rng(2)
    ts = [seq_task(rng, 16, p, skip_bos=True) for p in ("mean", "first", "last")] + [seq_task(rng, 16, "last")]
    ts += [probe_task(rng, 16, p, skip_bos=True) for p in ("mean", "first", "last")]
    reads = IncrementalReads(ts)
    rows = {"x": [rng.standard_normal((1, 16)).astype(np.float32) for _ in ts]}
    for step in range(3):
        got = reads.step(["x"], [r[-1:] for r in rows["x"]], [1])
        mask = np.ones((1, len(rows["x"][0])), bool)
        for g, w in zip(got, nh.read_all(ts, [r[None] for r in rows["x"]], mask)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        rows["x"] = [np.concatenate([r, rng.standard_normal((1, 16)).astype(np.float32)]) for r in rows["x"]]


def test_token_heads_and_bad_steps_refused():
    rng = np.random.default_rng(3)
    token = nh.Task("token", ["a"], np.ones(1, np.float32), {0: np.zeros((8, D), np.float32)},
                    nh.TokenHead([], np.zeros((1, 8), np.float32), np.zeros(1, np.float32)))
    assert not IncrementalReads.applies(token)
    with pytest.raises(ValueError, match="no sequence head or probe"):
        IncrementalReads([token])
    reads = IncrementalReads([seq_task(rng, 8, "mean")])
    with pytest.raises(ValueError, match="each sequence once"):
        reads.step(["a", "a"], [np.zeros((2, 8), np.float32)], [1, 1])
