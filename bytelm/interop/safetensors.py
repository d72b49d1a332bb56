"""The safetensors file format, read and written with numpy alone (no torch, no extra package).

A file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON (``name -> {dtype,
shape, data_offsets}``, plus an optional ``__metadata__`` table of strings), then the tensors'
bytes, row-major and little-endian, at their offsets from the end of the header. A model folder
holds one ``model.safetensors`` or several shards listed by ``model.safetensors.index.json``
(``weight_map``: tensor name -> shard file), as Hugging Face ``save_pretrained`` writes them.

Tensors are memory-mapped: a many-gigabyte checkpoint is read one tensor at a time.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import ml_dtypes
import numpy as np

from bytelm.atomic import atomic_file
from bytelm.errors import UserError

DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("bool"),
}
_NAMES = {dt: name for name, dt in DTYPES.items()}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class SafetensorsFolder:
    """The tensors of a model folder (one file or an index of shards), by name."""

    def __init__(self, path: str | os.PathLike):
        path = Path(path)
        files: dict[str | None, Path]
        if path.is_file():
            files = {None: path}
            self._where: dict[str, Path] = {}
        elif (path / INDEX_FILE).is_file():
            try:
                weight_map = json.loads((path / INDEX_FILE).read_text())["weight_map"]
            except (ValueError, KeyError) as e:
                raise UserError(
                    f"{path / INDEX_FILE} is not a safetensors index (no readable 'weight_map': {e})"
                ) from None
            self._where = {name: path / shard for name, shard in weight_map.items()}
            files = {name: where for name, where in self._where.items()}
        elif (path / SINGLE_FILE).is_file():
            files = {None: path / SINGLE_FILE}
            self._where = {}
        else:
            raise UserError(
                f"{path} holds no {SINGLE_FILE} or {INDEX_FILE}: point at a folder written by save_pretrained"
            )
        self._headers: dict[Path, tuple[dict, int]] = {}
        for file in set(files.values()):
            header, start = _read_header(file)
            self._headers[file] = (header, start)
            for name in header:
                if name != "__metadata__":
                    self._where.setdefault(name, file)
        self.path = path

    def names(self) -> list[str]:
        return sorted(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entry(name)["shape"])

    def metadata(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for header, _ in self._headers.values():
            out.update(header.get("__metadata__") or {})
        return out

    def _entry(self, name: str) -> dict:
        if name not in self._where:
            raise UserError(f"{self.path} has no tensor {name!r}")
        header, _ = self._headers[self._where[name]]
        if name not in header:
            raise UserError(f"{self._where[name]} does not hold {name!r}, which {INDEX_FILE} places there")
        return header[name]

    def get(self, name: str) -> np.ndarray:
        """The tensor ``name`` (memory-mapped, read-only) in its stored dtype."""
        entry = self._entry(name)
        file = self._where[name]
        _, start = self._headers[file]
        dtype = DTYPES.get(entry["dtype"])
        if dtype is None:
            raise UserError(
                f"{file}: tensor {name!r} has dtype {entry['dtype']!r}, which bytelm does not read "
                f"({sorted(DTYPES)})"
            )
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if end - begin != dtype.itemsize * int(np.prod(shape, dtype=np.int64)):
            raise UserError(
                f"{file}: tensor {name!r} spans {end - begin} bytes, not the {shape} x {dtype} its header "
                "states"
            )
        if end == begin:
            return np.zeros(shape, dtype)
        return np.memmap(file, dtype=dtype, mode="r", offset=start + begin, shape=shape)


def _read_header(file: Path) -> tuple[dict, int]:
    with open(file, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise UserError(f"{file} is not a safetensors file (shorter than its 8-byte header length)")
        (n,) = struct.unpack("<Q", raw)
        size = file.stat().st_size
        if n > size - 8:
            raise UserError(
                f"{file} is not a safetensors file (header length {n} exceeds the file's {size} bytes)"
            )
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise UserError(f"{file} is not a safetensors file (its header is not JSON: {e})") from None
    return header, 8 + n


def write_safetensors(
    path: str | os.PathLike, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None
) -> None:
    """Write ``tensors`` as one safetensors file (names sorted, header padded to 8 bytes), streamed
    to a temporary sibling and renamed over ``path`` when complete."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    offset = 0
    for name in sorted(tensors):
        a = tensors[name]
        dtype_name = _NAMES.get(np.dtype(a.dtype))
        if dtype_name is None:
            raise ValueError(
                f"tensor {name!r} has dtype {a.dtype}, which safetensors cannot hold here ({sorted(DTYPES)})"
            )
        nbytes = int(np.prod(a.shape, dtype=np.int64)) * np.dtype(a.dtype).itemsize
        header[name] = {
            "dtype": dtype_name,
            "shape": list(a.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path = Path(path)
    with atomic_file(path) as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name in sorted(tensors):
            f.write(
                np.ascontiguousarray(tensors[name])
                .astype(np.dtype(tensors[name].dtype).newbyteorder("<"), copy=False)
                .tobytes()
            )
