"""Typed, frozen configs loaded from TOML files with includes and ``--set a.b=c`` overrides.

A config file has the sections ``[data]``, ``[model]``, ``[train]`` and ``[eval]``, and may start
with ``include = "base.toml"`` (or a list of files), resolved relative to the including file.
Merge order, lowest to highest precedence: included files in list order (each with its own
includes resolved first), then the including file, then ``--set`` overrides in command-line order.
Tables merge key by key; any other value replaces the inherited one.

The ``[model]`` table picks its dataclass by ``family`` (``byte``, ``megabyte``, ``blt``, ``bpe``,
...) from the family registry (:mod:`bytelm.families`). Every key is checked: an unknown key fails with the
closest valid key, a value of the wrong type names the key, the value and the expected type.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import math
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Literal

from bytelm.errors import UserError
from bytelm.families import config_class
from bytelm.models.configs import ModelConfig, field_name, key_name, replace_fields


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Which corpus, how it is split, and which held-out bytes are scored."""

    source: str = "stdlib"  # data spec: stdlib, files:, jsonl:, parquet:, hf:, tfds: (README)
    split_seed: int = 0  # seed of the stable hash split
    heldout_fraction: float = 0.05  # expected fraction of documents held out
    # expected fraction of the other documents kept out of training as the validation split, on
    # which learning rates are selected (bytelm ablate); 0 = none. The held-out bytes do not move.
    validation_fraction: float = 0.0
    segment_bytes: int = 1024  # evaluation segments are at most this long
    max_eval_bytes: int = 1 << 20  # total bytes scored by the evaluator
    cache_dir: str = ""  # "" = $BYTELM_CACHE_DIR or ~/.cache/bytelm
    # training batches made this many steps ahead by a background thread (reading, gathering and the
    # family's decoration, e.g. BLT's patching, overlap the step); 0 = made in the loop
    prefetch: int = 2
    # processes that prepare the corpus (a source of many files) and encode a subword LM's training
    # split when a run needs them (bytelm data prepare --workers N does the first beforehand)
    workers: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"data.heldout_fraction must be in (0, 1), got {self.heldout_fraction}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                "data.validation_fraction must be in [0, 1) (0: no validation split), got "
                f"{self.validation_fraction}"
            )
        if self.workers < 1:
            raise ValueError(f"data.workers must be >= 1, got {self.workers}")
        if self.prefetch < 0:
            raise ValueError(f"data.prefetch must be >= 0 (0: no prefetch), got {self.prefetch}")
        if self.segment_bytes < 1 or self.max_eval_bytes < 1:
            raise ValueError(
                f"data.segment_bytes ({self.segment_bytes}) and data.max_eval_bytes "
                f"({self.max_eval_bytes}) must be >= 1"
            )


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation, schedule, logging and checkpointing for the one trainer."""

    steps: int = 1000
    batch_size: int = 16  # global batch, in sequences
    seq_len: int = 512  # positions per sequence (bytes, or tokens for the BPE LM)
    seed: int = 0
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # cosine decays to learning_rate * min_lr_ratio
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    # "adamw", or "muon": Muon's orthogonalised step on the hidden weight matrices, Adam
    # (beta1, beta2) on embeddings, heads and vectors, one learning rate (bytelm/training/optim.py)
    optimizer: Literal["adamw", "muon"] = "adamw"
    muon_momentum: float = 0.95  # Muon's Nesterov momentum (train.optimizer = "muon")
    # the lookup tables' learning rate (byte or subword embeddings, hashed n-gram tables: the
    # parameters whose first logical axis is "vocab"; not output heads) is learning_rate times this,
    # their weight decay with it, under either optimizer (bytelm/training/optim.py)
    embedding_lr_scale: float = 1.0
    # > 0: keep an exponential moving average of the weights, bias-corrected (an average of the
    # iterates so far, step i weighted by decay^(t - i)); the averaged weights are the run's model:
    # evaluations, sampling, export and compare read them, training resumes from the raw ones
    # (bytelm/training/loop.py). 0: the last weights are the model.
    ema_decay: float = 0.0
    grad_clip: float = 1.0  # global-norm clipping; 0 disables
    grad_accum: int = 1  # micro-batches per optimizer step
    log_every: int = 10
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    mesh_data: int = -1  # mesh axis sizes; one may be -1 (= fill with the remaining devices)
    mesh_fsdp: int = 1
    mesh_tensor: int = 1
    # per-device peak FLOP/s for MFU; 0 = the datasheet bf16 peak of a GPU/TPU (bytelm/training/peak.py),
    # and no MFU on a CPU (it has no peak that holds while other processes share its cores)
    peak_flops: float = 0.0
    # > 0: train for this many seconds of training time (compilation included, evaluations not;
    # summed across resumes) instead of train.steps, which is then ignored; the schedule's horizon
    # is planned from the first steps' time (bytelm/training/clock.py)
    time_budget_s: float = 0.0
    # > 0: for a family that measures what its steps spend (H-Net's chunk rate), train until the measured
    # FLOPs (own + auxiliary) reach this, the horizon re-planned from them (bytelm/training/flop_budget.py)
    flop_budget: float = 0.0
    # TensorBoard event files of every logged scalar in RUN_DIR/tensorboard (process 0; tensorboardX)
    tensorboard: bool = True
    # a Weights & Biases project to log the same scalars to (process 0; `pip install -e '.[wandb]'`;
    # WANDB_MODE=offline keeps the run in RUN_DIR/wandb for a later `wandb sync`); "" = none
    wandb_project: str = ""
    # "A:B": a jax.profiler trace of steps A to B (numbered as in the logs, from 1) into
    # RUN_DIR/profile, which TensorBoard's profile plugin and XProf open; "" = none
    profile_steps: str = ""

    def profile_window(self) -> tuple[int, int] | None:
        if not self.profile_steps:
            return None
        a, b = self.profile_steps.split(":")
        return int(a), int(b)

    def __post_init__(self) -> None:
        if self.profile_steps:
            m = re.fullmatch(r"(\d+):(\d+)", self.profile_steps.strip())
            if not m or not 1 <= int(m[1]) <= int(m[2]):
                raise ValueError(
                    f"train.profile_steps must be A:B with 1 <= A <= B (steps numbered from 1), got "
                    f"{self.profile_steps!r}"
                )
        for name in "steps batch_size seq_len grad_accum log_every checkpoint_every keep_checkpoints".split():
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.batch_size % self.grad_accum:
            raise ValueError(
                f"train.batch_size {self.batch_size} is not divisible by train.grad_accum {self.grad_accum}"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"train.learning_rate must be a finite number > 0, got {self.learning_rate}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"train.{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(
                "train.min_lr_ratio must be in [0, 1] (the cosine's floor as a fraction of the peak), got "
                f"{self.min_lr_ratio}"
            )
        for name, meaning in (
            ("weight_decay", "0: none"),
            ("grad_clip", "0: no clipping"),
            ("peak_flops", "0: datasheet, none on CPU"),
        ):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"train.{name} must be a finite number >= 0 ({meaning}), got {value}")
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError(f"train.optimizer must be 'adamw' or 'muon', got {self.optimizer!r}")
        if not 0.0 <= self.muon_momentum < 1.0:
            raise ValueError(f"train.muon_momentum must be in [0, 1), got {self.muon_momentum}")
        if not (self.embedding_lr_scale > 0 and math.isfinite(self.embedding_lr_scale)):
            raise ValueError(
                "train.embedding_lr_scale must be a finite number > 0 (1: the learning rate of the rest), "
                f"got {self.embedding_lr_scale}"
            )
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(
                "train.ema_decay must be in [0, 1) (0: no weight average; 0.99 averages over about 100 "
                f"steps), got {self.ema_decay}"
            )
        for name in ("time_budget_s", "flop_budget"):
            if not (value := getattr(self, name)) >= 0:
                raise ValueError(f"train.{name} must be >= 0 (0: train for train.steps), got {value}")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Periodic held-out evaluation during training and the evaluator's batching."""

    every: int = 200  # steps between held-out evaluations during training; 0 disables
    eval_bytes: int = 65536  # bytes of the evaluation set scored by the periodic evaluation
    batch_size: int = 16  # segments per evaluation batch

    def __post_init__(self) -> None:
        if self.every < 0 or self.eval_bytes < 1 or self.batch_size < 1:
            raise ValueError(
                f"eval.every ({self.every}) must be >= 0, eval.eval_bytes ({self.eval_bytes}) and "
                f"eval.batch_size ({self.batch_size}) >= 1"
            )


@dataclasses.dataclass(frozen=True)
class Config:
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig | None = None
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)

    def require_model(self) -> ModelConfig:
        """The ``[model]`` section; :class:`UserError` when the config has none."""
        if self.model is None:
            raise UserError(
                "the config has no [model] section: set model.family (e.g. --set model.family=byte)"
            )
        return self.model


_SECTIONS = {"data": DataConfig, "train": TrainConfig, "eval": EvalConfig}


class _Override(str):
    """A value from ``--set``: a string converted to the target field's type at build time."""


# -- reading ------------------------------------------------------------------------------
def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise UserError(f"config file not found: {path}; {shipped_names_line(path)}") from None
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"cannot parse config file {path}: {e}") from None
    except UnicodeDecodeError as e:
        raise UserError(
            f"config file {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
            "TOML files are UTF-8: save it in that encoding"
        ) from None
    except OSError as e:
        raise UserError(f"cannot read config file {path}: {e.strerror or e}") from None


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def shipped_configs() -> Path:
    """The configs and presets that ship inside the package (``bytelm/configs``, package data;
    ``configs/`` at the repository root is a link to it)."""
    return Path(str(importlib.resources.files("bytelm") / "configs"))


def shipped_names_line(path: str | Path) -> str:
    """The shipped configs a user may name (``tiny/byte``...), those of the missing name's folder
    first, as the end of a "not found" line."""
    root = shipped_configs()
    names = sorted(p.relative_to(root).with_suffix("").as_posix() for p in root.glob("*/*.toml"))
    names = [n for n in names if not n.startswith(("compare/", "ablations/"))]
    folder = Path(path).parent.name
    near = [n for n in names if n.startswith(f"{folder}/")]
    shown = near or names
    more = f" (and {len(names) - len(shown)} more: configs/)" if len(shown) < len(names) else ""
    return f"give a TOML file, or a shipped config by name: {', '.join(shown)}{more}"


def resolve_config_path(path: str | Path) -> Path:
    """``path`` itself when it exists; otherwise the shipped config it names, so that
    ``configs/tiny/byte.toml``, ``tiny/byte.toml`` and ``tiny/byte`` work from any directory
    (and from an installed wheel). A path that names neither is returned as given."""
    p = Path(path)
    if p.exists():
        return p
    rel = p.parts[1:] if p.parts[:1] == ("configs",) else p.parts
    if not p.is_absolute() and rel:
        for candidate in (
            shipped_configs().joinpath(*rel),
            shipped_configs().joinpath(*rel).with_suffix(".toml"),
        ):
            if candidate.is_file():
                return candidate
    return p


def load_raw(path: str | Path, _stack: tuple[Path, ...] = ()) -> dict:
    """The merged dict of ``path`` (see :func:`resolve_config_path`) and everything it includes
    (no validation)."""
    path = (resolve_config_path(path) if not _stack else Path(path)).resolve()
    if path in _stack:
        chain = " -> ".join(str(p) for p in (*_stack, path))
        raise UserError(f"config include cycle: {chain}")
    raw = _read_toml(path)
    includes = raw.pop("include", [])
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise UserError(f"'include' in {path} must be a file name or a list of file names, got {includes!r}")
    merged: dict = {}
    for inc in includes:
        merged = _merge(merged, load_raw(path.parent / inc, (*_stack, path)))
    return _merge(merged, raw)


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``a.b=c`` strings to ``raw`` (a new dict); values are typed when the config is built."""
    raw = _merge({}, raw)
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise UserError(
                f"override {item!r} is not of the form section.key=value (e.g. model.d_model=512)"
            )
        *parents, leaf = key.split(".")
        node = raw
        for part in parents:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[leaf] = _Override(value)
    return raw


# -- typing -------------------------------------------------------------------------------
def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        args = typing.get_args(tp)
        return f"list of {_type_name(args[0])}" if args else "list"
    return getattr(tp, "__name__", str(tp))


def _convert(key: str, value: Any, tp: Any) -> Any:
    def shown() -> str:
        if isinstance(value, _Override):
            return str(value)
        try:
            return _toml_value(value)
        except (TypeError, ValueError):
            return repr(value)

    def bad() -> UserError:
        return UserError(f"{key} = {shown()} is not a valid {_type_name(tp)}")

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None or (isinstance(value, _Override) and value.lower() in ("none", "")):
                    return None
                continue
            try:
                return _convert(key, value, arg)
            except UserError as e:
                errors.append(e)
        raise bad()
    if origin is typing.Literal:  # a closed set of strings: the value as written must be one of them
        text = value.strip() if isinstance(value, _Override) else value
        if isinstance(text, str) and text in typing.get_args(tp):
            return text
        raise UserError(
            f"{key} = {_toml_value(text) if isinstance(text, str) else shown()} is not {_type_name(tp)}"
        )
    if isinstance(value, _Override):
        text = value.strip()
        if tp is bool:
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise bad()
        if tp is int:
            try:
                return int(text.replace("_", ""), 0)
            except ValueError:
                try:
                    as_float = float(text)
                except ValueError:
                    raise bad() from None
                if as_float.is_integer():
                    return int(as_float)
                raise bad() from None
        if tp is float:
            try:
                return float(text)
            except ValueError:
                raise bad() from None
        if tp is str:
            return str(value)
        if origin is tuple:
            if text.startswith("["):
                try:
                    parsed = tomllib.loads(f"v = {text}")["v"]
                except tomllib.TOMLDecodeError:
                    raise bad() from None
            else:
                parsed = [_Override(p) for p in text.split(",") if p.strip()]
            return _convert(key, parsed, tp)
        raise bad()
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise bad()
    if tp is str:
        if isinstance(value, str):
            return str(value)
        raise bad()
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise bad()
        (elem,) = typing.get_args(tp)[:1] or (Any,)
        return tuple(_convert(f"{key}[{i}]", v, elem) for i, v in enumerate(value))
    return value


def _unknown_key(key: str, valid: list[str]) -> UserError:
    leaf = key.rsplit(".", 1)[-1]
    prefix = key[: -len(leaf)]
    close = difflib.get_close_matches(leaf, valid, n=1, cutoff=0.5)
    hint = f"; did you mean '{prefix}{close[0]}'?" if close else f"; valid keys: {', '.join(sorted(valid))}"
    return UserError(f"unknown key '{key}'{hint}")


def _moved_key(cls: type, section: str, key: str) -> UserError | None:
    """The error for a key that a table of ``cls`` no longer has because it moved into a nested table
    (``model.global_d_model`` is ``model.global.d_model``): the class's own ``moved_keys``, or a
    ``<table>_<key>`` whose table is a nested dataclass field with that key."""
    new = getattr(cls, "moved_keys", {}).get(key)
    if new is None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            table = key_name(f.name)
            if dataclasses.is_dataclass(hints[f.name]) and key.startswith(table + "_"):
                leaf = key[len(table) + 1 :]
                if field_name(hints[f.name], leaf) is not None:
                    new = f"{table}.{leaf}"
    if new is None:
        return None
    table, _, leaf = new.rpartition(".")
    where = f"a [{section}.{table}] table" if table else f"the [{section}] table"
    return UserError(
        f"{section}.{key} is now {section}.{new}: write {leaf} = ... in {where}, or --set {section}.{new}=..."
    )


def build_section(section: str, cls: type, raw: Any, base: Any = None) -> Any:
    """The frozen dataclass ``cls`` from a TOML table ``raw`` (or ``--set`` strings in it): every key
    checked (an unknown one names the closest valid key; a key that moved into a nested table names
    its new place), every value typed by the field's annotation (a field typed ``Any`` takes the value
    as it is; a field typed by a dataclass is a nested table, ``[model.global]``, whose keys go over
    the field's default), required fields (no default, and no ``base`` instance to take them from)
    demanded, and the class's own invariants (``__post_init__``'s ``ValueError``) reported as
    :class:`UserError`. Config files, compare presets and ablation grids are all read through it."""
    if not isinstance(raw, dict):
        raise UserError(f"'{section}' must be a table ([{section}]), got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        name = field_name(cls, key)
        if name is None:
            raise _moved_key(cls, section, key) or _unknown_key(
                f"{section}.{key}", [key_name(f) for f in fields]
            )
        tp = hints[name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            default = getattr(base, name) if base is not None else fields[name].default
            kwargs[name] = build_section(
                f"{section}.{key}", tp, value, None if default is dataclasses.MISSING else default
            )
        else:
            kwargs[name] = value if tp is Any else _convert(f"{section}.{key}", value, tp)
    if base is not None:
        kwargs = {f: getattr(base, f) for f in fields} | kwargs
    missing = [
        key_name(name)
        for name, f in fields.items()
        if name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise UserError(f"[{section}] needs {', '.join(missing)}")
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise UserError(f"invalid [{section}] config: {e}") from None


def with_values(cfg: Config, values: dict) -> Config:
    """``cfg`` with ``{"section.key": value}`` set (values typed like the fields; each section rebuilt
    with ``dataclasses.replace``, so its invariants are checked): how the library changes a config,
    where a person would type ``--set``."""
    by_section: dict[str, dict] = {}
    for key, value in values.items():
        section, _, name = key.partition(".")
        if section not in ("data", "model", "train", "eval") or not name:
            raise UserError(
                f"{key!r} is not a config key (section.key, section one of data, model, train, eval)"
            )
        by_section.setdefault(section, {})[name] = value
    changes = {}
    for section, fields in by_section.items():
        current = getattr(cfg, section)
        if current is None:
            raise UserError(
                f"the config has no [{section}] table to set {', '.join(f'{section}.{k}' for k in fields)} in"
            )
        typed = typed_fields(
            type(current),
            {k: (str(v) if isinstance(v, Path) else v) for k, v in fields.items()},
            section=section,
        )
        try:
            changes[section] = replace_fields(current, typed)
        except ValueError as e:
            raise UserError(f"invalid [{section}] config: {e}") from None
    return dataclasses.replace(cfg, **changes)


def with_overrides(cfg: Config, overrides: list[str] | tuple[str, ...]) -> Config:
    """``cfg`` with a person's ``--set`` strings applied on top, validated like a config file."""
    return build_config(apply_overrides(config_to_dict(cfg), list(overrides))) if overrides else cfg


def typed_fields(cls: type, values: dict, *, section: str = "model") -> dict:
    """``values`` (key -> a TOML value or a ``--set`` string; a dotted key reaches into a nested
    table, ``global.d_model``) converted to the types of ``cls``'s fields, with the loader's errors (an
    unknown key names the closest, or its new place; a bad value names its type). The keys come back
    as given, for :func:`bytelm.models.configs.replace_fields`."""
    hints = typing.get_type_hints(cls)
    out = {}
    for key, value in values.items():
        head, dot, rest = key.partition(".")
        name = field_name(cls, head)
        if name is None:
            raise _moved_key(cls, section, head) or _unknown_key(
                f"{section}.{head}", [key_name(f.name) for f in dataclasses.fields(cls)]
            )
        tp = hints[name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if not dot:
                raise UserError(
                    f"{section}.{head} is a table: set its keys ({section}.{head}.<key>), one of "
                    f"{', '.join(key_name(f.name) for f in dataclasses.fields(tp))}"
                )
            (out[key],) = typed_fields(tp, {rest: value}, section=f"{section}.{head}").values()
        elif dot:
            raise _unknown_key(f"{section}.{key}", [key_name(f.name) for f in dataclasses.fields(cls)])
        else:
            out[key] = _convert(f"{section}.{key}", _Override(value) if isinstance(value, str) else value, tp)
    return out


def override_text(value: Any) -> str:
    """A typed value as the text of ``--set key=TEXT`` (what :func:`load_config` reads back to it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return (
            _toml_value(list(value))
            if any(isinstance(v, str) for v in value)
            else ",".join(override_text(v) for v in value)
        )
    return repr(value) if isinstance(value, float) else str(value)


def section_overrides(section: str, new: Any, base: Any) -> list[str]:
    """``--set`` strings turning the dataclass ``base`` into ``new`` (same class): one per changed field
    (``model.global.d_model=...`` for a nested table's), for a command a person or a scheduler runs
    (inside the library configs stay typed)."""
    out = []
    for f in dataclasses.fields(new):
        value, before = getattr(new, f.name), getattr(base, f.name)
        if value == before:
            continue
        key = f"{section}.{key_name(f.name)}"
        if dataclasses.is_dataclass(value) and type(value) is type(before):
            out.extend(section_overrides(key, value, before))
        else:
            out.append(f"{key}={override_text(value)}")
    return out


def build_config(raw: dict) -> Config:
    """Validate a merged dict into a :class:`Config` (raises ``UserError`` on any bad key/value)."""
    raw = dict(raw)
    raw.pop("include", None)
    valid_sections = [*_SECTIONS, "model"]
    for key in raw:
        if key not in valid_sections:
            raise _unknown_key(key, valid_sections)
    sections = {name: build_section(name, cls, raw.get(name, {})) for name, cls in _SECTIONS.items()}
    model = None
    if "model" in raw:
        model_raw = raw["model"]
        if not isinstance(model_raw, dict):
            raise UserError(f"'model' must be a table ([model]), got {model_raw!r}")
        model = build_section("model", config_class(str(model_raw.get("family", ""))), model_raw)
    return Config(model=model, **sections)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Load ``path`` (with includes), apply ``overrides``, validate. ``path=None``: defaults only."""
    raw = load_raw(path) if path is not None else {}
    return build_config(apply_overrides(raw, list(overrides)))


def load_run_config(run_dir) -> Config:
    """The resolved config a run directory (a path or a URL) recorded; :class:`UserError` when it is
    not a run directory or its config is not whole."""
    from bytelm.rundir import RunDir  # noqa: PLC0415

    files = RunDir(run_dir)
    files.require_config()
    try:
        raw = tomllib.loads(files.config_text())
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"cannot parse config file {files.config_path}: {e}") from None
    return build_config(raw)


# -- writing ------------------------------------------------------------------------------
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        escaped = "".join(c if c.isprintable() or c == " " else f"\\u{ord(c):04x}" for c in escaped)
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if value is None:
        raise ValueError("TOML has no null; None fields are omitted")
    raise TypeError(f"cannot write {value!r} to TOML")


def _table(obj: Any) -> dict:
    """A dataclass as a TOML table: keys as written (:func:`key_name`), None fields left out, nested
    dataclasses as nested tables."""
    out: dict = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is not None:
            out[key_name(f.name)] = _table(value) if dataclasses.is_dataclass(value) else value
    return out


def config_to_dict(cfg: Config) -> dict:
    return {
        name: _table(section)
        for name in ("data", "model", "train", "eval")
        if (section := getattr(cfg, name)) is not None
    }


def dump_config(cfg: Config) -> str:
    """The resolved config as TOML (``load_config`` of it gives back an equal config)."""
    lines: list[str] = []

    def write(name: str, table: dict) -> None:
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in table.items() if not isinstance(v, dict))
        lines.append("")
        for k, v in table.items():
            if isinstance(v, dict):
                write(f"{name}.{k}", v)

    for name, table in config_to_dict(cfg).items():
        write(name, table)
    return "\n".join(lines)
