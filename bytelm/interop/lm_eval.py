"""bytelm runs in EleutherAI's lm-evaluation-harness (``pip install "bytelm[lm-eval]"``).

:class:`BytelmLM` is the harness model ``bytelm``: ``--model bytelm --model_args run=RUN_DIR`` loads
any bytelm run (every family: byte LM, MegaByte, BLT, H-Net, the subword LM) on its latest
checkpoint (``step=N``: another) and answers the harness's three requests with bytelm's own code:

- ``loglikelihood(context, continuation)``: ``log p(continuation | context) = log p(context +
  continuation) - log p(context)``, each string scored on its own from BOS by the run's evaluation
  path (the probes' conditional scoring, :func:`bytelm.evaluation.probes.conditional_nats`). The
  pair must fit the run's held-out segment length (``data.segment_bytes``, which every model's
  window holds): a longer context loses its oldest bytes, a continuation longer than that is refused.
  ``is_greedy``: the run's greedy decoding of ``len(continuation)`` bytes after the context is the
  continuation (``greedy=false`` in the model arguments skips that decoding and answers False).
- ``loglikelihood_rolling(text)``: the text cut into consecutive pieces of ``data.segment_bytes``
  bytes, each scored on its own from BOS, summed: bytelm's evaluation protocol, so the harness's
  ``bits_per_byte`` over documents equals bytelm's BPB over the same segments (no piece sees the
  one before it; a document up to ``segment_bytes`` long is one piece).
- ``generate_until(context, gen_kwargs)``: bytelm's cached decoding (as ``bytelm sample``), greedy
  unless ``do_sample`` with a ``temperature`` > 0 (``top_p``, ``top_k`` honoured), ``max_gen_toks``
  counted in **bytes** for every family, stopped at the first of the ``until`` strings (cut there).

Strings are the UTF-8 bytes of the harness's text, exactly (``surrogateescape`` for text that
carries undecodable bytes): no whitespace is added or stripped, whatever the family; the subword
LM encodes those bytes with its own tokenizer. Requests are scored in the run's evaluation batches
(``batch_size`` in the model arguments or ``--batch_size``: segments per batch, rounded up to a
multiple of the devices the rows are split over; ``auto``: the run's ``eval.batch_size``).

lm-eval 0.4 finds models only in its own table, so ``bytelm-lm-eval`` (:func:`main`) is lm-eval's
command line with this model registered: ``bytelm-lm-eval --model bytelm --model_args run=RUN
--tasks T --include_path DIR`` takes every option ``lm_eval`` takes. In Python, importing this
module registers the model (``lm_eval.simple_evaluate(model="bytelm", ...)``).

Task files for the harness (:func:`write_tasks`, ``bytelm probe --export-lm-eval DIR``): the
held-out segments as a rolling task (``bytelm_heldout``: ``bits_per_byte``), and the probes of
:mod:`bytelm.evaluation.probes` as multiple-choice tasks (``bytelm_choice``, one per noise, and
``bytelm_spelling``, scored by ``acc_bytes``: log-likelihood per byte, the probes' rule), grouped
as ``bytelm_probes``, each with its data in a JSON Lines file beside it. A string that is not valid
UTF-8 cannot be a harness string: segments and items holding one are left out, and the count is
in ``tasks.json``.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bytelm.atomic import atomic_write_text
from bytelm.errors import UserError
from bytelm.evaluation.probes import conditional_nats, corpus_probe_set, score_strings
from bytelm.generate import generate, stream
from bytelm.sampling.decoders import Decoder
from bytelm.sampling.sampler import SamplingOptions
from bytelm.training.restore import restore_scorer

try:
    import lm_eval.models  # noqa: F401 (lm-eval's own models first, so that registering ours keeps them)
    from lm_eval.__main__ import cli_evaluate
    from lm_eval.api.model import LM
    from lm_eval.api.registry import model_registry
    from tqdm import tqdm
except ImportError as e:  # pragma: no cover (the extra is part of the test install)
    raise UserError(
        f"the lm-evaluation-harness is not installed ({e}); install it with: pip install 'bytelm[lm-eval]'"
    ) from None

NAME = "bytelm"
TASK_PREFIX = "bytelm"


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def fit_pair(context: bytes, continuation: bytes, limit: int) -> tuple[bytes, bytes]:
    """``(context, continuation)`` within ``limit`` bytes together: the context loses its oldest bytes.

    >>> fit_pair(b"abcdef", b"xy", 5)
    (b'def', b'xy')
    """
    if len(continuation) > limit:
        raise UserError(
            f"a continuation of {len(continuation)} bytes is longer than the run's segment length ({limit} "
            "bytes, data.segment_bytes), the longest string it scores"
        )
    return context[max(0, len(context) + len(continuation) - limit) :], continuation


def rolling_pieces(text: bytes, limit: int) -> list[bytes]:
    """The consecutive pieces of at most ``limit`` bytes a document is scored in.

    >>> rolling_pieces(b"abcdefg", 3)
    [b'abc', b'def', b'g']
    """
    return [text[i : i + limit] for i in range(0, len(text), limit)]


class BytelmLM(LM):
    """The harness model ``bytelm`` (module docstring)."""

    def __init__(
        self,
        run: str | None = None,
        step: int | str | None = None,
        greedy: bool | str = True,
        max_gen_bytes: int | str = 256,
        seed: int | str = 0,
        batch_size: int | str | None = None,
        max_batch_size: int | str | None = None,
        device: str | None = None,
        **unknown: Any,
    ) -> None:
        super().__init__()
        if unknown:
            raise UserError(
                f"--model bytelm has no model argument {sorted(unknown)[0]!r}: it takes run=RUN_DIR, step=N, "
                "greedy=true|false, max_gen_bytes=N, seed=N"
            )
        if not run:
            raise UserError("--model bytelm needs the run directory: --model_args run=RUN_DIR")
        self.run = str(run)
        self.scorer = restore_scorer(self.run, load_corpus=False, step=None if step is None else int(step))
        self.limit = int(self.scorer.cfg.data.segment_bytes)
        self.check_greedy = str(greedy).lower() not in ("false", "0", "no")
        self.max_gen_bytes = int(max_gen_bytes)
        self.seed = int(seed)
        shards = self.scorer.mesh.shape["data"] * self.scorer.mesh.shape["fsdp"]
        if batch_size is None or str(batch_size).startswith("auto"):
            self.batch = None  # the run's eval.batch_size
        else:  # (rounded up to a multiple of the devices the rows are split over)
            self.batch = -(-max(int(batch_size), 1) // shards) * shards
        self._decoder: Decoder | None = None
        self.disable_tqdm = False

    # -- scoring ----------------------------------------------------------------------------------
    def _scorer(self, strings: list[bytes]) -> np.ndarray:
        """Nats of each string scored on its own from BOS (the run's evaluation path), with a bar."""
        bar = tqdm(total=len(strings), desc=f"bytelm {Path(self.run).name}", disable=self.disable_tqdm)
        try:
            return self.scorer.evaluate(
                list(strings), batch_size=self.batch, on_batch=lambda _batch, n: bar.update(n)
            ).nats
        finally:
            bar.close()

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self.disable_tqdm = disable_tqdm
        pairs = [fit_pair(_bytes(r.args[0]), _bytes(r.args[1]), self.limit) for r in requests]
        nats = conditional_nats(self._scorer, pairs)
        out = []
        for r, (context, continuation), n in zip(requests, pairs, nats):
            result = (-float(n), self._is_greedy(context, continuation))
            self.cache_hook.add_partial("loglikelihood", r.args, result)
            out.append(result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        self.disable_tqdm = disable_tqdm
        pieces = [rolling_pieces(_bytes(r.args[0]), self.limit) for r in requests]
        table = score_strings(self._scorer, [p for ps in pieces for p in ps])
        out = []
        for r, ps in zip(requests, pieces):
            result = -math.fsum(table[p] for p in ps)
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, result)
            out.append(result)
        return out

    # -- decoding ---------------------------------------------------------------------------------
    @property
    def decoder(self):
        if self._decoder is None:
            scorer = self.scorer
            self._decoder = scorer.task.decoder(scorer.model)
        return self._decoder

    def _is_greedy(self, context: bytes, continuation: bytes) -> bool:
        if not self.check_greedy:
            return False
        made = generate(
            self.decoder, context, max_bytes=len(continuation), options=SamplingOptions(greedy=True)
        )
        return made == continuation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for r in tqdm(requests, desc=f"bytelm {Path(self.run).name}", disable=disable_tqdm):
            context, kwargs = r.args
            text = self.continue_text(_bytes(context), dict(kwargs or {}))
            self.cache_hook.add_partial("generate_until", r.args, text)
            out.append(text)
        return out

    def continue_text(self, context: bytes, kwargs: dict) -> str:
        """The text generated after ``context`` under the harness's ``gen_kwargs`` (module docstring)."""
        until = kwargs.pop("until", None) or []
        stops = [_bytes(s) for s in ([until] if isinstance(until, str) else until) if s]
        max_bytes = int(kwargs.pop("max_gen_toks", self.max_gen_bytes))
        temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
        sample = str(kwargs.pop("do_sample", False)).lower() in ("true", "1") and temperature > 0
        options = SamplingOptions(
            greedy=not sample,
            temperature=temperature if sample else 1.0,
            top_p=float(kwargs.pop("top_p", 1.0) or 1.0),
            top_k=int(kwargs.pop("top_k", 0) or 0),
            seed=self.seed,
        )
        made = b""
        cut = None
        for data in stream(self.decoder, context, max_bytes=max_bytes, options=options):
            made += data
            hits = [i for i in (made.find(s) for s in stops) if i >= 0]
            if hits:
                cut = min(hits)
                break
        return made[:cut].decode("utf-8", "replace")

    @property
    def tokenizer_name(self) -> str:
        return f"bytelm-{self.scorer.task.family}"


model_registry.register(NAME)(BytelmLM)


def main(argv: Sequence[str] | None = None) -> None:
    """``bytelm-lm-eval``: lm-eval's command line, with ``--model bytelm`` registered."""
    if argv is not None:
        sys.argv = ["bytelm-lm-eval", *argv]
    cli_evaluate()


# -- task files ------------------------------------------------------------------------------------
def _valid(*strings: bytes) -> bool:
    try:
        for s in strings:
            s.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _yaml(config: dict) -> str:
    """A task config as YAML: JSON's scalars (a JSON document is YAML), one key per line."""
    lines = []
    for key, value in config.items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k}: {json.dumps(v)}" for k, v in value.items()]
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            lines.append(f"{key}:")
            for item in value:
                first, *rest = item.items()
                lines.append(f"  - {first[0]}: {json.dumps(first[1])}")
                lines += [f"    {k}: {json.dumps(v)}" for k, v in rest]
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


def _task(name: str, data: Path, **config: Any) -> dict:
    return {
        "task": name,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.resolve())}},
        "test_split": "test",
        **config,
    }


_ROLLING = {
    "output_type": "loglikelihood_rolling",
    "doc_to_text": "",
    "doc_to_target": "text",
    "metric_list": [
        {"metric": "bits_per_byte", "aggregation": "bits_per_byte", "higher_is_better": False},
        {"metric": "byte_perplexity", "aggregation": "weighted_perplexity", "higher_is_better": False},
    ],
}
_CHOICE = {
    "output_type": "multiple_choice",
    "doc_to_text": "context",
    "doc_to_choice": "choices",
    "doc_to_target": "answer",
    "target_delimiter": "",  # the continuation follows the context byte for byte
    "metric_list": [
        {"metric": "acc_bytes", "aggregation": "mean", "higher_is_better": True},
        {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
    ],
}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def write_tasks(out: str | Path, eval_set, probe_set=None) -> dict:
    """Harness task files for the held-out segments of ``eval_set`` and, when given, the items of
    ``probe_set`` (module docstring) into ``out``; returns what was written and left out."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kept = [(s, d) for s, d in zip(eval_set.segments, eval_set.data) if _valid(d)]
    rows = [{"text": _text(d), "id": s.id, "doc": s.doc, "group": s.group} for s, d in kept]
    _write_jsonl(out / "heldout.jsonl", rows)
    names = [f"{TASK_PREFIX}_heldout"]
    atomic_write_text(out / f"{names[0]}.yaml", _yaml(_task(names[0], out / "heldout.jsonl", **_ROLLING)))
    summary: dict = {
        "fingerprint": eval_set.fingerprint,
        "heldout": {
            "segments": len(kept),
            "bytes": sum(len(d) for _, d in kept),
            "left_out": len(eval_set.segments) - len(kept),
        },
    }
    if probe_set is not None:
        probes = []
        kinds = ["clean", *sorted({k for it in probe_set.choice for k in it["noised"]})]
        for kind in kinds:
            items = []
            for it in probe_set.choice:
                context = it["context"] if kind == "clean" else it["noised"][kind]
                if _valid(context, *it["candidates"]):
                    items.append(
                        {
                            "context": _text(context),
                            "choices": [_text(c) for c in it["candidates"]],
                            "answer": int(it["answer"]),
                            "doc": int(it["doc"]),
                        }
                    )
            name = f"{TASK_PREFIX}_choice" + ("" if kind == "clean" else f"_{kind}")
            _write_jsonl(out / f"{name}.jsonl", items)
            atomic_write_text(out / f"{name}.yaml", _yaml(_task(name, out / f"{name}.jsonl", **_CHOICE)))
            probes.append(name)
            summary[name] = {"items": len(items), "left_out": len(probe_set.choice) - len(items)}
        pairs = [
            {"context": "", "choices": [_text(it["real"]), _text(it["altered"])], "answer": 0}
            for it in probe_set.spelling
            if _valid(it["real"], it["altered"])
        ]
        name = f"{TASK_PREFIX}_spelling"
        _write_jsonl(out / f"{name}.jsonl", pairs)
        atomic_write_text(out / f"{name}.yaml", _yaml(_task(name, out / f"{name}.jsonl", **_CHOICE)))
        probes.append(name)
        summary[name] = {"items": len(pairs), "left_out": len(probe_set.spelling) - len(pairs)}
        summary["probe_fingerprint"] = probe_set.fingerprint
        group = f"group: {json.dumps(TASK_PREFIX + '_probes')}\ntask:\n" + "".join(
            f"  - {json.dumps(t)}\n" for t in probes
        )
        atomic_write_text(out / f"{TASK_PREFIX}_probes.yaml", group)
        names += probes
    summary["tasks"] = names
    atomic_write_text(out / "tasks.json", json.dumps(summary, indent=1) + "\n")
    return summary


def write_probe_tasks(out: str | Path, eval_set, corpus, *, seed: int = 0, items: int | None = None) -> dict:
    """:func:`write_tasks` with the probe set of ``eval_set`` and ``corpus``
    (:func:`~bytelm.evaluation.probes.corpus_probe_set` with ``seed`` and ``items``)."""
    return write_tasks(out, eval_set, corpus_probe_set(eval_set, corpus, seed=seed, items=items))
