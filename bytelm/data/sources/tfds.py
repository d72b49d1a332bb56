"""``tfds:`` sources: a tensorflow-datasets dataset already prepared as array_record
(:class:`TfdsSource`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from bytelm.data.sources.base import Document, Progress, Source, split_query, stat_signature
from bytelm.errors import UserError


class TfdsSource(Source):
    def __init__(self, spec: str, name: str, split: str, field: str, data_dir: str | None) -> None:
        self.spec = spec
        self.name = name
        self.split = split
        self.field = field
        self.data_dir = data_dir

    @classmethod
    def from_spec(cls, spec: str) -> TfdsSource:
        body, params = split_query(spec, spec[len("tfds:") :])
        name, _, split = body.partition(":")
        if not name:
            raise UserError(f"data spec {spec!r} names no dataset: use tfds:NAME[/CONFIG][:SPLIT]")
        field = params.pop("field", "text")
        data_dir = params.pop("data_dir", None)
        if params:
            raise UserError(
                f"unknown option(s) {sorted(params)} in data spec {spec!r}: valid options are field and "
                "data_dir"
            )
        return cls(spec, name, split or "train", field, os.path.expanduser(data_dir) if data_dir else None)

    def _data_source(self):
        try:
            import tensorflow_datasets as tfds  # noqa: PLC0415  (optional extra)
        except ImportError:
            raise UserError(
                f"data spec {self.spec!r} needs tensorflow-datasets, which is not installed: "
                "pip install 'bytelm[tfds]'"
            ) from None
        try:
            return tfds.data_source(self.name, split=self.split, data_dir=self.data_dir, download=False)
        except Exception as e:  # tfds raises many types for "not prepared"/"unknown name"
            where = f" in {self.data_dir}" if self.data_dir else ""
            raise UserError(
                f"cannot open tfds dataset {self.name!r} split {self.split!r}{where} (data spec "
                f"{self.spec!r}): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; it must be "
                "prepared locally as array_record (builder.download_and_prepare(file_format='array_record')) "
                "since nothing is downloaded"
            ) from None

    def signature(self) -> str:
        ds = self._data_source()
        files: list[Path] = []
        if self.data_dir:
            files = sorted(p for p in Path(self.data_dir).rglob("*") if p.is_file())
        return f"{self.name}:{self.split}:{self.field}:{len(ds)}:{stat_signature(files)}"

    def documents(self, progress: Progress | None = None) -> Iterator[Document]:
        ds = self._data_source()
        n = len(ds)
        for i in range(n):
            record = ds[i]
            if self.field not in record:
                raise UserError(
                    f"tfds dataset {self.name!r} has no field {self.field!r} (fields: {sorted(record)}); "
                    f"set it with ?field=NAME in the data spec"
                )
            value = record[self.field]
            if isinstance(value, str):
                value = value.encode("utf-8")
            elif not isinstance(value, bytes):
                value = bytes(getattr(value, "item", lambda: value)())
            yield Document(f"{self.split}/{i}", self.split, value)
            if progress:
                progress(i + 1, n)
