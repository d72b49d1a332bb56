"""The harness model ``bytelm`` in lm-evaluation-harness (bytelm/interop/lm_eval.py), for a run of
every family: the harness's bits_per_byte on the held-out segments and on whole held-out documents
(rolling) equals bytelm's own BPB; loglikelihood is bytelm's conditional score; generate_until stops
at the stop strings and is `bytelm sample --greedy`; the exported tasks run through the harness's
command line. Nothing is downloaded: the tasks are local JSON Lines files."""

from __future__ import annotations

import contextlib
import io
import json
import math
import subprocess
import sys
import types
from pathlib import Path

import pytest
from conftest import TINY_COMMON, TINY_FAMILIES, tiny_family, word_corpus

from bytelm import cli
from bytelm.config import load_config
from bytelm.interop import lm_eval as lm_eval_model  # (the lm-eval extra is part of the test install)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A 2-step run of every family on one small word corpus, bytelm's own evaluation of them, and the
    held-out data as harness tasks: (runs, report, eval set, task dir)."""
    from lm_eval.tasks import TaskManager  # noqa: F401 (the harness is importable)

    from bytelm.baselines.bpe import train_bpe_on_corpus
    from bytelm.data import load_corpus_from_config
    from bytelm.evaluation.evaluator import eval_sets_for_runs, evaluate_runs
    from bytelm.training.loop import train

    root = word_corpus(tmp_path_factory.mktemp("lm_eval_corpus"), n_docs=30, words_per_doc=40)
    out = tmp_path_factory.mktemp("lm_eval_runs")

    def cfg_of(extra):
        over = {"data.source": f"files:{root}", **TINY_COMMON, **extra}
        return load_config(None, [f"{k}={v}" for k, v in over.items()])

    train_bpe_on_corpus(load_corpus_from_config(cfg_of(TINY_FAMILIES["byte"]).data), vocab_size=300).save(
        out / "tokenizer"
    )
    train(cfg_of({**TINY_FAMILIES["byte"], "model.window": 16}), out / "entropy")
    runs = {}
    for family in TINY_FAMILIES:
        train(cfg_of(tiny_family(family, out)), out / family)
        runs[family] = out / family
    report = evaluate_runs([str(r) for r in runs.values()])
    eval_set, _ = eval_sets_for_runs([str(r) for r in runs.values()])
    tasks = out / "tasks"
    lm_eval_model.write_tasks(tasks, eval_set)
    # whole held-out documents (every one scored in full: its segments are consecutive from 0)
    docs: dict[int, list] = {}
    for seg, data in zip(eval_set.segments, eval_set.data):
        docs.setdefault(seg.doc, []).append((seg.start, data))
    texts = []
    for parts in docs.values():
        starts = [s for s, _ in sorted(parts)]
        assert starts == list(range(0, len(starts) * TINY_COMMON["data.segment_bytes"], 48))
        texts.append(b"".join(d for _, d in sorted(parts)).decode())
    assert max(len(t) for t in texts) > 2 * 48  # documents that need several pieces
    (tasks / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tasks / "bytelm_docs.yaml").write_text(
        (tasks / "bytelm_heldout.yaml")
        .read_text()
        .replace("bytelm_heldout", "bytelm_docs")
        .replace(str(tasks / "heldout.jsonl"), str(tasks / "docs.jsonl"))
    )
    return runs, report, eval_set, tasks


def request(*args):
    return types.SimpleNamespace(args=args)


@pytest.mark.parametrize("family", list(TINY_FAMILIES))
@pytest.mark.slow
def test_the_harness_model_of_every_family(runs, family, capsys):
    """One restored run per family: the harness's bits_per_byte, loglikelihood, generate_until."""
    lm = lm_eval_model.BytelmLM(run=str(runs[0][family]))
    check_bits_per_byte(lm, runs, family)
    check_loglikelihood(lm)
    check_generate_until(lm, capsys)


def check_bits_per_byte(lm, runs, family):
    """On the held-out segments (each within the context) and on whole held-out documents scored in
    rolling pieces, the harness's bits_per_byte is the BPB of bytelm's own evaluation report."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    _, report, _, tasks = runs
    bpb = next(m["bpb"] for m in report["models"] if m["name"] == family)
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=["bytelm_heldout", "bytelm_docs"],
        task_manager=TaskManager(include_path=str(tasks), include_defaults=False),  # not its 26k task files
        log_samples=False,
    )["results"]
    assert results["bytelm_heldout"]["bits_per_byte,none"] == pytest.approx(bpb, abs=1e-4)
    assert results["bytelm_docs"]["bits_per_byte,none"] == pytest.approx(bpb, abs=1e-4)

    # the rolling rule on one long document: its pieces of segment_bytes, each scored on its own
    texts = [json.loads(line)["text"] for line in (tasks / "docs.jsonl").read_text().splitlines()]
    data = max(texts, key=len).encode()
    (nats,) = lm.loglikelihood_rolling([request(data.decode())])
    pieces = [data[i : i + 48] for i in range(0, len(data), 48)]
    alone = [lm.scorer.evaluate([p]).nats[0] for p in pieces]
    assert len(pieces) >= 3 and -nats == pytest.approx(math.fsum(alone), rel=1e-5)


def check_loglikelihood(lm):
    """loglikelihood is bytelm's conditional score (two scorings, each string in a call of its own)."""
    pairs = [("the of and", " to in"), ("", "from BOS"), ("x" * 60, "is that")]  # the last: context cut
    got = lm.loglikelihood([request(c, x) for c, x in pairs])
    for (context, continuation), (ll, greedy) in zip(pairs, got):
        ctx = context.encode()[-(48 - len(continuation)) :] if context else b""
        joint = lm.scorer.evaluate([ctx + continuation.encode()]).nats[0]
        alone = lm.scorer.evaluate([ctx]).nats[0] if ctx else 0.0
        assert -ll == pytest.approx(joint - alone, rel=1e-5, abs=1e-4) and isinstance(greedy, bool)
    # is_greedy is exactly "greedy decoding after the context gives the continuation"
    from bytelm.generate import generate
    from bytelm.sampling.sampler import SamplingOptions

    made = generate(lm.decoder, b"the of", max_bytes=4, options=SamplingOptions(greedy=True))
    assert made  # (any bytes, EOS may end them early: harness strings carry them through surrogateescape)
    ((_, is_greedy),) = lm.loglikelihood([request("the of", made.decode("utf-8", "surrogateescape"))])
    assert is_greedy
    other = bytes([made[0] ^ 1]) + made[1:]
    assert not lm.loglikelihood([request("the of", other.decode("utf-8", "surrogateescape"))])[0][1]
    with pytest.raises(ValueError, match="longer than the run's segment length"):
        lm.loglikelihood([request("", "y" * 49)])


def check_generate_until(lm, capsys):
    """generate_until is `bytelm sample --greedy`, cut at the first stop string."""
    run = lm.run
    prompt = "the of and "
    (text,) = lm.generate_until([request(prompt, {"until": [], "max_gen_toks": 24})])
    capsys.readouterr()
    assert cli.main(["sample", run, "--prompt", prompt, "--greedy", "--max-bytes", "24"]) == 0
    assert capsys.readouterr().out == text + "\n"
    from bytelm.generate import generate
    from bytelm.sampling.sampler import SamplingOptions

    made = generate(lm.decoder, prompt.encode(), max_bytes=24, options=SamplingOptions(greedy=True))
    assert len(made) == 24
    stop = made[
        5:7
    ]  # two bytes of the output (any bytes, through surrogateescape): cut at their first occurrence
    until = ["\x00never", stop.decode("utf-8", "surrogateescape")]
    (cut,) = lm.generate_until([request(prompt, {"until": until, "max_gen_toks": 24})])
    assert cut == made[: made.index(stop)].decode("utf-8", "replace")


@pytest.mark.slow
def test_the_exported_tasks_run_through_the_harness_command_line(runs, tmp_path):
    """`bytelm probe --export-lm-eval`, then `bytelm-lm-eval --model bytelm ...` as the docs say."""
    run_dirs, report = runs[0], runs[1]
    tasks = tmp_path / "tasks"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(["probe", str(run_dirs["byte"]), "--export-lm-eval", str(tasks), "--items", "8"]) == 0
    assert "bytelm-lm-eval --model bytelm" in stdout.getvalue()
    summary = json.loads((tasks / "tasks.json").read_text())
    assert (
        summary["tasks"][:2] == ["bytelm_heldout", "bytelm_choice"] and "bytelm_spelling" in summary["tasks"]
    )
    choice = [json.loads(line) for line in (tasks / "bytelm_choice.jsonl").read_text().splitlines()]
    assert choice and all(len(c["choices"]) == 4 and 0 <= c["answer"] < 4 for c in choice)
    script = Path(sys.executable).parent / "bytelm-lm-eval"  # (the console script of the install)
    cmd = [
        str(script),
        "--model", "bytelm", "--model_args", f"run={run_dirs['byte']},greedy=false",
        "--tasks", "bytelm_heldout,bytelm_spelling", "--include_path", str(tasks),
        "--output_path", str(tmp_path / "results"),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = next(line for line in done.stdout.splitlines() if "bits_per_byte" in line)
    bpb = next(m["bpb"] for m in report["models"] if m["name"] == "byte")
    assert float(row.split("|")[7]) == pytest.approx(bpb, abs=1e-4)
    assert "acc_bytes" in done.stdout
    written = list((tmp_path / "results").rglob("results_*.json"))
    assert written and "bytelm_spelling" in json.loads(written[0].read_text())["results"]
