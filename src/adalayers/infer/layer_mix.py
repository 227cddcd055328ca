"""Every head's accumulator F, fed layer by layer as the base computes (the mixer of numpy_heads' formulas).

Per layer i, the W_i of all heads that read layer i stacked into one (d, H k) matrix, so a layer costs one GELU,
one matrix product and one LayerNorm whatever the number of heads (add: a prefill's layer, its rows in blocks on
the calling thread's numba threads, infer/mix_blocks.py, or numpy's way where numpy's BLAS exports no sgemm); a
pass's positions may also go through every layer at once (add_layers: one batched product, or for a decode step's
few rows one compiled call, infer/mix_kernel.py). tests/test_numpy_heads.py holds it to the torch mixer
(AdaLayersMixer) and the ways to each other (tests/test_mix_blocks.py too).
"""
from __future__ import annotations

import numpy as np

from adalayers.infer import blas
from adalayers.infer.numpy_heads import Scratch, Task, gelu, layer_norm


class LayerMix:
    """Every head's accumulator F, fed layer by layer: per layer, the W_i of all heads reading layer i stacked
    (heads of one k form a group; a seed ensemble's members are heads here), one product per layer and group.
    A probe's W_i is the identity (model.heads.probe_projection): the probes form a group of their own whose
    f_i = LayerNorm_noaffine(GELU(Z_i)) needs no product (a d x d identity product read d*d floats a step).

        mix.begin(n)                # n token positions in this pass
        mix.add(i, Z_i)             # Z_i (n, d), as the base computes layer i
        mix.add_layers(layers, Z)   # or all at once, Z (len(layers), n, d): one batched product (decode steps)
        accs = mix.take()           # [task's F (n, k)] in the order of the tasks (an ensemble: (n, M k))
    """

    def __init__(self, tasks: list[Task]):
        self.tasks = tasks
        self.leaves = [m for t in tasks for m in (t.members or [t])]
        self.groups: dict[tuple[int, bool], list[int]] = {}  # (k, identity W) -> leaf indices
        for j, leaf in enumerate(self.leaves):
            self.groups.setdefault((leaf.k, _identity(leaf)), []).append(j)
        layers = sorted({i for leaf in self.leaves for i in leaf.proj})
        self.layers = layers
        self._plans = {(g, i): self._plan(g, members, i) for g, members in self.groups.items() for i in layers}
        self._stacks: dict[tuple, tuple] = {}
        self._acc: dict[tuple[int, bool], np.ndarray] = {}
        self._scratch = Scratch(2)  # add_layers' GELU of the states (0), add's (1)

    def _plan(self, group: tuple[int, bool], members: list[int], i: int
              ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray] | None:
        live = [h for h, j in enumerate(members) if i in self.leaves[j].proj]
        if not live:
            return None
        w_t = None if group[1] else np.ascontiguousarray(
            np.concatenate([self.leaves[members[h]].proj[i] for h in live]).T)  # (d, H k)
        w = np.array([self.leaves[members[h]].weights[i] for h in live], np.float32)[:, None]
        return np.array(live, np.int64), w_t, w

    def begin(self, n: int) -> None:
        self._acc = {g: np.zeros((n, len(m), g[0]), np.float32) for g, m in self.groups.items()}

    def add(self, i: int, z: np.ndarray) -> None:
        """Layer i's states z (n, d) into every group that reads it: with numpy's OpenBLAS, a projected group's
        GELU, product and LayerNorm in row blocks on the calling thread's numba threads (infer/mix_blocks.py, one
        call a group, the GELU written once a layer); otherwise numpy's GELU, matmul and LayerNorm."""
        a, normed = None, None
        gemm = blas.sgemm()  # through the module: tests and benchmarks/prefill_mix.py swap it for None
        for g, acc in self._acc.items():
            plan = self._plans.get((g, i))
            if plan is None:
                continue
            live, w_t, w = plan
            if w_t is not None and gemm is not None:
                from adalayers.infer.mix_blocks import mix_blocks
                z = np.ascontiguousarray(z, dtype=np.float32)
                have_a = a is not None
                a = self._scratch.get(1, z.shape) if a is None else a  # valid until the next add
                mix_blocks(z, a, have_a, w_t, w.reshape(-1), live, acc, gemm)
                continue
            a = gelu(z) if a is None else a
            if w_t is None:
                normed = layer_norm(a) if normed is None else normed
                f = normed[:, None, :]
            else:
                f = layer_norm((a @ w_t).reshape(len(a), len(live), g[0]))
            if len(live) == acc.shape[1]:
                acc += f * w
            else:
                acc[:, live] += f * w

    def add_layers(self, layers: list[int], z: np.ndarray) -> None:
        """Layers `layers` at once, z (L, n, d): one GELU, per group one (L, n, d) x (L, d, H k) product, one
        LayerNorm and one weighted sum over the layers (a head that does not read layer i has W_i and w_i 0).
        The probes' group: LayerNorm(GELU(Z_i)) of the layers some probe reads, weighted per probe. A step's
        few rows: one compiled call a group instead, GELU included (infer/mix_kernel.py, imported at the first
        call as gelu's); many rows, with numpy's OpenBLAS: add()'s row blocks, a call a layer and group."""
        from adalayers.infer.mix_kernel import ROWS, mix_rows
        a = None  # GELU(z), taken once where a group needs it (mix_rows takes its own)
        gemm = blas.sgemm()  # through the module: tests and benchmarks/prefill_mix.py swap it for None
        for g, acc in self._acc.items():
            w_t, w, read = self._stack(g, tuple(layers))
            if w_t is not None and z.shape[1] <= ROWS:
                mix_rows(np.ascontiguousarray(z, dtype=np.float32), w_t, w, acc)
                continue
            if w_t is not None and gemm is not None:  # many rows (LATER_ROWS' kept steps): add()'s row blocks
                from adalayers.infer.mix_blocks import mix_blocks
                z = np.ascontiguousarray(z, dtype=np.float32)
                have_a = a is not None
                a = self._scratch.get(0, z.shape) if a is None else a  # valid until the next add_layers
                every = np.arange(acc.shape[1])
                for li in range(len(layers)):
                    mix_blocks(z[li], a[li], have_a, w_t[li], w[li], every, acc, gemm)
                continue
            a = gelu(z, out=self._scratch.get(0, z.shape)) if a is None else a  # valid until the next add_layers
            if w_t is None:  # w: (the layers some probe reads, probes)
                acc += np.einsum("lh,lnk->nhk", w, layer_norm(a[read]))
            else:  # einsum with no optimize=: its path search costs more than the sum
                y = np.matmul(a, w_t).reshape(*a.shape[:2], *acc.shape[1:])
                acc += np.einsum("lh,lnhk->nhk", w, layer_norm(y))

    def _stack(self, group: tuple[int, bool], layers: tuple) -> tuple[np.ndarray | None, np.ndarray, list[int]]:
        """(W_i^T stacked (L, d, H k), or None for the probes' group; w (L, H); the layers' places in `layers`
        the group reads: all of them for a projected group, the probes' own for theirs)."""
        key = (group, layers)
        if key not in self._stacks:
            members = self.groups[group]
            k = group[0]
            d = next(iter(self.leaves[members[0]].proj.values())).shape[1]
            w_t = None if group[1] else np.zeros((len(layers), d, len(members) * k), np.float32)
            w = np.zeros((len(layers), len(members)), np.float32)
            for li, i in enumerate(layers):
                for h, j in enumerate(members):
                    if i in self.leaves[j].proj:
                        if w_t is not None:
                            w_t[li, :, h * k:(h + 1) * k] = self.leaves[j].proj[i].T
                        w[li, h] = self.leaves[j].weights[i]
            read = list(range(len(layers))) if w_t is not None else [li for li in range(len(layers)) if w[li].any()]
            self._stacks[key] = (w_t, w if w_t is not None else w[read], read)
        return self._stacks[key]

    def take(self) -> list[np.ndarray]:
        """Each task's F of this pass, (n, k) (an ensemble: its members' side by side), and the pass's state dropped."""
        where = {j: (g, h) for g, members in self.groups.items() for h, j in enumerate(members)}
        leaf = [self._acc[where[j][0]][:, where[j][1]] for j in range(len(self.leaves))]
        out, j = [], 0
        for t in self.tasks:
            m = len(t.members) or 1
            out.append(leaf[j] if m == 1 else np.concatenate(leaf[j:j + m], -1))
            j += m
        self._acc = {}
        return out


def _identity(task: Task) -> bool:
    """Every W_i of the task is the identity matrix (a probe's: F_i = LayerNorm_noaffine(GELU(Z_i)))."""
    return all(w.shape[0] == w.shape[1] and np.array_equal(w, np.eye(len(w), dtype=w.dtype))
               for w in task.proj.values())
