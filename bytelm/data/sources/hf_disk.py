"""``hf:`` sources: a Hugging Face ``datasets`` dataset written by ``save_to_disk``, on disk or in an
object store (:class:`HfDiskSource`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bytelm.data.remote import ObjectPath, failure, filesystem, is_remote, open_binary
from bytelm.data.sources.base import (
    Progress,
    Record,
    Source,
    optional_module,
    split_query,
    stat_signature,
    text_field,
)
from bytelm.errors import UserError


class HfDiskSource(Source):
    """A Hugging Face ``datasets`` dataset written by ``save_to_disk`` (Arrow stream files), read
    with pyarrow (``datasets`` itself is not needed): ``hf:DIR[?split=train&field=text]``; a
    ``DatasetDict`` directory needs ``split``. Record ``i`` is named ``SPLIT/i``, its group ``SPLIT``."""

    distinct_groups = True  # (one group)

    def __init__(self, spec: str, path: Path | str, split: str, field: str) -> None:
        self.spec, self.path, self.split, self.field = spec, path, split, field

    @classmethod
    def from_spec(cls, spec: str) -> HfDiskSource:
        path, params = split_query(spec, spec[len("hf:") :])
        if not path:
            raise UserError(f"data spec {spec!r} names no directory: use hf:DIR (written by save_to_disk)")
        split, field = params.pop("split", "train"), params.pop("field", "text")
        if params:
            raise UserError(
                f"unknown option(s) {sorted(params)} in data spec {spec!r}: valid are split and field"
            )
        if is_remote(path):
            return cls(spec, path, split, field)  # (a URL: see _remote_files)
        return cls(spec, Path(os.path.expanduser(path)), split, field)

    def _remote_files(self) -> list[ObjectPath]:
        """The Arrow files of a save_to_disk directory in a bucket (the layout of :meth:`_files`)."""
        url = str(self.path)
        fs, base = filesystem(url, self.spec)
        protocol, base = url.split("://", 1)[0], base.rstrip("/")
        try:
            if fs.exists(f"{base}/dataset_dict.json"):
                splits = json.loads(fs.cat(f"{base}/dataset_dict.json")).get("splits", [])
                if self.split not in splits:
                    raise UserError(
                        f"{url} has no split {self.split!r} (it has: {splits}); choose one with ?split=NAME"
                    )
                base = f"{base}/{self.split}"
            try:
                state = json.loads(fs.cat(f"{base}/state.json"))
            except FileNotFoundError:
                raise UserError(
                    f"no save_to_disk directory at {url} ({protocol}://{base}/state.json is missing; data "
                    f"spec {self.spec!r}): check the URL"
                ) from None
            names = [f"{base}/{f['filename']}" for f in state["_data_files"]]
            return [ObjectPath(fs, name, protocol, fs.info(name)) for name in names]
        except UserError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise UserError(
                f"{protocol}://{base}/state.json cannot be read as a save_to_disk record "
                f"({type(e).__name__}: {e}); {url} is not a datasets directory written by save_to_disk"
            ) from None
        except Exception as e:  # (the store's errors)
            raise failure(url, self.spec, e) from None

    def _files(self) -> list[Any]:
        if is_remote(str(self.path)):
            return self._remote_files()
        d = Path(self.path)
        if not d.is_dir():
            raise UserError(
                f"no such directory: {d} (data spec {self.spec!r}); give a save_to_disk directory"
            )
        if (d / "dataset_dict.json").is_file():
            splits = json.loads((d / "dataset_dict.json").read_text()).get("splits", [])
            if self.split not in splits:
                raise UserError(
                    f"{d} has no split {self.split!r} (it has: {splits}); choose one with ?split=NAME"
                )
            d = d / self.split
        state = d / "state.json"
        try:
            files = [d / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(
                f"{state} cannot be read as a save_to_disk record ({type(e).__name__}: {e}); {self.path} is "
                "not a datasets directory written by save_to_disk"
            ) from None
        return files

    def signature(self) -> str:
        return f"hf:{self.split}:{self.field}:{stat_signature([p.absolute() for p in self._files()])}"

    def records(self, progress: Progress | None = None) -> Iterator[Record]:
        pa = optional_module("pyarrow", self.spec)
        files, i = self._files(), 0
        for n, path in enumerate(files):
            try:
                opened = (
                    open_binary(path, self.spec) if isinstance(path, ObjectPath) else pa.memory_map(str(path))
                )
                with opened as src:
                    reader = pa.ipc.open_stream(src)
                    if self.field not in reader.schema.names:
                        raise UserError(
                            f"{path} has no column {self.field!r} (it has: {reader.schema.names[:12]}); name "
                            "the text column with ?field=NAME in the data spec"
                        )
                    for batch in reader:
                        for value in batch.column(self.field).to_pylist():
                            yield f"{self.split}/{i}", self.split, (text_field(value, str(path), self.field),)
                            i += 1
            except UserError:
                raise
            except Exception as e:
                raise UserError(
                    f"cannot read {path} as an Arrow stream: {e}; the file is corrupt or truncated"
                ) from None
            if progress:
                progress(n + 1, len(files))
