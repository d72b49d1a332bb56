"""train.ema_decay: the bias-corrected weight average, its checkpoints, and that it is the run's model."""

import jax
import numpy as np
import pytest
from helpers import corpus_dir, metrics, tiny_overrides  # noqa: F401  (corpus_dir: a fixture)

from bytelm.config import load_config
from bytelm.data import load_corpus_from_config
from bytelm.training.loop import eval_slice, train
from bytelm.training.restore import make_task, restore_model, restore_scorer
from bytelm.training.trainer import Trainer


def _leaves(tree) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(tree)]  # copies: the next step donates the buffers


def _gap(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def test_the_average_is_the_bias_corrected_mean_of_the_iterates_and_leaves_training_alone(corpus_dir):  # noqa: F811
    decay, steps = 0.7, 6
    averaged = load_config(
        None, tiny_overrides(corpus_dir, **{"train.steps": steps, "train.ema_decay": decay})
    )
    plain = load_config(None, tiny_overrides(corpus_dir, **{"train.steps": steps}))
    task = make_task(averaged, load_corpus_from_config(averaged.data))
    a, p = Trainer(averaged, task), Trainer(plain, task)
    batches = task.train_batches(0, 0, 1)
    iterates = []
    for _ in range(steps):
        batch = next(batches)
        a.train_step(dict(batch))
        p.train_step(dict(batch))
        iterates.append(_leaves(p.params))
    # independently: the iterates weighted by (1 - decay) decay^(t - i), normalised (float64)
    w = np.array([(1 - decay) * decay ** (steps - 1 - i) for i in range(steps)], np.float64)
    w /= w.sum()
    expected = [
        sum(wi * it[k].astype(np.float64) for wi, it in zip(w, iterates)) for k in range(len(iterates[0]))
    ]
    for got, want in zip(_leaves(a.ema), expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert _gap(_leaves(a.params), iterates[-1]) < 1e-5  # the average does not steer the training
    assert _gap(_leaves(a.ema), iterates[-1]) > 1e-3  # and it is not the last iterate


def test_the_average_is_checkpointed_resumed_and_is_what_the_run_is_scored_and_restored_as(
    corpus_dir,  # noqa: F811
    tmp_path,
):
    cfg = load_config(
        None,
        tiny_overrides(
            corpus_dir,
            **{"train.steps": 8, "train.checkpoint_every": 4, "eval.every": 8, "train.ema_decay": 0.8},
        ),
    )
    straight = train(cfg, tmp_path / "straight")
    train(
        cfg, tmp_path / "resumed", stop_after=6
    )  # stops after step 6; resumes from the checkpoint of step 4
    train(cfg, tmp_path / "resumed")
    live = straight.trainer
    restored = restore_scorer(tmp_path / "straight")
    assert _gap(_leaves(restored.params), _leaves(live.ema)) == 0.0  # the checkpoint's model is the average
    assert _gap(_leaves(live.params), _leaves(live.ema)) > 1e-3
    resumed = _leaves(restore_model(tmp_path / "resumed"))
    assert (
        _gap(resumed, _leaves(live.ema)) < 1e-5
    )  # without the average in the checkpoint it restarts at step 5
    segments = eval_slice(restored.task.corpus, cfg.eval.eval_bytes)
    bpb = restored.evaluate(segments).bpb
    assert metrics(tmp_path / "straight", "eval")[-1]["bpb"] == pytest.approx(
        bpb, rel=1e-6
    )  # periodic evals score the average
    live.ema = None  # the live trainer's raw weights score otherwise
    assert abs(live.evaluate(segments).bpb - bpb) > 1e-4


def test_the_decay_is_checked():
    for bad in ("1.0", "-0.1"):
        with pytest.raises(ValueError, match=r"train.ema_decay must be in \[0, 1\)"):
            load_config(None, ["model.family=byte", f"train.ema_decay={bad}"])
