"""What an experiment is: budgets, members (families or models), cells, learning rates, seeds, artefacts.

``bytelm ablate`` reads a grid (``configs/ablations/*.toml``) and ``bytelm compare`` a preset
(``configs/compare/*.toml``); both become one :class:`Experiment`, which the one runner
(:mod:`bytelm.experiments.runner`) carries out. A compare preset is a grid with one budget, one cell
per model, each model at its own config's sizes (no size rule) and every model trained with the same
seeds. Both files are read through the config loader's typed sections (:func:`bytelm.config.build_section`):
an unknown key names the closest valid one, a wrong value names its type.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import tomllib
from pathlib import Path
from typing import Any

from bytelm.baselines import KINDS, encoders_of
from bytelm.config import build_section
from bytelm.errors import UserError
from bytelm.families import Trunk
from bytelm.models.configs import StackConfig

TOKENIZER_KEYS = ("tokenizer.vocab_size", "tokenizer.pattern")  # required of a subword cell
TOKENIZER_OPTIONS = ("tokenizer.kind", "tokenizer.encoder")
TOKENIZER_DIR = "tokenizer.dir"  # a tokenizer directory made elsewhere (trained or imported), used as is
ROLES = (
    "compared",
    "entropy",
)  # a compare preset's [[model]] role: compared, or the entropy model of the BLT models


def _positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclasses.dataclass(frozen=True)
class SizeRule:
    """Model size from the compute budget, the same trunk for every family at one budget.

    Compute-optimal scaling (Hoffmann et al. 2022): training FLOPs C = 6 N D and D = tokens_per_param
    x N give the trunk's non-embedding parameters N = sqrt(C / (6 tokens_per_param)). A transformer
    of L layers and width d has about 12 L d^2 of them; with d = width_per_layer x L (a fixed aspect
    ratio), L = (N / (12 width_per_layer^2))^(1/3), at least ``min_layers``, and then
    d = sqrt(N / (12 L)) rounded to ``width_multiple``. Heads are ``head_dim`` wide, MLPs
    ``mlp_ratio`` x d. The trunk is the byte and BPE LMs' stack and MegaByte's and BLT's global
    stack; their local stacks are half as wide (MegaByte's local stack half as deep too). The
    family's FLOPs then decide how many bytes it sees at that budget."""

    tokens_per_param: float = 20.0
    width_per_layer: float = 32.0
    min_layers: int = 2
    width_multiple: int = 16
    head_dim: int = 16
    mlp_ratio: float = 2.75

    def __post_init__(self) -> None:
        if self.width_multiple % self.head_dim:
            raise ValueError(
                f"size.width_multiple {self.width_multiple} must be a multiple of size.head_dim "
                f"{self.head_dim} (whole heads)"
            )
        if (
            self.min_layers < 1
            or not self.tokens_per_param > 0
            or not self.width_per_layer > 0
            or not self.mlp_ratio > 0
        ):
            raise ValueError(
                "size.min_layers must be >= 1 and size.tokens_per_param, width_per_layer, mlp_ratio > 0"
            )

    def trunk(self, budget: float) -> tuple[int, int]:
        """``(d_model, n_layers)`` for ``budget`` training FLOPs."""
        n = math.sqrt(budget / (6.0 * self.tokens_per_param))
        layers = max(self.min_layers, round((n / (12.0 * self.width_per_layer**2)) ** (1 / 3)))
        width = max(
            self.width_multiple,
            self.width_multiple * round(math.sqrt(n / (12.0 * layers)) / self.width_multiple),
        )
        return width, layers

    def mlp(self, d: int) -> int:
        return 16 * max(1, round(self.mlp_ratio * d / 16))

    def sizes(self, budget: float) -> Trunk:
        """The trunk at ``budget`` and its half-width local stacks (half as deep, at least one layer)."""
        d, L = self.trunk(budget)
        local = max(self.width_multiple, self.width_multiple * round(d / 2 / self.width_multiple))
        return Trunk(
            StackConfig(d, L, max(1, d // self.head_dim), self.mlp(d)),
            StackConfig(local, max(1, -(-L // 2)), max(1, local // self.head_dim), self.mlp(local)),
        )


@dataclasses.dataclass(frozen=True)
class Member:
    """A family of a grid, or a model of a preset: its config, its cells (a grid's product of lists),
    and what it takes from other members."""

    name: str
    config: Path
    overrides: tuple[str, ...] = ()  # --set strings of the file (a person's), applied to every cell
    grid: tuple[tuple[str, tuple], ...] = ()  # (key, values) in file order
    sweep: tuple[tuple[str, object], ...] = ()  # the cell its learning-rate search runs on
    lr_from: str | None = None  # another member's chosen rate, no search of its own
    ngram_from: str | None = None  # another member's hashed n-gram tables (sizes, rows)
    role: str = "compared"  # "entropy": the entropy model of the BLT members (a compare preset's)
    flop_budget: float | None = None  # its own budget (a preset's entropy model)

    def cells(self) -> list[dict]:
        """Every combination of the grid's values, as ``{key: value}`` (one empty cell without a grid)."""
        keys = [k for k, _ in self.grid]
        return [dict(zip(keys, combo)) for combo in itertools.product(*(v for _, v in self.grid))]

    def sweep_cell(self) -> dict:
        """The sweep cell: the grid's ``sweep`` values, the middle value of every other key."""
        chosen = dict(self.sweep)
        return {k: chosen.get(k, values[(len(values) - 1) // 2]) for k, values in self.grid}


@dataclasses.dataclass(frozen=True)
class Experiment:
    """One experiment for the runner (see the module docstring)."""

    kind: str  # "compare" or "ablate": which outputs it writes
    name: str
    path: Path
    budgets: tuple[float, ...]  # training FLOPs per run (each run's total, own + auxiliary), ascending
    members: tuple[Member, ...]
    learning_rates: tuple[float, ...] = ()  # () = every config's own rate
    size: SizeRule | None = None  # None: each config's own sizes
    overrides: tuple[str, ...] = ()  # --set strings for every run
    eval_points: int = 4
    extra_seeds: int = 0  # seeds 1..extra_seeds of each member's best cell at the smallest budget
    sweep_fraction: float = 1.0  # a rate-search run's share of its cell's steps (1: it is the cell's run)
    time_budget_s: float = 0.0  # > 0: every run of a compared member trains this long instead
    entropy: Member | None = None  # the entropy model of the BLT members (an artefact, its own budget)
    entropy_budget: float = 0.0
    tokenizer: dict = dataclasses.field(
        default_factory=dict
    )  # a preset's one subword tokenizer: tokenizer.* -> value
    probes: bool = True  # probe the compared models (bytelm/evaluation/probes.py) for the report

    def member(self, name: str) -> Member:
        return next(m for m in (*self.members, *([self.entropy] if self.entropy else [])) if m.name == name)

    @property
    def entropy_model(self) -> Member | None:
        return self.entropy


# -- reading the files -------------------------------------------------------------------------------
def find_toml(name_or_path: str, directory: Path, what: str) -> Path:
    """A TOML file path, or the name of a file in ``directory`` (shipped presets and grids)."""
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.is_file():
        if not p.is_file():
            raise UserError(f"{what} file {p} not found; give a TOML file or a name from {directory}")
        return p
    path = directory / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(q.stem for q in directory.glob("*.toml")) if directory.is_dir() else []
        raise UserError(
            f"no {what} {name_or_path!r} (known: {', '.join(known) or 'none'}); or give a TOML file path"
        )
    return path


def read_sections(path: Path, what: str, sections: tuple[str, ...], _seen: tuple[Path, ...] = ()) -> dict:
    """A preset or grid file's tables, refusing a file that does not parse or has unknown sections.

    ``include = "OTHER.toml"`` (relative to the file) starts from that file's tables: a table of
    keys given here replaces those keys of its table, an array of tables (``[[model]]``) replaces
    the whole array."""
    try:
        raw = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"cannot parse {what} {path}: {e}") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if "include" in raw:
        base_name = raw.pop("include")
        if not isinstance(base_name, str):
            raise UserError(f"{what} {path}: include must be a file name (a string), got {base_name!r}")
        base_path = (path.parent / base_name).resolve()
        if base_path in _seen or base_path == path.resolve():
            raise UserError(f"{what} {path}: include = {base_name!r} includes itself (a cycle)")
        base = read_sections(base_path, what, sections, (*_seen, path.resolve()))
        for table in [t for v in base.values() for t in (v if isinstance(v, list) else [v])]:
            for key in ("config", "dir"):  # (paths stay relative to the file that gives them)
                if isinstance(table, dict) and isinstance(table.get(key), str) and table[key]:
                    table[key] = str(base_path.parent / table[key])
        for key, value in raw.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                base[key] = {**base[key], **value}
            else:
                base[key] = value
        raw = base
    unknown = set(raw) - set(sections)
    if unknown:
        raise UserError(f"{what} {path}: unknown section(s) {sorted(unknown)}; valid: {', '.join(sections)}")
    return raw


def _section(where: str, section: str, cls: type, raw: Any):
    try:
        return build_section(section, cls, raw)
    except UserError as e:
        raise UserError(f"{where}: {e}") from None


def _config_path(path: Path, where: str, config: str) -> Path:
    p = (path.parent / config).resolve()
    if not p.is_file():
        raise UserError(f"{where}: config file {p} not found")
    return p


def _check_names(path: Path, what: str, members: list[Member], reserved: tuple[str, ...] = ()) -> None:
    names = [m.name for m in members]
    if not members or len(set(names)) != len(names) or set(names) & set(reserved):
        raise UserError(
            f"{what} {path}: needs [[{'family' if what == 'grid' else 'model'}]] tables with distinct names"
            + (f" (not {', '.join(map(repr, reserved))})" if reserved else "")
            + f", got {names}"
        )
    sweeping = {m.name for m in members if m.lr_from is None}
    noun = "family" if what == "grid" else "model"
    for m in members:
        if m.lr_from is not None and m.lr_from not in sweeping:
            raise UserError(
                f"{what} {path}: {noun} {m.name!r}: lr_from {m.lr_from!r} must name a {noun} that sweeps its "
                "own rate"
            )
        if m.ngram_from is not None and (m.ngram_from not in names or m.ngram_from == m.name):
            raise UserError(
                f"{what} {path}: {noun} {m.name!r}: ngram_from {m.ngram_from!r} must name another {noun} of "
                f"{names}"
            )


def _name(value: str, where: str) -> str:
    if not value or "/" in value:
        raise ValueError(f"{where}name must be a non-empty string without '/', got {value!r}")
    return value


# a compare preset ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _CompareTable:
    flop_budget: float  # total training FLOPs per compared model
    eval_points: int = 8
    time_budget_s: float = 0.0
    learning_rates: tuple[float, ...] = ()
    sweep_fraction: float = 0.25
    seeds: int = 1
    probes: bool = True  # continuation-choice, noise and spelling probes of every compared model
    set: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _positive("flop_budget", self.flop_budget)
        for lr in self.learning_rates:
            _positive("learning_rates", lr)
        if not 0 < self.sweep_fraction <= 1:
            raise ValueError(f"sweep_fraction must be in (0, 1], got {self.sweep_fraction}")
        if self.seeds < 1:
            raise ValueError(
                f"seeds must be a whole number >= 1 (seeds per compared model), got {self.seeds}"
            )
        if self.eval_points < 1 or not self.time_budget_s >= 0:
            raise ValueError(
                f"eval_points must be >= 1 and time_budget_s >= 0, got {self.eval_points} and "
                f"{self.time_budget_s}"
            )


@dataclasses.dataclass(frozen=True)
class _TokenizerTable:
    vocab_size: int = 4096
    pattern: str = "cl100k"
    kind: str = "bpe"
    encoder: str = ""  # "": the kind's own rule (ranks / viterbi / wordpiece), or "longest"
    dir: str = ""  # a tokenizer directory (bytelm tokenizer train / import), relative to the preset

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind is {self.kind!r}; use one of {list(KINDS)}")
        rules = encoders_of(self.kind)
        if self.encoder not in ("", *rules):
            raise ValueError(
                f"encoder is {self.encoder!r}: a {self.kind} tokenizer's rule is its own ('' or {rules[0]})"
                + (" or 'longest'" if len(rules) > 1 else "")
            )
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {self.vocab_size}")


@dataclasses.dataclass(frozen=True)
class _ModelTable:
    name: str
    config: str  # relative to the preset file
    role: str = "compared"
    flop_budget: float = 0.0  # 0: the preset's
    set: tuple[str, ...] = ()
    ngram_from: str = ""

    def __post_init__(self) -> None:
        _name(self.name, "")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")
        if self.flop_budget < 0:
            raise ValueError(f"flop_budget must be > 0, got {self.flop_budget}")


def load_preset(path: Path, *, seeds: int | None = None, time_budget_s: float | None = None) -> Experiment:
    """A compare preset as an experiment with one budget (see the module docstring)."""
    raw = read_sections(path, "preset", ("compare", "tokenizer", "model"))
    comp = _section(f"preset {path}", "compare", _CompareTable, raw.get("compare", {}))
    tok = _section(f"preset {path}", "tokenizer", _TokenizerTable, raw.get("tokenizer", {}))
    tokenizer = {f"tokenizer.{k}": v for k, v in dataclasses.asdict(tok).items() if k != "dir"}
    if tok.dir:
        others = sorted(set(raw.get("tokenizer", {})) - {"dir"})
        if others:
            raise UserError(
                f"preset {path}: [tokenizer] gives dir = {tok.dir!r} and {', '.join(others)}: a given "
                "directory is used as it is; remove the other keys (or dir, to train one)"
            )
        tokenizer = {TOKENIZER_DIR: str((Path(path).parent / tok.dir).absolute())}
    if not isinstance(raw.get("model", []), list):
        raise UserError(f"preset {path}: model must be [[model]] tables")
    members: list[Member] = []
    entropy: list[Member] = []
    for i, table in enumerate(raw.get("model", [])):
        where = f"preset {path} [[model]] #{i + 1}"
        m = _section(where, "model", _ModelTable, table)
        member = Member(
            m.name,
            _config_path(path, where, m.config),
            m.set,
            lr_from=None,
            ngram_from=m.ngram_from or None,
            role=m.role,
            flop_budget=m.flop_budget or None,
        )
        (entropy if m.role == "entropy" else members).append(member)
    if len(entropy) > 1:
        raise UserError(f"preset {path}: at most one model may have role = 'entropy'")
    _check_names(path, "preset", [*members, *entropy])
    if seeds is not None and seeds < 1:
        raise UserError(f"--seeds must be a whole number >= 1 (seeds per compared model), got {seeds}")
    if time_budget_s is not None and not time_budget_s > 0:
        raise UserError(f"the time budget must be > 0 seconds, got {time_budget_s}")
    return Experiment(
        kind="compare",
        name=path.stem,
        path=path,
        budgets=(comp.flop_budget,),
        members=tuple(members),
        learning_rates=comp.learning_rates,
        size=None,
        overrides=comp.set,
        eval_points=comp.eval_points,
        extra_seeds=(seeds or comp.seeds) - 1,
        sweep_fraction=comp.sweep_fraction,
        time_budget_s=time_budget_s or comp.time_budget_s,
        entropy=entropy[0] if entropy else None,
        entropy_budget=(entropy[0].flop_budget or comp.flop_budget) if entropy else 0.0,
        tokenizer=tokenizer,
        probes=comp.probes,
    )


# an ablation grid -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _AblationTable:
    budgets: tuple[float, ...]
    learning_rates: tuple[float, ...]
    extra_seeds: int = 2
    eval_points: int = 4
    set: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.budgets or not self.learning_rates:
            raise ValueError("budgets and learning_rates must be non-empty lists of positive numbers")
        for b in (*self.budgets, *self.learning_rates):
            _positive("budgets and learning_rates", b)
        if self.extra_seeds < 0 or self.eval_points < 1:
            raise ValueError(
                f"extra_seeds must be >= 0 and eval_points >= 1, got {self.extra_seeds} and "
                f"{self.eval_points}"
            )


@dataclasses.dataclass(frozen=True)
class _FamilyTable:
    name: str
    config: str  # relative to the grid file
    set: tuple[str, ...] = ()
    grid: Any = None  # {config key: [values]}
    sweep: Any = None  # {config key: one of its values}
    lr_from: str = ""
    ngram_from: str = ""

    def __post_init__(self) -> None:
        _name(self.name, "")
        grid = {} if self.grid is None else self.grid
        if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
            raise ValueError(f"grid must map config keys to non-empty lists of values, got {self.grid!r}")
        sweep = {} if self.sweep is None else self.sweep
        if not isinstance(sweep, dict) or any(k not in grid or v not in grid[k] for k, v in sweep.items()):
            raise ValueError(
                f"sweep must pick one listed value of some grid keys, got {self.sweep!r} for grid {grid!r}"
            )


@dataclasses.dataclass(frozen=True)
class _EntropyTable:
    config: str
    flop_budget: float
    set: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _positive("flop_budget (the entropy model's own training FLOPs)", self.flop_budget)


def load_grid(path: Path) -> Experiment:
    """An ablation grid (docs/ablations.md)."""
    raw = read_sections(path, "grid", ("ablation", "size", "entropy", "family"))
    ab = _section(f"grid {path}", "ablation", _AblationTable, raw.get("ablation", {}))
    size = _section(f"grid {path}", "size", SizeRule, raw.get("size", {}))
    if not isinstance(raw.get("family", []), list):
        raise UserError(f"grid {path}: family must be [[family]] tables")
    members = []
    for i, table in enumerate(raw.get("family", [])):
        where = f"grid {path} [[family]] #{i + 1}"
        f = _section(where, "family", _FamilyTable, table)
        members.append(
            Member(
                f.name,
                _config_path(path, where, f.config),
                f.set,
                tuple((k, tuple(v)) for k, v in (f.grid or {}).items()),
                tuple((f.sweep or {}).items()),
                f.lr_from or None,
                f.ngram_from or None,
            )
        )
    _check_names(path, "grid", members, reserved=("entropy",))
    entropy = None
    if "entropy" in raw:
        e = _section(f"grid {path}", "entropy", _EntropyTable, raw["entropy"])
        entropy = Member(
            "entropy",
            _config_path(path, f"grid {path} [entropy]", e.config),
            e.set,
            role="entropy",
            flop_budget=e.flop_budget,
        )
    return Experiment(
        kind="ablate",
        name=path.stem,
        path=path,
        budgets=tuple(sorted(ab.budgets)),
        members=tuple(members),
        learning_rates=ab.learning_rates,
        size=size,
        overrides=ab.set,
        eval_points=ab.eval_points,
        extra_seeds=ab.extra_seeds,
        sweep_fraction=1.0,
        entropy=entropy,
        entropy_budget=(entropy.flop_budget or 0.0) if entropy else 0.0,
    )


def cell_label(cell: dict) -> str:
    """``{"model.patch_size": 4}`` -> ``"patch_size=4"`` (the table's and the run directory's name)."""
    return ",".join(f"{k.split('.', 1)[-1]}={v}" for k, v in cell.items()) or "base"


def tokenizer_kind(cell: dict) -> tuple[str, str]:
    """A cell's subword tokenizer kind and encoder rule (``""``: the kind's own)."""
    kind, encoder = str(cell.get("tokenizer.kind", "bpe")), str(cell.get("tokenizer.encoder", ""))
    if kind not in KINDS:
        raise UserError(f"tokenizer.kind = {kind!r} in a cell; use one of {list(KINDS)}")
    return kind, encoder
