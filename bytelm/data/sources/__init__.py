"""Data sources: a spec string names a corpus (README.md, Data sources).

``stdlib``
    Every ``*.py`` file of the running Python's standard library (``site-packages`` excluded),
    one document per file, sorted by path. Group: the top-level package (``<top>`` for modules
    at the root).
``files:PATH[?split=file|paragraph|line]``
    A file, a directory (searched recursively; names starting with ``.`` are skipped) or a glob.
    One document per file by default; ``split=paragraph`` cuts each file at runs of blank lines
    (``\\n\\n``, ``\\r\\n\\r\\n``, ...), ``split=line`` at ``\\n`` (a ``\\r`` before it stays in
    the document, as data). Empty pieces are dropped by those two splits; an empty *file* is a
    document of 0 bytes. Group: the file's path relative to the root.
``jsonl:PATH[?field=text]``, ``parquet:PATH[?field=text]``
    Files of records (a file, a directory or a glob, as ``files:``; ``.jsonl.gz`` and
    ``.jsonl.zst`` read compressed): each record's text field is one document, document ``k`` of
    file ``REL`` named ``REL#k``. Group: the file's path relative to the root.
``hf:DIR[?split=train&field=text]``
    A Hugging Face ``datasets`` dataset written by ``save_to_disk`` (read with pyarrow). Record
    ``i`` is named ``SPLIT/i``. Group: the split.
``tfds:NAME[/CONFIG][:SPLIT][?field=text&data_dir=DIR]``
    A tensorflow-datasets dataset already prepared as array_record, read with
    ``tfds.data_source`` (no TensorFlow needed, nothing downloaded). Group: the split.

Documents are raw bytes: nothing is decoded, normalised or stripped. :func:`parse_source` reads a
spec; each kind is a module of this package (:mod:`.files`, :mod:`.records`, :mod:`.hf_disk`,
:mod:`.tfds`) on :mod:`.base`.
"""

from __future__ import annotations

from bytelm.data.sources.base import Document, Progress, Record, Source
from bytelm.data.sources.files import READ_CHUNK, FilesSource, StdlibSource, split_pieces
from bytelm.data.sources.hf_disk import HfDiskSource
from bytelm.data.sources.records import RecordFilesSource
from bytelm.data.sources.tfds import TfdsSource
from bytelm.errors import UserError

__all__ = [
    "READ_CHUNK",
    "Document",
    "FilesSource",
    "HfDiskSource",
    "Progress",
    "Record",
    "RecordFilesSource",
    "Source",
    "StdlibSource",
    "TfdsSource",
    "parse_source",
    "split_pieces",
]


def parse_source(spec: str) -> Source:
    """Parse a source spec (``stdlib``, ``files:...``, ``tfds:...``) or raise ``UserError``."""
    spec = spec.strip()
    if spec == "stdlib":
        return StdlibSource()
    if spec.startswith("files:"):
        return FilesSource.from_spec(spec)
    if spec.startswith("tfds:"):
        return TfdsSource.from_spec(spec)
    for kind in RecordFilesSource.KINDS:
        if spec.startswith(f"{kind}:"):
            return RecordFilesSource.from_spec(spec, kind)
    if spec.startswith("hf:"):
        return HfDiskSource.from_spec(spec)
    raise UserError(
        f"unknown data source {spec!r}: use 'stdlib', 'files:PATH[?split=paragraph|line]', "
        "'jsonl:PATH[?field=text]' (also .jsonl.gz, .jsonl.zst), 'parquet:PATH[?field=text]', "
        "'hf:DIR[?split=train&field=text]' (datasets' save_to_disk) or "
        "'tfds:NAME[/CONFIG][:SPLIT][?field=text&data_dir=DIR]'"
    )
