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
import gzip
import hashlib
import importlib
import io
import itertools
import json
import os
import re
import sys
import sysconfig
import urllib.parse
import zlib
from collections.abc import Callable, Iterable, Iterator, Sized
from pathlib import Path
from typing import Any

from bytelm.data.remote import ObjectPath, failure, filesystem, is_remote, list_objects, open_binary
from bytelm.errors import UserError

Progress = Callable[[int, int], None]

_SPLIT_MODES = ("file", "paragraph", "line")
_PARAGRAPH_BREAK = re.compile(rb"(?:\r?\n){2,}")
READ_CHUNK = 8 << 20  # files are read in pieces of this many bytes (memory bounded by it, not by a file)
Record = tuple[str, str, Iterable[bytes]]  # (name, group, the document's bytes in pieces)


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


def _split_query(spec: str, body: str) -> tuple[str, dict[str, str]]:
    path, _, query = body.partition("?")
    params: dict[str, str] = {}
    if query:
        for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False):
            params[key] = value
        if not params:
            raise UserError(f"cannot parse the options {query!r} in data spec {spec!r}: use KEY=VALUE&...")
    return path, params


def _stat_signature(paths: Iterable[AnyFile]) -> str:
    h = hashlib.sha256()
    for p in paths:
        try:
            st = p.stat()
            h.update(f"{p}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
        except OSError:
            h.update(f"{p}\0?\n".encode())
    return h.hexdigest()


def _read_file(path: Path, spec: str) -> bytes:
    return b"".join(_file_chunks(path, spec))


def _file_chunks(path: Path, spec: str, size: int = READ_CHUNK) -> Iterator[bytes]:
    """The bytes of ``path`` in pieces of at most ``size`` (at least one piece, maybe empty)."""
    try:
        with open_binary(path, spec) as f:
            # read no more than the file holds (plus one byte, to see its end): a read of ``size``
            # allocates ``size`` whatever it returns, a cost per file of a corpus of small files
            try:
                left: int | None = os.fstat(f.fileno()).st_size
            except (OSError, AttributeError, io.UnsupportedOperation):
                left = None
            first = True
            while True:
                want = size if left is None else max(1, min(size, left + 1))
                chunk = f.read(want)
                if chunk or first:
                    yield chunk
                first = False
                if len(chunk) < want:
                    return
                if left is not None:
                    left = max(0, left - len(chunk))
    except UserError:
        raise
    except OSError as e:
        raise UserError(
            f"cannot read {path} (from data spec {spec!r}): {e.strerror or e}; "
            "fix its permissions or remove it from the corpus"
        ) from None
    except Exception as e:  # (an object store's errors)
        if not isinstance(path, ObjectPath):
            raise
        raise UserError(f"cannot read {path} (from data spec {spec!r}): {type(e).__name__}: {e}") from None


def split_pieces(chunks: Iterable[bytes], mode: str) -> Iterator[bytes]:
    """The non-empty pieces of the concatenated ``chunks`` cut at ``\n`` (``mode="line"``) or at runs
    of blank lines (``"paragraph"``), exactly as cutting the whole would give them (a piece that is
    only ``\r`` is dropped too), holding only one chunk and one piece in memory."""
    carry = b""
    for chunk in chunks:
        buffer = carry + chunk
        if mode == "line":
            *done, carry = buffer.split(b"\n")
        else:
            last = None
            for last in _PARAGRAPH_BREAK.finditer(buffer):
                pass
            if last is None:
                carry = buffer
                continue
            done = _PARAGRAPH_BREAK.split(buffer[: last.start()])
            # a break that reaches the end of the buffer may go on in the next chunk
            carry = buffer[last.start() :] if last.end() == len(buffer) else buffer[last.end() :]
        yield from (p for p in done if p not in (b"", b"\r"))
    tail = carry.split(b"\n") if mode == "line" else _PARAGRAPH_BREAK.split(carry)
    yield from (p for p in tail if p not in (b"", b"\r"))


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

    def records(self, progress: Progress | None = None) -> Iterator[Record]:
        return self._records(self.root, self.files(), progress)

    def _records(
        self, root: AnyRoot, files: Iterable[AnyFile], progress: Progress | None
    ) -> Iterator[Record]:
        for i, p in enumerate(files):
            rel = p.relative_to(self.root).as_posix()
            group = rel.split("/", 1)[0] if "/" in rel else "<top>"
            yield rel, group, _file_chunks(p, self.spec)
            if progress:
                progress(i + 1, _count(files))

    def partitions(self, n: int) -> list[Source]:
        return [_FileRun(self, self.root, run) for run in _file_runs(self.files(), n)]


def _file_runs(files: Iterable[AnyFile], n: int) -> list[Iterable[AnyFile]]:
    """``files`` cut into at most ``n`` runs of about equal total size, in order: two passes over
    the listing (the sizes, then where to cut), so a listing that is walked, not held, stays so."""
    if n <= 1:
        return [files]
    total, count = 0, 0
    for p in files:
        total += _size(p)
        count += 1
    if count <= 1:
        return [files]
    targets = [total * k / n for k in range(1, n)]
    bounds, acc, t = [0], 0, 0
    for i, p in enumerate(files):
        acc += _size(p)
        while t < len(targets) and acc >= targets[t]:
            if 0 < i + 1 < count and bounds[-1] != i + 1:
                bounds.append(i + 1)
            t += 1
    bounds.append(count)
    return [_Slice(files, a, b) for a, b in zip(bounds[:-1], bounds[1:])]


class _Slice:
    """Files ``[a, b)`` of a listing, listed again when iterated (what a worker of a parallel build
    reads: its share of the files, without the whole listing in memory)."""

    def __init__(self, files: Iterable[AnyFile], a: int, b: int) -> None:
        self.files, self.a, self.b = files, a, b

    def __len__(self) -> int:
        return self.b - self.a

    def __iter__(self) -> Iterator[AnyFile]:
        return itertools.islice(iter(self.files), self.a, self.b)


class _Walk:
    """The files (and links) under a directory, recursively, in the order of their paths relative
    to it, walked afresh each time it is iterated (memory: one directory's entries per level, not
    the listing); names starting with ``.`` (files or directories) are skipped."""

    def __init__(self, top: str) -> None:
        self.top = top

    def __iter__(self) -> Iterator[_LocalFile]:
        return self._dir(self.top)

    def _dir(self, d: str) -> Iterator[_LocalFile]:
        try:
            with os.scandir(d) as it:
                entries = []
                for e in it:
                    if e.name.startswith("."):
                        continue
                    is_link = e.is_symlink()
                    is_dir = not is_link and e.is_dir()
                    if is_dir or is_link or e.is_file():
                        # (a directory's key ends in "/": everything under it sorts as its paths do)
                        entries.append((e.name + "/" if is_dir else e.name, e.path, is_dir))
        except PermissionError:  # (an unreadable directory is skipped, as pathlib's rglob does)
            return
        entries.sort()
        for _, path, is_dir in entries:
            if is_dir:
                yield from self._dir(path)
            else:
                yield _LocalFile(path)


class _LocalFile(str):
    """A local file's path as a plain string (a tenth of a :class:`Path`'s memory: a corpus of millions
    of files is listed in memory), with the few ``Path`` methods the sources use."""

    __slots__ = ()

    @property
    def name(self) -> str:
        return os.path.basename(self)

    def relative_to(self, root) -> Path:
        return Path(self).relative_to(root)

    def as_posix(self) -> str:
        return str(self)

    def absolute(self) -> str:
        return self if os.path.isabs(self) else os.path.join(os.getcwd(), self)

    def stat(self) -> os.stat_result:
        return os.stat(self)

    def is_file(self) -> bool:
        return os.path.isfile(self)

    def is_symlink(self) -> bool:
        return os.path.islink(self)


# what a source of files lists: a Path, a _LocalFile or an ObjectPath (the same few Path methods)
AnyFile = Any
AnyRoot = Any


def _relative_name(p: AnyFile, root: AnyRoot) -> str:
    """A file's document name: its path under the source's root (its own name when it is the root)."""
    try:
        rel = p.relative_to(root).as_posix()
    except ValueError:
        rel = p.as_posix()
    return p.name if rel in ("", ".") else rel


class _FilesBase(Source):
    """A source read file by file (``_root_and_files`` lists them, ``_records`` reads a listing);
    a parallel build reads runs of whole files of about equal size, in order."""

    distinct_groups = True  # (a group is a file; each file is listed once)

    def _root_and_files(self) -> tuple[AnyRoot, Iterable[AnyFile]]:
        raise NotImplementedError

    def _records(
        self, root: AnyRoot, files: Iterable[AnyFile], progress: Progress | None
    ) -> Iterator[Record]:
        raise NotImplementedError

    def partitions(self, n: int) -> list[Source]:
        root, files = self._root_and_files()
        return [_FileRun(self, root, run) for run in _file_runs(files, n)]

    def records(self, progress: Progress | None = None) -> Iterator[Record]:
        root, files = self._root_and_files()
        return self._records(root, files, progress)


class FilesSource(_FilesBase):
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

    def _root_and_files(self) -> tuple[AnyRoot, Iterable[AnyFile]]:
        if is_remote(self.pattern):  # (ObjectPaths: the part of Path the sources use)
            return list_objects(self.pattern, self.spec)
        if glob.has_magic(self.pattern):
            # (sorted as paths are: by their parts, i.e. "/" below every other character)
            matches = sorted(
                (_LocalFile(str(Path(m))) for m in glob.glob(self.pattern, recursive=True)),
                key=lambda m: m.replace("/", "\0"),
            )
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
            walk = _Walk(str(path))
            if next(iter(walk), None) is None:
                raise UserError(
                    f"the directory {path} (data spec {self.spec!r}) contains no files: "
                    "point files: at a directory of text files, a file, or a glob"
                )
            return path, walk
        if path.is_file():
            return path.parent, [_LocalFile(str(path))]
        if path.is_symlink():
            return path.parent, [_LocalFile(str(path))]  # a broken link: reported as unreadable when read
        raise UserError(f"no such file or directory: {path} (data spec {self.spec!r}); check the path")

    def signature(self) -> str:
        _, files = self._root_and_files()
        return f"{self.split}:{_stat_signature(f.absolute() for f in files)}"

    def _records(
        self, root: AnyRoot, files: Iterable[AnyFile], progress: Progress | None
    ) -> Iterator[Record]:
        for i, p in enumerate(files):
            rel = _relative_name(p, root)
            if self.split == "file":
                yield rel, rel, _file_chunks(p, self.spec)
            else:
                for k, piece in enumerate(split_pieces(_file_chunks(p, self.spec), self.split)):
                    yield f"{rel}#{k}", rel, (piece,)
            if progress:
                progress(i + 1, _count(files))


def _count(files: Iterable[AnyFile]) -> int:
    """The number of files of a listing that knows it; 0 (unknown) for a walk."""
    return len(files) if isinstance(files, Sized) else 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class _FileRun(Source):
    """A run of the files of a source of files (one partition of a parallel build)."""

    def __init__(self, parent, root: AnyRoot, files: Iterable[AnyFile]) -> None:
        self.spec, self.parent, self.root, self.files = parent.spec, parent, root, files
        self.distinct_groups = parent.distinct_groups

    def records(self, progress: Progress | None = None) -> Iterator[Record]:
        return self.parent._records(self.root, self.files, progress)


def _text(value, where: str, field: str) -> bytes:
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


def _optional(module: str, spec: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(
            f"data spec {spec!r} needs {module.split('.')[0]}, which is not installed: pip install "
            "'bytelm[formats]'"
        ) from None


class RecordFilesSource(_FilesBase):
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
        pattern, params = _split_query(spec, spec[len(kind) + 1 :])
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
            rel = _relative_name(p, root)
            texts = self._jsonl(p) if self.kind == "jsonl" else self._parquet(p)
            for k, text in enumerate(texts):
                yield f"{rel}#{k}", rel, (text,)
            if progress:
                progress(i + 1, _count(files))

    def _open(self, path: Path):
        name = path.name.lower()
        if name.endswith(".gz"):
            return gzip.GzipFile(fileobj=open_binary(path, self.spec), mode="rb")
        if name.endswith(".zst"):
            zstd = _optional("zstandard", self.spec)
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
                    yield _text(record[self.field], f"{path} line {n}", self.field)
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
        pq = _optional("pyarrow.parquet", self.spec)
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
                    yield _text(value, str(path), self.field)
        except UserError:
            raise
        except Exception as e:
            raise UserError(f"cannot read {path} as parquet: {e}; the file is corrupt or truncated") from None


class HfDiskSource(Source):
    """A Hugging Face ``datasets`` dataset written by ``save_to_disk`` (Arrow stream files), read
    with pyarrow (``datasets`` itself is not needed): ``hf:DIR[?split=train&field=text]``; a
    ``DatasetDict`` directory needs ``split``. Record ``i`` is named ``SPLIT/i``, its group ``SPLIT``."""

    distinct_groups = True  # (one group)

    def __init__(self, spec: str, path: Path | str, split: str, field: str) -> None:
        self.spec, self.path, self.split, self.field = spec, path, split, field

    @classmethod
    def from_spec(cls, spec: str) -> HfDiskSource:
        path, params = _split_query(spec, spec[len("hf:") :])
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
        return f"hf:{self.split}:{self.field}:{_stat_signature([p.absolute() for p in self._files()])}"

    def records(self, progress: Progress | None = None) -> Iterator[Record]:
        pa = _optional("pyarrow", self.spec)
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
                            yield f"{self.split}/{i}", self.split, (_text(value, str(path), self.field),)
                            i += 1
            except UserError:
                raise
            except Exception as e:
                raise UserError(
                    f"cannot read {path} as an Arrow stream: {e}; the file is corrupt or truncated"
                ) from None
            if progress:
                progress(n + 1, len(files))


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
