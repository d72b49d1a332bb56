"""Sampling: the cached decoders against the full forward pass at every step, for every family;
the online patch rule against the batch rule; determinism; the API's and the CLI's edges.

The models are freshly initialised (what is tested is that the cache computes the same function
as the full pass, which holds for any weights). The tolerance: both paths run the same float32
arithmetic, but in differently shaped programs (one position over a cache against a whole padded
row), so they agree to float32 rounding, about 1e-6 on these probabilities; 1e-4 is the issue's
bound and leaves room for other CPUs' instruction sets.
"""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from bytelm.baselines.bpe import train_bpe
from bytelm.config import load_config
from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID
from bytelm.errors import UserError
from bytelm.families.blt.decoder import BLTDecoder
from bytelm.families.blt.model import BLT
from bytelm.families.bpe import token_decoder
from bytelm.families.bpe.model import TokenLM
from bytelm.families.byte import byte_decoder
from bytelm.families.byte.model import ByteLM
from bytelm.families.megabyte.decoder import MegaByteDecoder
from bytelm.families.megabyte.model import MegaByte
from bytelm.generate import generate, stream, text_pieces
from bytelm.patching import EntropyModel
from bytelm.patching.lengths import cap_starts
from bytelm.patching.online import OnlineStarts
from bytelm.patching.patchers import entropy_starts
from bytelm.sampling.decoders import byte_units
from bytelm.sampling.sampler import SamplingOptions, choose

CONTEXT = 32  # long enough to cross many patches, short enough to recompute at every step
TOL = 1e-4


def model_cfg(**kw):
    return load_config(None, [f"model.{k}={v}" for k, v in kw.items()]).model


LM = dict(d_model=32, n_layers=2, n_heads=2, mlp_dim=64)
TEXT = "the quick brown fox jumps over the lazy dog; Zwölf Boxkämpfer jagen Viktor über den Deich. "


def softmax(logits, allowed):
    z = np.where(allowed, np.asarray(logits, np.float64), -np.inf)
    p = np.exp(z - z.max())
    return p / p.sum()


def check_every_step(decoder, prompt: bytes, seed: int) -> list[int]:
    """Sample to the end of the context; at every step the cached distribution must equal the
    recomputed one. Returns the units generated."""
    rng = np.random.default_rng(seed)
    allowed = decoder.allowed_V.copy()
    allowed[EOS_ID] = False  # run to the end of the context
    logits, units = decoder.start(prompt), []
    while True:
        ref = decoder.recompute(prompt, units)
        np.testing.assert_allclose(
            softmax(logits, allowed), softmax(ref, allowed), rtol=0, atol=TOL, err_msg=f"step {len(units)}"
        )
        unit = choose(logits, allowed, SamplingOptions(), rng)
        try:
            decoder.recompute(prompt, [*units, unit])
        except UserError:  # the next prefix no longer fits the context
            return units
        units.append(unit)
        logits = decoder.step(unit)


@pytest.mark.parametrize(
    "extra",
    [
        dict(window=0),
        dict(window=8),
        dict(window=0, ngram_sizes="2,3", hash_table_size=97),
        dict(window=0, logit_softcap=1.5),
        dict(window=0, qk_norm="true"),
    ],
)
@pytest.mark.slow
def test_byte_lm_cache_equals_full_pass(extra):
    dec = byte_decoder(ByteLM(model_cfg(family="byte", **extra, **LM), rngs=nnx.Rngs(0)), CONTEXT)
    for i, prompt in enumerate([b"", "Zwölf Box".encode()]):
        units = check_every_step(dec, prompt, seed=i)
        assert len(units) == CONTEXT - 1 - len(prompt)


def test_token_lm_cache_equals_full_pass():
    tok = train_bpe(
        [TEXT.encode() * 4], vocab_size=300, pattern="gpt2", special_tokens=["<|eot|>"], num_workers=1
    )
    model = TokenLM(model_cfg(family="bpe", **LM), tok.n_vocab, rngs=nnx.Rngs(1))
    dec = token_decoder(model, tok, CONTEXT)
    assert not dec.allowed_V[tok.special_tokens["<|eot|>"] + BYTE_OFFSET]  # never generated
    assert check_every_step(dec, b"the quick", seed=2)
    with pytest.raises(UserError, match="special token"):
        dec.start(b"injected <|eot|> token")


@pytest.mark.parametrize("patch_size", [4, 5])
@pytest.mark.slow
def test_megabyte_cache_equals_full_pass_across_patches(patch_size):
    cfg = model_cfg(
        family="megabyte",
        patch_size=patch_size,
        embed_dim=8,
        **{
            "global.d_model": 8 * patch_size,
            "global.layers": 2,
            "global.heads": 2,
            "global.mlp_dim": 64,
            "local.d_model": 16,
            "local.layers": 2,
            "local.heads": 2,
            "local.mlp_dim": 32,
        },
    )
    dec = MegaByteDecoder(MegaByte(cfg, rngs=nnx.Rngs(2)), CONTEXT)
    for i, prompt in enumerate([b"", b"abc", b"abcdefg"]):  # prompts ending at several points of a patch
        calls = dec.global_calls
        units = check_every_step(dec, prompt, seed=i)
        n = len(prompt) + len(units)
        assert n // patch_size >= 6
        # the prefill, then one call per patch completed (the BOS is the first position of the first patch)
        assert dec.global_calls - calls == 1 + ((n + 1) // patch_size - (len(prompt) + 1) // patch_size)


BLT_KW = dict(
    family="blt",
    **{
        "local.d_model": 32,
        "local.heads": 2,
        "local.mlp_dim": 64,
        "local.window": 8,
        "global.d_model": 48,
        "global.heads": 2,
        "global.mlp_dim": 96,
        "global.layers": 2,
    },
    hash_table_size=101,
    ngram_sizes="3,4,5",
    **{"local.decoder_layers": 2},
)


@pytest.fixture(scope="module")
def entropy_lm():
    return ByteLM(
        model_cfg(family="byte", d_model=16, n_layers=1, n_heads=2, mlp_dim=32, window=8), rngs=nnx.Rngs(5)
    )


def batch_starts(entropy_lm, ids, settings, max_patches):
    """The patch starts of training for the row ``ids`` (the batch rule, then the slot rule)."""
    h = EntropyModel(entropy_lm, width=CONTEXT + 1).entropies(np.asarray(ids)[None])
    s = entropy_starts(np.asarray(ids)[None], h, **settings)
    return cap_starts(s, [len(ids)], max_patches)[0][0]


@pytest.mark.parametrize(
    "kw, rule, max_patches",
    [
        ({}, {"threshold": "median", "max_patch_len": 5}, 30),
        ({"cross_attention": False}, {"threshold": "median", "max_patch_len": 5}, 30),
        (
            {"local.encoder_layers": 2, "encoder_cross_all_layers": True},
            {"monotonic_threshold": 0.0, "max_patch_len": 4},
            30,
        ),
        # the slots run out; Meta's architecture (its hash with two functions, doubled residuals, no global
        # norm)
        (
            {"decoder_cross_all_layers": False, "variant": "reference", "hash_functions": 2},
            {"threshold": "low", "max_patch_len": 3},
            8,
        ),
    ],
)
@pytest.mark.slow
def test_blt_cache_equals_full_pass_and_patches_online_as_in_training(entropy_lm, kw, rule, max_patches):
    model = BLT(model_cfg(**{**BLT_KW, **kw}), rngs=nnx.Rngs(3))
    ids = [BOS_ID, *(np.frombuffer(TEXT.encode(), np.uint8)[:CONTEXT] + BYTE_OFFSET).tolist()]
    h = EntropyModel(entropy_lm, width=CONTEXT + 1).entropies(np.asarray(ids)[None])[0]
    settings = dict(rule)
    if "threshold" in settings:  # entropies of a random model vary little: put the threshold among them
        settings["threshold"] = float(np.quantile(h[1:], 0.5 if settings["threshold"] == "median" else 0.2))
    dec = BLTDecoder(model, entropy_lm, settings, CONTEXT, max_patches)
    # generation from BOS where the slots run out, a prompt (prefill, then generation) elsewhere
    for i, prompt in [(0, b"")] if max_patches == 8 else [(1, "über den".encode())]:
        calls = dec.global_calls
        units = check_every_step(dec, prompt, seed=10 + i)
        full = [BOS_ID, *(np.frombuffer(prompt, np.uint8) + BYTE_OFFSET).tolist(), *units]
        online = np.asarray(dec.starts[: len(full)])
        np.testing.assert_array_equal(online, batch_starts(entropy_lm, full, settings, max_patches))
        n_patches = int(online.sum())
        assert n_patches >= 6  # several boundaries crossed
        # the global model ran once per closed patch (all the prompt's in one prefill call)
        closed_in_prompt = int(np.asarray(dec.starts[1 : len(prompt) + 2]).sum())
        assert dec.global_calls - calls == 1 + (
            int(np.asarray(dec.starts[1 : len(full) + 1]).sum()) - closed_in_prompt
        )
    if max_patches == 8:
        assert int(np.asarray(dec.starts).sum()) == 8  # capped as in training


def test_past_the_context_a_full_attention_cache_is_a_sliding_window():
    """Past its context the ring buffer makes a full-attention model attend to its last ``context``
    positions: the cached path must equal the full pass of the same weights with that window."""
    S = 16
    dec = byte_decoder(ByteLM(model_cfg(family="byte", window=0, **LM), rngs=nnx.Rngs(4)), S)
    windowed = ByteLM(model_cfg(family="byte", window=S, **LM), rngs=nnx.Rngs(4))  # same initialisation
    rng, allowed = np.random.default_rng(0), dec.allowed_V.copy()
    allowed[EOS_ID] = False
    ids, logits = [BOS_ID, *byte_units(b"abc")], dec.start(b"abc")
    width = 64
    full = jax.jit(lambda row: windowed(row))
    while len(ids) < width:
        row = np.zeros((1, width), np.int32)
        row[0, : len(ids)] = ids
        ref = np.asarray(full(row))[0, len(ids) - 1, : len(allowed)]
        np.testing.assert_allclose(
            softmax(logits, allowed), softmax(ref, allowed), rtol=0, atol=TOL, err_msg=f"{len(ids)} ids"
        )
        unit = choose(logits, allowed, SamplingOptions(), rng)
        ids.append(unit)
        logits = dec.step(unit)
    assert len(ids) > 3 * S


def test_blt_past_the_context_lifts_the_slot_rule_and_splits_long_patches(entropy_lm):
    model = BLT(model_cfg(**BLT_KW), rngs=nnx.Rngs(3))
    settings = {
        "threshold": 100.0,
        "max_patch_len": 4,
    }  # no entropy boundary: patches end by max_patch_len or the slots
    dec = BLTDecoder(model, entropy_lm, settings, 24, 4)  # 4 slots in a window of 25 ids: they run out
    out = generate(dec, b"ab", max_bytes=70, options=SamplingOptions(seed=1))
    assert len(out) == 70
    starts = np.flatnonzero(np.asarray(dec.starts))
    assert list(starts[:4]) == [
        0,
        1,
        5,
        9,
    ]  # in the window: BOS, then max_patch_len patches until the slots run out
    after = starts[starts >= 24 + 1]  # past the window: the slot rule lifted, the long patch split at once
    assert after[0] == 24 + 1 and set(np.diff(after)) == {4}
    assert dec.global_calls == 1 + int(
        np.asarray(dec.starts[3 : dec.position + 1]).sum()
    )  # the global ring wrapped


@settings(max_examples=60, deadline=None)
@given(
    h=st.lists(st.floats(0.0, 6.0, width=32), min_size=1, max_size=40),
    threshold=st.one_of(st.none(), st.floats(0.5, 5.5)),
    mono=st.one_of(st.none(), st.floats(0.0, 2.0)),
    max_len=st.one_of(st.none(), st.integers(1, 6)),
    max_patches=st.integers(1, 30),
)
def test_online_starts_equal_the_batch_rule(h, threshold, mono, max_len, max_patches):
    if threshold is None and mono is None:
        threshold = 3.0
    L = len(h) + 1
    ids = np.full(L, BYTE_OFFSET, np.int64)
    ids[0] = BOS_ID
    H = np.asarray([*h, 0.0], np.float32)
    want = cap_starts(
        entropy_starts(
            ids[None], H[None], threshold=threshold, monotonic_threshold=mono, max_patch_len=max_len
        ),
        [L],
        max_patches,
    )[0][0]
    rule = OnlineStarts(threshold, mono, max_len, max_patches)
    got = [rule.start_at_zero()] + [rule.next(x) for x in H[:-1]]
    np.testing.assert_array_equal(np.asarray(got), want)


@pytest.fixture(scope="module")
def byte_dec():
    return byte_decoder(ByteLM(model_cfg(family="byte", **LM), rngs=nnx.Rngs(7)), CONTEXT)


def test_greedy_is_deterministic_and_a_seed_repeats(byte_dec):
    greedy = SamplingOptions(greedy=True)
    assert generate(byte_dec, b"abc", max_bytes=20, options=greedy) == generate(
        byte_dec, b"abc", max_bytes=20, options=greedy
    )
    a = generate(byte_dec, b"abc", max_bytes=30, options=SamplingOptions(seed=3, top_k=50, top_p=0.9))
    b = generate(byte_dec, b"abc", max_bytes=30, options=SamplingOptions(seed=3, top_k=50, top_p=0.9))
    c = generate(byte_dec, b"abc", max_bytes=30, options=SamplingOptions(seed=4, top_k=50, top_p=0.9))
    assert a == b and len(a) == 30 and a != c


def test_choose_respects_top_k_top_p_and_the_allowed_ids():
    logits = np.log(np.asarray([0.0, 0.5, 0.3, 0.15, 0.05]) + 1e-30)
    allowed = np.asarray([False, True, True, True, True])
    rng = np.random.default_rng(0)
    draws = lambda o: {choose(logits, allowed, o, rng) for _ in range(300)}  # noqa: E731
    assert draws(SamplingOptions(top_k=2)) == {1, 2}
    assert draws(SamplingOptions(top_p=0.75)) == {1, 2}  # 0.5 + 0.3 reaches 0.75
    assert draws(SamplingOptions(top_p=0.5)) == {1}
    assert (
        choose(logits, np.asarray([False, False, True, True, True]), SamplingOptions(greedy=True), rng) == 2
    )
    for bad in (dict(temperature=0), dict(top_k=-1), dict(top_p=0), dict(top_p=1.5)):
        with pytest.raises(UserError):
            SamplingOptions(**bad)


def test_edges_max_bytes_zero_empty_prompt_and_long_prompt(byte_dec):
    assert generate(byte_dec, b"abc", max_bytes=0) == b""
    assert len(generate(byte_dec, b"", max_bytes=5)) == 5  # starts from BOS alone
    with pytest.raises(UserError, match=f"context is {CONTEXT}"):
        generate(byte_dec, b"x" * CONTEXT, max_bytes=1)  # with its BOS, one position too many
    assert len(generate(byte_dec, b"x" * (CONTEXT - 1), max_bytes=1)) == 1
    # generation runs on past the context (the caches slide)
    assert (
        len(generate(byte_dec, b"ab", max_bytes=2 * CONTEXT, options=SamplingOptions(greedy=True)))
        == 2 * CONTEXT
    )
    with pytest.raises(UserError, match="max_bytes"):
        list(stream(byte_dec, b"", max_bytes=-1))


def test_a_token_that_would_overshoot_max_bytes_is_cut():
    tok = train_bpe([TEXT.encode() * 4], vocab_size=300, pattern="gpt2", num_workers=1)
    dec = token_decoder(TokenLM(model_cfg(family="bpe", **LM), tok.n_vocab, rngs=nnx.Rngs(1)), tok, CONTEXT)
    for n in (1, 7, 20):
        assert len(generate(dec, b"the", max_bytes=n, options=SamplingOptions(seed=n))) == n


# -- the CLI, on a trained run ----------------------------------------------------------------

from helpers import corpus_dir, tiny_overrides  # noqa: E402, F401  (module fixture)

from bytelm.training.loop import train  # noqa: E402


@pytest.fixture(scope="module")
def byte_run(corpus_dir, tmp_path_factory):  # noqa: F811
    out = tmp_path_factory.mktemp("sample") / "run"
    train(load_config(None, tiny_overrides(corpus_dir, **{"train.steps": 2, "eval.every": 0})), out)
    return out


def run_cli(*args, **kw):
    argv = [a if isinstance(a, bytes) else str(a) for a in args]
    return subprocess.run([sys.executable, "-m", "bytelm", "sample", *argv], capture_output=True, **kw)


def test_text_pieces_hold_back_incomplete_utf8():
    e = "é".encode()  # 0xC3 0xA9
    assert list(text_pieces([b"a" + e[:1], e[1:] + b"b"])) == ["a", "éb"]
    assert list(text_pieces([e[1:], b"c"], after=b"x" + e[:1])) == ["é", "c"]  # the prompt's open character
    assert list(text_pieces([b"\xff", b"d" + e[:1]])) == ["\ufffd", "d", "\ufffd"]  # invalid; cut at the end


@pytest.mark.slow
def test_cli_streams_utf8_and_matches_the_api(byte_run, capsysbinary):
    prompt = "Zwö".encode()[:-1]  # ends inside a two-byte character
    api = generate(byte_run, prompt, max_bytes=40, options=SamplingOptions(seed=5, top_k=40))
    assert api  # (an untrained model may draw EOS early: generation stops there)
    whole = (prompt + api).decode("utf-8", errors="replace")
    r = run_cli(
        byte_run, "--prompt", prompt, "--max-bytes", 40, "--seed", 5, "--top-k", 40
    )  # raw bytes in argv
    assert r.returncode == 0, r.stderr.decode()
    assert (
        r.stdout.decode("utf-8") == whole[len("Zw") :] + "\n"
    )  # the prompt's open character decoded with what follows
    r = run_cli(byte_run, "--prompt", prompt, "--max-bytes", 40, "--seed", 5, "--top-k", 40, "--echo")
    assert r.stdout.decode("utf-8") == whole + "\n"
    from bytelm import cli

    assert (
        cli.main(["sample", str(byte_run), "--prompt", "hi", "--max-bytes", "0"]) == 0
    )  # in process: no subprocess start
    assert capsysbinary.readouterr().out == b"\n"


def test_cli_errors(byte_run, tmp_path, capsys):
    """Bad input ends with exit status 2 and a message naming it (in process: the same main the
    console script runs; the subprocess tests above cover the real argv and streams)."""
    from bytelm import cli

    def sample(*args):
        code = cli.main(["sample", *map(str, args)])
        return code, capsys.readouterr().err

    code, err = sample(byte_run, "--prompt", "x" * 80, "--max-bytes", 3)
    assert code == 2 and "context is 64" in err
    code, err = sample(tmp_path, "--prompt", "x")
    assert code == 2 and str(tmp_path) in err
    code, err = sample(byte_run, "--prompt", "x", "--temperature", "0")
    assert code == 2 and "temperature" in err


def test_cli_json_stats(byte_run, capsys):
    from bytelm import cli

    assert (
        cli.main(["sample", str(byte_run), "--prompt", "the", "--max-bytes", "8", "--greedy", "--stats"]) == 0
    )
    stats = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert stats["generated_bytes"] == 8 and stats["family"] == "byte"
