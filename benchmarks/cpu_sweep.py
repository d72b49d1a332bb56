"""The sweep behind the CPU recipes (``configs/cpu/``): time-budgeted runs scored on a validation split.

Each family starts from its tiny preset (``configs/tiny/``) and goes through its knob groups in
order (for the byte LM shape, then learning rate, then batch; for the others the learning rate). Every
candidate of a group is trained for ``--seconds`` of training time (``train.time_budget_s``, compilation
included) on the training documents of ``--data`` (default: the stdlib corpus) less a validation split
(``data.validation_fraction=0.05``), and scored in bits per byte on that validation split; the
group's best candidate is kept for the next group (greedy coordinate descent). The held-out
segments choose nothing, and the corpus the recipes are later judged on (tiny shakespeare, the
UDHR) is never read. BLT's entropy model and the subword LM's tokenizer are made once, first, with
the recipes ``configs/cpu/entropy.toml`` and a 4096-id cl100k BPE.

``--recipes cpu2`` is their second round (ROUND_TWO_GROUPS): from each CPU recipe as the first round
left it, the shape (MegaByte, BLT, the subword LM), the batch, warmup, weight decay and the context,
with the first round's values pinned (ROUND_TWO_PINS).

``--recipes ten`` sweeps the ten-minute recipes instead (``--seconds 600``): it starts from the CPU
recipes and tries dropout and larger shapes, then Muon (the subword LM), or from the byte LM's
ten-minute recipe (as the first round left it: ``TEN_MINUTE_PINS``) Muon (``train.optimizer``), a
higher learning rate, a decay to zero, then hashed n-gram embeddings, dropout and width, then depth
and the lookup tables' learning rate, document masking, then weight decay, batch and warmup, then
the tables' size, dropout, n-gram row dropout and Muon's momentum, then soft-capped logits, QK-norm,
heads and MLP width, then a moving average of the weights, then half the batch, then dropout lower
or off, then more n-gram row dropout, then the tables' learning rate, Adam's beta2, the tables' size
and the average's decay again, then larger tables, then clipping, the learning rate, width, weight
decay, dropout, row dropout and the tables' learning rate again; BLT from its CPU recipe, n-gram row dropout
or fewer n-gram tables (``TEN_MINUTE_GROUPS``). A ten-minute run reads a few megabytes, so on the whole stdlib
corpus (about 30 MB) no run would see a byte twice and regularisation could never win; ``--sample-mb M``
sweeps instead on a fixed sample of the stdlib's files of about ``M`` megabytes (files ordered by the SHA-256
of their path, copied under ``--out``, cut into paragraphs as the race cuts its corpora), the laptop case of
one book or one project's sources.

A time budget gives a faster machine more steps, and a candidate can win at one machine's pace and
lose at another's (regularisation pays more the longer a run is). ``--also-steps N`` trains every
candidate a second time for a fixed ``N`` steps without a time budget (the same steps on any
machine; for the ten-minute byte recipe, 1400 is what ten minutes give it on the Intel Xeons), and a
candidate then replaces the best so far only if it scores lower at both paces (``pick``).

At a fixed step count a run is deterministic on one kind of machine, but a different seed (the
initialisation, the batches, the dropout masks) moves the score by as much as most candidates do
(``benchmarks/RESULTS.md`` at 3372114, twenty-seventh session). ``--seeds N`` trains every candidate with the
seeds 0 to N-1 and compares the mean of their scores at each pace (seed 0 is the run a single-seed
sweep makes, so its results are reused).

Finished runs are reused (each candidate's directory is named after its preset, budget, data and
overrides), so an interrupted sweep continues where it stopped. Prints one table per family and, last, one
JSON line: the chosen overrides and validation BPB per family. A full sweep at 100 s takes about 35 minutes on
a 2-core CPU; nothing else should run meanwhile (the budget is wall-clock time).

    python benchmarks/cpu_sweep.py [--seconds 100] [--family byte ...] [--out runs/cpu_sweep]
    python benchmarks/cpu_sweep.py --recipes ten --family byte --seconds 600 --sample-mb 1.2 --also-steps 1400
        [--seeds 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from results import record

from bytelm.config import load_config
from bytelm.data import load_corpus_from_config
from bytelm.data.sources import StdlibSource
from bytelm.evaluation.evaluator import evaluate_run
from bytelm.evaluation.results import EvalSet
from bytelm.training.host import configure_cpu_devices

SWEEP_SET = ("data.validation_fraction=0.05", "eval.every=0", "train.checkpoint_every=100000")

# Per family: the starting preset, then knob groups tried in order. Each candidate is a tuple of
# overrides; () keeps the current best. Shapes keep the context at 256 so that every 256-byte
# evaluation segment lies inside the training context.
GROUPS: dict[str, tuple[str, list[list[tuple[str, ...]]]]] = {
    "byte": (
        "tiny/byte",
        [
            [
                (),
                ("model.d_model=128", "model.n_layers=3", "model.n_heads=2", "model.mlp_dim=352"),
                ("model.d_model=192", "model.n_heads=3", "model.mlp_dim=512"),
                ("model.d_model=384", "model.n_layers=3", "model.n_heads=6", "model.mlp_dim=1024"),
            ],
            [(), ("train.learning_rate=1.5e-3",), ("train.learning_rate=6e-3",)],
            [(), ("train.batch_size=8",), ("train.batch_size=32",)],
        ],
    ),
    "megabyte": (
        "tiny/megabyte_p4",
        [
            [(), ("train.learning_rate=6e-3",), ("train.learning_rate=1.2e-2",)],
        ],
    ),
    "blt": (
        "tiny/blt",
        [
            [(), ("train.learning_rate=6e-3",), ("train.learning_rate=1.2e-2",)],
        ],
    ),
    "bpe": (
        "tiny/bpe",
        [
            [(), ("train.learning_rate=6e-3",), ("train.learning_rate=1.2e-2",)],
        ],
    ),
}

# The second round of the CPU recipes (--recipes cpu2, eighteenth session): from each family's
# recipe as the first round (GROUPS) left it, the knobs that round did not try: the shape (MegaByte,
# BLT, the subword LM), the batch, the context, warmup and weight decay. Each group keeps its best.
# The batch, warmup and weight decay, after the shape; then twice the context at half the batch
# (the same tokens per step). The byte LM's shape and batch came from the first round.
_SCHEDULE = [[(), ("train.warmup_steps=20",)], [(), ("train.weight_decay=0",), ("train.weight_decay=0.3",)]]
_BATCH = [[(), ("train.batch_size=8",), ("train.batch_size=32",)]]
_CONTEXT = [[(), ("train.seq_len=512", "train.batch_size=8")]]
ROUND_TWO_GROUPS: dict[str, tuple[str, list[list[tuple[str, ...]]]]] = {
    "byte": ("cpu/byte", [*_CONTEXT, [(), ("model.document_mask=true",)], *_SCHEDULE]),
    "megabyte": (
        "cpu/megabyte",
        [
            [
                (),
                ("model.global.layers=2",),
                (
                    "model.embed_dim=48",
                    "model.global.d_model=192",
                    "model.global.heads=3",
                    "model.global.mlp_dim=512",
                ),
            ],
            *_BATCH,
            *_SCHEDULE,
            *_CONTEXT,
        ],
    ),
    "blt": (
        "cpu/blt",
        [
            [
                (),
                ("model.global.layers=2", "model.local.decoder_layers=1"),
                ("model.global.d_model=192", "model.global.heads=3", "model.global.mlp_dim=512"),
            ],
            *_BATCH,
            *_SCHEDULE,
            *_CONTEXT,
        ],
    ),
    "bpe": (
        "cpu/bpe",
        [
            [
                (),
                ("model.d_model=192", "model.n_layers=3", "model.n_heads=3", "model.mlp_dim=512"),
                ("model.n_layers=2",),
            ],
            *_BATCH,
            *_SCHEDULE,
            [(), ("train.seq_len=512", "train.batch_size=4")],  # batch 8 -> 4: the same tokens
        ],
    ),
}
# Pinned under every candidate of the second round: the values the recipe files held when it began,
# for every knob it tries, so that the chain reproduces whatever the files hold after it.
_OPTIM_PINS = ("train.batch_size=16", "train.seq_len=256", "train.warmup_steps=60", "train.weight_decay=0.1")
ROUND_TWO_PINS: dict[str, tuple[str, ...]] = {
    "byte": (*_OPTIM_PINS, "model.document_mask=false"),
    "megabyte": (
        *_OPTIM_PINS,
        "model.global.layers=4",
        "model.embed_dim=64",
        "model.global.d_model=256",
        "model.global.heads=4",
        "model.global.mlp_dim=704",
    ),
    "blt": (
        *_OPTIM_PINS,
        "model.global.layers=3",
        "model.local.decoder_layers=2",
        "model.global.d_model=256",
        "model.global.heads=4",
        "model.global.mlp_dim=704",
    ),
    "bpe": (*_OPTIM_PINS, "model.d_model=256", "model.n_layers=4", "model.n_heads=4", "model.mlp_dim=704"),
}

# The ten-minute sweep (--recipes ten): from the CPU recipes, dropout and larger shapes; for the byte
# LM, from its ten-minute recipe, the optimizer, the learning rate and the floor of the decay.
TEN_MINUTE_GROUPS: dict[str, tuple[str, list[list[tuple[str, ...]]]]] = {
    # The first sweep (eleventh session, docs/cpu.md at 3372114) went from cpu/byte: the preset 1.5773, with
    # dropout 0.1 1.6107, 4 x 192 with dropout 0.1 1.5441 -> cpu/byte_10min. This one goes on from it.
    "byte": (
        "cpu/byte_10min",
        [
            [(), ("train.optimizer=muon",)],
            [(), ("train.learning_rate=6e-3",)],
            [(), ("train.min_lr_ratio=0",)],
            [(), ("train.learning_rate=1.2e-2",)],
            [(), ("train.optimizer=adamw",)],  # the optimizer again, at the learning rate chosen for Muon
            # thirteenth session: BLT's hashed n-gram embeddings added to the byte embedding
            [(), ("model.ngram_sizes=2,3,4",)],
            [(), ("model.ngram_sizes=2,3,4,5,6",)],
            [(), ("model.dropout=0.2",)],
            [(), ("model.ngram_sizes=2,3",)],
            [(), ("model.d_model=256", "model.n_heads=4", "model.mlp_dim=704")],
            # fourteenth session, with the hashed dropout masks (about 7% off the step): the depth. The
            # current depth is named, not inherited, so that the baseline trains again with the new masks
            [("model.n_layers=4",), ("model.n_layers=5",)],
            [(), ("train.embedding_lr_scale=4",)],  # the lookup tables' learning rate (optim.py)
            [(), ("train.embedding_lr_scale=16",)],
            [(), ("train.embedding_lr_scale=64",)],
            # fifteenth session: each training window's documents attend (and read n-grams) only
            # within themselves, as evaluation scores each segment alone (model.document_mask)
            [(), ("model.document_mask=true",)],
            # seventeenth session: the optimisation knobs no round had tried (each on the same best so far)
            [
                (),
                ("train.weight_decay=0.3",),
                ("train.weight_decay=0.03",),
                ("train.weight_decay=0",),
                ("train.batch_size=32",),
                ("train.warmup_steps=20",),
            ],
            # nineteenth session: the n-gram tables' size, dropout again (now with the tables at 16x and
            # document masking), whole n-gram rows dropped (model.ngram_dropout), Muon's momentum
            [
                (),
                ("model.hash_table_size=2047",),
                ("model.hash_table_size=16383",),
                ("model.dropout=0.2",),
                ("model.ngram_dropout=0.1",),
                ("model.ngram_dropout=0.3",),
                ("train.muon_momentum=0.9",),
            ],
            # twenty-first session (none won; 0 1.4017, 30 1.4026, 15 1.4054; QK-norm 1.4153, with 1.2e-2
            # 1.4660; 6 heads 1.4129; MLP 768 1.4367): the logits soft-capped (model.logit_softcap); the
            # cap 0 named, so that the best so far trains again in this sitting
            [("model.logit_softcap=0",), ("model.logit_softcap=30",), ("model.logit_softcap=15",)],
            # then the queries and keys RMS-normalised (model.qk_norm), at the learning rate and at twice it
            [(), ("model.qk_norm=true",), ("model.qk_norm=true", "train.learning_rate=1.2e-2")],
            # then six heads of 32 dimensions instead of three of 64, and a wider MLP
            [(), ("model.n_heads=6",), ("model.mlp_dim=768",)],
            # twenty-second session (0.99 1.3846, 0.995 1.4022; the best so far 1.4017): the weights'
            # bias-corrected moving average as the model (train.ema_decay)
            [(), ("train.ema_decay=0.99",), ("train.ema_decay=0.995",)],
            # then, the average smoothing the last steps' noise, a higher floor of the decay or a higher peak
            # (neither won: 0.3 1.3983, 9e-3 1.4139; the best so far 1.3846)
            [(), ("train.min_lr_ratio=0.3",), ("train.learning_rate=9e-3",)],
            # twenty-third session: half the batch (about twice the steps in the same time), alone and
            # with the average's window kept in bytes (0.995); the batch named, so that the best so far
            # trains again in this sitting
            # (batch 8 lost: 1.4274 at 1,642 steps, against 1.3898 at 948; with the average at 0.995 it was
            # stopped a quarter of the way, behind)
            [
                ("train.batch_size=16",),
                ("train.batch_size=8",),
                ("train.batch_size=8", "train.ema_decay=0.995"),
            ],
            # then dropout lower or off: the first sweep last tried it off at 3 x 128, before the n-gram
            # tables, their row dropout and the average (off won: 1.3524; 0.05 1.3684; the best so far 1.3846)
            [(), ("model.dropout=0",), ("model.dropout=0.05",)],
            # twenty-fourth session, scored at ten minutes and at a fixed 1,400 steps (the Intel Xeons'
            # ten-minute count): more n-gram rows dropped, without dropout (0.3 won at both: 1.3380 and
            # 1.3102, against 1.3452 and 1.3255)
            [(), ("model.ngram_dropout=0.3",)],
            # twenty-fifth session: past that edge (0.5 lost at 1,400 steps, 1.3334 against 1.3102, so it
            # was not trained for 600 s: a loss at either pace keeps the best so far)
            [(), ("model.ngram_dropout=0.5",)],
            # twenty-sixth session, each at 1,400 steps and the winner also at 600 s: the knobs of the
            # tables again, now that their rows are dropped at 0.3 (16383 rows won at both paces: 1.3057
            # and 1.3437, against 1.3102 and 1.3495; the tables at 8x 1.3237, beta2 0.99 1.3212, the
            # average's decay 0.98 1.3202, each a loss at 1,400 steps and so not trained for 600 s)
            [
                (),
                ("train.embedding_lr_scale=8",),
                ("train.beta2=0.99",),
                ("model.hash_table_size=16383",),
                ("train.ema_decay=0.98",),
            ],
            # then twice the rows again (32767: 1.3036 at 1,400 steps against 16383's 1.3057, with a step
            # about a sixth slower than 8191 rows; not yet trained for 600 s, so not chosen)
            [(), ("model.hash_table_size=32767",)],
            # twenty-seventh session, at 1,400 steps on an H200 (benchmarks/RESULTS.md at 3372114; best so far
            # 1.3099 there): clipping at 0.5 1.2942, the learning rate 4.5e-3 1.2961, width 256 1.2991, weight
            # decay 0.2 1.3102, row dropout 0.4 1.3127, dropout 0.05 1.3140, the tables at 24x 1.3166. The
            # first two did not hold on the CPU (clipping at 0.5 1.3045 against 1.3057; with 4.5e-3 as well
            # 1.3206), and all lie inside the best so far's spread over three seeds (1.2928-1.3079); none was
            # trained for 600 s
            [
                (),
                ("train.grad_clip=0.5",),
                ("train.learning_rate=4.5e-3",),
                ("model.d_model=256", "model.n_heads=4", "model.mlp_dim=704"),
                ("train.weight_decay=0.2",),
                ("model.ngram_dropout=0.4",),
                ("model.dropout=0.05",),
                ("train.embedding_lr_scale=24",),
            ],
        ],
    ),
    "bpe": (
        "cpu/bpe",
        [
            [(), ("model.dropout=0.1",), ("model.dropout=0.25",), ("model.dropout=0.4",)],
            # fourteenth session: Muon, as for the byte LM (the optimizer named in both candidates, so
            # that the baseline trains again with the hashed dropout masks)
            [("train.optimizer=adamw",), ("train.optimizer=muon",)],
        ],
    ),
    # twentieth session: BLT's 100-second recipe memorises a megabyte in ten minutes through its six
    # n-gram tables (training loss 0.47 nats, 2.84 BPB held out on tiny shakespeare): whole rows of
    # them dropped (model.ngram_dropout), or only the 3- and 4-gram tables
    "blt": (
        "cpu/blt",
        [
            [(), ("model.ngram_dropout=0.25",), ("model.ngram_dropout=0.5",), ("model.ngram_sizes=3,4",)],
            [(), ("model.ngram_dropout=0.7",)],  # past the first group's edge (0.25: 1.6096, 0.5: 1.5088)
        ],
    ),
}
# Set under every candidate of a family (before its own overrides, which win): the byte chain starts
# from cpu/byte_10min as the first sweep left it, whatever the file holds now (the file keeps each
# round's choice: every setting a later round chose is pinned back here), and runs its stack
# unscanned, as the rounds were measured.
TEN_MINUTE_PINS: dict[str, tuple[str, ...]] = {
    "byte": (
        "train.optimizer=adamw",
        "train.learning_rate=3e-3",
        "model.ngram_sizes=[]",
        "model.scan_layers=false",
        "train.embedding_lr_scale=1",
        "model.document_mask=false",
        "model.ngram_dropout=0",
        "train.ema_decay=0",
        "model.dropout=0.1",
    ),
}


def label(overrides: tuple[str, ...], group: int = 0) -> str:
    return " ".join(overrides) or ("(preset)" if group == 0 else "(best so far)")


def run_name(
    family: str, preset: str, pace: str, data: str, overrides: tuple[str, ...], fixed: tuple[str, ...] = ()
) -> str:
    """A candidate's directory: its family and a hash of everything its result depends on, so a
    cached result is only reused for the same preset, pace (``"600"`` seconds, ``"1400steps"``),
    data, pins and overrides."""
    key = "\n".join([preset, pace, data, *sorted(overrides), *(("pinned:", *fixed) if fixed else ())])
    return f"{family}-" + hashlib.sha256(key.encode()).hexdigest()[:10]


def pick(scores: list[tuple[float, ...]]) -> int:
    """The index of a group's winner, from each candidate's validation BPB at every pace. The first
    candidate is the best so far and stays unless another scores lower at every pace; of those, the
    one with the lowest product of its ratios to the first wins (at one pace: the lowest score)."""
    first = scores[0]
    better = [
        (math.fsum(math.log(b / f) for b, f in zip(row, first)), i)
        for i, row in enumerate(scores)
        if i and all(b < f for b, f in zip(row, first))
    ]
    return min(better)[1] if better else 0


def data_tag(data: str) -> str:
    return hashlib.sha256(data.encode()).hexdigest()[:8]


def bytelm(*args: str) -> None:
    cmd = [sys.executable, "-m", "bytelm", *args]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def stdlib_sample(out: Path, megabytes: float) -> str:
    """A ``files:`` spec of a fixed sample of the stdlib corpus's files, about ``megabytes`` MB:
    files in the order of the SHA-256 of their relative path, taken until the total reaches it,
    copied under ``out`` (kept when already there)."""
    source = StdlibSource()
    files = sorted(
        source.files(),
        key=lambda f: hashlib.sha256(f.relative_to(source.root).as_posix().encode()).hexdigest(),
    )
    folder = out / f"stdlib-sample-{megabytes:g}mb"
    if not (folder / ".complete").is_file():
        total, limit = 0, megabytes * 1e6
        for f in files:
            if total >= limit:
                break
            data = f.read_bytes()
            target = folder / f.relative_to(source.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            total += len(data)
        (folder / ".complete").write_text(f"{total} bytes\n")
    return f"files:{folder.resolve()}?split=paragraph"


class Sweep:
    def __init__(
        self,
        out: Path,
        data: str,
        seconds: float,
        groups: dict,
        pins: dict | None = None,
        also_steps: int | None = None,
        seeds: int = 1,
    ):
        self.out, self.data, self.seconds, self.groups = out, data, seconds, groups
        self.also_steps = also_steps
        self.seeds = seeds
        self.pins = pins or {}
        self.common = (f"data.source={data}", *SWEEP_SET)
        self.validation: EvalSet | None = None
        self.results: dict[str, dict] = {}

    def artefacts(self, family: str) -> tuple[str, ...]:
        if family == "blt":
            entropy = self.out / f"entropy-{data_tag(self.data)}"
            if (
                not (entropy / "run.json").is_file()
                or json.loads((entropy / "run.json").read_text()).get("status") != "finished"
            ):
                bytelm("train", "cpu/entropy", "--out", str(entropy), *[f"--set={s}" for s in self.common])
            return (f"model.entropy_run={entropy}",)
        if family == "bpe":
            tok = self.out / f"tokenizer-4096-{data_tag(self.data)}"
            if not (tok / "tokenizer.json").is_file():
                bytelm(
                    "tokenizer",
                    "train",
                    "--data",
                    self.data,
                    "--vocab-size",
                    "4096",
                    "--pattern",
                    "cl100k",
                    "--out",
                    str(tok),
                )
            return (f"model.tokenizer={tok}",)
        return ()

    def score(
        self,
        preset: str,
        family: str,
        overrides: tuple[str, ...],
        fixed: tuple[str, ...],
        steps: int | None = None,
    ) -> dict:
        """Train one candidate for ``self.seconds`` of training time, or for ``steps`` steps without
        a time budget, once per seed (0 to ``self.seeds`` - 1), and score it on the validation
        split: seed 0's row, with ``validation_bpb`` the mean over the seeds and each seed's score
        and steps under ``seeds``."""
        rows = [
            self.score_seed(preset, family, overrides + ((f"train.seed={k}",) if k else ()), fixed, steps)
            for k in range(self.seeds)
        ]
        if self.seeds == 1:
            return rows[0]
        return {
            **rows[0],
            "validation_bpb": math.fsum(r["validation_bpb"] for r in rows) / len(rows),
            "seeds": [{"validation_bpb": r["validation_bpb"], "steps": r["steps"]} for r in rows],
        }

    def score_seed(
        self,
        preset: str,
        family: str,
        overrides: tuple[str, ...],
        fixed: tuple[str, ...],
        steps: int | None = None,
    ) -> dict:
        """One training run of a candidate and its validation score (cached in its run directory)."""
        pace = f"{steps}steps" if steps else f"{self.seconds:g}"
        run_dir = self.out / "runs" / run_name(family, preset, pace, self.data, overrides, fixed)
        cached = run_dir / "validation.json"
        if cached.is_file():
            return json.loads(cached.read_text())
        sets = (*self.common, *fixed, *overrides)
        budget = (
            ("train.time_budget_s=0", f"train.steps={steps}")
            if steps
            else (f"train.time_budget_s={self.seconds}",)
        )
        t0 = time.perf_counter()
        bytelm("train", preset, "--out", str(run_dir), *[f"--set={s}" for s in (*budget, *sets)])
        wall = time.perf_counter() - t0
        if self.validation is None:
            cfg = load_config(preset, list(sets))
            self.validation = EvalSet.from_corpus(load_corpus_from_config(cfg.data), "validation")
        result = evaluate_run(run_dir, self.validation)
        row = {
            "overrides": list(overrides),
            "validation_bpb": result.bpb,
            "steps": result.step,
            "params": result.params.get("total"),
            "wall_s": round(wall, 1),
            "fingerprint": self.validation.fingerprint,
        }
        cached.write_text(json.dumps(row))
        return row

    def family(self, family: str) -> dict:
        preset, groups = self.groups[family]
        fixed = (*self.artefacts(family), *self.pins.get(family, ()))
        best: tuple[str, ...] = ()
        table = []
        n = self.also_steps
        for g, group in enumerate(groups):
            scores, options = [], []
            for cand in group:
                overrides = (
                    tuple(o for o in best if not any(o.split("=")[0] == c.split("=")[0] for c in cand)) + cand
                )
                row = self.score(preset, family, overrides, fixed)
                at_steps = self.score(preset, family, overrides, fixed, steps=n) if n else None
                table.append((g, label(cand, g), row, at_steps))
                scores.append((row["validation_bpb"],) + ((at_steps["validation_bpb"],) if at_steps else ()))
                options.append(overrides)
                print(
                    f"[{family}] group {g} {label(cand, g)}: validation BPB {row['validation_bpb']:.4f} "
                    f"({row['steps']} steps)"
                    + (f", {at_steps['validation_bpb']:.4f} at {n} steps" if at_steps else ""),
                    flush=True,
                )
            best = options[pick(scores)]
        print(
            f"\n## {family} (start: {preset}; {self.seconds:g} s per run"
            + (f", and {n} steps" if n else "")
            + (f"; each score the mean of seeds 0-{self.seeds - 1}, steps seed 0's" if self.seeds > 1 else "")
            + ")\n"
        )
        extra = (f" BPB at {n} steps |", "---:|") if n else ("", "")
        print(
            f"| group | candidate | validation BPB | steps | params | wall s |{extra[0]}\n"
            f"|---:|---|---:|---:|---:|---:|{extra[1]}"
        )
        for g, lab, row, at_steps in table:
            print(
                f"| {g} | {lab} | {row['validation_bpb']:.4f} | {row['steps']} | {row['params']:,} | "
                f"{row['wall_s']} |" + (f" {at_steps['validation_bpb']:.4f} |" if at_steps else "")
            )
        chosen = self.score(preset, family, best, fixed)
        chosen_at_steps = self.score(preset, family, best, fixed, steps=n) if n else None
        print(
            f"\nchosen for {family}: {label(best)} -> {chosen['validation_bpb']:.4f}"
            + (f" ({chosen_at_steps['validation_bpb']:.4f} at {n} steps)" if chosen_at_steps else "")
            + "\n",
            flush=True,
        )
        return {
            "preset": preset,
            "overrides": list(best),
            "validation_bpb": round(chosen["validation_bpb"], 4),
            **(
                {"validation_bpb_at_steps": round(chosen_at_steps["validation_bpb"], 4)}
                if chosen_at_steps
                else {}
            ),
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=100.0, help="training time per run (default 100)")
    p.add_argument(
        "--family",
        action="append",
        choices=sorted(GROUPS),
        help="families to sweep (repeatable; default all of the recipe set)",
    )
    p.add_argument(
        "--recipes",
        choices=("cpu", "cpu2", "ten"),
        default="cpu",
        help="cpu: the CPU recipes from the tiny presets (GROUPS); cpu2: their second round, from the CPU "
        "recipes (ROUND_TWO_GROUPS); ten: the ten-minute recipes from the CPU ones (TEN_MINUTE_GROUPS)",
    )
    p.add_argument(
        "--data", default="stdlib", help="corpus spec whose validation split chooses (default stdlib)"
    )
    p.add_argument(
        "--sample-mb",
        type=float,
        default=None,
        help="sweep on a fixed sample of about this many megabytes of the stdlib's files instead of --data",
    )
    p.add_argument("--out", default="runs/cpu_sweep", help="output directory (default runs/cpu_sweep)")
    p.add_argument(
        "--also-steps",
        type=int,
        default=None,
        metavar="N",
        help="also train every candidate for N steps without a time budget (the step count --seconds "
        "gives on a faster machine); a candidate then replaces the best so far only if it scores "
        "lower at both paces",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=1,
        metavar="N",
        help="train every candidate with the seeds 0 to N-1 and compare the means of their scores "
        "(default 1; seed 0's runs are the single-seed sweep's, and are reused)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="append the JSON line to benchmarks/results/ (printed either way)",
    )
    args = p.parse_args()
    if args.seeds < 1:
        p.error(f"--seeds must be a positive number of seeds, not {args.seeds}")
    if args.also_steps is not None and args.also_steps < 1:
        p.error(f"--also-steps must be a positive number of steps, not {args.also_steps}")
    groups, pins = {
        "cpu": (GROUPS, None),
        "cpu2": (ROUND_TWO_GROUPS, ROUND_TWO_PINS),
        "ten": (TEN_MINUTE_GROUPS, TEN_MINUTE_PINS),
    }[args.recipes]
    families = args.family or list(groups)
    missing = [f for f in families if f not in groups]
    if missing:
        p.error(
            f"--recipes {args.recipes} has no candidates for {', '.join(missing)}; choose among "
            f"{', '.join(groups)}"
        )
    configure_cpu_devices()
    os.makedirs(args.out, exist_ok=True)
    data = stdlib_sample(Path(args.out), args.sample_mb) if args.sample_mb else args.data
    sweep = Sweep(
        Path(args.out), data, args.seconds, groups, pins, also_steps=args.also_steps, seeds=args.seeds
    )
    chosen = {f: sweep.family(f) for f in families}
    result = {
        "seconds": args.seconds,
        "also_steps": args.also_steps,
        "seeds": args.seeds,
        "recipes": args.recipes,
        "data": data,
        "validation_fingerprint": sweep.validation.fingerprint if sweep.validation else None,
        "chosen": chosen,
    }
    print(json.dumps(result))
    if args.record:
        record("cpu_sweep", result)


if __name__ == "__main__":
    main()
