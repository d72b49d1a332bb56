"""SentencePiece's unigram trainer and encoder as a peer, on exactly the problem bytelm solves.

Used by the tests and ``benchmarks/unigram.py`` only (``sentencepiece`` is a test extra;
bytelm does not depend on it). To compare *trainers* rather than pre-tokenizers, SentencePiece is
given bytelm's own chunks: every distinct chunk, with its count, as one line of a TSV file, its
bytes written as GPT-2's byte characters (:mod:`~bytelm.baselines.bpe.bytelevel`), so that one
SentencePiece character is one byte and nothing in a chunk is whitespace. Its own splitting is
off (``split_by_whitespace``, ``split_by_unicode_script``, ``split_by_number``), normalisation is
``identity``, there is no dummy prefix, pieces have at most 16 characters (= bytes), and
``character_coverage=1.0`` keeps every byte seen. Its vocabulary holds one id more than ours,
for its ``<unk>`` (never produced here: every byte of the text is a piece); BOS and EOS are off.

Quality (:func:`quality`) is measured on the same held-out chunks for both: bytes per token, and
the log-likelihood per byte of the Viterbi segmentation (the sum of the pieces' scores, which
are log-probabilities in both).
"""

from __future__ import annotations

import io
import os
import tempfile
import time

import numpy as np

from bytelm.baselines.bpe.bytelevel import bytes_to_chars


def _tsv(chunks: dict[bytes, int]) -> str:
    return "".join(f"{bytes_to_chars(k)}\t{n}\n" for k, n in sorted(chunks.items()) if k)


def train_sentencepiece(chunks: dict[bytes, int], vocab_size: int, *, num_threads: int = 2):
    """``(SentencePieceProcessor, seconds)``: SentencePiece's unigram trainer on bytelm's counted
    chunks (module docstring), timed from the written TSV file to the loaded model."""
    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "chunks.tsv")
        with open(path, "w", encoding="utf-8") as f:
            f.write(_tsv(chunks))
        model = io.BytesIO()
        t0 = time.perf_counter()
        spm.SentencePieceTrainer.train(
            input=path,
            input_format="tsv",
            model_writer=model,
            model_type="unigram",
            vocab_size=vocab_size + 1,  # + its <unk>
            character_coverage=1.0,
            normalization_rule_name="identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            split_by_unicode_script=False,
            split_by_number=False,
            split_by_whitespace=False,
            max_sentencepiece_length=16,
            max_sentence_length=1 << 16,
            bos_id=-1,
            eos_id=-1,
            hard_vocab_limit=False,
            num_threads=num_threads,
            minloglevel=2,
        )
        sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
        return sp, time.perf_counter() - t0


def sentencepiece_ids(sp, chunks: list[bytes]) -> list[list[int]]:
    """SentencePiece's ids of each chunk (given as its byte characters)."""
    return sp.encode([bytes_to_chars(c) for c in chunks])


def quality(chunks: list[bytes], *, ours=None, sp=None) -> dict:
    """``{"bytes_per_token", "loglik_per_byte"}`` of one tokenizer (``ours``: a
    :class:`~bytelm.baselines.unigram.tokenizer.UnigramTokenizer`, or ``sp``) on ``chunks``."""
    n_bytes = sum(map(len, chunks))
    if ours is not None:
        paths, scores = ours.viterbi_many(chunks), np.asarray(ours.scores)
    else:
        paths = sentencepiece_ids(sp, chunks)
        scores = np.array([sp.get_score(i) for i in range(sp.get_piece_size())])
    ids = np.fromiter((i for p in paths for i in p), dtype=np.int64)
    if sp is not None and np.any(ids == sp.unk_id()):
        raise ValueError(
            "SentencePiece produced <unk>: a byte of the held-out text was not in its training chunks"
        )
    return {
        "bytes_per_token": n_bytes / max(len(ids), 1),
        "loglik_per_byte": float(scores[ids].sum()) / max(n_bytes, 1),
    }
