"""Layers under ``jax.lax.scan`` (``model.scan_layers``): the same model as the unrolled stack, and
a program that does not grow with depth.

Parity: a scanned model is initialised with the same random draws as the unrolled one, so its
weights are the unrolled weights stacked (checked exactly), and its scores and gradients equal the
unrolled ones to float32 reassociation (1e-5): scores and gradients for the byte LM, scores for
MegaByte (both stacks scanned) and BLT (its global stack). The sampling caches step through a scanned stack's
layers one by one and give the same logits.

Depth: the lowered training-loss program of a scanned 24-layer byte LM is about as large as a
2-layer one's (the loop body holds one block), where the unrolled program grows with every layer.
Measured in program text (StableHLO), not in seconds: compile time follows program size, and a
size does not depend on the machine's load.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import LM, MEGABYTE, _byte_batch, blt_cfg, random_lengths

from bytelm.config import load_config
from bytelm.families.blt.model import BLT
from bytelm.families.byte.model import ByteLM
from bytelm.families.megabyte.model import MegaByte
from bytelm.training.optim import make_optimizer, schedule_plan
from bytelm.training.sharding import logical_to_spec

jax.config.update("jax_numpy_rank_promotion", "raise")  # as the other model tests: no silent broadcasting


def _pair(build, cfg_of):
    """The unrolled and the scanned model from the same seed."""
    return build(cfg_of(False), rngs=nnx.Rngs(0)), build(cfg_of(True), rngs=nnx.Rngs(0))


def _flat_state(state) -> dict:
    return {tuple(str(k) for k in path): np.asarray(v.get_value()) for path, v in nnx.to_flat_state(state)}


def _flat(model) -> dict:
    return _flat_state(nnx.state(model, nnx.Param))


def _as_stacked(unrolled: dict, path: tuple[str, ...], n_layers: int, depth: int = 1) -> np.ndarray:
    """The unrolled model's weights that a scanned model holds at ``path`` (``<stack path>, layers, ...``,
    the stack's path ``depth`` long), stacked."""
    return np.stack(
        [unrolled[(*path[:depth], "blocks", str(i), *path[depth + 1 :])] for i in range(n_layers)]
    )


def _stacked_equals_unrolled(unrolled, scanned, stacks: list[str]) -> None:
    """Every weight of the scanned model equals the unrolled one (stacked over the layers of ``stacks``)."""
    a, b = _flat(unrolled), _flat(scanned)
    prefixes = [tuple(s.split(".")) for s in stacks]
    for path, value in b.items():
        prefix = next((p for p in prefixes if path[: len(p)] == p), None)
        if prefix is not None:
            assert path[len(prefix)] == "layers"
            np.testing.assert_array_equal(value, _as_stacked(a, path, value.shape[0], len(prefix)))
        else:
            np.testing.assert_array_equal(value, a[path])
    assert sum(v.size for v in a.values()) == sum(v.size for v in b.values())


def _loss_and_grads(model, batch):
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss(p):
        return nnx.merge(graphdef, p, rest).score(batch).nll_BxT.sum()

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    return float(value), _flat_state(grads)


def _same_scores(unrolled, scanned, batch) -> None:
    def nll(model):
        graphdef, state = nnx.split(model)
        return np.asarray(jax.jit(lambda st: nnx.merge(graphdef, st).score(batch).nll_BxT)(state))

    np.testing.assert_allclose(nll(scanned), nll(unrolled), rtol=1e-5, atol=1e-5)


def _same_scores_and_grads(unrolled, scanned, batch, stacks) -> None:
    loss_a, grads_a = _loss_and_grads(unrolled, batch)
    loss_b, grads_b = _loss_and_grads(scanned, batch)
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    for path, g in grads_b.items():
        want = _as_stacked(grads_a, path, g.shape[0]) if path[0] in stacks else grads_a[path]
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5)


def test_scanned_byte_lm_is_the_unrolled_one():
    unrolled, scanned = _pair(
        ByteLM,
        lambda scan: (
            load_config(None, [*LM, "model.n_layers=3", f"model.scan_layers={str(scan).lower()}"]).model
        ),
    )
    assert scanned.stack.scan and not unrolled.stack.scan
    _stacked_equals_unrolled(unrolled, scanned, ["stack"])
    batch = _byte_batch()
    _same_scores_and_grads(unrolled, scanned, batch, ["stack"])
    # the sampling caches: the same logits for a prefix, then for one more id
    ids = batch["ids"][:, :9]
    outs = []
    extend = nnx.jit(
        lambda model, ids, caches, pos0: model(ids, cache=caches, pos0=pos0)
    )  # (eagerly: an op at a time)
    for model in (unrolled, scanned):
        logits, caches = extend(model, ids[:, :8], model.init_cache(2, 16), jnp.int32(0))
        more, _ = extend(model, ids[:, 8:9], caches, jnp.int32(8))
        outs.append((np.asarray(logits), np.asarray(more)))
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_scanned_megabyte_and_blt_are_the_unrolled_ones():
    unrolled, scanned = _pair(
        MegaByte, lambda scan: load_config(None, [*MEGABYTE, f"model.scan_layers={str(scan).lower()}"]).model
    )
    _stacked_equals_unrolled(unrolled, scanned, ["global_stack", "local_stack"])
    _same_scores(unrolled, scanned, _byte_batch(T=23))  # (gradients through the scan: the byte LM's test)

    unrolled, scanned = _pair(
        BLT, lambda scan: blt_cfg(**{"global.layers": 3}, scan_layers=str(scan).lower())
    )
    _stacked_equals_unrolled(unrolled, scanned, ["latent.stack"])
    rng = np.random.default_rng(3)
    batch = _byte_batch(T=15)
    batch["patch_lengths"] = jnp.asarray([random_lengths(rng, 16, 10), random_lengths(rng, 16, 10)])
    _same_scores(unrolled, scanned, batch)


def _program_size(n_layers: int, scan: bool) -> int:
    model = ByteLM(
        load_config(
            None, [*LM, f"model.n_layers={n_layers}", f"model.scan_layers={str(scan).lower()}"]
        ).model,
        rngs=nnx.Rngs(0),
    )
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    batch = _byte_batch()
    loss = jax.jit(jax.grad(lambda p: nnx.merge(graphdef, p, rest).score(batch).nll_BxT.sum()))
    return len(loss.lower(params).as_text())


def test_scanned_program_size_is_flat_in_depth():
    scanned = _program_size(24, True) / _program_size(2, True)
    unrolled = _program_size(24, False) / _program_size(2, False)
    assert scanned < 1.1, scanned  # the same loop body; only the stacked weights' shapes change
    assert unrolled > 5, unrolled  # the contrast: every layer is in the program


def test_the_layer_axis_is_never_sharded():
    class Mesh:
        shape = {"data": 1, "fsdp": 2, "tensor": 2}

    # a scanned attention projection: (layers, embed, heads, kv); layers divides 2, and stays whole
    assert tuple(logical_to_spec(("layers", "embed", "heads", "kv"), (4, 32, 2, 16), Mesh())) == (
        None,
        "fsdp",
        "tensor",
        None,
    )


# a byte LM with QK-norm's gains too, and optimizer steps that are the learning rate's from the first
TRAIN = [*LM, "model.n_layers=2", "model.qk_norm=true", "train.warmup_steps=0", "train.grad_clip=0"]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.slow
def test_a_scanned_stack_trains_as_the_unrolled_one(optimizer):
    """A few optimizer steps with weight decay leave the scanned model's weights the unrolled
    model's, stacked: a norm's gain (one row per layer when stacked; QK-norm's too) is not decayed
    as a matrix."""
    overrides = [*TRAIN, f"train.optimizer={optimizer}", "train.weight_decay=0.5", "train.learning_rate=0.01"]
    cfgs = [load_config(None, [*overrides, f"model.scan_layers={scan}"]) for scan in ("false", "true")]
    trained = []
    for cfg in cfgs:
        model = ByteLM(cfg.model, rngs=nnx.Rngs(0))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        tx = make_optimizer(cfg.train)
        state = tx.init(params)
        grad = jax.jit(jax.grad(lambda p, batch: nnx.merge(graphdef, p, rest).score(batch).nll_BxT.sum()))
        for step in range(3):
            updates, state = tx.update(
                grad(params, _byte_batch(seed=step)), state, params, plan=schedule_plan(cfg.train, 10)
            )
            params = optax.apply_updates(params, updates)
        nnx.update(model, params)
        trained.append(model)
    a, b = _flat(trained[0]), _flat(trained[1])
    for path, value in b.items():
        want = _as_stacked(a, path, value.shape[0]) if path[0] == "stack" else a[path]
        np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-5, err_msg=str(path))


def test_weight_decay_takes_matrices_not_gains_scanned_or_not():
    """With zero gradients an AdamW step is the decay alone: every matrix (a layer's, stacked or
    not, the embedding and the head) shrinks by ``lr * weight_decay``, and no norm's gain moves."""
    lr, wd = 0.01, 0.5
    for scan in ("false", "true"):
        cfg = load_config(
            None,
            [
                *TRAIN,
                f"model.scan_layers={scan}",
                "train.optimizer=adamw",
                f"train.weight_decay={wd}",
                f"train.learning_rate={lr}",
            ],
        )
        _, params, _ = nnx.split(ByteLM(cfg.model, rngs=nnx.Rngs(0)), nnx.Param, ...)
        tx = make_optimizer(cfg.train)
        zeros = jax.tree.map(jnp.zeros_like, params)
        updates, _ = tx.update(zeros, tx.init(params), params, plan=schedule_plan(cfg.train, 10))
        before, after = _flat_state(params), _flat_state(optax.apply_updates(params, updates))
        gains = [p for p in before if p[-1] == "scale"]
        assert (
            len(gains) == (4 if scan == "true" else 2 * 4) + 1
        )  # attn, mlp, q, k norms (stacked, or per block), final norm
        for path, value in before.items():
            want = value if path[-1] == "scale" else value * (1 - lr * wd)
            np.testing.assert_allclose(after[path], want, rtol=1e-6, atol=1e-7, err_msg=f"scan={scan} {path}")
