"""Sources in an object store: ``gs://BUCKET/PATH`` (and any other fsspec URL) wherever a data spec
takes a path (``files:``, ``jsonl:``, ``parquet:``), read through fsspec (``gcsfs`` for ``gs://``:
``pip install -e '.[gcs]'``).

:class:`ObjectPath` is the part of :class:`pathlib.Path` the sources use (a name, a path relative to
a root, a size and a version for the cache key, a binary stream), so a source reads a bucket as it
reads a directory: the same files in the same order give the same documents, names and split. A
test runs this against a local GCS emulator (``STORAGE_EMULATOR_HOST``, which gcsfs honours).
"""

from __future__ import annotations

import glob
import posixpath
import types
from pathlib import PurePosixPath

from bytelm.errors import UserError

READ_BLOCK = 8 << 20  # bytes per ranged read of an object


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def filesystem(url: str, spec: str):
    try:
        import fsspec
    except ImportError:  # pragma: no cover (fsspec comes with the package's dependencies)
        raise UserError(f"data spec {spec!r} names {url}: reading URLs needs fsspec") from None
    try:
        return fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        protocol = url.split("://", 1)[0]
        hint = (
            "pip install -e '.[gcs]' (gcsfs)"
            if protocol in ("gs", "gcs")
            else f"the fsspec driver for {protocol}://"
        )
        raise UserError(f"cannot read {url} (data spec {spec!r}): {e}; install {hint}") from None


def failure(url: str, spec: str, e: BaseException) -> UserError:
    return UserError(
        f"cannot reach {url} (data spec {spec!r}): {type(e).__name__}: {e}; check the bucket name and the "
        "credentials (gcloud auth application-default login, or GOOGLE_APPLICATION_CREDENTIALS), or "
        "STORAGE_EMULATOR_HOST for an emulator"
    )


class ObjectPath:
    """One object of a bucket, as the sources use a :class:`pathlib.Path`."""

    def __init__(self, fs, path: str, protocol: str, info: dict | None = None) -> None:
        self.fs, self.path, self.protocol, self.info = fs, path.rstrip("/"), protocol, info or {}

    def __str__(self) -> str:
        return f"{self.protocol}://{self.path}"

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, ObjectPath) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def __lt__(self, other: ObjectPath) -> bool:
        return PurePosixPath(self.path) < PurePosixPath(other.path)

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)

    def relative_to(self, root: ObjectPath) -> PurePosixPath:
        return PurePosixPath(self.path).relative_to(root.path)

    def as_posix(self) -> str:
        return str(self)

    def absolute(self) -> ObjectPath:
        return self

    def is_file(self) -> bool:
        return True

    def is_symlink(self) -> bool:
        return False

    def stat(self):
        """The object's size, and its version (generation or etag) where a file has its mtime."""
        info = self.info or self.fs.info(self.path)
        version = info.get("generation") or info.get("etag") or info.get("mtime") or info.get("updated")
        return types.SimpleNamespace(st_size=int(info.get("size") or 0), st_mtime_ns=str(version))

    def open(self, mode: str = "rb"):
        return self.fs.open(self.path, mode, block_size=READ_BLOCK)


def list_objects(pattern: str, spec: str) -> tuple[ObjectPath, list[ObjectPath]]:
    """The root and the objects (sorted as a directory's files are) that a URL, a URL prefix
    ("directory", recursive; names starting with ``.`` skipped) or a URL glob names."""
    fs, path = filesystem(pattern, spec)
    protocol = pattern.split("://", 1)[0]
    try:
        if glob.has_magic(path):
            found = fs.glob(path, detail=True)
            static = []
            for part in path.split("/"):
                if glob.has_magic(part):
                    break
                static.append(part)
            root = "/".join(static)
            files = [
                ObjectPath(fs, p, protocol, info)
                for p, info in found.items()
                if info.get("type") != "directory"
            ]
            if not files:
                raise UserError(f"the glob {pattern!r} (data spec {spec!r}) matched no objects")
            return ObjectPath(fs, root, protocol), sorted(files)
        # (info raises for an unreachable store; isdir/isfile would answer False, i.e. "no such object")
        try:
            kind = fs.info(path).get("type")
        except FileNotFoundError:
            kind = None
        if kind == "directory":
            found = fs.find(path, detail=True)
            named: list[tuple[str, ObjectPath]] = []
            for p, info in found.items():
                rel = PurePosixPath(p).relative_to(path.rstrip("/"))
                if info.get("type") == "directory" or any(part.startswith(".") for part in rel.parts):
                    continue
                named.append((rel.as_posix(), ObjectPath(fs, p, protocol, info)))
            if not named:
                raise UserError(
                    f"{pattern} (data spec {spec!r}) holds no objects: point it at a prefix of text files"
                )
            return ObjectPath(fs, path, protocol), [f for _, f in sorted(named, key=lambda kv: kv[0])]
        if kind is not None:
            return ObjectPath(fs, posixpath.dirname(path), protocol), [
                ObjectPath(fs, path, protocol, fs.info(path))
            ]
    except UserError:
        raise
    except Exception as e:  # (the store's own errors: connection, permission, bad bucket name)
        raise failure(pattern, spec, e) from None
    raise UserError(f"no such object or prefix: {pattern} (data spec {spec!r}); check the URL")


def open_binary(path, spec: str):
    """A binary stream of a local path or an :class:`ObjectPath`."""
    if isinstance(path, ObjectPath):
        try:
            return path.open("rb")
        except Exception as e:
            raise failure(str(path), spec, e) from None
    return open(path, "rb")
