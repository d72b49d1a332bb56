"""Mamba-2 layers (bytelm/models/ssd.py) and the MambaByte family: the chunked SSD against a plain
transcription of the recurrence, a layer continued from its decoding state against the whole
sequence, causality, cached sampling against the full pass, and a run through the commands."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import corpus_dir, tiny_overrides  # noqa: F401  (corpus_dir: a fixture)

from bytelm import cli
from bytelm.config import load_config
from bytelm.constants import BOS_ID
from bytelm.families.byte import byte_decoder
from bytelm.families.mambabyte.flops import forward_flops_per_byte
from bytelm.families.mambabyte.model import MambaByte
from bytelm.generate import generate, load_decoder
from bytelm.models.ssd import Mamba2, SSMConfig, ssd_chunked
from bytelm.sampling.sampler import SamplingOptions

RNG = np.random.default_rng(11)


def recurrence(x, dt, A, B, C, state=None):
    """``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t`` per head, position by
    position in float64 (``B``, ``C`` per group of ``H / G`` consecutive heads)."""
    Bsz, T, H, P = x.shape
    G, N = B.shape[2:]
    h = np.zeros((Bsz, H, P, N)) if state is None else np.array(state, np.float64)
    y = np.zeros((Bsz, T, H, P))
    for t in range(T):
        for head in range(H):
            g = head // (H // G)
            decay = np.exp(dt[:, t, head] * A[head])[:, None, None]
            h[:, head] = decay * h[:, head] + dt[:, t, head, None, None] * (
                x[:, t, head, :, None] * B[:, t, g, None, :]
            )
            y[:, t, head] = np.einsum("bpn,bn->bp", h[:, head], C[:, t, g])
    return y, h


@pytest.mark.parametrize("T, chunk", [(37, 8), (16, 16), (5, 64), (9, 1)])
def test_chunked_ssd_equals_the_recurrence(T, chunk):
    Bsz, H, P, G, N = 2, 4, 3, 2, 5
    x = RNG.normal(size=(Bsz, T, H, P))
    dt = np.log1p(np.exp(RNG.normal(size=(Bsz, T, H))))  # softplus: positive steps
    A = -RNG.uniform(1, 16, size=H)
    B, C = RNG.normal(size=(Bsz, T, G, N)), RNG.normal(size=(Bsz, T, G, N))
    state = RNG.normal(size=(Bsz, H, P, N))
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    for start in (None, state):
        want_y, want_h = recurrence(x, dt, A, B, C, start)
        y, h = ssd_chunked(
            f32(x), f32(dt), f32(A), f32(B), f32(C), chunk, None if start is None else f32(start)
        )
        np.testing.assert_allclose(np.asarray(y), want_y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(h), want_h, rtol=1e-5, atol=1e-5)


def test_a_layer_continued_from_its_state_equals_the_whole_sequence():
    """The whole sequence at once, against a prefill of 7 positions, then one position at a time,
    then a call of 5: the outputs and the final state agree."""
    ssm = SSMConfig(d_state=8, d_conv=4, expand=2, head_dim=16, groups=1, chunk=4)
    layer = Mamba2(32, ssm, n_layers=2, rngs=nnx.Rngs(3))
    x = jnp.asarray(RNG.normal(size=(2, 20, 32)), jnp.float32)
    whole, _ = layer(x)
    cache, parts = layer.init_cache(2), []
    for a, b in [(0, 7), *[(t, t + 1) for t in range(7, 15)], (15, 20)]:
        y, cache = layer(x[:, a:b], cache=cache)
        parts.append(y)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(parts, axis=1)), np.asarray(whole), atol=1e-5)
    _, full_cache = layer(x, cache=layer.init_cache(2))
    np.testing.assert_allclose(np.asarray(cache.ssm_BxHxPxN), np.asarray(full_cache.ssm_BxHxPxN), atol=1e-5)
    # the convolution's inputs of the last 3 positions: the x, B, C columns of the input projection
    xbc = np.asarray(x[:, -3:] @ layer.in_proj[...])[..., 64 : 64 + layer.conv_dim]
    np.testing.assert_allclose(np.asarray(cache.conv_BxKxC), xbc, rtol=1e-5, atol=1e-5)


def mambabyte(**kw):
    overrides = {
        "family": "mambabyte",
        "d_model": 32,
        "n_layers": 2,
        "d_state": 8,
        "head_dim": 16,
        "chunk": 8,
    }
    return load_config(None, [f"model.{k}={v}" for k, v in {**overrides, **kw}.items()]).model


def test_bytes_after_t_change_no_log_probability_up_to_t():
    model = MambaByte(mambabyte(), rngs=nnx.Rngs(0))
    ids = RNG.integers(4, 260, size=(2, 41)).astype(np.int32)
    ids[:, 0] = BOS_ID
    base = np.asarray(model(jnp.asarray(ids)))
    for t in (0, 7, 8, 23, 39):
        changed = ids.copy()
        changed[:, t + 1 :] = RNG.integers(4, 260, size=changed[:, t + 1 :].shape)
        out = np.asarray(model(jnp.asarray(changed)))
        np.testing.assert_array_equal(out[:, : t + 1], base[:, : t + 1])
        assert not np.allclose(out[:, t + 1 :], base[:, t + 1 :])


def test_cached_sampling_equals_the_full_pass():
    """The flat decoder over the carried states: at every step of a generation to the end of the
    context, the cached next-byte distribution equals the one recomputed over the whole prefix."""
    context = 40
    decoder = byte_decoder(MambaByte(mambabyte(), rngs=nnx.Rngs(1)), context)
    for prompt in (b"", "Zw\u00f6lf Box".encode()):
        logits, units = decoder.start(prompt), []
        while len(prompt) + len(units) + 2 <= context:
            ref = decoder.recompute(prompt, units)
            np.testing.assert_allclose(
                np.asarray(jax.nn.log_softmax(logits[decoder.allowed_V])),
                np.asarray(jax.nn.log_softmax(ref[decoder.allowed_V])),
                atol=1e-4,
            )
            unit = int(np.flatnonzero(decoder.allowed_V)[np.argmax(logits[decoder.allowed_V])])
            units.append(unit)
            logits = decoder.step(unit)
        assert len(units) >= context - len(prompt) - 2


@pytest.mark.slow
def test_it_trains_is_evaluated_and_samples(corpus_dir, tmp_path, capsys):  # noqa: F811
    """``bytelm train`` and ``bytelm eval`` on a MambaByte run: the loss falls, the ledger charges the
    family's FLOPs, the report scores the held-out bytes one position per byte; a greedy generation
    equals the decoder's own greedy choice over full recomputation."""
    run = tmp_path / "run"
    sets = tiny_overrides(
        corpus_dir,
        **{
            "model.family": "mambabyte",
            "model.d_model": 32,
            "model.n_layers": 2,
            "model.d_state": 8,
            "model.head_dim": 16,
            "model.chunk": 16,
            "train.steps": 24,
            "eval.every": 0,
        },
    )
    sets = [s for s in sets if not s.startswith(("model.n_heads", "model.mlp_dim"))]
    assert (
        cli.main(["train", "tiny/mambabyte", "--out", str(run), *[a for s in sets for a in ("--set", s)]])
        == 0
    )
    info = json.loads((run / "run.json").read_text())
    assert info["family"] == "mambabyte" and info["status"] == "finished" and info["step"] == 24
    cfg = load_config(run / "config.toml")
    per_position = forward_flops_per_byte(cfg.model, cfg.train.seq_len)
    assert info["ledger"]["own_per_step"] == pytest.approx(3 * per_position * 8 * 64)
    losses = [
        r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r
    ]
    assert np.mean(losses[-4:]) < np.mean(losses[:4])
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--json", str(tmp_path / "report.json")]) == 0
    row = json.loads((tmp_path / "report.json").read_text())["models"][0]
    assert row["family"] == "mambabyte" and 0 < row["bpb"] < 9 and row["mean_bytes_per_global_step"] == 1.0
    out = generate(run, b"the ", max_bytes=8, options=SamplingOptions(greedy=True))
    dec, units = load_decoder(run), []
    for _ in range(len(out)):
        logits = dec.recompute(b"the ", units)
        units.append(int(np.flatnonzero(dec.allowed_V)[np.argmax(logits[dec.allowed_V])]))
    assert out == b"".join(dec.unit_bytes(u) for u in units)
