"""``jsonl:`` and ``parquet:`` sources: files of records, each record's text field one document
(:class:`RecordFilesSource`)."""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from bytelm.data.remote import ObjectPath, open_binary
from bytelm.data.sources.base import (
    AnyFile,
    AnyRoot,
    Progress,
    Record,
    optional_module,
    split_query,
    text_field,
)
from bytelm.data.sources.files import FilesBase, FilesSource, count_files, relative_name
from bytelm.errors import UserError


class RecordFilesSource(FilesBase):
    """Files of records, each record's text field one document: ``jsonl:`` (one JSON object per
    line; ``.gz`` and ``.zst`` read compressed, by extension) and ``parquet:``. A file, a directory
    or a glob, as ``files:``; document ``k`` of file ``REL`` is named ``REL#k``, its group ``REL``."""

    KINDS = {"jsonl": (".jsonl", ".json", ".ndjson"), "parquet": (".parquet",)}
    COMPRESSED = (".gz", ".zst")

    def __init__(self, spec: str, kind: str, pattern: str, field: str) -> None:
        self.spec, self.kind, self.field = spec, kind, field
        self.files_source = FilesSource(spec, pattern, "file")

    @classmethod
    def from_spec(cls, spec: str, kind: str) -> RecordFilesSource:
        pattern, params = split_query(spec, spec[len(kind) + 1 :])
        if not pattern:
            raise UserError(f"data spec {spec!r} names no path: use {kind}:PATH (a file, directory or glob)")
        field = params.pop("field", "text")
        if params:
            raise UserError(
                f"unknown option(s) {sorted(params)} in data spec {spec!r}: only 'field' is valid for {kind}:"
            )
        return cls(spec, kind, os.path.expanduser(pattern), field)

    def _root_and_files(self) -> tuple[AnyRoot, Iterable[AnyFile]]:
        root, files = self.files_source._root_and_files()
        suffixes = self.KINDS[self.kind]
        for p in files:
            name = p.name.lower()
            for c in self.COMPRESSED if self.kind == "jsonl" else ():
                name = name.removesuffix(c)
            if not name.endswith(suffixes):
                raise UserError(
                    f"{p} (data spec {self.spec!r}) is not a {self.kind} file (expected {', '.join(suffixes)}"
                    f"{' optionally + .gz/.zst' if self.kind == 'jsonl' else ''}); give a path or glob of "
                    f"{self.kind} files only"
                )
        return root, files

    def signature(self) -> str:
        return f"{self.kind}:{self.field}:{self.files_source.signature()}"

    def _records(
        self, root: AnyRoot, files: Iterable[AnyFile], progress: Progress | None
    ) -> Iterator[Record]:
        for i, p in enumerate(files):
            rel = relative_name(p, root)
            texts = self._jsonl(p) if self.kind == "jsonl" else self._parquet(p)
            for k, text in enumerate(texts):
                yield f"{rel}#{k}", rel, (text,)
            if progress:
                progress(i + 1, count_files(files))

    def _open(self, path: Path):
        name = path.name.lower()
        if name.endswith(".gz"):
            return gzip.GzipFile(fileobj=open_binary(path, self.spec), mode="rb")
        if name.endswith(".zst"):
            zstd = optional_module("zstandard", self.spec)
            raw = open_binary(path, self.spec)
            return io.BufferedReader(zstd.ZstdDecompressor().stream_reader(raw, closefd=True))
        return open_binary(path, self.spec)

    def _jsonl(self, path: Path) -> Iterator[bytes]:
        n = 0
        try:
            with self._open(path) as f:
                for n, line in enumerate(f, 1):  # noqa: B007  (n: the line an error names)
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError as e:
                        raise UserError(
                            f"{path} line {n} is not JSON ({e}); the file is damaged or not JSON Lines "
                            f"(data spec {self.spec!r})"
                        ) from None
                    if not isinstance(record, dict) or self.field not in record:
                        fields = sorted(record)[:12] if isinstance(record, dict) else type(record).__name__
                        raise UserError(
                            f"{path} line {n} has no field {self.field!r} (it has: {fields}); name the text "
                            "field with ?field=NAME in the data spec"
                        )
                    yield text_field(record[self.field], f"{path} line {n}", self.field)
        except UserError:
            raise
        except OSError as e:
            raise UserError(
                f"cannot read {path} after line {n} (from data spec {self.spec!r}): {e.strerror or e}; the "
                "file is corrupt or truncated: fix or remove it"
            ) from None
        except (EOFError, zlib.error) as e:
            raise UserError(
                f"cannot read {path} after line {n}: {e}; the compressed file is corrupt or truncated: fix "
                "or remove it"
            ) from None
        except Exception as e:  # zstandard.ZstdError (the module is optional)
            if type(e).__name__ != "ZstdError":
                raise
            raise UserError(
                f"cannot read {path} after line {n}: {e}; the compressed file is corrupt or truncated: fix "
                "or remove it"
            ) from None

    def _parquet(self, path: Path) -> Iterator[bytes]:
        pq = optional_module("pyarrow.parquet", self.spec)
        try:
            table = pq.ParquetFile(open_binary(path, self.spec) if isinstance(path, ObjectPath) else path)
        except Exception as e:  # (pyarrow's errors: ArrowInvalid, OSError)
            raise UserError(
                f"cannot read {path} as parquet: {e}; the file is corrupt or not parquet"
            ) from None
        names = table.schema_arrow.names
        if self.field not in names:
            raise UserError(
                f"{path} has no column {self.field!r} (it has: {names[:12]}); name the text column with "
                "?field=NAME in the data spec"
            )
        try:
            for batch in table.iter_batches(columns=[self.field], batch_size=4096):
                for value in batch.column(0).to_pylist():
                    yield text_field(value, str(path), self.field)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"cannot read {path} as parquet: {e}; the file is corrupt or truncated") from None
