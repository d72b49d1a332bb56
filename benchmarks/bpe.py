"""Benchmark the byte-level BPE against its peers, in the same run on the same documents.

    python benchmarks/bpe.py [--data stdlib] [--vocab-size 32768] [--pattern cl100k]
                             [--encode-mb 10] [--workers N] [--repeat 1] [--encode-repeat 3] [--record]

1. Training: ours (``train_bpe``, pre-tokenization on ``--workers`` processes) vs HF
   ``tokenizers``' ``BpeTrainer`` (Rust, on all cores), same documents, pattern and vocab size;
   wall time, and whether the merge lists are identical. Documents that are not valid UTF-8 are
   left out for both (HF only takes text).
2. Encoding: the first ``--encode-mb`` MB of those documents, ours (``encode_documents`` on
   ``--workers`` processes, starting from an empty chunk cache) vs tiktoken's single-thread
   ``encode_ordinary`` loop on the same ranks (exported ``ranks.tiktoken``); the ids must match.
   Both encoders get one tiny warm-up call before the timing (one-time setup, not caching).
3. Peak resident memory of our training (this process and its workers, from ``getrusage``).

Timings are wall-clock (``time.perf_counter``); with ``--repeat N`` each side's training is run N
times, and encoding ``--encode-repeat`` times per side, alternating ours and tiktoken so that a
noisy machine weighs on both alike; each side's best time is reported (our chunk cache is
cleared before every run). The last line printed is one JSON object with the numbers; ``--record``
also appends it to ``benchmarks/results/bpe.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time


def peak_rss_mb() -> tuple[float, float]:
    """(this process, largest finished descendant) peak RSS in MiB (Linux reports KiB).

    Our workers are children of multiprocessing's fork server, which reaps them: they count once the
    fork server has ended, so it is stopped first (the next process pool starts another)."""
    import multiprocessing.forkserver

    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    if server is not None and hasattr(server, "_stop"):
        server._stop()
    self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return self_kb / 1024, child_kb / 1024


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="stdlib", help="corpus spec (default: stdlib)")
    p.add_argument("--vocab-size", type=int, default=32768, help="vocabulary size (default: 32768)")
    p.add_argument("--pattern", default="cl100k", help="pre-tokenization pattern (default: cl100k)")
    p.add_argument("--encode-mb", type=float, default=10.0, help="MB (10^6 bytes) to encode (default: 10)")
    p.add_argument("--workers", type=int, default=None, help="our worker processes (default: all CPUs)")
    p.add_argument(
        "--repeat", type=int, default=1, help="training runs per side; the best is reported (default: 1)"
    )
    p.add_argument(
        "--encode-repeat",
        type=int,
        default=3,
        help="encoding runs per side, alternating ours / tiktoken; each side's best is reported (default: 3)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args(argv)

    os.environ["TIKTOKEN_CACHE_DIR"] = ""  # tiktoken would otherwise cache the ranks file by path
    import tiktoken
    import tiktoken.load
    from tokenizers import Regex, models, pre_tokenizers, trainers
    from tokenizers import Tokenizer as HFTokenizer

    from bytelm.baselines.bpe import PATTERNS, train_bpe
    from bytelm.baselines.bpe.bytelevel import chars_to_bytes
    from bytelm.baselines.bpe.parallel import available_cpus
    from bytelm.data import load_corpus

    corpus = load_corpus(args.data)
    docs, texts, skipped = [], [], 0
    for d in corpus.documents("all"):
        try:
            texts.append(d.decode("utf-8"))
        except UnicodeDecodeError:
            skipped += 1
            continue
        docs.append(d)
    n_bytes = sum(map(len, docs))
    print(f"corpus {corpus.spec}: {len(docs)} documents, {n_bytes:,} bytes ({skipped} not UTF-8, left out)")
    print(f"cpus available: {available_cpus()}; vocab {args.vocab_size}, pattern {args.pattern}")

    # -- training: ours ----------------------------------------------------------------------
    train_times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        tok = train_bpe(docs, vocab_size=args.vocab_size, pattern=args.pattern, num_workers=args.workers)
        train_times.append(time.perf_counter() - t0)
    rss_self, rss_child = peak_rss_mb()
    train_s = min(train_times)
    print(
        f"ours  train {train_s:7.2f} s  ({len(tok.merges)} merges)  peak RSS {rss_self:.0f} MiB (+ workers "
        f"{rss_child:.0f} MiB)"
    )

    # -- training: HF --------------------------------------------------------------------------
    pattern = PATTERNS.get(args.pattern, args.pattern)
    hf_times = []
    for _ in range(args.repeat):
        hf = HFTokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        trainer = trainers.BpeTrainer(
            vocab_size=args.vocab_size,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        t0 = time.perf_counter()
        hf.train_from_iterator(texts, trainer)
        hf_times.append(time.perf_counter() - t0)
    hf_train_s = min(hf_times)
    hf_merges = [
        (chars_to_bytes(a), chars_to_bytes(b)) for a, b in json.loads(hf.to_str())["model"]["merges"]
    ]
    our_merges = [(tok.token_bytes(a), tok.token_bytes(b)) for a, b in tok.merges]
    identical = hf_merges == our_merges
    print(f"HF    train {hf_train_s:7.2f} s  ({len(hf_merges)} merges)  merge lists identical: {identical}")
    if not identical:
        i = next(
            (i for i, (x, y) in enumerate(zip(our_merges, hf_merges)) if x != y),
            min(len(our_merges), len(hf_merges)),
        )
        print(f"      first difference at merge {i}")

    # -- encoding ------------------------------------------------------------------------------
    limit = int(args.encode_mb * 1e6)
    enc_docs, enc_texts, size = [], [], 0
    for d, t in zip(docs, texts):
        if size >= limit:
            break
        enc_docs.append(d)
        enc_texts.append(t)
        size += len(d)
    with tempfile.TemporaryDirectory() as tmp:
        tok.save(tmp)
        ranks = tiktoken.load.load_tiktoken_bpe(os.path.join(tmp, "ranks.tiktoken"))
    enc = tiktoken.Encoding(
        name="bytelm-bench", pat_str=tok.pattern, mergeable_ranks=ranks, special_tokens={}
    )
    # one-time setup on both sides, outside the timing: tiktoken builds its encoder and regex;
    # ours builds the fast path's tables (which tokens encode to themselves, the pair-rank table)
    enc.encode_ordinary("warm up")
    tok.encode_documents([b"warm up"], num_workers=1)

    # alternate the two sides, so that both see the same (noisy) machine
    our_times, tt_times = [], []
    for _ in range(args.encode_repeat):
        tok.clear_cache()
        t0 = time.perf_counter()
        ids, _counts = tok.encode_documents(enc_docs, num_workers=args.workers)
        our_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        tt_ids = [enc.encode_ordinary(t) for t in enc_texts]
        tt_times.append(time.perf_counter() - t0)
    print(
        f"encode times, alternating (s): ours {[round(t, 3) for t in our_times]}, tiktoken "
        f"{[round(t, 3) for t in tt_times]}"
    )
    same_ids = ids.tolist() == [i for x in tt_ids for i in x]
    encode_mb_s = size / 1e6 / min(our_times)
    tiktoken_mb_s = size / 1e6 / min(tt_times)
    print(
        f"encode {size / 1e6:.1f} MB ({len(enc_docs)} documents, {len(ids):,} tokens): ours "
        f"{encode_mb_s:.2f} MB/s, tiktoken (1 thread) {tiktoken_mb_s:.2f} MB/s, ids identical: {same_ids}"
    )
    result = {
        "train_s": round(train_s, 3),
        "hf_train_s": round(hf_train_s, 3),
        "train_ratio": round(train_s / hf_train_s, 3),
        "merges_identical_to_hf": identical,
        "encode_mb_s": round(encode_mb_s, 3),
        "tiktoken_mb_s": round(tiktoken_mb_s, 3),
        "encode_ratio": round(encode_mb_s / tiktoken_mb_s, 3),
        "encode_ids_identical": same_ids,
        "peak_rss_mb": round(max(rss_self, rss_child), 1),
        "train_peak_rss_self_mb": round(rss_self, 1),
        "train_peak_rss_worker_mb": round(rss_child, 1),
        "documents": len(docs),
        "bytes": n_bytes,
        "vocab_size": args.vocab_size,
        "pattern": args.pattern,
        "cpus": available_cpus(),
        "repeat": args.repeat,
        "encode_repeat": args.encode_repeat,
    }
    print(json.dumps(result))
    if args.record:
        from results import record

        record("bpe", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
