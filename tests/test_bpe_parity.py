"""Parity of the byte-level BPE with the reference libraries.

- Encoding: ids identical to tiktoken (built from the exported ``ranks.tiktoken``) and to HF
  tokenizers (loaded from the exported ``tokenizer.json``) on stdlib files, multilingual text,
  random text and adversarial strings.
- Training: the merge list is identical to HF's ``BpeTrainer`` on the same corpus and pattern.

tiktoken and HF tokenizers are used here only as references; bytelm does not depend on them.
"""

from __future__ import annotations

import json

import pytest
from helpers import ADVERSARIAL, MULTILINGUAL, stdlib_sample
from hypothesis import given, settings
from hypothesis import strategies as st

from bytelm.baselines.bpe import PATTERNS, Tokenizer, train_bpe
from bytelm.baselines.bpe.bytelevel import chars_to_bytes

tiktoken = pytest.importorskip("tiktoken")
tokenizers = pytest.importorskip("tokenizers")
import tiktoken.load  # noqa: E402, F811

SPECIALS = ["<|endoftext|>", "<|fim_prefix|>"]


@pytest.fixture(scope="module")
def references(tmp_path_factory):
    """Per pattern: our tokenizer trained on a stdlib sample, and the peers loaded from its files."""
    import os

    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken would otherwise cache by path
    docs = stdlib_sample(300_000)
    out = {}
    for name in ("cl100k", "gpt2"):
        tok = train_bpe(docs, vocab_size=2000, pattern=name, special_tokens=SPECIALS, num_workers=2)
        tok.add_tokens(["    return self"])
        d = tmp_path_factory.mktemp(name)
        tok.save(d)
        hf = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
        ranks = tiktoken.load.load_tiktoken_bpe(str(d / "ranks.tiktoken"))
        tt = tiktoken.Encoding(
            name=f"bytelm-{name}",
            pat_str=tok.pattern,
            mergeable_ranks=ranks,
            special_tokens=tok.special_tokens,
        )
        out[name] = (Tokenizer.load(d), hf, tt)
    return out


def check(references, text: str, *, with_tiktoken: bool = True) -> None:
    for name, (tok, hf, tt) in references.items():
        ours = tok.encode(text, allowed_special="all")
        assert hf.encode(text).ids == ours, (name, text[:80])
        if with_tiktoken:
            # tiktoken knows nothing of added tokens: compare where none occurs
            if not any(t in text for t in tok.added_tokens):
                assert tt.encode(text, allowed_special="all") == ours, (name, text[:80])
        assert tok.decode(ours) == text


def test_parity_on_stdlib_files(references):
    for doc in stdlib_sample(200_000, skip=40):
        check(references, doc.decode("utf-8"))


@pytest.mark.parametrize("text", MULTILINGUAL)
def test_parity_on_multilingual_text(references, text):
    check(references, text)
    check(references, " ".join(MULTILINGUAL))


@pytest.mark.parametrize("i", range(len(ADVERSARIAL)))
def test_parity_on_adversarial_strings(references, i):
    check(references, ADVERSARIAL[i])


def test_parity_with_special_and_added_tokens(references):
    text = "def f():\n    return self<|endoftext|>x<|fim_prefix|><|endoftext|>    return selfish"
    check(references, text)
    for tok, hf, tt in references.values():
        ids = tok.encode(text, allowed_special="all")
        assert ids.count(tok.special_tokens["<|endoftext|>"]) == 2
        assert tok.added_tokens["    return self"] in ids
        assert tt.encode_ordinary("<|endoftext|>") == tok.encode_ordinary("<|endoftext|>")


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
@pytest.mark.slow
def test_parity_on_random_text(references, text):
    check(references, text)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.sampled_from(["a", "b", " ", "1", "2", "\n", "'", "s", "é", "日", "!", "\t", "  "]), max_size=80
    )
)
def test_parity_on_random_text_from_a_small_alphabet(references, parts):
    check(references, "".join(parts))


# -- training parity -------------------------------------------------------------------------------
def hf_train(texts: list[str], pattern: str, vocab_size: int, specials: list[str]):
    from tokenizers import Regex, models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        show_progress=False,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    hf.train_from_iterator(texts, trainer)
    model = json.loads(hf.to_str())["model"]
    return model, [(chars_to_bytes(x), chars_to_bytes(y)) for x, y in model["merges"]]


@pytest.fixture(scope="module")
def training_sample() -> list[bytes]:
    return stdlib_sample(250_000, skip=10)


@pytest.mark.parametrize("pattern", ["cl100k", "gpt2"])
@pytest.mark.parametrize("vocab_size", [512, 4096])
def test_merge_list_identical_to_hf_bpe_trainer(training_sample, pattern, vocab_size):
    specials = ["<|endoftext|>"] if vocab_size == 512 else []
    model, hf_merges = hf_train(
        [d.decode() for d in training_sample], PATTERNS[pattern], vocab_size, specials
    )
    tok = train_bpe(
        training_sample, vocab_size=vocab_size, pattern=pattern, special_tokens=specials, num_workers=2
    )
    ours = [(tok.token_bytes(x), tok.token_bytes(y)) for x, y in tok.merges]
    assert len(ours) == len(hf_merges) == vocab_size - 256 - len(specials)
    first_diff = next((i for i, (x, y) in enumerate(zip(ours, hf_merges)) if x != y), None)
    assert first_diff is None, f"merge {first_diff}: ours {ours[first_diff]}, HF {hf_merges[first_diff]}"
    assert tok.n_vocab == len(model["vocab"]) == vocab_size  # the same vocab_size convention
