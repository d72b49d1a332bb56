"""Probes on the identical held-out bytes: continuation choice, noised contexts, spelling minimal pairs.

docs/evaluation.md ("Probes") states each probe, its construction and its chance level. In short:

- **Probe sets** are built from the held-out segments of the evaluation set, deterministically
  from a seed (:func:`build_probe_set`); every string a probe scores is at most ``max_bytes``
  long (the corpus's ``segment_bytes``, which every model's window holds). The set is written to
  disk as JSON Lines (bytes in base64) and fingerprinted (sha256 of those lines), so every model
  is probed with the same bytes and a report names them.
- **Conditional scoring** for every family: ``log p(continuation | context) = log p(context +
  continuation) - log p(context)``, each string scored on its own from BOS by the model's own
  scorer (bytes, patches, chunks or a subword LM's tokens of the exact bytes), i.e. the code path of
  BPB (:func:`conditional_nats`).
- **Continuation choice**: a context and four continuations of the same number of characters, the
  true one and three spans of other held-out documents (of the same group where it has others);
  the model picks the highest log-likelihood per byte (ties split evenly: a uniform model scores
  exactly 0.25). Chance: 0.25.
- **Noised contexts**: the same items with the context noised by each of BLT's five noises
  (:mod:`bytelm.evaluation.noise`): accuracy per noise, H-Net's robustness score
  ``100 (acc_noised - 0.25) / (acc_clean - 0.25)`` (averaged over the noises, undefined when the
  clean accuracy is at chance or below), and the BPB of the true continuation given the noised
  context beside the clean context and no context, with ``R = 100 (b0 - b_noised) / (b0 - b_clean)``
  (100: the noise costs nothing; 0: the noised context is worth no more than none).
- **Spelling minimal pairs**: a held-out window around a word and the same window with that word
  altered by one character substitution, deletion, insertion or adjacent swap (CUTE's kinds); the
  model is right when the real window has the higher log-likelihood per byte (per byte: a total
  would favour every deletion and refuse every insertion, whatever the model knows of spelling;
  ties count half). Per edit kind and per frequency band of the word in a sample of the training
  documents. Chance: 0.5.

Every accuracy and BPB carries a 95% interval from the cluster bootstrap over held-out documents
(:mod:`bytelm.evaluation.stats`), overall and per group.
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from bytelm.atomic import atomic_write_text
from bytelm.bpb import LN2
from bytelm.evaluation import stats
from bytelm.evaluation.noise import NOISES, characters, encode, noise

PROBE_VERSION = 1
EDITS = ("substitute", "delete", "insert", "swap")
FREQUENT = 10  # a word seen at least this many times in the training sample is "frequent", else "rare"
MIN_ITEMS = 20  # fewer continuation items than this: the held-out part is too small to probe
TRAIN_SAMPLE_BYTES = 4 << 20  # the training sample word frequencies are counted on
CHANCE = {"choice": 0.25, "spelling": 0.5}
_WORD = re.compile(r"[^\W\d_]{4,}")

Scorer = Callable[[list[bytes]], np.ndarray]  # nats of each string, scored on its own from BOS


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """What a probe set is built with; ``max_bytes`` is the longest string scored."""

    max_bytes: int
    seed: int = 0
    choice_items: int = 96
    spelling_items: int = 96

    @property
    def continuation_chars(self) -> int:
        return max(4, self.max_bytes // 16)

    @property
    def context_bytes(self) -> int:
        """About 3/8 of the longest string: AntSpeak doubles a context, which must still fit."""
        return max(8, (3 * self.max_bytes) // 8)


@dataclasses.dataclass
class ProbeSet:
    settings: ProbeSettings
    choice: list[dict]
    spelling: list[dict]
    truncated: dict[str, int]  # per noise: noised contexts cut from the left to fit max_bytes

    def lines(self) -> list[str]:
        """The probe file: a header, then one item per line (bytes as base64)."""

        def enc(v):
            if isinstance(v, bytes):
                return {"b64": base64.b64encode(v).decode("ascii")}
            if isinstance(v, list):
                return [enc(x) for x in v]
            if isinstance(v, dict):
                return {k: enc(x) for k, x in v.items()}
            return v

        header = {
            "format": "bytelm-probes",
            "version": PROBE_VERSION,
            **dataclasses.asdict(self.settings),
            "continuation_chars": self.settings.continuation_chars,
            "context_bytes": self.settings.context_bytes,
            "choice_items": len(self.choice),
            "spelling_items": len(self.spelling),
            "truncated": self.truncated,
        }
        return [json.dumps(header)] + [json.dumps(enc(x)) for x in [*self.choice, *self.spelling]]

    @property
    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for line in self.lines():
            h.update(line.encode() + b"\n")
        return h.hexdigest()

    def write(self, path: str | Path) -> None:
        atomic_write_text(path, "\n".join(self.lines()) + "\n")


# -- building ------------------------------------------------------------------------------------
def _offsets(chars: list[str]) -> np.ndarray:
    """Byte offset of every character boundary (``len(chars) + 1`` of them)."""
    return np.concatenate([[0], np.cumsum([len(encode([c])) for c in chars])]).astype(np.int64)


def _doc_order(segments, rng: np.random.Generator) -> list[int]:
    """Segment positions in a seeded order that takes one segment of every document before a second."""
    perm = rng.permutation(len(segments))
    seen: collections.Counter = collections.Counter()
    rank = []
    for i in perm:
        rank.append(seen[segments[i].doc])
        seen[segments[i].doc] += 1
    return [int(perm[k]) for k in np.argsort(rank, kind="stable")]


def _fit_left(data: bytes, limit: int) -> tuple[bytes, bool]:
    """``data`` cut from the left at a character boundary to at most ``limit`` bytes."""
    if len(data) <= limit:
        return data, False
    chars = characters(data)
    off = _offsets(chars)
    k = int(np.searchsorted(off, len(data) - limit))
    return encode(chars[k:]), True


def _span(chars: list[str], start: int, n: int) -> bytes:
    return encode(chars[start : start + n])


def _item_of(segment, kind: str) -> dict:
    """What every probe item records of where it comes from."""
    return {"kind": kind, "doc": segment.doc, "name": segment.name, "group": segment.group}


def _choice_items(eval_set, settings: ProbeSettings, rng: np.random.Generator) -> tuple[list[dict], dict]:
    segs, data = eval_set.segments, eval_set.data
    n_cont, ctx_bytes, limit = settings.continuation_chars, settings.context_bytes, settings.max_bytes
    chars = [characters(d) for d in data]
    offs = [_offsets(c) for c in chars]
    by_group: dict[str, list[int]] = collections.defaultdict(list)
    for i, s in enumerate(segs):
        if len(chars[i]) >= n_cont:
            by_group[s.group].append(i)
    items: list[dict] = []
    truncated = {k: 0 for k in NOISES}
    for i in _doc_order(segs, rng):
        if len(items) >= settings.choice_items:
            break
        c, off = chars[i], offs[i]
        # split points: at least ctx_bytes of context before, n_cont characters after
        valid = np.flatnonzero((off[: len(c) - n_cont + 1] >= ctx_bytes))
        if not len(valid):
            continue
        at = int(valid[rng.integers(len(valid))])
        first = int(np.searchsorted(off, off[at] - ctx_bytes))
        context = encode(c[first:at])
        true = _span(c, at, n_cont)
        same = [j for j in by_group[segs[i].group] if segs[j].doc != segs[i].doc]
        pool = (
            same
            if len(same) >= 3
            else [j for g in by_group.values() for j in g if segs[j].doc != segs[i].doc]
        )
        if len(pool) < 3:
            continue
        distractors: list[bytes] = []
        for j in rng.permutation(pool):
            start = int(rng.integers(len(chars[j]) - n_cont + 1))
            span = _span(chars[j], start, n_cont)
            if span != true and span not in distractors:
                distractors.append(span)
            if len(distractors) == 3:
                break
        if len(distractors) < 3:
            continue
        answer = int(rng.integers(4))
        candidates = distractors[:answer] + [true] + distractors[answer:]
        longest = max(len(x) for x in candidates)
        if len(context) + longest > limit:
            continue
        noised = {}
        for k, kind in enumerate(NOISES):
            item_rng = np.random.default_rng([settings.seed, PROBE_VERSION, len(items), k])
            noised[kind], cut = _fit_left(noise(kind, context, item_rng), limit - longest)
            truncated[kind] += cut
        items.append(
            {
                **_item_of(segs[i], "choice"),
                "context": context,
                "candidates": candidates,
                "answer": answer,
                # (distractors from other groups are easier: another language's script, another package)
                "distractors": "same group" if pool is same else "any group",
                "noised": noised,
            }
        )
    return items, truncated


def _alter(word: str, edit: str, rng: np.random.Generator) -> str | None:
    """``word`` with one character edit of kind ``edit`` (letters drawn from the word itself), or
    None when the word allows no such edit."""
    letters = sorted(set(word))
    n = len(word)
    if edit == "substitute":
        p = int(rng.integers(n))
        others = [x for x in letters if x != word[p]]
        return None if not others else word[:p] + others[int(rng.integers(len(others)))] + word[p + 1 :]
    if edit == "delete":
        p = int(rng.integers(n))
        return word[:p] + word[p + 1 :]
    if edit == "insert":
        p = int(rng.integers(n + 1))
        return word[:p] + letters[int(rng.integers(len(letters)))] + word[p:]
    pairs = [p for p in range(n - 1) if word[p] != word[p + 1]]
    if not pairs:
        return None
    p = pairs[int(rng.integers(len(pairs)))]
    return word[:p] + word[p + 1] + word[p] + word[p + 2 :]


def train_word_counts(corpus, max_bytes: int = TRAIN_SAMPLE_BYTES) -> collections.Counter:
    """Word (``[^\\W\\d_]{4,}``, case kept) frequencies in a deterministic sample of the training
    documents (:meth:`~bytelm.data.Corpus.sample`)."""
    counts: collections.Counter = collections.Counter()
    idx, _ = corpus.sample("train", max_bytes)
    for d in idx:
        counts.update(_WORD.findall(corpus.document(int(d)).tobytes().decode("utf-8", errors="replace")))
    return counts


def _spelling_items(
    eval_set, settings: ProbeSettings, words: collections.Counter, rng: np.random.Generator
) -> list[dict]:
    segs, data = eval_set.segments, eval_set.data
    before, after = max(8, settings.max_bytes // 8), max(2, settings.max_bytes // 32)
    items: list[dict] = []
    for i in _doc_order(segs, rng):
        if len(items) >= settings.spelling_items:
            break
        text = data[i].decode("utf-8", errors="surrogateescape")
        found = [m for m in _WORD.finditer(text) if not any("\udc80" <= ch <= "\udcff" for ch in m.group())]
        if not found:
            continue
        m = found[int(rng.integers(len(found)))]
        word = m.group()
        edit = EDITS[len(items) % len(EDITS)]
        altered = None
        for _ in range(8):  # an edit that makes a string seen as a word in training is drawn again
            altered = _alter(word, edit, rng)
            if altered is not None and altered != word and altered not in words:
                break
            altered = None
        if altered is None:
            continue
        a, b = max(0, m.start() - before), min(len(text), m.end() + after)
        real = text[a:b].encode("utf-8", errors="surrogateescape")
        fake = (text[a : m.start()] + altered + text[m.end() : b]).encode("utf-8", errors="surrogateescape")
        if max(len(real), len(fake)) > settings.max_bytes:
            continue
        items.append(
            {
                **_item_of(segs[i], "spelling"),
                "real": real,
                "altered": fake,
                "edit": edit,
                "word": word,
                "band": "frequent" if words.get(word, 0) >= FREQUENT else "rare",
            }
        )
    return items


def build_probe_set(eval_set, settings: ProbeSettings, words: collections.Counter) -> ProbeSet:
    """The probe set of ``eval_set``'s held-out segments (see the module docstring); ``words``: the
    training sample's word counts (:func:`train_word_counts`)."""
    choice, truncated = _choice_items(
        eval_set, settings, np.random.default_rng([settings.seed, PROBE_VERSION, 0])
    )
    spelling = _spelling_items(
        eval_set, settings, words, np.random.default_rng([settings.seed, PROBE_VERSION, 1])
    )
    return ProbeSet(settings, choice, spelling, truncated)


# -- scoring -------------------------------------------------------------------------------------
def score_strings(scorer: Scorer, strings: Sequence[bytes]) -> dict[bytes, float]:
    """Nats of every distinct string (the empty string: 0, nothing to predict), one scorer call."""
    distinct = sorted({s for s in strings if s})
    nats = np.asarray(scorer(distinct), np.float64) if distinct else np.zeros(0)
    out = dict(zip(distinct, nats.tolist()))
    out[b""] = 0.0
    return out


def conditional_nats(scorer: Scorer, pairs: Sequence[tuple[bytes, bytes]]) -> np.ndarray:
    """``-log p(continuation | context)`` in nats for each ``(context, continuation)``:
    ``nats(context + continuation) - nats(context)``, both scored by ``scorer``."""
    table = score_strings(scorer, [s for c, x in pairs for s in (c, c + x)])
    return np.asarray([table[c + x] - table[c] for c, x in pairs])


def _pick(ll: np.ndarray, answer: int) -> float:
    """1 / (number of best candidates) when the answer is among them, else 0."""
    best = np.flatnonzero(ll == ll.max())
    return 1.0 / len(best) if answer in best else 0.0


def item_outcomes(probe_set: ProbeSet, scorer: Scorer) -> dict:
    """Per item: correctness (choice: clean and per noise; spelling) and the true continuation's nats
    given no, the clean and each noised context."""
    strings: list[bytes] = []
    for it in probe_set.choice:
        for ctx in [it["context"], *it["noised"].values()]:
            strings += [ctx] + [ctx + c for c in it["candidates"]]
        strings.append(it["candidates"][it["answer"]])
    for it in probe_set.spelling:
        strings += [it["real"], it["altered"]]
    # (one scorer call over every distinct string: batches as full as they can be)
    table = score_strings(scorer, strings)

    def given(ctx: bytes, cands: list[bytes]) -> np.ndarray:
        return np.asarray([table[ctx + c] - table[ctx] for c in cands])

    out: dict = {"choice": {"clean": []}, "nats": {"none": [], "clean": []}, "spelling": []}
    for kind in NOISES:
        out["choice"][kind], out["nats"][kind] = [], []
    for it in probe_set.choice:
        cands, a = it["candidates"], it["answer"]
        per_byte = np.asarray([len(c) for c in cands], np.float64)
        for kind, ctx in [("clean", it["context"]), *it["noised"].items()]:
            nats = given(ctx, cands)
            out["choice"][kind].append(_pick(-nats / per_byte, a))
            out["nats"][kind].append(float(nats[a]))
        out["nats"]["none"].append(table[cands[a]])
    for it in probe_set.spelling:  # (per byte: an edit that shortens the window is not favoured)
        r, f = table[it["real"]] / len(it["real"]), table[it["altered"]] / len(it["altered"])
        out["spelling"].append(1.0 if r < f else 0.5 if r == f else 0.0)
    return out


# -- statistics ----------------------------------------------------------------------------------
def _per_doc(docs: Sequence[int], values: Sequence[float] | np.ndarray, order: np.ndarray) -> np.ndarray:
    pos = np.searchsorted(order, np.asarray(docs, np.int64))
    return np.bincount(pos, weights=np.asarray(values, np.float64), minlength=len(order))


def _ci(samples: np.ndarray) -> list[float | None]:
    if not np.isfinite(samples).any():
        return [None, None]
    lo, hi = stats.percentile_interval(samples[np.isfinite(samples)])
    return [float(lo), float(hi)]


def _robustness(noised: np.ndarray, clean: np.ndarray) -> np.ndarray:
    """H-Net's robustness score, NaN where the clean accuracy is at chance or below."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(clean > 0.25, 100 * (noised - 0.25) / (clean - 0.25), np.nan)


def _ratio_score(none: np.ndarray, noised: np.ndarray, clean: np.ndarray) -> np.ndarray:
    """R = 100 (b0 - b_noised) / (b0 - b_clean), NaN where the clean context does not help."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(none - clean > 0, 100 * (none - noised) / (none - clean), np.nan)


def summarize(
    probe_set: ProbeSet, outcomes: dict, *, resamples: int = stats.RESAMPLES, seed: int = stats.SEED
) -> dict:
    """A model's probe figures with 95% intervals (cluster bootstrap over the items' documents)."""
    ch, sp = probe_set.choice, probe_set.spelling
    result: dict = {}
    if ch:
        docs = np.unique([it["doc"] for it in ch])
        d = [it["doc"] for it in ch]
        count = _per_doc(d, np.ones(len(ch)), docs)
        kinds = ["clean", *NOISES]
        acc_rows = [_per_doc(d, outcomes["choice"][k], docs)[None] for k in kinds]
        acc = stats.bootstrap(acc_rows, count, resamples=resamples, seed=seed)  # (R, 6)
        point_acc = np.asarray([r.sum() for r in acc_rows]) / count.sum()
        cont_bytes = _per_doc(d, [len(it["candidates"][it["answer"]]) for it in ch], docs)
        bit_kinds = ["none", "clean", *NOISES]
        bit_rows = [(_per_doc(d, outcomes["nats"][k], docs) / LN2)[None] for k in bit_kinds]
        bpb = stats.bootstrap(bit_rows, cont_bytes, resamples=resamples, seed=seed)  # (R, 7)
        point_bpb = np.asarray([r.sum() for r in bit_rows]) / cont_bytes.sum()
        noise_rows = {}
        for k, kind in enumerate(NOISES):
            noop = sum(it["noised"][kind] == it["context"] for it in ch)
            noise_rows[kind] = {
                "accuracy": float(point_acc[1 + k]),
                "accuracy_ci95": _ci(acc[:, 1 + k]),
                "robustness": _nan_none(_robustness(point_acc[1 + k], point_acc[0])),
                "bpb": float(point_bpb[2 + k]),
                "bpb_ci95": _ci(bpb[:, 2 + k]),
                "R": _nan_none(_ratio_score(point_bpb[0], point_bpb[2 + k], point_bpb[1])),
                "R_ci95": _ci(_ratio_score(bpb[:, 0], bpb[:, 2 + k], bpb[:, 1])),
                "unchanged": noop,
                "truncated": probe_set.truncated.get(kind, 0),
            }
        mean_noised = acc[:, 1:].mean(axis=1)
        result["choice"] = {
            "items": len(ch),
            "documents": len(docs),
            "accuracy": float(point_acc[0]),
            "accuracy_ci95": _ci(acc[:, 0]),
            "noised_accuracy": float(point_acc[1:].mean()),
            "noised_accuracy_ci95": _ci(mean_noised),
            "robustness": _nan_none(_robustness(point_acc[1:].mean(), point_acc[0])),
            "robustness_ci95": _ci(_robustness(mean_noised, acc[:, 0])),
            "bpb_no_context": float(point_bpb[0]),
            "bpb_no_context_ci95": _ci(bpb[:, 0]),
            "bpb_clean_context": float(point_bpb[1]),
            "bpb_clean_context_ci95": _ci(bpb[:, 1]),
            "R": _nan_none(np.mean([v["R"] for v in noise_rows.values() if v["R"] is not None] or [np.nan])),
            "noise": noise_rows,
            "groups": _group_accuracy(ch, outcomes["choice"]["clean"], resamples, seed),
            "noised_groups": _group_accuracy(
                ch, np.mean([outcomes["choice"][k] for k in NOISES], axis=0), resamples, seed
            ),
        }
    if sp:
        result["spelling"] = _spelling_summary(sp, outcomes["spelling"], resamples, seed)
    return result


def _nan_none(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _doc_totals(items: list[dict], correct: Sequence[float] | np.ndarray) -> tuple[np.ndarray, ...]:
    """``(documents, items per document, right answers per document)`` of ``items``."""
    docs = np.unique([it["doc"] for it in items])
    d = [it["doc"] for it in items]
    return docs, _per_doc(d, np.ones(len(items)), docs), _per_doc(d, correct, docs)


def _accuracy(items: list[dict], correct: Sequence[float] | np.ndarray, resamples: int, seed: int) -> dict:
    _, count, right = _doc_totals(items, correct)
    samples = stats.bootstrap([right[None]], count, resamples=resamples, seed=seed)[:, 0]
    return {"items": len(items), "accuracy": float(right.sum() / count.sum()), "accuracy_ci95": _ci(samples)}


def _group_accuracy(
    items: list[dict], correct: Sequence[float] | np.ndarray, resamples: int, seed: int
) -> dict:
    docs, count, right = _doc_totals(items, correct)
    group_of = {it["doc"]: it["group"] for it in items}
    labels = [group_of[int(x)] for x in docs]
    intervals = stats.group_intervals([right[None]], count, labels, resamples=resamples, seed=seed + 1)
    out = {}
    for g, ci in intervals.items():
        sel = np.asarray([lab == g for lab in labels])
        n_docs = int(sel.sum())
        out[g] = {
            "items": int(count[sel].sum()),
            "documents": n_docs,
            "accuracy": float(right[sel].sum() / count[sel].sum()),
            "accuracy_ci95": [float(ci[0, 0]), float(ci[0, 1])] if n_docs > 1 else None,
        }
    return out


def _spelling_summary(items: list[dict], correct: list[float], resamples: int, seed: int) -> dict:
    out = _accuracy(items, correct, resamples, seed)
    out["documents"] = len({it["doc"] for it in items})
    for key, values in (("by_edit", EDITS), ("by_band", ("frequent", "rare"))):
        field = "edit" if key == "by_edit" else "band"
        out[key] = {}
        for v in values:
            sel = [k for k, it in enumerate(items) if it[field] == v]
            if sel:
                out[key][v] = _accuracy([items[k] for k in sel], [correct[k] for k in sel], resamples, seed)
    out["groups"] = _group_accuracy(items, correct, resamples, seed)
    return out


def probe_model(probe_set: ProbeSet, scorer: Scorer, **kw) -> dict:
    """Score ``probe_set`` with one model and summarize it."""
    return summarize(probe_set, item_outcomes(probe_set, scorer), **kw)


# -- probing runs --------------------------------------------------------------------------------
def corpus_probe_set(eval_set, corpus, *, seed: int = 0, items: int | None = None) -> ProbeSet:
    """The probe set of ``eval_set`` (strings up to the corpus's segment length; ``items``
    continuation items and spelling pairs at most), word bands from the corpus's training documents."""
    settings = ProbeSettings(max_bytes=corpus.segment_bytes, seed=seed)
    if items is not None:
        settings = dataclasses.replace(settings, choice_items=items, spelling_items=items)
    return build_probe_set(eval_set, settings, train_word_counts(corpus))


def trainer_scorer(trainer) -> Scorer:
    """A restored run's scorer: every string scored on its own from BOS, as a held-out segment."""
    return lambda strings: trainer.evaluate(list(strings)).nats


def probe_runs(
    eval_set,
    corpus,
    runs: Mapping[str, str | Path],
    *,
    seed: int = 0,
    items: int | None = None,
    out: str | Path | None = None,
    note: Callable[[str], None] | None = None,
) -> dict:
    """Build the probe set of ``eval_set`` and probe every run (``name -> run directory``); with
    ``out``, write the probe set there (``probe_set.jsonl``) and cache each run's figures
    (``NAME.json``, reused while the probe set's fingerprint and the run's step are the same)."""
    from bytelm.rundir import RunDir  # noqa: PLC0415 (the training layer, only when runs are probed)
    from bytelm.training.restore import restore_scorer  # noqa: PLC0415

    probe_set = corpus_probe_set(eval_set, corpus, seed=seed, items=items)
    settings = probe_set.settings
    record: dict = {
        "version": PROBE_VERSION,
        "fingerprint": probe_set.fingerprint,
        "settings": {
            **dataclasses.asdict(settings),
            "continuation_chars": settings.continuation_chars,
            "context_bytes": settings.context_bytes,
        },
        "choice_items": len(probe_set.choice),
        "cross_group_items": sum(it["distractors"] == "any group" for it in probe_set.choice),
        "spelling_items": len(probe_set.spelling),
        "models": {},
    }
    if len(probe_set.choice) < MIN_ITEMS:
        docs = len({s.doc for s in eval_set.segments})
        record["skipped"] = (
            f"only {len(probe_set.choice)} continuation items could be built from the held-out segments of "
            f"{docs} document{'s' * (docs != 1)} (at least {MIN_ITEMS} are needed, each from a segment of "
            f"at least {settings.context_bytes} bytes plus {settings.continuation_chars} characters, with "
            "three spans of other held-out documents): hold out more documents (data.heldout_fraction), "
            "score more held-out bytes (data.max_eval_bytes) or longer segments (data.segment_bytes)"
        )
        return record
    cache = Path(out) if out is not None else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        probe_set.write(cache / "probe_set.jsonl")
    for name, run_dir in runs.items():
        step = RunDir(run_dir).info_or_empty().get("step")
        path = cache / f"{name}.json" if cache is not None else None
        if path is not None and path.is_file():
            try:
                cached = json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError):
                cached = {}
            if cached.get("fingerprint") == probe_set.fingerprint and cached.get("step") == step:
                record["models"][name] = cached["figures"]
                if note:
                    note(f"probes {name}: done earlier")
                continue
        trainer = restore_scorer(run_dir, corpus=corpus)
        figures = probe_model(probe_set, trainer_scorer(trainer))
        record["models"][name] = figures
        if path is not None:
            atomic_write_text(
                path, json.dumps({"fingerprint": probe_set.fingerprint, "step": step, "figures": figures})
            )
        if note:
            c = figures.get("choice", {})
            note(f"probes {name}: continuation choice {c.get('accuracy', float('nan')):.3f}")
    return record
