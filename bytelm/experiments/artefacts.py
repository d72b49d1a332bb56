"""Stage 1 of an experiment: the artefacts its members' families name
(:attr:`bytelm.families.Task.artefacts`), made before any member trains: the subword tokenizers
(one per tokenizer setting of the cells, trained here with ``bytelm.baselines``) and the entropy
model (a run of its own, at its own budget). :class:`ArtefactStage` is the part of
:class:`~bytelm.experiments.runner.Runner` that plans them, makes them and points runs at them."""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bytelm.atomic import atomic_directory
from bytelm.baselines import OWN_ENCODER, is_saved, load_tokenizer, train_tokenizer
from bytelm.config import Config, load_config, section_overrides
from bytelm.data import Corpus
from bytelm.errors import UserError
from bytelm.experiments.runs import Run
from bytelm.experiments.spec import (
    TOKENIZER_DIR,
    TOKENIZER_KEYS,
    TOKENIZER_OPTIONS,
    Experiment,
    Member,
    tokenizer_kind,
)
from bytelm.families import ARTEFACT_KINDS, task_class
from bytelm.training.distributed import barrier, is_primary


class ArtefactStage:
    """Tokenizers and the entropy model of an experiment (see the module docstring)."""

    if TYPE_CHECKING:  # the runner's (bytelm.experiments.runner.Runner)
        exp: Experiment
        out: Path
        mode: str
        scale: float
        runs: dict[str, Run]
        corpus: Corpus
        failed_artefacts: dict[str, str]

        say: Callable[[str], None]

        def bar(self, stage: str): ...
        def timed(self, stage: str, t0: float) -> float: ...
        def plain(self, member: Member) -> Config: ...
        def layout(self, run: Run) -> tuple[str, Path]: ...
        def cell_changes(self, member: Member, cell: dict) -> dict: ...
        def schedule(self, run: Run, member: Member, cfg: Config, *, timed: bool) -> None: ...
        def execute(self, runs: list[Run], stage: str) -> None: ...

    def tokenizer_dir(self, cell: dict) -> Path:
        if TOKENIZER_DIR in cell:
            return Path(cell[TOKENIZER_DIR])
        kind, encoder = tokenizer_kind(cell)
        rule = "" if encoder in ("", OWN_ENCODER[kind]) else f"-{encoder}"
        return (
            self.out
            / "tokenizers"
            / f"{kind}-{cell['tokenizer.vocab_size']}-{cell['tokenizer.pattern']}{rule}"
        )

    def cell_tokenizer(self, cell: dict) -> dict:
        """A cell's subword tokenizer keys: its own (a grid's), else the experiment's one (a preset's)."""
        own = {k: v for k, v in cell.items() if k in (*TOKENIZER_KEYS, *TOKENIZER_OPTIONS, TOKENIZER_DIR)}
        return own or dict(self.exp.tokenizer)

    def artefact_values(self, member: Member, cell: dict, cfg: Config) -> dict:
        """The config values pointing a run at the artefacts its family names (tokenizer, entropy run)."""
        out = {}
        model = cfg.require_model()
        for field, kind in task_class(model.family).artefacts_of(model).items():
            if kind == "tokenizer":
                tok = self.cell_tokenizer(cell)
                if TOKENIZER_DIR not in tok and not all(k in tok for k in TOKENIZER_KEYS):
                    raise UserError(f"a {model.family} cell needs tokenizer.vocab_size and tokenizer.pattern")
                out[f"model.{field}"] = self.tokenizer_dir(tok).absolute()
            elif kind == "entropy_model":
                if self.exp.entropy is None:
                    maker = (
                        "a [[model]] with role = 'entropy'"
                        if self.exp.kind == "compare"
                        else "an [entropy] table"
                    )
                    raise UserError(
                        f"{self.exp.kind} {self.exp.path}: {member.name!r} ({model.family}) needs "
                        f"{ARTEFACT_KINDS[kind].noun}, but it has none: add {maker}"
                    )
                out[f"model.{field}"] = self.entropy_run().run_dir.absolute()
            else:
                raise UserError(
                    f"{member.name!r} needs {ARTEFACT_KINDS[kind].noun}, which an experiment cannot make"
                )
        return out

    def tokenizer_cells(self) -> list[dict]:
        """The distinct subword tokenizers the members' cells need."""
        seen = {}
        for m in self.exp.members:
            try:
                model = self.plain(m).require_model()
            except (UserError, ValueError):
                continue  # a bad member is reported with its cells
            if "tokenizer" not in task_class(model.family).artefacts_of(model).values():
                continue
            for cell in m.cells():
                tok = self.cell_tokenizer(cell)
                if TOKENIZER_DIR in tok or all(k in tok for k in TOKENIZER_KEYS):
                    seen[self.tokenizer_dir(tok)] = tok
        return list(seen.values())

    def needs_entropy_model(self) -> bool:
        for m in self.exp.members:
            for cell in m.cells():
                try:
                    model = dataclasses.replace(self.plain(m).require_model(), **self.cell_changes(m, cell))
                except (UserError, ValueError):
                    continue  # a bad cell is reported with the cells
                if "entropy_model" in task_class(model.family).artefacts_of(model).values():
                    return True
        return False

    def entropy_run(self) -> Run:
        """The entropy model's run (an artefact at its own budget)."""
        member = self.exp.entropy
        if member is None:
            raise RuntimeError(f"{self.exp.kind} {self.exp.path} has no entropy model")
        run = Run("artefacts", member.name, {}, 0, self.exp.entropy_budget * self.scale, None, 0)
        run.id, run.run_dir = self.layout(run)
        if run.id in self.runs:
            return self.runs[run.id]
        self.runs[run.id] = run
        try:
            self.schedule(run, member, self.plain(member), timed=False)
        except (UserError, ValueError) as e:
            run.error = str(e)
        if run.error is None and run.failure_file.is_file():
            run.error = (
                f"{run.failure_file.read_text().strip()} (recorded in {run.failure_file}; delete "
                f"{run.run_dir} to retry)"
            )
        return run

    def train_tokenizer(self, tok: dict) -> str | None:
        """A cell's tokenizer (kept when one is saved already, if it is the one asked for): the command
        that makes it in print mode, else None."""
        tdir = self.tokenizer_dir(tok)
        if TOKENIZER_DIR in tok:  # made elsewhere: used as is
            if not is_saved(tdir):
                self.failed_artefacts[str(tdir)] = (
                    f"tokenizer.dir = {tdir} holds no tokenizer: train one there (bytelm tokenizer train) or "
                    "import one (bytelm tokenizer import)"
                )
            elif getattr(given := load_tokenizer(tdir), "lossy", None):
                self.failed_artefacts[str(tdir)] = (
                    f"tokenizer.dir = {tdir}: {given.lossy}: BPB would not be a likelihood of the held-out "
                    "bytes; give a byte-exact tokenizer (an HF ByteLevel BPE with add_prefix_space=false, a "
                    "tiktoken import, or one bytelm trains)"
                )
            else:
                self.say(f"tokenizer {tdir}: given, used as is")
            return None
        kind, encoder = tokenizer_kind(tok)
        vocab, pattern = int(tok["tokenizer.vocab_size"]), str(tok["tokenizer.pattern"])
        if is_saved(tdir):
            have = load_tokenizer(tdir)
            wanted = (kind, encoder or have.encoders[0])
            # (a corpus can run out of merges or pieces: fewer ids than asked for are the same tokenizer)
            if (have.kind, have.encoder) != wanted or have.n_vocab > vocab:
                raise UserError(
                    f"{tdir} holds a {have.kind} tokenizer (encoder {have.encoder}, {have.n_vocab} ids), but "
                    f"the {self.exp.kind} asks for {wanted[0]} (encoder {wanted[1]}, up to {vocab} ids): use "
                    "another --out, or delete it"
                )
            self.say(f"tokenizer {tdir.name}: exists, skipped")
            return None
        if self.mode == "print":
            data = " ".join(
                f"--set {shlex.quote(o)}"
                for o in section_overrides(
                    "data", self.plain(self.exp.members[0]).data, load_config(None).data
                )
            )
            rule = f" --encoder {shlex.quote(encoder)}" if encoder else ""
            return (
                f"bytelm tokenizer train {data} --kind {kind}{rule} --vocab-size {vocab} --pattern "
                f"{shlex.quote(pattern)} --out {shlex.quote(str(tdir))}"
            )
        if self.mode == "run" and not is_primary():  # (process 0 makes it; the others wait and read it)
            barrier(f"bytelm: tokenizer {tdir.name}")
            if not is_saved(tdir):
                self.failed_artefacts[str(tdir)] = "process 0 could not make it (its log says why)"
            return None
        if self.mode == "run":
            t0 = time.perf_counter()
            try:
                made = train_tokenizer(
                    kind,
                    self.corpus,
                    vocab_size=vocab,
                    pattern=pattern,
                    progress=self.bar(f"tokenizer {tdir.name}"),
                )
                if encoder and encoder != made.encoder:
                    made = made.with_encoder(encoder)
                with atomic_directory(tdir) as tmp:
                    made.save(tmp)
                dt = self.timed("tokenizer", t0)
                self.say(
                    f"tokenizer {tdir.name}: {made.kind}, {made.n_vocab} ids ({pattern}, encoder "
                    f"{made.encoder}) in {dt:.1f}s"
                )
            except (UserError, ValueError) as e:
                self.failed_artefacts[str(tdir)] = str(e)
                self.say(f"tokenizer {tdir.name}: FAILED: {e}")
            finally:
                barrier(f"bytelm: tokenizer {tdir.name}")
        return None

    def artefacts(self) -> list[str]:
        """Make what is missing (or return the commands that make it, in print mode)."""
        commands = [c for tok in self.tokenizer_cells() if (c := self.train_tokenizer(tok))]
        if self.exp.entropy is not None and self.needs_entropy_model():
            ent = self.entropy_run()
            if ent.error:
                self.failed_artefacts[ent.id] = ent.error
            elif not ent.finished():
                if self.mode == "print":
                    commands.append(ent.command())
                elif self.mode == "run":
                    self.execute([ent], "artefacts")
                    if ent.error:
                        self.failed_artefacts[ent.id] = ent.error
        return commands

    def artefacts_missing(self) -> bool:
        if any(not is_saved(self.tokenizer_dir(tok)) for tok in self.tokenizer_cells()):
            return True
        return (
            self.exp.entropy is not None and self.needs_entropy_model() and not self.entropy_run().finished()
        )
