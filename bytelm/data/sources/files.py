"""Sources of files: ``stdlib`` (:class:`StdlibSource`) and ``files:`` (:class:`FilesSource`), and
what every source read file by file shares (:class:`FilesBase`: listings walked or globbed, local or
in an object store; files read in pieces; runs of whole files for a parallel build)."""

from __future__ import annotations

import glob
import io
import itertools
import os
import re
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Sized
from pathlib import Path

from bytelm.data.remote import ObjectPath, is_remote, list_objects, open_binary
from bytelm.data.sources.base import AnyFile, AnyRoot, Progress, Record, Source, split_query, stat_signature
from bytelm.errors import UserError

_SPLIT_MODES = ("file", "paragraph", "line")
_PARAGRAPH_BREAK = re.compile(rb"(?:\r?\n){2,}")
READ_CHUNK = 8 << 20  # files are read in pieces of this many bytes (memory bounded by it, not by a file)


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
        return f"python-{sys.version.split()[0]}:{self.root}:{stat_signature(self.files())}"

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
                progress(i + 1, count_files(files))

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

    def absolute(self) -> _LocalFile:
        return self if os.path.isabs(self) else _LocalFile(os.path.join(os.getcwd(), self))

    def stat(self) -> os.stat_result:
        return os.stat(self)

    def is_file(self) -> bool:
        return os.path.isfile(self)

    def is_symlink(self) -> bool:
        return os.path.islink(self)


def relative_name(p: AnyFile, root: AnyRoot) -> str:
    """A file's document name: its path under the source's root (its own name when it is the root)."""
    try:
        rel = p.relative_to(root).as_posix()
    except ValueError:
        rel = p.as_posix()
    return p.name if rel in ("", ".") else rel


class FilesBase(Source):
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


class FilesSource(FilesBase):
    def __init__(self, spec: str, pattern: str, split: str) -> None:
        self.spec = spec
        self.pattern = pattern
        self.split = split

    @classmethod
    def from_spec(cls, spec: str) -> FilesSource:
        pattern, params = split_query(spec, spec[len("files:") :])
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
        return f"{self.split}:{stat_signature(f.absolute() for f in files)}"

    def _records(
        self, root: AnyRoot, files: Iterable[AnyFile], progress: Progress | None
    ) -> Iterator[Record]:
        for i, p in enumerate(files):
            rel = relative_name(p, root)
            if self.split == "file":
                yield rel, rel, _file_chunks(p, self.spec)
            else:
                for k, piece in enumerate(split_pieces(_file_chunks(p, self.spec), self.split)):
                    yield f"{rel}#{k}", rel, (piece,)
            if progress:
                progress(i + 1, count_files(files))


def count_files(files: Iterable[AnyFile]) -> int:
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
