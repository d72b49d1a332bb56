"""Preparing a corpus: its source's documents streamed into the directory :mod:`bytelm.data.corpus`
describes and reads, by one process, or by several (:func:`build_corpus` with ``workers > 1``: one
part per partition of the source, then joined by :func:`_merge`; the result is the same whatever
their number). Memory stays bounded by a read chunk and the longest document piece, whatever the
corpus's size.
"""

from __future__ import annotations

import array
import concurrent.futures
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import BinaryIO

import numpy as np

from bytelm.data.sources import Progress
from bytelm.data.split import is_heldout, is_validation
from bytelm.errors import UserError

CACHE_VERSION = 2
SHARD_BYTES = 256 << 20  # (below 2 GiB: a position inside a shard fits int32)
FLAG_HELDOUT, FLAG_VALIDATION = 1, 2  # a document's flags.u8 (neither: it trains)


def _flag(name: str, split_seed: int, heldout_fraction: float, validation_fraction: float) -> int:
    """A document's ``flags.u8`` value: held out, else validation, else 0 (it trains)."""
    if is_heldout(name, split_seed, heldout_fraction):
        return FLAG_HELDOUT
    return FLAG_VALIDATION if is_validation(name, split_seed, validation_fraction) else 0


class _Builder:
    """Streams documents into a corpus directory (the files :mod:`bytelm.data.corpus` describes),
    holding one piece of a document and a few fixed-size buffers in memory."""

    FLUSH = 1 << 16  # documents per write of the per-document arrays

    def __init__(self, out: Path, shard_bytes: int = SHARD_BYTES, *, distinct_groups: bool = False):
        """``distinct_groups``: the source promises that a group never comes back after another (a
        source of files: a group is a file), so no table of the groups seen is kept and the group
        names are written as they come: memory stays flat in the number of files too."""
        self.out, self.shard_bytes, self.distinct = out, shard_bytes, distinct_groups
        self.groups_file = open(out / "groups.json", "w", encoding="utf-8")
        self.groups_file.write("[")
        self.n_groups = 0
        self.files = {
            name: open(out / name, "wb")
            for name in ("offsets.i64", "flags.u8", "group.u32", "train.i64", "vstart.i64", "runs.i64")
        }
        self.names_file = open(out / "names.jsonl", "w", encoding="utf-8")
        self.buffers = {
            "offsets.i64": array.array("q", [0]),
            "flags.u8": array.array("B"),
            "group.u32": array.array("I"),
            "train.i64": array.array("q"),
            "vstart.i64": array.array("q", [0]),
            "runs.i64": array.array("q"),
        }
        self.shard_sizes: list[int] = []
        self.shard: BinaryIO | None = None
        self._next_shard()
        self.group_ids: dict[str, int] = {}
        self.n = self.n_runs = self.n_train = self.pos = self.vpos = self.k = 0
        self.group, self.group_name = -1, ""
        self.rules = {"group": True, "group#k": True, "group/k": True}  # how names derive from groups

    def _next_shard(self) -> BinaryIO:
        if self.shard is not None:
            self.shard.close()
        self.shard = open(self.out / f"shard-{len(self.shard_sizes):05d}.u8", "wb")
        self.shard_sizes.append(0)
        return self.shard

    def add(self, name: str, group: str, pieces, flag: int) -> None:
        shard = self._next_shard() if self.shard_sizes[-1] >= self.shard_bytes else self.shard
        assert shard is not None
        length = 0
        for piece in pieces:
            shard.write(piece)
            length += len(piece)
        self.shard_sizes[-1] += length
        if self.distinct:
            gid = self.group if self.group >= 0 and group == self.group_name else None
        else:
            gid = self.group_ids.get(group)
        if gid is None or gid != self.group:  # a new run of documents of one group
            if gid is not None:  # the group came back after another: names cannot derive from it
                self.rules = dict.fromkeys(self.rules, False)
            else:
                gid = self.n_groups
                if not self.distinct:
                    self.group_ids[group] = gid
                self.groups_file.write(("," if gid else "") + json.dumps(group))
                self.n_groups += 1
            self.group, self.k, self.group_name = gid, 0, group
            self.buffers["runs.i64"].append(self.n)
            self.n_runs += 1
        else:
            self.k += 1
        rules = self.rules
        rules["group"] = rules["group"] and name == group and self.k == 0
        rules["group#k"] = rules["group#k"] and name == f"{group}#{self.k}"
        rules["group/k"] = rules["group/k"] and name == f"{group}/{self.k}"
        self.names_file.write(json.dumps(name) + "\n")
        self.pos += length
        self.buffers["offsets.i64"].append(self.pos)
        self.buffers["flags.u8"].append(flag)
        self.buffers["group.u32"].append(gid)
        if flag == 0:
            self.buffers["train.i64"].append(self.n)
            self.vpos += length + 2
            self.buffers["vstart.i64"].append(self.vpos)
            self.n_train += 1
        self.n += 1
        if self.n % self.FLUSH == 0:
            self._flush()

    def _flush(self) -> None:
        for name, buf in self.buffers.items():
            buf.tofile(self.files[name])
            del buf[:]

    def finish(self, header: dict, *, part: bool = False) -> dict:
        """Close the files and write the index; ``part``: one worker's share of a parallel build
        (its names kept, and every rule its names follow, for :func:`_merge`)."""
        self._flush()
        if self.shard is not None:
            self.shard.close()
        self.names_file.close()
        for f in self.files.values():
            f.close()
        if part:
            header = {**header, "rules": [r for r, ok in self.rules.items() if ok]}
        rule = next((r for r, ok in self.rules.items() if ok), "stored")
        if not part:
            _settle_names(self.out, rule, self.n, header["spec"])
        self.groups_file.write("]")
        self.groups_file.close()
        index = {
            "version": CACHE_VERSION,
            **header,
            "documents": self.n,
            "bytes": self.pos,
            "shards": self.shard_sizes,
            "runs": self.n_runs,
            "groups": self.n_groups,
            "names": rule,
            "train_documents": self.n_train,
            "train_stream_len": self.vpos,
        }
        if part:
            index["distinct_groups"] = self.distinct
        (self.out / "index.json").write_text(json.dumps(index, indent=1))
        return index


def _settle_names(out: Path, rule: str, n: int, spec: str) -> None:
    """Drop the names file when names derive from groups (unique by construction); else check
    that the stored names are unique."""
    if rule != "stored":
        (out / "names.jsonl").unlink()
        return
    seen: set[bytes] = set()
    with open(out / "names.jsonl", "rb") as names:
        for line in names:
            seen.add(hashlib.blake2b(line, digest_size=16).digest())
    if len(seen) != n:
        raise UserError(f"data spec {spec!r} yields duplicate document names; they must be unique")


def _build_part(job: tuple) -> dict:
    """One worker of a parallel build: its partition of the source into ``out`` (a part)."""
    source, out, split_seed, heldout_fraction, validation_fraction, shard_bytes = job
    out.mkdir()
    builder = _Builder(out, shard_bytes, distinct_groups=getattr(source, "distinct_groups", False))
    for name, group, pieces in source.records():
        builder.add(name, group, pieces, _flag(name, split_seed, heldout_fraction, validation_fraction))
        if _DONE is not None:
            with _DONE.get_lock():
                _DONE.value += 1
    return builder.finish({"spec": source.spec}, part=True)


_DONE = None  # a worker's shared count of documents done (set by _worker_init)


def _worker_init(done) -> None:
    global _DONE
    _DONE = done


def _copy_adjusted(src: Path, dst, dtype, add: int = 0, skip: int = 0, chunk: int = 1 << 20) -> None:
    """Append ``src``'s values (from index ``skip``) plus ``add`` to the open file ``dst``, a chunk
    at a time."""
    n = src.stat().st_size // np.dtype(dtype).itemsize
    if n <= skip:
        return
    values = np.memmap(src, dtype=dtype, mode="r", shape=(n,))
    for lo in range(skip, n, chunk):
        block = np.asarray(values[lo : lo + chunk])
        (block + np.asarray(add, dtype) if add else block).astype(dtype).tofile(dst)


_PER_DOC = ("offsets.i64", "flags.u8", "group.u32", "train.i64", "vstart.i64", "runs.i64")


def _merge(parts: list[Path], indexes: list[dict], out: Path, header: dict) -> None:
    """Join the parts of a parallel build, in order, into one corpus directory: the shards are
    renamed, the per-document files appended with their offsets shifted (streamed)."""
    # parts of a source whose groups never recur (files) concatenate their group tables, streamed;
    # else the names are matched across parts
    distinct = all(i.get("distinct_groups") for i in indexes)
    groups: dict[str, int] = {}
    n_groups = 0
    recurring = False
    shard_sizes: list[int] = []
    n = n_bytes = n_runs = n_train = v_len = 0
    files = {name: open(out / name, "wb") for name in _PER_DOC}
    np.zeros(1, np.int64).tofile(files["offsets.i64"])
    np.zeros(1, np.int64).tofile(files["vstart.i64"])
    table_file = open(out / "groups.json", "w", encoding="utf-8")
    table_file.write("[")
    with open(out / "names.jsonl", "wb") as names:
        for part, idx in zip(parts, indexes):
            for k, size in enumerate(idx["shards"]):
                os.replace(part / f"shard-{k:05d}.u8", out / f"shard-{len(shard_sizes):05d}.u8")
                shard_sizes.append(size)
            if distinct:
                body = (part / "groups.json").read_text(encoding="utf-8")[1:-1]
                if body:
                    table_file.write(("," if n_groups else "") + body)
                _copy_adjusted(part / "group.u32", files["group.u32"], np.uint32, add=n_groups)
                n_groups += idx["groups"]
            else:
                table = json.loads((part / "groups.json").read_text(encoding="utf-8"))
                remap = np.empty(len(table), np.uint32)
                for g, name in enumerate(table):
                    recurring = recurring or name in groups
                    if name not in groups:
                        table_file.write(("," if groups else "") + json.dumps(name))
                    remap[g] = groups.setdefault(name, len(groups))
                ids = np.fromfile(part / "group.u32", np.uint32)
                remap[ids].tofile(files["group.u32"])
                n_groups = len(groups)
            _copy_adjusted(part / "offsets.i64", files["offsets.i64"], np.int64, add=n_bytes, skip=1)
            _copy_adjusted(part / "flags.u8", files["flags.u8"], np.uint8)
            _copy_adjusted(part / "runs.i64", files["runs.i64"], np.int64, add=n)
            _copy_adjusted(part / "train.i64", files["train.i64"], np.int64, add=n)
            _copy_adjusted(part / "vstart.i64", files["vstart.i64"], np.int64, add=v_len, skip=1)
            with open(part / "names.jsonl", "rb") as src:
                shutil.copyfileobj(src, names, 1 << 20)
            n, n_bytes, n_runs = n + idx["documents"], n_bytes + idx["bytes"], n_runs + idx["runs"]
            n_train, v_len = n_train + idx["train_documents"], v_len + idx["train_stream_len"]
    for out_file in files.values():
        out_file.close()
    table_file.write("]")
    table_file.close()
    common = set.intersection(*(set(i["rules"]) for i in indexes)) if not recurring else set()
    rule = next((r for r in ("group", "group#k", "group/k") if r in common), "stored")
    _settle_names(out, rule, n, header["spec"])
    index = {
        "version": CACHE_VERSION,
        **header,
        "documents": n,
        "bytes": n_bytes,
        "shards": shard_sizes,
        "runs": n_runs,
        "groups": n_groups,
        "names": rule,
        "train_documents": n_train,
        "train_stream_len": v_len,
    }
    (out / "index.json").write_text(json.dumps(index, indent=1))


def build_corpus(
    source,
    out: Path,
    split_seed: int,
    heldout_fraction: float,
    validation_fraction: float,
    progress: Progress | None,
    shard_bytes: int | None = None,
    workers: int = 1,
) -> None:
    shard_bytes = shard_bytes or SHARD_BYTES
    header = {
        "spec": source.spec,
        "source": source.describe(),
        "split_seed": split_seed,
        "heldout_fraction": heldout_fraction,
        "validation_fraction": validation_fraction,
    }
    partitions = source.partitions(workers) if workers > 1 else [source]
    if len(partitions) > 1:
        _build_parallel(partitions, out, header, shard_bytes, progress)
        return
    builder = _Builder(out, shard_bytes, distinct_groups=getattr(source, "distinct_groups", False))
    for name, group, pieces in source.records(progress):
        builder.add(name, group, pieces, _flag(name, split_seed, heldout_fraction, validation_fraction))
    builder.finish(header)


def _build_parallel(partitions, out: Path, header: dict, shard_bytes: int, progress: Progress | None) -> None:
    """One worker process per partition (spawned: the parent may hold JAX's threads), each writing
    a part; then :func:`_merge`. Progress counts documents (of an unknown total)."""
    import multiprocessing  # noqa: PLC0415

    context = multiprocessing.get_context("spawn")
    done = context.Value("q", 0)
    parts = [out / f"part-{k:05d}" for k in range(len(partitions))]
    jobs = [
        (
            p,
            part,
            header["split_seed"],
            header["heldout_fraction"],
            header["validation_fraction"],
            shard_bytes,
        )
        for p, part in zip(partitions, parts)
    ]
    with concurrent.futures.ProcessPoolExecutor(
        len(jobs), mp_context=context, initializer=_worker_init, initargs=(done,)
    ) as pool:
        futures = [pool.submit(_build_part, job) for job in jobs]
        while not all(f.done() for f in futures):
            concurrent.futures.wait(futures, timeout=0.5)
            if progress:
                progress(done.value, 0)
        indexes = [f.result() for f in futures]
    _merge(parts, indexes, out, header)
    for part in parts:
        shutil.rmtree(part)
