"""Tokenizer files: a versioned native file plus exports that the reference libraries load.

A tokenizer directory holds:

- ``bytelm_bpe.json``: the native, versioned file that
  :meth:`~bytelm.baselines.bpe.tokenizer.Tokenizer.load` reads (through :func:`read_native`):
  ``{"format": "bytelm-bpe", "version": 1, "pattern", "merges", "special_tokens",
  "added_tokens", "n_vocab", "fingerprint"}``. ``merges`` is the ordered merge list as id pairs;
  special and added tokens are ``[{"id", "content"}, ...]``. The fingerprint is checked on load.
- ``tokenizer.json``: HF ``tokenizers`` format (``Tokenizer.from_file``): a BPE model over GPT-2's
  byte characters, a ``Split`` pre-tokenizer with the same pattern followed by
  ``ByteLevel(use_regex=False)``, and the special/added tokens. Same ids. With
  ``encoder="longest"`` the model is HF's ``WordPiece`` (:func:`hf_longest_match_model`).
- ``ranks.tiktoken``: ``base64(token bytes) rank`` per line, for
  ``tiktoken.load.load_tiktoken_bpe``; the rank of a mergeable token is its id. With
  ``tiktoken.Encoding(pat_str=tokenizer.pattern, mergeable_ranks=..., special_tokens=...)`` it
  gives the same ids (a custom pattern that leaves gaps is the exception: tiktoken drops text
  the pattern does not match, this tokenizer keeps it as chunks). Only for ``encoder="ranks"``.
- ``vocab.txt``: a human-readable dump (id, kind, bytes, and for merged tokens the merge that
  made them). Written for people; never loaded back.

Every file is written atomically; ``bytelm_bpe.json`` last, so a directory with it is complete.
This module knows the formats and imports nothing of the tokenizer: the writers take any object
with the :class:`~bytelm.baselines.bpe.tokenizer.Tokenizer` attributes they read.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

from bytelm.atomic import atomic_write_text
from bytelm.baselines.bpe.bytelevel import bytes_to_chars
from bytelm.errors import UserError

FORMAT_NAME = "bytelm-bpe"
FORMAT_VERSION = 1
NATIVE_FILE = "bytelm_bpe.json"
HF_FILE = "tokenizer.json"
TIKTOKEN_FILE = "ranks.tiktoken"
VOCAB_DUMP_FILE = "vocab.txt"


# -- writing ------------------------------------------------------------------------------------
def native_json(tok) -> str:
    """The versioned native file's text."""
    doc = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "pattern": tok.pattern,
        "n_vocab": tok.n_vocab,
        "n_mergeable": tok.n_mergeable,
        "special_tokens": [{"id": i, "content": s} for s, i in tok.special_tokens.items()],
        "added_tokens": [{"id": i, "content": s} for s, i in tok.added_tokens.items()],
        "fingerprint": tok.fingerprint,
        "merges": [list(m) for m in tok.merges],
    }
    if tok.encoder != "ranks":
        doc = {
            **{k: v for k, v in doc.items() if k != "merges"},
            "encoder": tok.encoder,
            "merges": doc["merges"],
        }
    head = json.dumps({k: v for k, v in doc.items() if k != "merges"}, indent=1, ensure_ascii=False)
    # one merge per line keeps the file diffable and short
    merges = ",\n".join(f"  [{a}, {b}]" for a, b in tok.merges)
    return head[:-2] + ',\n "merges": [\n' + merges + "\n ]\n}\n"


def _hf_added_token(token_id: int, content: str, *, special: bool) -> dict:
    """One entry of HF's ``added_tokens`` list: matched whole, never normalised or stripped."""
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def hf_model(tok) -> dict:
    """The ``model`` of ``tokenizer.json``: BPE (ranked merges), or WordPiece for greedy longest
    match (``encoder="longest"`` of any vocabulary; see :func:`hf_longest_match_model`)."""
    if tok.encoder == "longest":
        return hf_longest_match_model(tok)
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": {bytes_to_chars(tok.token_bytes(i)): i for i in range(tok.n_mergeable)},
        "merges": [
            [bytes_to_chars(tok.token_bytes(a)), bytes_to_chars(tok.token_bytes(b))] for a, b in tok.merges
        ],
    }


def hf_longest_match_model(tok) -> dict:
    """HF's ``WordPiece`` model as greedy longest match on a byte alphabet: no ``##`` prefix
    (``continuing_subword_prefix=""``: a piece is the same inside a word as at its start) and no
    length limit on a word (``max_input_chars_per_word``: WordPiece otherwise turns longer words
    into its unknown token). Its ``unk_token`` is never produced: every byte is a piece."""
    return {
        "type": "WordPiece",
        "unk_token": "[UNK]",
        "continuing_subword_prefix": "",
        "max_input_chars_per_word": 1 << 30,
        "vocab": {bytes_to_chars(tok.token_bytes(i)): i for i in range(tok.n_mergeable)},
    }


def hf_tokenizer_json(tok) -> str:
    """``tokenizer.json`` text for HF ``tokenizers`` (same ids as ``tok``): the pattern's ``Split``
    and ``ByteLevel`` around ``tok``'s model (:func:`hf_model`, or the tokenizer's own ``hf_model``)."""
    added = [_hf_added_token(i, s, special=True) for s, i in tok.special_tokens.items()]
    added += [_hf_added_token(i, s, special=False) for s, i in tok.added_tokens.items()]
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": tok.pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        "model": tok.hf_model() if hasattr(tok, "hf_model") else hf_model(tok),
    }
    return json.dumps(doc, ensure_ascii=False, indent=1) + "\n"


def tiktoken_ranks(tok) -> str:
    """``ranks.tiktoken`` text: ``base64(bytes) rank`` per mergeable token, in rank order."""
    return "".join(
        f"{base64.b64encode(tok.token_bytes(i)).decode('ascii')} {i}\n" for i in range(tok.n_mergeable)
    )


def vocab_dump(tok) -> str:
    """The human-readable vocabulary (never loaded back)."""
    made_by: dict[int, tuple[int, int, int]] = {}
    for rank, (a, b) in enumerate(tok.merges):
        made_by.setdefault(tok.merge_results[rank], (rank, a, b))
    lines = [
        f"# bytelm byte-level BPE vocabulary: {tok.n_vocab} ids ({tok.n_mergeable} mergeable = 256 bytes + "
        f"{tok.n_mergeable - 256} learned, {len(tok.special_tokens)} special, "
        f"{tok.n_vocab - tok.n_mergeable - len(tok.special_tokens)} added)",
        f"# pattern: {tok.pattern}",
        f"# fingerprint: {tok.fingerprint}",
        "# id\tkind\tbytes (Python literal)\tmade by merge rank: left + right",
    ]
    kinds = {i: "special" for i in tok.special_tokens.values()}
    kinds.update({i: "added" for i in tok.added_tokens.values() if i >= tok.n_mergeable})
    for i in range(tok.n_vocab):
        kind = kinds.get(i, "byte" if i < 256 else "merged")
        line = f"{i}\t{kind}\t{tok.token_bytes(i)!r}"
        if i in made_by:
            rank, a, b = made_by[i]
            line += f"\t{rank}: {a} + {b}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def tokenizer_directory(directory: str | os.PathLike) -> Path:
    """``directory`` as a path to save a tokenizer into; :class:`UserError` when it is a file."""
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise UserError(f"cannot save the tokenizer to {d}: it exists and is not a directory")
    return d


def write_files(directory: str | os.PathLike, files: list[tuple[str, str]]) -> Path:
    """Write ``(name, text)`` files into a tokenizer directory, atomically each, in order: the native
    file comes last, so a directory that holds it is complete. Every kind saves through this."""
    d = tokenizer_directory(directory)
    for name, text in files:
        atomic_write_text(d / name, text)
    return d


def write_tokenizer_files(tok, directory: str | os.PathLike) -> Path:
    """Write all tokenizer files into ``directory`` (created if needed); return its path."""
    d = tokenizer_directory(directory)
    if tok.encoder == "ranks":
        atomic_write_text(d / TIKTOKEN_FILE, tiktoken_ranks(tok))
    elif (d / TIKTOKEN_FILE).exists():  # tiktoken ranks mean ranked merges: a stale file would mislead
        (d / TIKTOKEN_FILE).unlink()
    return write_files(
        d,
        [
            (HF_FILE, hf_tokenizer_json(tok)),
            (VOCAB_DUMP_FILE, vocab_dump(tok)),
            (NATIVE_FILE, native_json(tok)),
        ],
    )


# -- reading ------------------------------------------------------------------------------------
def read_native(
    directory: str | os.PathLike, *, name: str = NATIVE_FILE, format_name: str = FORMAT_NAME
) -> tuple[Path, dict]:
    """``(path, document)`` of the native file ``name`` in ``directory``, its format and version checked.

    Raises :class:`~bytelm.errors.UserError` (a ``ValueError``) naming the file when the
    directory or file is missing, truncated, corrupted or of an unknown version.
    """
    d = Path(directory)
    if not d.is_dir():
        raise UserError(f"tokenizer directory {d} does not exist; train one with 'bytelm tokenizer train'")
    path = d / name
    if not path.is_file():
        raise UserError(
            f"{path} is missing: {d} is not a bytelm tokenizer directory (or its save did not finish)"
        )
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise invalid(path, f"not UTF-8: {e}") from None
    except json.JSONDecodeError as e:
        raise invalid(path, f"truncated or corrupted JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("format") != format_name:
        raise invalid(path, f"the 'format' field is not {format_name!r}")
    version = doc.get("version")
    if version != FORMAT_VERSION:
        raise invalid(path, f"format version {version!r}; this bytelm reads version {FORMAT_VERSION}")
    return path, doc


def invalid(path: Path, why: str) -> UserError:
    """The error for a native file that cannot be read back."""
    return UserError(
        f"{path} is not a valid bytelm tokenizer file ({why}); re-save or re-train the tokenizer"
    )
