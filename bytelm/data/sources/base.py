"""What every data source shares: :class:`Source` (a parsed spec: its signature, its records),
:class:`Document`, and the helpers of the source kinds (spec options, file signatures, a record's
text field, optional modules)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bytelm.errors import UserError

Progress = Callable[[int, int], None]
Record = tuple[str, str, Iterable[bytes]]  # (name, group, the document's bytes in pieces)

# what a source of files lists: a Path, a _LocalFile or an ObjectPath (the same few Path methods)
AnyFile = Any
AnyRoot = Any


@dataclasses.dataclass(frozen=True)
class Document:
    """One document: a stable ``name`` (its identity for the split), a ``group``, its bytes."""

    name: str
    group: str
    data: bytes


class Source:
    """A parsed spec. ``signature()`` changes whenever the underlying data may have changed."""

    # whether a group's documents are always consecutive (a group never comes back after another):
    # true of sources of files (a group is a file), which lets preparation keep no table of groups
    distinct_groups = False

    spec: str

    def signature(self) -> str:
        raise NotImplementedError

    def records(self, progress: Progress | None = None) -> Iterator[Record]:
        """Each document as ``(name, group, pieces)``, in source order: what a corpus build streams
        (a piece is consumed before the next record is asked for). Sources whose documents may be
        large read them piece by piece."""
        for doc in self.documents(progress):
            yield doc.name, doc.group, (doc.data,)

    def documents(self, progress: Progress | None = None) -> Iterator[Document]:
        for name, group, pieces in self.records(progress):
            yield Document(name, group, b"".join(pieces))

    def describe(self) -> str:
        return self.spec

    def partitions(self, n: int) -> list[Source]:
        """Up to ``n`` sources whose records, one after another, are this one's (what a parallel
        build gives its workers); a source that cannot be cut is one partition."""
        return [self]


def split_query(spec: str, body: str) -> tuple[str, dict[str, str]]:
    path, _, query = body.partition("?")
    params: dict[str, str] = {}
    if query:
        for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            params[key] = value
        if not params:
            raise UserError(f"cannot parse the options {query!r} in data spec {spec!r}: use KEY=VALUE&...")
    return path, params


def stat_signature(paths: Iterable[AnyFile]) -> str:
    h = hashlib.sha256()
    for p in paths:
        try:
            st = p.stat()
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{p}\0?\n".encode())
    return h.hexdigest()


def text_field(value, where: str, field: str) -> bytes:
    """A record's text field as bytes (a string as its UTF-8; bytes as they are; null as empty)."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if value is None:
        return b""
    raise UserError(
        f"{where}: field {field!r} is a {type(value).__name__}, not text; name a text field with ?field=NAME"
    )


def optional_module(module: str, spec: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"data spec {spec!r} needs {module.split('.')[0]}, which is not installed: pip install "
            "'bytelm[formats]'"
        ) from None
