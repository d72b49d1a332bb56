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
``tfds:NAME[/CONFIG][:SPLIT][?field=text&data_dir=DIR]``
    A tensorflow-datasets dataset already prepared as array_record, read with
    ``tfds.data_source`` (no TensorFlow needed, nothing downloaded). Group: the split.

Documents are raw bytes: nothing is decoded, normalised or stripped.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import re
import sys
import sysconfig
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

from bytelm.errors import UserError

Progress = Callable[[int, int], None]

_SPLIT_MODES = ("file", "paragraph", "line")
_PARAGRAPH_BREAK = re.compile(rb"(?:\r?\n){2,}")


@dataclasses.dataclass(frozen=True)
class Document:
    """One document: a stable ``name`` (its identity for the split), a ``group``, its bytes."""

    name: str
    group: str
    data: bytes


class Source:
    """A parsed spec. ``signature()`` changes whenever the underlying data may have changed."""

    spec: str

    def signature(self) -> str:
        raise NotImplementedError

    def documents(self, progress: Progress | None = None) -> Iterator[Document]:
        raise NotImplementedError

    def describe(self) -> str:
        return self.spec


def parse_source(spec: str) -> Source:
    """Parse a source spec (``stdlib``, ``files:...``, ``tfds:...``) or raise ``UserError``."""
    spec = spec.strip()
    if spec == "stdlib":
        return StdlibSource()
    if spec.startswith("files:"):
        return FilesSource.from_spec(spec)
    if spec.startswith("tfds:"):
        return TfdsSource.from_spec(spec)
    raise UserError(
        f"unknown data source {spec!r}: use 'stdlib', 'files:PATH[?split=paragraph|line]' or "
        "'tfds:NAME[/CONFIG][:SPLIT][?field=text&data_dir=DIR]'"
    )


def _split_query(spec: str, body: str) -> tuple[str, dict[str, str]]:
    path, _, query = body.partition("?")
    params: dict[str, str] = {}
    if query:
        for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            params[key] = value
        if not params:
            raise UserError(f"cannot parse the options {query!r} in data spec {spec!r}: use KEY=VALUE&...")
    return path, params


def _stat_signature(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        try:
            st = p.stat()
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{p}\0?\n".encode())
    return h.hexdigest()


def _read_file(path: Path, spec: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise UserError(
            f"cannot read {path} (from data spec {spec!r}): {e.strerror or e}; "
            "fix its permissions or remove it from the corpus"
        ) from None


class StdlibSource(Source):
    spec = "stdlib"

    def __init__(self) -> None:
        self.root = Path(sysconfig.get_paths()["stdlib"])

    def files(self) -> list[Path]:
        found = [
            p
            for p in self.root.rglob("*.py")
            if "site-packages" not in p.relative_to(self.root).parts and p.is_file()
        ]
        return sorted(found, key=lambda p: p.relative_to(self.root).as_posix())

    def signature(self) -> str:
        return f"python-{sys.version.split()[0]}:{self.root}:{_stat_signature(self.files())}"

    def describe(self) -> str:
        return f"stdlib (Python {sys.version.split()[0]}, {self.root})"

    def documents(self, progress: Progress | None = None) -> Iterator[Document]:
        files = self.files()
        for i, p in enumerate(files):
            rel = p.relative_to(self.root).as_posix()
            group = rel.split("/", 1)[0] if "/" in rel else "<top>"
            yield Document(rel, group, _read_file(p, self.spec))
            if progress:
                progress(i + 1, len(files))


class FilesSource(Source):
    def __init__(self, spec: str, pattern: str, split: str) -> None:
        self.spec = spec
        self.pattern = pattern
        self.split = split

    @classmethod
    def from_spec(cls, spec: str) -> FilesSource:
        pattern, params = _split_query(spec, spec[len("files:") :])
        if not pattern:
            raise UserError(f"data spec {spec!r} names no path: use files:PATH (a file, directory or glob)")
        split = params.pop("split", "file")
        if params:
            raise UserError(
                f"unknown option(s) {sorted(params)} in data spec {spec!r}: only 'split' is valid for files:"
            )
        if split not in _SPLIT_MODES:
            raise UserError(f"split={split!r} in data spec {spec!r} is not one of {', '.join(_SPLIT_MODES)}")
        return cls(spec, os.path.expanduser(pattern), split)

    def _root_and_files(self) -> tuple[Path, list[Path]]:
        if glob.has_magic(self.pattern):
            matches = sorted(Path(m) for m in glob.glob(self.pattern, recursive=True))
            files = [m for m in matches if m.is_file() or m.is_symlink()]
            if not files:
                raise UserError(f"the glob {self.pattern!r} (data spec {self.spec!r}) matched no files")
            static = []
            for part in Path(self.pattern).parts:
                if glob.has_magic(part):
                    break
                static.append(part)
            root = Path(*static) if static else Path(".")
            return root, files
        path = Path(self.pattern)
        if path.is_dir():
            files = sorted(
                (
                    p
                    for p in path.rglob("*")
                    if (p.is_file() or p.is_symlink())
                    and not any(part.startswith(".") for part in p.relative_to(path).parts)
                ),
                key=lambda p: p.relative_to(path).as_posix(),
            )
            if not files:
                raise UserError(
                    f"the directory {path} (data spec {self.spec!r}) contains no files: "
                    "point files: at a directory of text files, a file, or a glob"
                )
            return path, files
        if path.is_file():
            return path.parent, [path]
        if path.is_symlink():
            return path.parent, [path]  # a broken link: reported as unreadable when read
        raise UserError(f"no such file or directory: {path} (data spec {self.spec!r}); check the path")

    def signature(self) -> str:
        _, files = self._root_and_files()
        return f"{self.split}:{_stat_signature([f.absolute() for f in files])}"

    def documents(self, progress: Progress | None = None) -> Iterator[Document]:
        root, files = self._root_and_files()
        for i, p in enumerate(files):
            try:
                rel = p.relative_to(root).as_posix()
            except ValueError:
                rel = p.as_posix()
            if rel in ("", "."):
                rel = p.name
            data = _read_file(p, self.spec)
            if self.split == "file":
                yield Document(rel, rel, data)
            else:
                pieces = _PARAGRAPH_BREAK.split(data) if self.split == "paragraph" else data.split(b"\n")
                k = 0
                for piece in pieces:
                    if piece in (b"", b"\r"):
                        continue
                    yield Document(f"{rel}#{k}", rel, piece)
                    k += 1
            if progress:
                progress(i + 1, len(files))


class TfdsSource(Source):
    def __init__(self, spec: str, name: str, split: str, field: str, data_dir: str | None) -> None:
        self.spec = spec
        self.name = name
        self.split = split
        self.field = field
        self.data_dir = data_dir

    @classmethod
    def from_spec(cls, spec: str) -> TfdsSource:
        body, params = _split_query(spec, spec[len("tfds:") :])
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
        return f"{self.name}:{self.split}:{self.field}:{len(ds)}:{_stat_signature(files)}"

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
