"""Tokenizers people already have, imported as the subword baseline with their own ids.

``bytelm tokenizer import PATH --out DIR`` reads a tiktoken rank file (``base64(token) rank`` per
line, with ``--pattern``: the split pattern that goes with it) and writes a tokenizer directory
that :func:`bytelm.baselines.load_tokenizer` reads, so the subword LM trains on it
(``model.tokenizer = DIR``, or ``[tokenizer] dir = DIR`` in a compare preset).

An :class:`ImportedTokenizer` is a bytelm tokenizer (the *inner* one, with bytelm's own id scheme)
plus the map from its ids to the source's: ``encode`` gives the source's ids, ``decode_bytes``
takes them. For a tiktoken file the inner tokenizer is a BPE whose merges are derived from the
ranks (:func:`merges_from_ranks`): the token of rank ``r`` is made by the one pair that BPE with
the ranks below ``r`` leaves of its bytes, which is the merge tiktoken applies (its rule: merge the
adjacent pair whose concatenation has the lowest rank, leftmost first). The source file is copied
into ``DIR`` beside ``bytelm_imported.json`` (the native file: the id map and a fingerprint) and
``inner/`` (the inner tokenizer's own directory).

An HF ``tokenizer.json`` (:func:`import_tokenizer_json`; what is supported and refused:
:mod:`bytelm.baselines.hf_import`) is copied as ``tokenizer.json`` and read again on load (there
is no ``inner/``). ``lossy`` says why the tokens' bytes do not reproduce the text, when they do not.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import shutil
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Literal

import numpy as np

from bytelm.atomic import atomic_write_text
from bytelm.baselines.bpe.io import FORMAT_VERSION, TIKTOKEN_FILE, read_native, tokenizer_directory
from bytelm.baselines.bpe.pretokenize import resolve_pattern
from bytelm.baselines.bpe.tokenizer import Tokenizer
from bytelm.baselines.hf_import import SOURCE_KIND as HF_SOURCE_KIND
from bytelm.baselines.hf_import import inner_from_tokenizer_json, read_tokenizer_json
from bytelm.errors import UserError

FORMAT_NAME = "bytelm-imported"
NATIVE_FILE = "bytelm_imported.json"
INNER_DIR = "inner"


# -- tiktoken --------------------------------------------------------------------------------------
def read_tiktoken_ranks(path: str | Path) -> dict[bytes, int]:
    """``{token bytes: rank}`` of a tiktoken rank file; :class:`UserError` naming the line otherwise."""
    path = Path(path)
    ranks: dict[bytes, int] = {}
    try:
        lines = path.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read the tiktoken rank file {path}: {e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise UserError(
                f"{path} line {n} is {line[:60]!r}, not 'base64(token) rank': give a tiktoken rank file "
                "(tiktoken.load.load_tiktoken_bpe reads the same format)"
            ) from None
    if len(set(ranks.values())) != len(ranks):
        raise UserError(f"{path}: two tokens share a rank; each rank must be one token's")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise UserError(
            f"{path}: byte {missing[0]:#04x} (and {len(missing) - 1} more) has no rank; bytelm needs all 256 "
            "single bytes so that every input has an encoding"
        )
    return ranks


def _bpe_below(ranks: dict[bytes, int], piece: bytes, limit: int) -> list[bytes]:
    """tiktoken's rule on ``piece`` with the ranks below ``limit`` only."""
    parts = [piece[i : i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < limit and (best is None or r < best):
                best, at = r, i
        if best is None:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    return parts


def merges_from_ranks(
    ranks: dict[bytes, int], *, source: str = "the ranks"
) -> tuple[list[tuple[int, int]], list[int]]:
    """``(merges, source id of each inner id)`` of a BPE that encodes like tiktoken with ``ranks``.

    Inner ids: byte ``b`` is ``b``; the multi-byte tokens follow in rank order (merge ``k`` makes
    id ``256 + k``).

    >>> r = {bytes([b]): 255 - b for b in range(256)} | {b"bc": 300, b"abc": 256}
    >>> merges, to_source = merges_from_ranks(r)   # abc (rank 256) first: a + b + c, nothing to make it
    Traceback (most recent call last):
    ...
    bytelm.errors.UserError: the ranks: token b'abc' (rank 256) is not one merge ...
    >>> r[b"abc"] = 301
    >>> merges_from_ranks(r)                       # bc is inner id 256, abc 257
    ([(98, 99), (97, 256)], ...)
    """
    inner_of: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    to_source = [ranks[bytes([b])] for b in range(256)]
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = _bpe_below(ranks, token, rank)
        if len(parts) != 2:
            raise UserError(
                f"{source}: token {token!r} (rank {rank}) is not one merge of two tokens of lower rank (BPE "
                f"with the ranks below it leaves {parts}); it could never be produced"
            )
        merges.append((inner_of[parts[0]], inner_of[parts[1]]))
        inner_of[token] = len(to_source)
        to_source.append(rank)
    return merges, to_source


def import_tiktoken(path: str | Path, *, pattern: str) -> ImportedTokenizer:
    """An :class:`ImportedTokenizer` with the ids of ``tiktoken.Encoding(pat_str=pattern,
    mergeable_ranks=<the file>, special_tokens={})``."""
    ranks = read_tiktoken_ranks(path)
    merges, to_source = merges_from_ranks(ranks, source=str(path))
    inner = Tokenizer(merges, pattern=resolve_pattern(pattern))
    return ImportedTokenizer(inner, to_source, source=Path(path).name, source_kind="tiktoken")


def import_tokenizer_json(path: str | Path) -> ImportedTokenizer:
    """An :class:`ImportedTokenizer` with the ids of HF ``Tokenizer.from_file(path).encode(text,
    add_special_tokens=False)`` (what is supported: :mod:`bytelm.baselines.hf_import`)."""
    inner, to_source = inner_from_tokenizer_json(path)
    return ImportedTokenizer(inner, to_source, source=Path(path).name, source_kind=HF_SOURCE_KIND)


def import_tokenizer(path: str | Path, *, pattern: str) -> ImportedTokenizer:
    """The tokenizer of ``path``: an HF tokenizer.json (:func:`import_tokenizer_json`), else a
    tiktoken rank file split by ``pattern`` (:func:`import_tiktoken`)."""
    if not Path(path).is_file():
        raise UserError(f"{path} is not a file: give an HF tokenizer.json or a tiktoken rank file")
    if read_tokenizer_json(path) is not None:
        return import_tokenizer_json(path)
    return import_tiktoken(path, pattern=pattern)


# -- the tokenizer -----------------------------------------------------------------------------
class ImportedTokenizer:
    """A bytelm tokenizer (``inner``) with the ids of the tokenizer it was imported from:
    ``to_source[i]`` is the source's id of inner id ``i`` (module docstring). The encode/decode API
    is :class:`~bytelm.baselines.subword.SubwordTokenizer`'s, in source ids."""

    def __init__(self, inner, to_source: Iterable[int], *, source: str, source_kind: str) -> None:
        self.inner = inner
        self.to_source = np.asarray(list(to_source), np.int64)
        if len(self.to_source) != inner.n_vocab:
            raise UserError(f"the id map has {len(self.to_source)} ids for {inner.n_vocab} tokens")
        if len(np.unique(self.to_source)) != len(self.to_source) or (self.to_source < 0).any():
            raise UserError("the id map gives two tokens one id (or a negative id)")
        self.n_vocab = int(self.to_source.max()) + 1 if len(self.to_source) else 0
        self.to_inner = np.full(self.n_vocab, -1, np.int64)
        self.to_inner[self.to_source] = np.arange(len(self.to_source))
        self.source, self.source_kind = source, source_kind
        self.kind, self.encoder, self.pattern = inner.kind, inner.encoder, inner.pattern
        self.special_tokens = {s: int(self.to_source[i]) for s, i in inner.special_tokens.items()}
        self.added_tokens = {s: int(self.to_source[i]) for s, i in inner.added_tokens.items()}
        #: why the tokens' bytes do not reproduce the text (None: they do); the subword LM refuses it
        self.lossy: str | None = getattr(inner, "lossy", None)
        unk = getattr(inner, "unk_id", None)
        self.unk_id = None if unk is None else int(self.to_source[unk])
        payload = json.dumps([inner.fingerprint, self.to_source.tolist()], separators=(",", ":"))
        self.fingerprint = hashlib.sha256(payload.encode()).hexdigest()

    def __repr__(self) -> str:
        return (
            f"ImportedTokenizer({self.source_kind} {self.source!r}, n_vocab={self.n_vocab}, "
            f"inner={self.inner!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImportedTokenizer) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def _out(self, ids) -> list[int]:
        return self.to_source[np.asarray(ids, np.int64)].tolist() if len(ids) else []

    def _in(self, ids) -> list[int]:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        for i in ids:
            if not isinstance(i, (int, np.integer)) or not 0 <= i < self.n_vocab or self.to_inner[i] < 0:
                raise ValueError(f"unknown token id {i!r}: not an id of {self.source}")
        return self.to_inner[np.asarray(ids, np.int64)].tolist() if ids else []

    # -- the API, in source ids ---------------------------------------------------------------------
    def encode_ordinary(self, text: str | bytes) -> list[int]:
        return self._out(self.inner.encode_ordinary(text))

    def encode(
        self,
        text: str | bytes,
        *,
        allowed_special: Literal["all"] | Collection[str] = frozenset(),
        disallowed_special: Literal["all"] | Collection[str] = "all",
    ) -> list[int]:
        return self._out(
            self.inner.encode(text, allowed_special=allowed_special, disallowed_special=disallowed_special)
        )

    def encode_ordinary_with_bytes(self, text: str | bytes) -> tuple[list[int], list[int]]:
        ids, nbytes = self.inner.encode_ordinary_with_bytes(text)
        return self._out(ids), nbytes

    def encode_documents(self, documents, *, num_workers: int | None = None, dtype=np.int32):
        ids, counts = self.inner.encode_documents(documents, num_workers=num_workers, dtype=np.int64)
        return self.to_source[ids].astype(dtype), counts

    def encode_batch(self, texts, **kwargs) -> list[list[int]]:
        return [self._out(ids) for ids in self.inner.encode_batch(texts, **kwargs)]

    def token_bytes(self, token_id: int) -> bytes:
        """A token's bytes (``b""`` for an id the source leaves unused: it is never produced)."""
        if 0 <= token_id < self.n_vocab and self.to_inner[token_id] < 0:
            return b""
        return self.inner.token_bytes(self._in([token_id])[0])

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        return self.inner.decode_bytes(self._in(ids))

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        return self.decode_bytes(ids).decode("utf-8", errors)

    def clear_cache(self) -> None:
        self.inner.clear_cache()

    # -- files --------------------------------------------------------------------------------------
    def save(self, directory, *, source_file: str | Path | None = None) -> Path:
        """Write ``inner/``, a copy of ``source_file`` (when given) and ``bytelm_imported.json`` (last)."""
        d = tokenizer_directory(directory)
        if self.source_kind == "tiktoken":  # (a tokenizer.json is read again on load: it is the source)
            self.inner.save(d / INNER_DIR)
        else:
            d.mkdir(parents=True, exist_ok=True)
        if source_file is not None:
            name = TIKTOKEN_FILE if self.source_kind == "tiktoken" else "tokenizer.json"
            shutil.copyfile(source_file, d / name)
        doc = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "source": self.source,
            "source_kind": self.source_kind,
            "n_vocab": self.n_vocab,
            "fingerprint": self.fingerprint,
            "to_source": self.to_source.tolist(),
        }
        atomic_write_text(d / NATIVE_FILE, json.dumps(doc) + "\n")
        return d

    @classmethod
    def load(cls, directory, inner_loader, hf_loader) -> ImportedTokenizer:
        """Read a directory written by :meth:`save` (``inner_loader`` reads ``inner/``, ``hf_loader``
        the copied ``tokenizer.json``: :func:`~bytelm.baselines.hf_import.inner_from_tokenizer_json`)."""
        path, doc = read_native(directory, name=NATIVE_FILE, format_name=FORMAT_NAME)
        try:
            if doc["source_kind"] == "tiktoken":
                inner = inner_loader(Path(directory) / INNER_DIR)
            else:
                inner = hf_loader(Path(directory) / "tokenizer.json")[0]
            tok = cls(
                inner,
                doc["to_source"],
                source=doc["source"],
                source_kind=doc["source_kind"],
            )
        except (KeyError, TypeError, ValueError) as e:
            raise _reimport(path, directory, doc, f"{type(e).__name__}: {e}") from None
        if tok.fingerprint != doc.get("fingerprint"):
            raise _reimport(
                path,
                directory,
                doc,
                f"fingerprint mismatch: the file says {doc.get('fingerprint')}, its contents hash to "
                f"{tok.fingerprint} (written by another version of the importer, or edited)",
            )
        return tok


def _reimport(path, directory, doc: dict, why: str) -> UserError:
    """The error for an imported directory that cannot be read back: import the copied source again."""
    tiktoken = doc.get("source_kind") == "tiktoken"
    source = Path(directory) / (TIKTOKEN_FILE if tiktoken else "tokenizer.json")
    return UserError(
        f"{path} is not a valid bytelm tokenizer file ({why}); import it again: bytelm tokenizer import "
        f"{source} --out {directory} --force" + (" --pattern <its split pattern>" if tiktoken else "")
    )
