"""`bytelm compare`: the micro preset end to end, matched budgets, resumption, presets."""

import contextlib
import dataclasses
import io
import json
import math
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import word_corpus

from bytelm import cli
from bytelm.config import shipped_configs
from bytelm.errors import UserError
from bytelm.evaluation.report import REPORT_SCHEMA, schema_errors
from bytelm.experiments.compare import find_preset, load_preset
from bytelm.experiments.runner import StageStopped


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return word_corpus(tmp_path_factory.mktemp("compare_corpus"), words_per_doc=200, two_dirs=True)


@pytest.fixture(scope="module")
def one_process(corpus_dir, tmp_path_factory):
    """`bytelm compare --preset test` on one process: its --out and what it printed."""
    out = tmp_path_factory.mktemp("one") / "cmp"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert (
            cli.main(["compare", "--preset", "test", "--data", f"files:{corpus_dir}", "--out", str(out)]) == 0
        )
    return out, stdout.getvalue()


@pytest.mark.slow
def test_compare_test_preset_end_to_end_and_resume(corpus_dir, one_process, tmp_path, capsys):
    out = one_process[0]  # (its resume below rewrites the report with the same numbers)
    printed = types.SimpleNamespace(out=one_process[1])
    args = ["compare", "--preset", "test", "--data", f"files:{corpus_dir}", "--out", str(out)]
    for name in ("report.md", "report.json", "bpb.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert (out / "bpb.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((out / "report.json").read_text())
    assert schema_errors(report, REPORT_SCHEMA) == []
    models = {m["name"]: m for m in report["models"]}
    assert {m["family"] for m in models.values()} == {"bpe", "byte", "megabyte", "blt"}
    assert set(models) == {"bpe", "byte", "byte+ngram", "megabyte", "blt", "entropy"}
    preset = load_preset("test")
    for m in models.values():
        assert m["bpb"] is not None and math.isfinite(m["bpb"]) and 0 < m["bpb"] < 9, m
        assert m["fingerprint"] == report["fingerprint"] and m["bytes"] == report["data"]["eval_bytes"]
        plan = report["compare"]["models"][m["name"]]
        budget = preset.budgets[0] if m["name"] != "entropy" else 1.0e9
        # matched budget: the run's total FLOPs (own + auxiliary) are the budget, up to rounding to whole
        # steps
        per_step = plan["flops_per_step"] + plan["auxiliary_flops_per_step"]
        assert abs(m["flops_total"] - budget) <= per_step / 2 + 1e-6 * budget, (m["name"], m["flops_total"])
        assert m["flops_own"] == m["flops"] and m["flops_total"] == pytest.approx(
            m["flops"] + m["flops_auxiliary"]
        )
    # BLT pays for its entropy model: that model's whole training, and its forward over every training window
    # and the calibration sample (a window is train.seq_len + 1 = 65 ids; batches of 8; 64 calibration rows)
    blt, entropy = models["blt"], models["entropy"]
    aux = blt["auxiliary_flops"]
    assert aux["entropy model training"] == entropy["flops_total"] > 0
    per_window = blt["entropy_inference_flops_per_byte"] * 65  # the entropy model over a BLT window
    assert aux["entropy model forward over the training bytes"] == pytest.approx(per_window * 8 * blt["step"])
    assert aux["entropy model forward over the calibration sample"] == pytest.approx(per_window * 64)
    assert (
        blt["flops_auxiliary"] == pytest.approx(sum(aux.values())) and blt["flops"] < 0.9 * preset.budgets[0]
    )
    assert all(not models[n]["flops_auxiliary"] for n in ("bpe", "byte", "byte+ngram", "megabyte", "entropy"))
    # the byte LM with BLT's n-gram tables: 3 tables (n = 3, 4, 5) of 512 rows at its width 32 (BLT's: local
    # width 32)
    assert models["byte+ngram"]["params"]["ngram"] == 3 * 512 * 32 == blt["params"]["ngram"]
    assert models["byte"]["params"]["ngram"] == 0
    assert set(blt["pipeline_stats"]) == {"patch_overflow_windows", "patch_overflow_bytes"}
    assert models["byte"]["mean_bytes_per_global_step"] == 1.0
    assert models["megabyte"]["mean_bytes_per_global_step"] == 4.0
    assert (
        models["blt"]["mean_bytes_per_global_step"] > 1.0
        and models["bpe"]["mean_bytes_per_global_step"] > 1.0
    )
    md = (out / "report.md").read_text()
    assert report["fingerprint"] in md and "unigram (eval entropy)" in md and "bpb.png" in md
    assert "auxiliary FLOPs" in md and "patch overflow windows" in md and "not neural compute" in md
    assert "| blt" in printed.out
    # the statistics and the probes of every compared model (not of the entropy model)
    assert {(p["a"], p["b"]) for p in report["statistics"]["pairs"]} == {
        (a, b)
        for i, a in enumerate(report["statistics"]["ranking"])
        for b in report["statistics"]["ranking"][i + 1 :]
    } and "entropy" not in report["statistics"]["ranking"]
    # (this corpus holds out one document: no distractors for continuation items, so the probes
    # section says why there are none; tests/test_probes.py and test_evaluation.py probe real sets)
    assert report["data"]["scored_documents"] == 1 and "1 document " in report["probes"]["skipped"]
    assert "No probes: only 0 continuation items" in md and not (out / "probes.png").exists()
    assert (out / "pairs.png").is_file() and (out / "scores.jsonl").is_file()
    assert "## Paired differences" in md and "95% interval" in md

    # a second run skips every finished stage and reproduces the report's numbers, through a torn
    # metrics tail and a damaged record of stage times (a crash mid-write)
    mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/checkpoints/*")}
    with open(out / "runs" / "byte" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "eval", "st')
    (out / "stages.json").write_text('{"corpus": 1.5, "train')
    assert cli.main(args) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "its last line is incomplete" in err and "stages.json is damaged" in err
    assert err.count("skipped") >= 5 and "done earlier" in err
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/checkpoints/*")} == mtimes
    again = json.loads((out / "report.json").read_text())
    assert [m["bpb"] for m in again["models"]] == [m["bpb"] for m in report["models"]]


@pytest.mark.slow
def test_compare_minutes_gives_every_compared_model_the_same_training_time(corpus_dir, tmp_path, capsys):
    out = tmp_path / "cmp"
    args = [
        "compare",
        "--preset",
        "test",
        "--data",
        f"files:{corpus_dir}",
        "--out",
        str(out),
        "--minutes",
        "0.05",
    ]
    assert cli.main(args) == 0
    report = json.loads((out / "report.json").read_text())
    assert schema_errors(report, REPORT_SCHEMA) == []
    c = report["compare"]
    assert c["matched"] == "training time" and c["time_budget_s"] == 3.0
    for name, plan in c["models"].items():
        info = json.loads((out / "runs" / name / "run.json").read_text())
        assert info["status"] == "finished" and plan["steps"] == info["step"]
        if name == "entropy":  # an artefact maker keeps its FLOP budget
            assert plan["flop_budget"] == 1.0e9 and "time_budget_s" not in info
        else:
            assert plan["time_budget_s"] == info["time_budget_s"] == 3.0
            assert (
                info["train_s"] >= 3.0 or info["step"] == info["planned_steps"]
            )  # the budget spent, or the planned horizon
    md = (out / "report.md").read_text()
    assert "3.0s of training time per compared model" in md and "train time" in md
    capsys.readouterr()
    assert cli.main(args) == 0  # finished runs are skipped
    assert capsys.readouterr().err.count("skipped") >= 5
    assert cli.main(["compare", "--preset", "test", "--out", str(out), "--minutes", "0"]) == 2


def test_compare_resumes_an_interrupted_training(corpus_dir, tmp_path, monkeypatch):
    """A run stopped mid-way (as by Ctrl-C) is continued from its checkpoint by the next compare."""
    from bytelm.experiments import compare as cmp  # noqa: PLC0415
    from bytelm.training import loop as trainer_mod  # noqa: PLC0415

    preset = load_preset("test")
    preset = dataclasses.replace(preset, members=tuple(m for m in preset.members if m.name == "byte"))
    out = tmp_path / "cmp"
    real_train = trainer_mod.train
    calls = []

    def interrupted(cfg, run_dir, **kw):
        calls.append(cfg.train.steps)
        return real_train(cfg, run_dir, stop_after=3 if len(calls) == 1 else None, **kw)

    monkeypatch.setattr(trainer_mod, "train", interrupted)
    with pytest.raises(StageStopped, match="stopped at step 3"):
        cmp.compare(preset, out, data_spec=f"files:{corpus_dir}")
    assert not (out / "report.json").exists()
    result = cmp.compare(preset, out, data_spec=f"files:{corpus_dir}")
    rows = [json.loads(x) for x in (out / "runs" / "byte" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == calls[0]  # continued, not restarted
    run = json.loads((out / "runs" / "byte" / "run.json").read_text())
    assert run["status"] == "finished" and run["step"] == calls[0] > 3
    assert math.isfinite(result.report["models"][0]["bpb"])


def test_presets_load_and_bad_presets_fail(tmp_path):
    tiny = load_preset("tiny")
    assert {m.name for m in tiny.members} == {
        "bpe",
        "byte",
        "mambabyte",
        "byte+ngram",
        "megabyte",
        "blt",
        "hnet",
    }
    variants = load_preset("hnet")  # the H-Net variants: the default's budget and held-out bytes
    assert len(variants.members) == 6 and variants.budgets == tiny.budgets
    assert {m.name for m in variants.members} >= {"hnet-n4", "hnet-n6", "hnet-n8", "hnet-2stage", "hnet-attn"}
    assert next(m for m in tiny.members if m.name == "byte+ngram").ngram_from == "blt"
    assert tiny.entropy_model.name == "entropy" and tiny.budgets[0] > 0 and tiny.budgets == (2.5e12,)
    assert (
        tiny.entropy_budget == 1e12
        and tiny.extra_seeds == 0
        and tiny.sweep_fraction == 0.25
        and tiny.size is None
    )
    seeds = load_preset("seeds")  # the default preset with three seeds (include = "tiny.toml")
    assert seeds.extra_seeds == 2 and seeds.members == tiny.members and seeds.overrides == tiny.overrides
    with pytest.raises(UserError, match="no compare preset"):
        load_preset("nope")
    loop = tmp_path / "loop.toml"
    loop.write_text('include = "loop.toml"\n[compare]\nflop_budget = 1e9\n')
    with pytest.raises(UserError, match="includes itself"):
        load_preset(str(loop))
    bad = tmp_path / "bad.toml"
    bad.write_text("[compare]\nflop_budget = 1e9\nbudget = 3\n")
    with pytest.raises(UserError, match="unknown key"):
        load_preset(str(bad))
    bad.write_text('[compare]\nflop_budget = 1e9\n[[model]]\nname = "x"\nconfig = "missing.toml"\n')
    with pytest.raises(UserError, match="not found"):
        load_preset(str(bad))
    bad.write_text('[compare]\nflop_budget = 1e9\n[tokenizer]\nkind = "sentencepiece"\n')
    with pytest.raises(UserError, match="kind is 'sentencepiece'"):
        load_preset(str(bad))
    bad.write_text(
        '[compare]\nflop_budget = 1e9\n[[model]]\nname = "x"\n'
        f'config = "{tiny.path.parent.parent}/tiny/byte.toml"\nngram_from = "y"\n'
    )
    with pytest.raises(UserError, match="ngram_from 'y' must name another model"):
        load_preset(str(bad))
    bad.write_text(
        '[compare]\nflop_budget = 1e9\nseeds = 0\n[[model]]\nname = "x"\n'
        f'config = "{tiny.path.parent.parent}/tiny/byte.toml"\n'
    )
    with pytest.raises(UserError, match="seeds must be a whole number >= 1"):
        load_preset(str(bad))


@pytest.mark.slow
def test_compare_with_a_unigram_tokenizer_records_its_kind_and_rule(corpus_dir, tmp_path):
    """``[tokenizer] kind = "unigram"``: the subword LM trains on Unigram ids; the report and
    the run name the kind and the encoder rule; a directory holding another kind is refused."""
    from bytelm.experiments import compare as cmp  # noqa: PLC0415

    preset = load_preset("test")
    preset = dataclasses.replace(
        preset,
        members=tuple(m for m in preset.members if m.name == "bpe"),
        tokenizer={**preset.tokenizer, "tokenizer.kind": "unigram"},
    )
    out = tmp_path / "cmp"
    result = cmp.compare(preset, out, data_spec=f"files:{corpus_dir}")
    assert (
        result.report["compare"]["tokenizer"]["kind"] == "unigram"
        and result.report["compare"]["tokenizer"]["encoder"] == "viterbi"
    )
    info = json.loads((out / "runs" / "bpe" / "run.json").read_text())
    assert (info["tokenizer_kind"], info["tokenizer_encoder"]) == ("unigram", "viterbi")
    assert "Tokenizer: unigram" in result.report_md.read_text()
    other = dataclasses.replace(preset, tokenizer={**preset.tokenizer, "tokenizer.kind": "bpe"})
    with pytest.raises(UserError, match="holds a unigram tokenizer"):
        cmp.compare(other, out, data_spec=f"files:{corpus_dir}")


@pytest.mark.slow
def test_compare_chooses_each_models_learning_rate_on_the_validation_split(corpus_dir, tmp_path):
    """``[compare] learning_rates``: a short run per rate, scored on the validation split; the
    lowest validation BPB trains the compared run, and the report shows every rate's score."""
    from bytelm.experiments import compare as cmp  # noqa: PLC0415

    preset = load_preset("test")
    preset = dataclasses.replace(
        preset,
        members=tuple(m for m in preset.members if m.name == "byte"),
        overrides=(*preset.overrides, "data.validation_fraction=0.1"),
        learning_rates=(1e-3, 1e-2),
        sweep_fraction=0.5,
    )
    out = tmp_path / "cmp"
    result = cmp.compare(preset, out, data_spec=f"files:{corpus_dir}")
    for name in ("byte",):
        plan = result.report["compare"]["models"][name]
        sweep = plan["lr_sweep"]
        scores = {float(k): v for k, v in sweep["validation_bpb"].items()}
        finite = {lr: v for lr, v in scores.items() if v is not None}
        assert sweep["chosen"] == min(finite, key=finite.get) and plan["learning_rate"] == sweep["chosen"]
        # the grid, then one more rate (x10, its ratio) past the end the best sits at, while it does, at most
        # twice
        extra = sorted(set(scores) - {1e-3, 1e-2})
        assert {1e-3, 1e-2} <= set(scores) and sweep["extensions"] == len(extra) <= 2
        assert extra == [1e-1, 1.0][: len(extra)] or extra == [1e-4, 1e-5][: len(extra)]
        assert sweep["at_edge"] == (sweep["chosen"] in (min(scores), max(scores)))
        assert sweep["at_edge"] or len(extra) < 2 or sweep["chosen"] not in (min(scores), max(scores))
        cfg = (out / "runs" / name / "config.toml").read_text()
        assert f"learning_rate = {sweep['chosen']}" in cfg
        for lr in scores:  # the sweep runs: half the budget each, on their own directories
            info = json.loads((out / "sweeps" / name / f"lr{lr:g}" / "run.json").read_text())
            assert (
                info["status"] in ("finished", "diverged")
                and abs(2 * info["step"] - plan["steps"]) <= 1
                or scores[lr] is None
            )
        row = next(m for m in result.report["models"] if m["name"] == name)
        assert row["bpb"] not in scores.values()  # the held-out score is not the validation one
    assert (
        "validation BPB" in result.report_md.read_text() or "validation split" in result.report_md.read_text()
    )
    bad = dataclasses.replace(preset, overrides=tuple(o for o in preset.overrides if "validation" not in o))
    with pytest.raises(UserError, match="validation_fraction"):
        cmp.compare(bad, tmp_path / "bad", data_spec=f"files:{corpus_dir}")


@pytest.mark.slow
def test_compare_seeds_give_each_model_a_mean_and_a_spread(corpus_dir, tmp_path, capsys):
    """``--seeds 2``: every compared model trained twice (train.seed and train.seed + 1, one learning
    rate); the report gives each model's BPB per seed, mean, std and range, and for each adjacent
    pair of the ranking whether the gap of the means exceeds the larger range."""
    from bytelm.experiments import compare as cmp  # noqa: PLC0415

    preset = load_preset("test")
    preset = dataclasses.replace(
        preset, members=tuple(m for m in preset.members if m.name in ("byte", "megabyte"))
    )
    out = tmp_path / "cmp"
    result = cmp.compare(preset, out, data_spec=f"files:{corpus_dir}", seeds=2)
    seeds = result.report["compare"]["seeds"]
    assert seeds["n"] == 2 and set(seeds["models"]) == {"byte", "megabyte"}
    for name, s in seeds["models"].items():
        first = json.loads((out / "runs" / name / "run.json").read_text())
        second = json.loads((out / "seeds" / name / "s1" / "run.json").read_text())
        assert first["status"] == second["status"] == "finished" and first["step"] == second["step"]
        assert "seed = 1" in (out / "seeds" / name / "s1" / "config.toml").read_text()
        row = next(m for m in result.report["models"] if m["name"] == name)
        assert s["bpb"][1] != s["bpb"][0]  # another seed, another model
        # the row is the mean over the seeds, its interval from the two-level bootstrap
        assert row["bpb"] == pytest.approx(np.mean(s["bpb"]), rel=1e-12) and row["seeds"] == 2
        assert row["bpb_ci95"][0] < row["bpb"] < row["bpb_ci95"][1]
        assert s["mean"] == pytest.approx(np.mean(s["bpb"])) and s["std"] == pytest.approx(
            np.std(s["bpb"], ddof=1)
        )
        assert s["spread"] == pytest.approx(abs(s["bpb"][1] - s["bpb"][0]))
    (pair,) = seeds["pairs"]
    means = {n: s["mean"] for n, s in seeds["models"].items()}
    assert pair["better"] == min(means, key=means.get) and pair["gap"] == pytest.approx(
        abs(means["byte"] - means["megabyte"])
    )
    assert pair["exceeds"] == (pair["gap"] > max(s["spread"] for s in seeds["models"].values()))
    assert "two levels" in result.report["statistics"]["method"]
    header = json.loads((out / "scores.jsonl").read_text().splitlines()[0])
    assert {m["name"]: m["seeds"] for m in header["models"]}["byte"] == 2
    md = result.report_md.read_text()
    assert "2 seeds per compared model" in md and ("does NOT exceed" in md or " exceeds " in md)
    # the same compare again: every seed's run and evaluation is reused
    capsys.readouterr()
    again = cmp.compare(preset, out, data_spec=f"files:{corpus_dir}", seeds=2, note=print)
    assert capsys.readouterr().out.count("skipped") == 4 and again.report["compare"]["seeds"] == seeds


TWO_PROCESSES = """
import sys
from bytelm import cli
port, pid, preset, data, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
layout = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", pid]
raise SystemExit(cli.main(["compare", "--preset", preset, "--data", data, "--out", out, *layout]))
"""


def preset_with(tmp_path, names: set[str]) -> Path:
    """The shipped test preset with only the ``[[model]]`` tables named in ``names`` (config paths
    made absolute), written into ``tmp_path``."""
    text = find_preset("test").read_text().replace('"../tiny/', f'"{shipped_configs() / "tiny"}/')
    head, *tables = text.split("[[model]]")
    kept = [t for t in tables if t.split('name = "')[1].split('"')[0] in names]
    path = tmp_path / "preset.toml"
    path.write_text(head + "".join(f"[[model]]{t}" for t in kept))
    return path


def test_compare_into_an_out_made_with_other_data_is_refused_in_one_short_line(one_process, tmp_path, capsys):
    out = one_process[0]
    other = word_corpus(tmp_path / "other", words_per_doc=150)
    assert cli.main(["compare", "--preset", "test", "--data", f"files:{other}", "--out", str(out)]) == 2
    (err,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("bytelm: error")]
    assert len(err) < 600 and "use another --out" in err and "holds a compare" in err
    assert "wall time" in one_process[1] and "summed over every invocation" in one_process[1]


@pytest.mark.slow
def test_two_process_compare_writes_the_one_process_report(corpus_dir, one_process, tmp_path):
    """`bytelm compare` of the test preset's BLT (its entropy model) and subword LM as a job of two
    processes (Gloo, 2 CPU devices each) sharing --out: process 0 prepares the corpus, trains the
    tokenizer and writes the report, every run trains and is scored on all 4 devices. Each model's
    steps, FLOPs and bytes equal one process's, and its BPB too, to the float32 reassociation of a
    data-parallel program (measured: 3e-8)."""
    from conftest import finished, spawn_two

    preset = preset_with(tmp_path, {"entropy", "blt", "bpe"})  # the artefacts and a tokenizer
    job = spawn_two(TWO_PROCESSES, preset, f"files:{corpus_dir}", tmp_path / "two", devices=2)
    outs = finished(job, timeout=600)
    assert "| blt" in outs[0][0] and "| blt" not in outs[1][0]  # one table, from process 0
    one = json.loads((one_process[0] / "report.json").read_text())
    two = json.loads((tmp_path / "two" / "report.json").read_text())
    rows = {m["name"]: m for m in one["models"]}
    assert two["fingerprint"] == one["fingerprint"]
    assert {m["name"] for m in two["models"]} == {"entropy", "blt", "bpe"}
    for m in two["models"]:
        other = rows[m["name"]]
        for key in ("step", "bytes", "flops", "flops_total", "params"):
            assert other.get(key) == m.get(key), (m["name"], key)
        assert other["bpb"] == pytest.approx(m["bpb"], abs=1e-5), m["name"]


@pytest.mark.slow
def test_compare_trains_the_subword_lm_on_an_imported_tokenizer(corpus_dir, tmp_path):
    """``[tokenizer] dir = DIR`` with a tiktoken rank file imported into DIR (built from our BPE):
    the subword LM trains on the imported ids and the report names the given directory; a directory
    holding no tokenizer is refused naming it, and dir beside the other keys is refused."""
    from bytelm.baselines import load_tokenizer  # noqa: PLC0415
    from bytelm.baselines.bpe import train_bpe  # noqa: PLC0415
    from bytelm.baselines.imported import import_tiktoken  # noqa: PLC0415
    from bytelm.data import load_corpus  # noqa: PLC0415
    from bytelm.experiments import compare as cmp  # noqa: PLC0415

    corpus = load_corpus(f"files:{corpus_dir}", cache_dir=tmp_path / "cache")
    train_bpe(corpus.documents("train"), vocab_size=300, num_workers=1).save(tmp_path / "bpe")
    import_tiktoken(tmp_path / "bpe" / "ranks.tiktoken", pattern="cl100k").save(
        tmp_path / "imported", source_file=tmp_path / "bpe" / "ranks.tiktoken"
    )
    preset_file = tmp_path / "p.toml"
    base = load_preset("test")
    preset = dataclasses.replace(
        base,
        members=tuple(m for m in base.members if m.name == "bpe"),
        tokenizer={"tokenizer.dir": str(tmp_path / "imported")},
    )
    out = tmp_path / "cmp"
    result = cmp.compare(preset, out, data_spec=f"files:{corpus_dir}")
    info = json.loads((out / "runs" / "bpe" / "run.json").read_text())
    assert info["tokenizer_fingerprint"] == load_tokenizer(tmp_path / "imported").fingerprint
    assert result.report["compare"]["tokenizer"]["dir"] == str(tmp_path / "imported")
    assert not (out / "tokenizer").exists()
    # an HF tokenizer.json (ByteLevel BPE, no prefix space, with added tokens), trained by HF
    hf = pytest.importorskip("tokenizers")
    from bytelm.baselines.imported import import_tokenizer_json  # noqa: PLC0415

    ref = hf.Tokenizer(hf.models.BPE())
    ref.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = hf.trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<s>"]
    )
    texts = [d.decode() for d in corpus.documents("train")]
    ref.train_from_iterator(texts, trainer)
    ref.add_tokens(["the"])
    ref.save(str(tmp_path / "tokenizer.json"))
    import_tokenizer_json(tmp_path / "tokenizer.json").save(
        tmp_path / "hf", source_file=tmp_path / "tokenizer.json"
    )
    hf_tok = load_tokenizer(tmp_path / "hf")
    held = [d.decode() for d in corpus.documents("heldout")]
    assert hf_tok.encode_documents(held, num_workers=1)[0].tolist() == [
        i for t in held for i in ref.encode(t, add_special_tokens=False).ids
    ]
    with_hf = dataclasses.replace(preset, tokenizer={"tokenizer.dir": str(tmp_path / "hf")})
    result = cmp.compare(with_hf, tmp_path / "cmp-hf", data_spec=f"files:{corpus_dir}")
    info = json.loads((tmp_path / "cmp-hf" / "runs" / "bpe" / "run.json").read_text())
    assert info["tokenizer_fingerprint"] == hf_tok.fingerprint
    assert [m["name"] for m in result.report["models"]] == ["bpe"] and math.isfinite(
        result.report["models"][0]["bpb"]
    )
    missing = dataclasses.replace(preset, tokenizer={"tokenizer.dir": str(tmp_path / "none")})
    with pytest.raises(UserError, match="holds no tokenizer"):
        cmp.compare(missing, tmp_path / "cmp2", data_spec=f"files:{corpus_dir}")
    preset_file.write_text('[compare]\nflop_budget = 1e9\n[tokenizer]\ndir = "x"\nvocab_size = 300\n')
    with pytest.raises(UserError, match="dir = 'x' and vocab_size"):
        load_preset(str(preset_file))
