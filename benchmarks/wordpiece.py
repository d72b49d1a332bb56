"""Benchmark the WordPiece tokenizer against HF ``tokenizers``, in the same run on the same documents.

    python benchmarks/wordpiece.py [--data stdlib] [--vocab-size 32768] [--pattern cl100k]
                                   [--level byte] [--encode-mb 5] [--threads 2] [--repeat 1]
                                   [--encode-repeat 3] [--no-record]

Both sides run on ``--threads`` threads: ours with that many worker processes, HF's Rust with
``RAYON_NUM_THREADS`` set to it before ``tokenizers`` is imported. Documents that are not valid
UTF-8 are left out for both (HF only takes text).

1. Training, from the documents: ours (``train_wordpiece``: pre-tokenization, then merges by the
   likelihood score) vs HF's ``WordPieceTrainer`` (frequency merges with ``##`` marks; not the same
   algorithm, see ``bytelm/baselines/wordpiece/trainer.py``) behind the same pre-tokenizer (``Split``
   pattern, ``Split("#")`` and, byte-level, ``ByteLevel`` with its 256-byte alphabet), at the same
   vocabulary size; the wall time of each (best of ``--repeat``) and the ratio ``ours / theirs``.
2. Encoding the first ``--encode-mb`` MB of the held-out documents with *our* vocabulary: ours
   (``encode_documents``, from an empty chunk cache) vs HF's ``encode_batch`` on our exported
   ``tokenizer.json``; runs alternate, each side's best of ``--encode-repeat`` counts, and the ratio
   is ``our MB/s / theirs``.
3. Parity: our ids against HF's on those documents.

The last line printed is one JSON object with the numbers (recorded in ``benchmarks/results/`` unless
``--no-record``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from results import record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="stdlib", help="corpus spec (default: stdlib)")
    p.add_argument("--vocab-size", type=int, default=32768, help="vocabulary size, every id (default: 32768)")
    p.add_argument("--pattern", default="cl100k", help="pre-tokenization pattern (default: cl100k)")
    p.add_argument("--level", default="byte", choices=["byte", "char"], help="units (default: byte)")
    p.add_argument("--encode-mb", type=float, default=5.0, help="MB (10^6 bytes) to encode (default: 5)")
    p.add_argument("--threads", type=int, default=2, help="threads of each side (default: 2)")
    p.add_argument("--repeat", type=int, default=1, help="training runs per side, best counts (default: 1)")
    p.add_argument("--encode-repeat", type=int, default=3, help="encoding runs per side (default: 3)")
    p.add_argument("--no-record", action="store_true", help="print the JSON line only")
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args(argv)

    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # (read once, when tokenizers starts its pool)
    from tokenizers import Regex, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    from bytelm.baselines.bpe import PATTERNS
    from bytelm.baselines.wordpiece import train_wordpiece
    from bytelm.data import load_corpus

    corpus = load_corpus(args.data)

    def texts_of(split: str, limit: float = float("inf")) -> tuple[list[bytes], list[str]]:
        docs, texts, size = [], [], 0
        for d in corpus.documents(split):
            try:
                texts.append(d.decode("utf-8"))
            except UnicodeDecodeError:
                continue
            docs.append(d)
            size += len(d)
            if size >= limit:
                break
        return docs, texts

    docs, texts = texts_of("train")
    print(
        f"corpus {corpus.spec}: {len(docs)} train documents, {sum(map(len, docs)):,} bytes", file=sys.stderr
    )

    ours_times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        tok = train_wordpiece(
            docs, vocab_size=args.vocab_size, level=args.level, pattern=args.pattern, num_workers=args.threads
        )
        ours_times.append(time.perf_counter() - t0)
    print(f"ours: {tok.n_vocab:,} ids in {min(ours_times):.2f}s", file=sys.stderr)

    pattern = PATTERNS.get(args.pattern, args.pattern)
    steps = [
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.Split("#", behavior="isolated"),
    ]
    if args.level == "byte":
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    hf_times = []
    for _ in range(args.repeat):
        hf_trained = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
        hf_trained.pre_tokenizer = pre_tokenizers.Sequence(steps)
        trainer = trainers.WordPieceTrainer(
            vocab_size=args.vocab_size,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet() if args.level == "byte" else [],
        )
        t0 = time.perf_counter()
        hf_trained.train_from_iterator(texts, trainer)
        hf_times.append(time.perf_counter() - t0)
    print(f"HF: {hf_trained.get_vocab_size():,} ids in {min(hf_times):.2f}s", file=sys.stderr)

    held_docs, held_texts = texts_of("heldout", args.encode_mb * 1e6)
    n_bytes = sum(map(len, held_docs))
    with tempfile.TemporaryDirectory() as d:
        tok.save(d)
        hf = HFTokenizer.from_file(f"{d}/tokenizer.json")
    hf.encode_batch(["warm up"], add_special_tokens=False)
    ours_s, hf_s = [], []
    for _ in range(args.encode_repeat):
        tok.clear_cache()
        t0 = time.perf_counter()
        ids, counts = tok.encode_documents(held_docs, num_workers=args.threads)
        ours_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        encodings = hf.encode_batch(held_texts, add_special_tokens=False)
        hf_s.append(time.perf_counter() - t0)
    theirs = [i for e in encodings for i in e.ids]
    identical = ids.tolist() == theirs
    print(f"encode {n_bytes / 1e6:.1f} MB: ours {min(ours_s):.2f}s, HF {min(hf_s):.2f}s", file=sys.stderr)

    result = {
        "data": args.data,
        "level": args.level,
        "vocab_size": args.vocab_size,
        "threads": args.threads,
        "wordpiece_train_s": round(min(ours_times), 3),
        "hf_wordpiece_train_s": round(min(hf_times), 3),
        "wordpiece_train_ratio": round(min(ours_times) / min(hf_times), 3),
        "wordpiece_encode_mb_s": round(n_bytes / min(ours_s) / 1e6, 3),
        "hf_wordpiece_encode_mb_s": round(n_bytes / min(hf_s) / 1e6, 3),
        "wordpiece_encode_ratio": round(min(hf_s) / min(ours_s), 3),
        "wordpiece_ids_identical_to_hf": bool(identical),
        "encode_bytes": n_bytes,
        "encode_tokens": int(len(ids)),
    }
    print(json.dumps(result))
    if not args.no_record:
        if args.record:
            record("wordpiece", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
