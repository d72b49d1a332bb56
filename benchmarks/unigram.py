"""Benchmark the byte-level Unigram tokenizer against SentencePiece, in the same run on the same chunks.

    python benchmarks/unigram.py [--data stdlib] [--vocab-size 32768] [--pattern cl100k]
                                    [--encode-mb 5] [--encode-repeat 3]

1. Chunks: the train documents of ``--data`` pre-tokenized with ``--pattern`` and counted once
   (bytelm's ``count_chunks`` on both cores; its time is reported, and is not part of either
   side's training time).
2. Training, from those counted chunks: ours (``learn_pieces``: seeds, EM, pruning) vs
   SentencePiece's unigram trainer on both cores, given the same chunks and counts as a TSV file
   in GPT-2's byte characters (``bytelm.baselines.unigram.peer``: one character is one byte,
   its own splitting off), at the same vocabulary size; the wall time of each, and the ratio.
   Then quality on the held-out split (bytes per token and Viterbi log-likelihood per byte).
3. Encoding the first ``--encode-mb`` MB of the held-out documents: ours (``encode_documents``,
   from raw bytes: the pattern's split, the chunk cache, numpy Viterbi; on both cores, from an
   empty cache) vs SentencePiece's batch ``encode`` on both threads, given the already split
   chunks (its time leaves out the split that ours includes). Runs alternate; each side's best
   of ``--encode-repeat`` is reported.
4. Parity: our ids against HF ``tokenizers`` loaded from the exported ``tokenizer.json`` on
   the same held-out documents (the valid UTF-8 ones; HF takes text).
5. Peak resident memory of this process (``getrusage``), which holds the corpus as well.

The last line printed is one JSON object with the numbers.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time

from results import record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="stdlib", help="corpus spec (default: stdlib)")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=32768,
        help="vocabulary size: 256 bytes + learned pieces (default: 32768)",
    )
    p.add_argument("--pattern", default="cl100k", help="pre-tokenization pattern (default: cl100k)")
    p.add_argument(
        "--encode-mb", type=float, default=5.0, help="MB (10^6 bytes) of held-out text to encode (default: 5)"
    )
    p.add_argument(
        "--encode-repeat",
        type=int,
        default=3,
        help="encoding runs per side, alternating; the best is reported (default: 3)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args(argv)

    import numpy as np
    import tokenizers

    from bytelm.baselines.bpe.trainer import count_chunks
    from bytelm.baselines.unigram import UnigramTokenizer
    from bytelm.baselines.unigram.peer import quality, sentencepiece_ids, train_sentencepiece
    from bytelm.baselines.unigram.trainer import learn_pieces
    from bytelm.data import load_corpus

    corpus = load_corpus(args.data)
    t0 = time.perf_counter()
    chunks = count_chunks(corpus.documents("train"), pattern=args.pattern, num_workers=2)
    count_s = time.perf_counter() - t0
    print(
        f"chunks: {len(chunks):,} distinct in {count_s:.1f}s ({corpus.split_bytes('train') / 1e6:.1f} MB of "
        "train text)",
        file=sys.stderr,
    )

    t0 = time.perf_counter()
    pieces, logp, stats = learn_pieces(chunks, args.vocab_size - 256)
    ours_train_s = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    tok = UnigramTokenizer(pieces, logp.tolist(), pattern=args.pattern)
    print(
        f"ours: {len(pieces):,} pieces in {ours_train_s:.1f}s (seeds {stats['seed_pieces']:,}, "
        f"{len(stats['rounds'])} rounds), peak RSS {rss_mb:.0f} MiB",
        file=sys.stderr,
    )
    sp, sp_train_s = train_sentencepiece(chunks, args.vocab_size, num_threads=2)
    print(f"sentencepiece: {sp.get_piece_size():,} pieces in {sp_train_s:.1f}s", file=sys.stderr)

    held_docs, size = [], 0
    for doc in corpus.documents("heldout"):
        held_docs.append(doc)
        size += len(doc)
        if size >= args.encode_mb * 1e6:
            break
    held_counts = count_chunks(held_docs, pattern=args.pattern, num_workers=1)
    seen = set(b"".join(chunks))
    held = [c for c, n in held_counts.items() for _ in range(n) if set(c) <= seen]
    q_ours, q_sp = quality(held, ours=tok), quality(held, sp=sp)
    print(f"quality ours {q_ours}, sentencepiece {q_sp}", file=sys.stderr)

    split = [
        [
            c.encode("utf-8", "surrogateescape")
            for c in tok.pretokenizer.split(d.decode("utf-8", "surrogateescape"))
        ]
        for d in held_docs
    ]
    sp_inputs = [c for doc in split for c in doc]
    n_bytes = sum(map(len, held_docs))
    ours_s, sp_s = [], []
    for _ in range(args.encode_repeat):
        tok.clear_cache()
        t0 = time.perf_counter()
        ids, _ = tok.encode_documents(held_docs, num_workers=2)
        ours_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        sp_chars = sentencepiece_ids(sp, sp_inputs)
        sp_s.append(time.perf_counter() - t0)
    n_sp = sum(map(len, sp_chars))

    with tempfile.TemporaryDirectory() as d:
        tok.save(d)
        hf = tokenizers.Tokenizer.from_file(f"{d}/tokenizer.json")
    texts = []
    for doc in held_docs:
        try:
            texts.append(doc.decode("utf-8"))
        except UnicodeDecodeError:
            continue
    identical = all(hf.encode(t).ids == tok.encode_ordinary(t) for t in texts)
    compared = len(texts)

    result = {
        "data": args.data,
        "vocab_size": args.vocab_size,
        "distinct_chunks": len(chunks),
        "count_chunks_s": round(count_s, 2),
        "unigram_train_s": round(ours_train_s, 2),
        "sentencepiece_train_s": round(sp_train_s, 2),
        "unigram_train_ratio": round(ours_train_s / sp_train_s, 3),
        "unigram_encode_mb_s": round(n_bytes / min(ours_s) / 1e6, 3),
        "sentencepiece_encode_mb_s": round(n_bytes / min(sp_s) / 1e6, 3),
        "unigram_encode_ratio": round(min(sp_s) / min(ours_s), 3),
        "encode_tokens": {"ours": int(len(ids)), "sentencepiece": int(n_sp)},
        "unigram_ids_identical_to_hf": bool(identical),
        "hf_docs_compared": compared,
        "quality": {"ours": q_ours, "sentencepiece": q_sp},
        "bytes_per_token_ratio": round(q_ours["bytes_per_token"] / q_sp["bytes_per_token"], 4),
        "loglik_per_byte_ratio": round(q_ours["loglik_per_byte"] / q_sp["loglik_per_byte"], 4),
        "peak_rss_mb": round(rss_mb, 1),
        "numpy": np.__version__,
    }
    print(json.dumps(result))
    if args.record:
        record("unigram", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
