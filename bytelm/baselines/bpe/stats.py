"""Tokenizer statistics: bytes per token overall and per document group ("token tax").

Bytes per token is measured, never assumed: the UTF-8 bytes of the documents divided by the
number of tokens the tokenizer produces for them (ordinary encoding: special tokens' spellings
are text). The *token tax* of a group is how many more tokens per byte it pays than the corpus
as a whole: ``(tokens / bytes of the group) / (tokens / bytes overall)``; 1.0 is average, 1.5
means 50% more tokens (and so 50% more sequence length and compute) per byte.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bytelm.baselines.bpe.tokenizer import Tokenizer
from bytelm.data import load_corpus
from bytelm.errors import UserError

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class GroupStats:
    """Counts for one group of documents (or the whole corpus)."""

    group: str
    documents: int
    bytes: int
    tokens: int

    @property
    def bytes_per_token(self) -> float:
        return self.bytes / self.tokens if self.tokens else float("nan")

    def tax(self, overall: GroupStats) -> float:
        """Tokens per byte relative to ``overall`` (1.0 = average)."""
        if not self.bytes or not overall.tokens:
            return float("nan")
        return (self.tokens / self.bytes) / (overall.tokens / overall.bytes)


@dataclass(frozen=True)
class TokenizerStats:
    """The result of :func:`tokenizer_stats`."""

    fingerprint: str
    n_vocab: int
    data: str
    split: str
    overall: GroupStats
    groups: list[GroupStats]

    def to_dict(self) -> dict:
        def row(g: GroupStats) -> dict:
            return {
                "group": g.group,
                "documents": g.documents,
                "bytes": g.bytes,
                "tokens": g.tokens,
                "bytes_per_token": g.bytes_per_token,
                "token_tax": g.tax(self.overall),
            }

        return {
            "tokenizer_fingerprint": self.fingerprint,
            "n_vocab": self.n_vocab,
            "data": self.data,
            "split": self.split,
            "overall": row(self.overall),
            "groups": [row(g) for g in self.groups],
        }

    def format_table(self) -> str:
        """The token tax table (groups by decreasing tax, then the total), as text."""
        header = ("group", "docs", "bytes", "tokens", "bytes/token", "token tax")
        rows = [
            (
                g.group,
                f"{g.documents:,}",
                f"{g.bytes:,}",
                f"{g.tokens:,}",
                f"{g.bytes_per_token:.3f}",
                f"{g.tax(self.overall):.3f}",
            )
            for g in sorted(self.groups, key=lambda g: (-g.tax(self.overall) if g.tokens else 0.0, g.group))
        ]
        o = self.overall
        total = (
            "TOTAL",
            f"{o.documents:,}",
            f"{o.bytes:,}",
            f"{o.tokens:,}",
            f"{o.bytes_per_token:.3f}",
            "1.000",
        )
        widths = [max(len(r[i]) for r in [header, *rows, total]) for i in range(len(header))]

        def fmt(r) -> str:
            return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

        rule = "  ".join("-" * w for w in widths)
        lines = [
            f"tokenizer {self.fingerprint[:16]} ({self.n_vocab:,} ids) on {self.data} [{self.split}]",
            "token tax = tokens per byte of the group / tokens per byte overall (1.0 = average)",
            fmt(header),
            rule,
            *map(fmt, rows),
            rule,
            fmt(total),
        ]
        return "\n".join(lines)


def tokenizer_stats(
    tokenizer: Tokenizer,
    data,
    *,
    split: str = "all",
    group_by: str = "group",
    num_workers: int | None = None,
    block_bytes: int = 1 << 26,
    progress: Progress | None = None,
) -> TokenizerStats:
    """Bytes per token of ``tokenizer`` on a corpus, overall and per document group.

    ``data`` is a data spec (``"stdlib"``, ``"files:PATH"``) or a loaded
    :class:`~bytelm.data.Corpus`. ``group_by="group"`` uses the corpus's document groups (the
    top-level package for ``stdlib``, the file for ``files:``); ``"dir"`` the first directory of
    each document's name (e.g. one directory per language). ``progress(documents_done,
    documents_total)`` is called as blocks finish.
    """
    if group_by not in ("group", "dir"):
        raise UserError(f"group_by must be 'group' or 'dir', got {group_by!r}")
    corpus = load_corpus(data) if isinstance(data, str) else data
    indices = corpus.document_indices(split)
    n_bytes = np.array([len(corpus.document(i)) for i in indices], dtype=np.int64)
    n_tokens = np.zeros(len(indices), dtype=np.int64)
    start = 0
    while start < len(indices):
        stop, size = start, 0
        while stop < len(indices) and (size < block_bytes or stop == start):
            size += int(n_bytes[stop])
            stop += 1
        docs = [corpus.document(i).tobytes() for i in indices[start:stop]]
        _, counts = tokenizer.encode_documents(docs, num_workers=num_workers)
        n_tokens[start:stop] = counts
        start = stop
        if progress is not None:
            progress(stop, len(indices))
    if group_by == "group":
        labels = [corpus.groups[i] for i in indices]
    else:
        labels = [corpus.names[i].split("/", 1)[0] if "/" in corpus.names[i] else "<top>" for i in indices]
    groups = np.array(labels, dtype=object)
    rows = []
    for g in sorted(set(groups.tolist())):
        mask = groups == g
        rows.append(GroupStats(g, int(mask.sum()), int(n_bytes[mask].sum()), int(n_tokens[mask].sum())))
    overall = GroupStats("TOTAL", len(indices), int(n_bytes.sum()), int(n_tokens.sum()))
    return TokenizerStats(
        fingerprint=tokenizer.fingerprint,
        n_vocab=tokenizer.n_vocab,
        data=getattr(corpus, "spec", str(data)),
        split=split,
        overall=overall,
        groups=rows,
    )
