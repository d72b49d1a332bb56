"""``bytelm tokenizer``: train, import, apply and measure the subword baseline's tokenizers."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bytelm import console
from bytelm.baselines import KINDS, encoders_of, is_saved, load_tokenizer, save_tokenizer, train_on_documents
from bytelm.baselines.bpe import tokenizer_stats
from bytelm.baselines.imported import import_tokenizer
from bytelm.cli.options import (
    add_config_options,
    add_data_option,
    add_tokenizer_option,
    add_workers_option,
    load_corpus,
    resolve_config,
)
from bytelm.errors import UserError
from bytelm.paths import check_output_dir, check_output_file
from bytelm.rundir import RunDir


def add_tokenizer(sub) -> None:
    tok = sub.add_parser(
        "tokenizer",
        help="train, import and use the subword baseline tokenizers (BPE, Unigram or WordPiece)",
        description="Train, import, apply and measure the BPE, Unigram and WordPiece tokenizers of the "
        "subword baseline.",
    )
    tok_sub = tok.add_subparsers(
        dest="tokenizer_command", metavar="SUBCOMMAND", required=True, help="tokenizer command"
    )
    for add in (
        add_tokenizer_train,
        add_tokenizer_import,
        add_tokenizer_encode,
        add_tokenizer_decode,
        add_tokenizer_stats,
    ):
        add(tok_sub)


# -- tokenizer train ------------------------------------------------------------------------------
def add_tokenizer_train(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train a BPE, Unigram or WordPiece tokenizer on the train split of a corpus",
        description="Learn a tokenizer on the train documents of --data and write its "
        "directory. --kind bpe (default): a merge list identical to HF tokenizers' BpeTrainer with the same "
        "pattern; files bytelm_bpe.json (native, versioned), tokenizer.json (HF tokenizers), ranks.tiktoken "
        "(tiktoken) and vocab.txt (human-readable). --kind unigram: a Unigram LM (seed substrings, EM over "
        "all segmentations, pruning; SentencePiece's algorithm on bytes); files bytelm_unigram.json, "
        "tokenizer.json (HF Unigram model) and vocab.txt. --kind wordpiece: merges chosen by the likelihood "
        "score f(xy) / (f(x) f(y)), encoded by longest match with ## continuation pieces and a whole-word "
        "[UNK] (BERT's WordPiece), byte-level or (--level char) character-level; files "
        "bytelm_wordpiece.json, tokenizer.json (HF WordPiece model, same ids) and vocab.txt.",
    )
    add_data_option(p)
    add_config_options(p)
    p.add_argument(
        "--kind",
        choices=KINDS,
        default="bpe",
        help="the algorithm: 'bpe' (ranked merges, default), 'unigram' (Viterbi over scored pieces) or "
        "'wordpiece' (longest match with ## pieces)",
    )
    p.add_argument(
        "--encoder",
        choices=["ranks", "viterbi", "wordpiece", "longest"],
        help="the segmentation rule recorded with the tokenizer: the kind's own (bpe: 'ranks', unigram: "
        "'viterbi', wordpiece: 'wordpiece'; the default) or, for bpe and unigram, 'longest' (greedy longest "
        "match over the same vocabulary, without WordPiece's ## marks)",
    )
    p.add_argument(
        "--level",
        choices=["byte", "char"],
        default="byte",
        help="wordpiece only: 'byte' (default; the 256 bytes as the alphabet, never [UNK]) or 'char' "
        "(the characters seen in training, [UNK] for the rest, as BERT)",
    )
    p.add_argument(
        "--max-input-chars-per-word",
        type=int,
        metavar="N",
        help="wordpiece --level char only: a longer word becomes [UNK] (default 100, BERT's)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        required=True,
        metavar="N",
        help="number of ids: 256 bytes + learned merges or pieces + special tokens (as HF counts it)",
    )
    p.add_argument(
        "--pattern",
        default="cl100k",
        metavar="gpt2|cl100k|REGEX",
        help="pre-tokenization pattern: 'cl100k' (default; digits in runs of 1-3), 'gpt2', or a regex",
    )
    p.add_argument(
        "--special",
        action="append",
        default=[],
        metavar="TOKEN",
        help="reserve a special token, e.g. --special '<|endoftext|>' (repeatable; ids after the merges)",
    )
    add_workers_option(p)
    p.add_argument(
        "--sample-mb",
        type=float,
        default=0,
        metavar="MB",
        help="train on a sample of about MB megabytes of the train split (every k-th document, in "
        "order, streamed; default 0: the whole split)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the tokenizer files into")
    p.add_argument(
        "--force",
        action="store_true",
        help="write over a tokenizer already in --out (runs trained on it will then refuse the new one)",
    )
    console.command(p, cmd_tokenizer_train)


def cmd_tokenizer_train(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")
    if RunDir(args.out).started() or RunDir(args.out).has_info():
        raise UserError(f"--out {args.out} is a run directory; write the tokenizer to a directory of its own")
    if is_saved(args.out) and not args.force:
        raise UserError(
            f"--out {args.out} holds a tokenizer already (runs trained on it check its fingerprint); give "
            "another directory, or --force to replace it"
        )
    if args.sample_mb < 0:
        raise UserError(f"--sample-mb must be >= 0 (0: the whole train split), got {args.sample_mb}")
    corpus = load_corpus(resolve_config(args).data)
    sample, sample_bytes = corpus.sample("train", int(args.sample_mb * 1e6))
    rules = encoders_of(args.kind)
    if args.encoder not in (None, *rules):
        raise UserError(
            f"--encoder {args.encoder} is not a rule of a {args.kind} tokenizer: use {rules[0]} (the default)"
            + (" or longest" if len(rules) > 1 else "")
        )
    if args.kind != "wordpiece" and (args.level != "byte" or args.max_input_chars_per_word is not None):
        raise UserError(f"--level and --max-input-chars-per-word are for --kind wordpiece, not {args.kind}")
    if args.max_input_chars_per_word is not None and args.level != "char":
        raise UserError(
            "--max-input-chars-per-word is for --level char: a byte-level WordPiece has no [UNK] to turn "
            "long words into"
        )
    unigram = args.kind == "unigram"
    learning = "pruning" if unigram else "merging"
    units = {"pre-tokenizing": " MB", learning: " rounds" if unigram else " merges"}
    with console.stages(units=units) as (progress, _):
        assert progress is not None
        tok = train_on_documents(
            args.kind,
            (corpus.document(int(i)).tobytes() for i in sample),  # (streamed)
            encoder=args.encoder,
            level=args.level,
            max_input_chars_per_word=args.max_input_chars_per_word,
            vocab_size=args.vocab_size,
            pattern=args.pattern,
            special_tokens=args.special,
            num_workers=args.workers,
            progress=lambda done, total: progress(learning, done, total),
            count_progress=lambda done, total: progress(
                "pre-tokenizing", done >> 20, (total or 0) >> 20 or None
            ),
            total_bytes=sample_bytes,
        )
    save_tokenizer(tok, args.out, args.kind)
    short = (
        f" (not the {args.vocab_size:,} asked for: the corpus gave no more; train on more text for more)"
        if tok.n_vocab < args.vocab_size
        else ""
    )
    if args.kind == "bpe":
        learned = f"256 bytes + {len(tok.merges):,} merges"
    elif unigram:
        learned = f"256 bytes + {tok.n_mergeable - 256:,} pieces"
    else:
        unk = ", [UNK] included" if tok.unk_id is not None else ""
        learned = f"{tok.n_mergeable:,} pieces ({tok.level}-level{unk})"
    console.print_rows(
        [
            ("tokenizer", args.out),
            ("kind", f"{args.kind} (encoder: {tok.encoder})"),
            (
                "data",
                f"{corpus.spec} (train split: {corpus.split_bytes('train'):,} bytes; trained on "
                f"{len(sample):,} documents, {sample_bytes:,} bytes)",
            ),
            ("pattern", args.pattern),
            ("ids", f"{tok.n_vocab:,} = {learned} + {len(tok.special_tokens)} special{short}"),
            ("fingerprint", tok.fingerprint),
        ]
    )
    return 0


# -- tokenizer import -----------------------------------------------------------------------------
def add_tokenizer_import(sub) -> None:
    p = sub.add_parser(
        "import",
        help="import an HF tokenizer.json or a tiktoken rank file as the subword baseline, with its ids",
        description="Read an HF tokenizer.json (a BPE model with the ByteLevel pre-tokenizer, WordPiece with "
        "BertPreTokenizer, or Unigram with Metaspace; ids as Tokenizer.encode(text, "
        "add_special_tokens=False): "
        "added tokens applied as by HF, the post-processor not; a normalizer, pre-tokenizer or added "
        "token that cannot be "
        "reproduced exactly is refused, naming it) or a tiktoken rank file (base64(token) rank per line; "
        "--pattern gives the split pattern that goes with it: ids as tiktoken.Encoding(pat_str=PATTERN, "
        "mergeable_ranks=..., special_tokens={})), and write a tokenizer directory that encodes with the "
        "source's ids. Use it like a trained one: --tokenizer DIR, model.tokenizer = DIR, or 'dir = DIR' in "
        "a compare preset's [tokenizer] table (the subword LM takes only tokenizers whose tokens' bytes "
        "reproduce the text: not BertPreTokenizer, Metaspace or ByteLevel add_prefix_space=true).",
    )
    p.add_argument(
        "path", metavar="PATH", help="an HF tokenizer.json, or a tiktoken rank file (e.g. ranks.tiktoken)"
    )
    p.add_argument(
        "--pattern",
        default="cl100k",
        metavar="gpt2|cl100k|REGEX",
        help="tiktoken only: the split pattern of the ranks: 'cl100k' (default), 'gpt2', or a regex",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write the tokenizer files into")
    p.add_argument("--force", action="store_true", help="write over a tokenizer already in --out")
    console.command(p, cmd_tokenizer_import)


def cmd_tokenizer_import(args: argparse.Namespace) -> int:
    check_output_dir(args.out, "--out")
    if is_saved(args.out) and not args.force:
        raise UserError(f"--out {args.out} holds a tokenizer already; give another directory, or --force")
    tok = import_tokenizer(args.path, pattern=args.pattern)
    if tok.source_kind == "tiktoken":
        source = f"{args.path} (tiktoken ranks, pattern {args.pattern})"
    else:
        source = f"{args.path} (HF tokenizer.json, {tok.inner.pattern or tok.kind})"
    save_tokenizer(tok, args.out, "imported", source_file=args.path)
    console.print_rows(
        [
            ("tokenizer", args.out),
            ("source", source),
            ("kind", f"{tok.kind} (encoder: {tok.encoder}), ids as in the source"),
            ("ids", f"{tok.n_vocab:,}"),
            ("subword LM", f"refused: {tok.lossy}" if tok.lossy else "yes (byte-exact)"),
            ("fingerprint", tok.fingerprint),
        ]
    )
    return 0


# -- tokenizer encode / decode -------------------------------------------------------------------
def add_tokenizer_encode(sub) -> None:
    p = sub.add_parser(
        "encode",
        help="encode stdin (raw bytes) to token ids on stdout",
        description="Read raw bytes on stdin (any bytes) and print their token ids, space-separated, on "
        "one line. A special token's spelling in the input is an error unless --allow-special or "
        "--special-as-text is given.",
    )
    add_tokenizer_option(p)
    special = p.add_mutually_exclusive_group()
    special.add_argument(
        "--allow-special", action="store_true", help="encode special tokens' spellings as the special tokens"
    )
    special.add_argument(
        "--special-as-text", action="store_true", help="encode special tokens' spellings as ordinary text"
    )
    console.command(p, cmd_tokenizer_encode)


def cmd_tokenizer_encode(args: argparse.Namespace) -> int:
    tok = load_tokenizer(args.tokenizer)
    data = sys.stdin.buffer.read()
    kwargs: dict[str, Any]
    if args.allow_special:
        kwargs = {"allowed_special": "all"}
    elif args.special_as_text:
        kwargs = {"disallowed_special": ()}
    else:
        kwargs = {}
    try:
        ids = tok.encode(data, **kwargs)
    except ValueError as e:
        raise UserError(f"{e} (on the command line: --allow-special or --special-as-text)") from None
    print(" ".join(map(str, ids)))
    return 0


def add_tokenizer_decode(sub) -> None:
    p = sub.add_parser(
        "decode",
        help="decode token ids on stdin to raw bytes on stdout",
        description="Read whitespace-separated token ids on stdin and write the exact bytes they stand for.",
    )
    add_tokenizer_option(p)
    console.command(p, cmd_tokenizer_decode)


def cmd_tokenizer_decode(args: argparse.Namespace) -> int:
    tok = load_tokenizer(args.tokenizer)
    ids = []
    for field in sys.stdin.buffer.read().split():
        try:
            ids.append(int(field))
        except ValueError:
            raise UserError(
                "decode reads whitespace-separated integer token ids on stdin, got "
                f"{field.decode(errors='replace')!r}"
            ) from None
    try:
        data = tok.decode_bytes(ids)
    except ValueError as e:
        raise UserError(str(e)) from None
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
    return 0


# -- tokenizer stats --------------------------------------------------------------------------------
def add_tokenizer_stats(sub) -> None:
    p = sub.add_parser(
        "stats",
        help="print bytes per token overall and per document group (the token tax table)",
        description="Encode the documents of --data and print bytes per token overall and per document "
        "group (directory), with each group's token tax: its tokens per byte relative to the whole corpus.",
    )
    add_tokenizer_option(p)
    add_data_option(p)
    add_config_options(p)
    p.add_argument(
        "--split",
        choices=["all", "train", "heldout"],
        default="all",
        help="which documents to measure (default: all)",
    )
    p.add_argument(
        "--group-by",
        choices=["group", "dir"],
        default="group",
        help="'group': the corpus's document groups (stdlib: top-level package; files: each file); "
        "'dir': the first directory of each document's path, e.g. one per language (default: group)",
    )
    add_workers_option(p)
    p.add_argument("--json", metavar="FILE", help="also write the numbers as JSON to FILE")
    console.command(p, cmd_tokenizer_stats)


def cmd_tokenizer_stats(args: argparse.Namespace) -> int:
    if args.json:
        check_output_file(args.json, "--json")
    tok = load_tokenizer(args.tokenizer)
    corpus = load_corpus(resolve_config(args).data)
    with console.progress_bar("encoding", unit=" docs") as bar:
        stats = tokenizer_stats(
            tok,
            corpus,
            split=args.split,
            group_by=args.group_by,
            num_workers=args.workers,
            progress=bar.update,
        )
    print(stats.format_table())
    if args.json:
        console.write_json(args.json, stats.to_dict())
    return 0
