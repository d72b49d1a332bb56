"""``train.optimizer = "muon"``: Muon on the hidden weight matrices, Adam on the rest.

- Which axes Muon treats as a matrix's input and output, from the logical axes (golden cases).
- One step from zero state on random gradients: every hidden matrix moves along the polar factor
  ``U V^T`` of its gradient seen as that matrix (computed here by an SVD, independently of the
  Newton-Schulz iteration), with the root-mean-square of an AdamW step; embeddings, the head and
  the norms take Adam's first step, ``-lr * sign(g)``.
- A scanned stack (a ``layers`` axis) orthogonalises each layer's matrix on its own: the same
  update as the unrolled stack.
- A Muon run stopped and resumed ends with the uninterrupted run's parameters (its momentum is
  checkpointed), and differs from an AdamW run.
- On two data-parallel devices the devices share the Newton-Schulz work (XLA's cost analysis),
  and train as one device does.
- ``train.embedding_lr_scale`` multiplies the step of the lookup tables (the byte embedding and
  the n-gram tables), under AdamW and Muon, and leaves every other step as it was; a bad value is
  refused, naming the key.
- A bad ``train.optimizer`` is refused, naming the key.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import subprocess_env
from flax import nnx
from helpers import LM, corpus_dir, tiny_overrides  # noqa: F401  (corpus_dir: a fixture)

from bytelm.config import load_config
from bytelm.families.byte.model import ByteLM
from bytelm.models.core import LAYER_AXIS
from bytelm.training.loop import train
from bytelm.training.optim import MUON_RMS, make_optimizer, muon_dimensions, schedule_plan
from bytelm.training.restore import restore_scorer

jax.config.update("jax_numpy_rank_promotion", "raise")  # as the other model tests: no silent broadcasting

ONE_STEP = [
    "train.optimizer=muon",
    "train.grad_clip=0",
    "train.weight_decay=0",
    "train.warmup_steps=0",
    "train.learning_rate=0.01",
]


@pytest.mark.parametrize(
    "axes, expected",
    [
        (("embed", "heads", "kv"), ((0,), (1, 2))),  # query/key/value projection
        (("heads", "kv", "embed"), ((0, 1), (2,))),  # output projection
        (("embed", "mlp"), ((0,), (1,))),
        (("mlp", "embed"), ((0,), (1,))),
        ((LAYER_AXIS, "embed", "heads", "kv"), ((1,), (2, 3))),  # a scanned stack: one matrix per layer
        ((LAYER_AXIS, "heads", "kv", "embed"), ((1, 2), (3,))),
        ((None, "embed"), ((0,), (1,))),
        (("vocab", "embed"), None),  # embedding table
        (("embed", "vocab"), None),  # output head
        (("embed",), None),
        ((LAYER_AXIS, "embed"), None),  # a scanned norm
    ],
)
def test_muon_dimensions_from_logical_axes(axes, expected):
    dims = muon_dimensions(axes, len(axes))
    assert (None if dims is None else (tuple(dims.reduction_axis), tuple(dims.output_axis))) == expected


def _random_grads(params, seed=1):
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(treedef, [jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def _one_step(overrides, grads_of=_random_grads):
    cfg = load_config(None, [*LM, *overrides, *ONE_STEP])
    params = nnx.state(ByteLM(cfg.model, rngs=nnx.Rngs(0)), nnx.Param)
    grads = grads_of(params)
    tx = make_optimizer(cfg.train)
    updates, _ = tx.update(grads, tx.init(params), params, plan=schedule_plan(cfg.train, 100))
    return cfg, params, grads, updates


def _flat(tree):
    """``{path: (logical axes, array)}`` of an ``nnx.State``."""
    out = {}
    for path, v in nnx.to_flat_state(tree):
        out[path] = (v.get_metadata().get("logical_axes"), np.asarray(v.get_value()))
    return out


def _matrix(path, x):
    """The matrix an unrolled block's weight multiplies by, written out per weight (independently of
    :func:`muon_dimensions`): the query/key/value projections map ``embed`` to all heads at once,
    the output projection all heads to ``embed``."""
    name = path[-1]
    if name in ("wq", "wk", "wv"):
        return x.reshape(x.shape[0], -1)
    if name == "wo":
        return x.reshape(-1, x.shape[-1])
    return x


@pytest.mark.slow
def test_one_step_follows_the_polar_factor_and_adam():
    cfg, _, grads, updates = _one_step(["model.n_layers=2", "model.scan_layers=false"])
    lr = cfg.train.learning_rate
    g, u = _flat(grads), _flat(updates)
    n_muon = 0
    for path, (axes, upd) in u.items():
        grad = g[path][1]
        if "blocks" not in path or upd.ndim < 2:  # Adam's first step, bias-corrected: -lr * g / (|g| + eps)
            np.testing.assert_allclose(upd, -lr * np.sign(grad), rtol=1e-4, atol=1e-9, err_msg=str(path))
            continue
        n_muon += 1
        gm, um = _matrix(path, grad), _matrix(path, upd)
        left, _, right = np.linalg.svd(gm, full_matrices=False)
        polar = left @ right
        cosine = np.sum(-um * polar) / (np.linalg.norm(um) * np.linalg.norm(polar))
        assert cosine > 0.97, (path, cosine)
        rms = np.sqrt(np.mean(um**2)) / lr
        assert 0.6 * MUON_RMS < rms < 1.1 * MUON_RMS, (path, rms)
    assert n_muon == 2 * 7  # q, k, v, o and the three MLP matrices of each layer


def test_scanned_stack_orthogonalises_each_layer():
    _, _, grads, unrolled = _one_step(["model.n_layers=2", "model.scan_layers=false"])
    g, u = _flat(grads), _flat(unrolled)

    def stacked_grads(params):  # the unrolled run's gradients, layer i at index i of the layers axis
        def one(path, v):
            if LAYER_AXIS not in path:
                return v.replace(jnp.asarray(g[path][1]))
            i = path.index(LAYER_AXIS)
            layers = [g[(*path[:i], "blocks", n, *path[i + 1 :])][1] for n in range(v.get_value().shape[0])]
            return v.replace(jnp.asarray(np.stack(layers)))

        return nnx.from_flat_state([(path, one(path, v)) for path, v in nnx.to_flat_state(params)])

    _, _, _, scanned = _one_step(["model.n_layers=2", "model.scan_layers=true"], stacked_grads)
    n = 0
    for path, (axes, upd) in _flat(scanned).items():
        if LAYER_AXIS not in path:
            np.testing.assert_allclose(upd, u[path][1], rtol=1e-5, atol=1e-7)
            continue
        i = path.index(LAYER_AXIS)
        for layer in range(upd.shape[0]):
            np.testing.assert_allclose(
                upd[layer],
                u[(*path[:i], "blocks", layer, *path[i + 1 :])][1],
                rtol=1e-4,
                atol=1e-6,
                err_msg=str(path),
            )
        n += 1
    assert n == 7 + 2  # the stacked matrices and norms


@pytest.mark.slow
def test_resumed_muon_run_ends_with_the_uninterrupted_parameters(corpus_dir, tmp_path):  # noqa: F811
    over = {"train.steps": 8, "eval.every": 0}
    cfg = load_config(None, tiny_overrides(corpus_dir, **over, **{"train.optimizer": "muon"}))
    train(cfg, tmp_path / "resumed", stop_after=4)
    train(cfg, tmp_path / "resumed")
    train(cfg, tmp_path / "straight")
    train(load_config(None, tiny_overrides(corpus_dir, **over)), tmp_path / "adamw")
    params = {
        name: jax.tree.leaves(restore_scorer(tmp_path / name).params)
        for name in ("resumed", "straight", "adamw")
    }
    for a, b in zip(params["resumed"], params["straight"]):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(
        np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-4
        for a, b in zip(params["straight"], params["adamw"])
    )


def test_config_refuses_an_unknown_optimizer():
    with pytest.raises(ValueError, match="train.optimizer"):
        load_config(None, ["train.optimizer=sgd"])
    with pytest.raises(ValueError, match="train.muon_momentum"):
        load_config(None, ["train.muon_momentum=1.0"])


def test_split_axis_prefers_the_layers_then_the_longest_axis():
    from optax.contrib import MuonDimensionNumbers as D

    from bytelm.training.optim import split_axis

    assert split_axis((4, 192, 3, 64), D((1,), (2, 3)), 2) == 0  # a scanned stack: whole layers per device
    assert (
        split_axis((3, 192, 3, 64), D((1,), (2, 3)), 2) == 1
    )  # 3 layers do not split in 2: the longest axis
    assert split_axis((192, 512), D((0,), (1,)), 2) == 1
    assert split_axis((3, 5), D((0,), (1,)), 2) is None


@pytest.mark.slow
def test_data_parallel_devices_share_the_newton_schulz_work(corpus_dir):  # noqa: F811
    """On two data-parallel devices, Muon's orthogonalisation is split between them (per device,
    its extra FLOPs over AdamW's step fall to about half of one device's, by XLA's cost analysis),
    the training equals the one-device run, and parameters and optimizer state stay replicated."""
    code = textwrap.dedent(
        f"""
        import jax, numpy as np
        from bytelm.config import load_config
        from bytelm.data import load_corpus
        from bytelm.training.optim import schedule_plan
        from bytelm.training.sharding import make_mesh
        from bytelm.training.restore import make_task
        from bytelm.training.trainer import Trainer
        assert jax.device_count() == 2
        corpus = load_corpus("files:{corpus_dir}", segment_bytes=64, max_eval_bytes=4096)

        def trainer(over, n):
            cfg = load_config(None, over)
            task = make_task(cfg, corpus)
            return Trainer(cfg, task, mesh=make_mesh(cfg.train, devices=jax.devices()[:n])), task

        def step_flops(t, batch):
            args = (
                t.params, t.opt_state, t.device_batch(dict(batch)), schedule_plan(t.cfg.train, t.horizon),
                np.asarray([0, 0], np.uint32)
            )
            with jax.set_mesh(t.mesh):
                return t.programs.train_step.lower(*args).compile().cost_analysis()["flops"]

        for scan in ("false", "true"):
            base = {tiny_overrides(corpus_dir, **{"train.learning_rate": 1e-3, "eval.every": 0})!r} + [
                "model.scan_layers=" + scan
            ]
            muon = base + ["train.optimizer=muon"]
            one, task = trainer(muon, 1)
            two, _ = trainer(muon, 2)
            stream = task.train_batches(0)
            batches = [next(stream) for _ in range(3)]
            extra = {{
                n: step_flops(t, batches[0]) - step_flops(trainer(base, n)[0], batches[0])
                for n, t in ((1, one), (2, two))
            }}
            assert 0.35 < extra[2] / extra[1] < 0.75, (scan, extra)
            losses = [
                (float(one.train_step(dict(b))["loss"]), float(two.train_step(dict(b))["loss"]))
                for b in batches
            ]
            assert max(abs(a - b) for a, b in losses) < 1e-5, losses
            worst = max(
                float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(two.params))
            )
            assert worst < 1e-5, (scan, worst)
            for leaf in jax.tree.leaves(two.params) + jax.tree.leaves(two.opt_state):
                assert all(a is None for a in leaf.sharding.spec), (scan, leaf.shape, leaf.sharding.spec)
            print("OK", scan, extra, worst, flush=True)
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=subprocess_env(2), capture_output=True, text=True)
    assert r.stdout.count("OK") == 2, r.stderr[-3000:]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.slow
def test_embedding_lr_scale_multiplies_the_lookup_tables_steps(optimizer):
    over = [f"train.optimizer={optimizer}", "model.ngram_sizes=2,3", "model.hash_table_size=61"]
    _, _, _, base = _one_step(over)
    _, _, _, scaled = _one_step([*over, "train.embedding_lr_scale=5"])
    tables = 0
    for path, (axes, b) in _flat(base).items():
        s = _flat(scaled)[path][1]
        if axes[0] == "vocab":
            tables += 1
            np.testing.assert_allclose(s, 5 * b, rtol=1e-6, err_msg=str(path))
            assert np.abs(b).max() > 0
        else:
            np.testing.assert_array_equal(s, b, err_msg=str(path))
    assert tables == 3  # the byte embedding and two n-gram tables


def test_config_refuses_a_bad_embedding_lr_scale():
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ValueError, match="train.embedding_lr_scale"):
            load_config(None, [*LM, f"train.embedding_lr_scale={bad}"])
