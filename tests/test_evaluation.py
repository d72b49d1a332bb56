"""The evaluation protocol, `bytelm eval`, the report schema and outside scores (docs/evaluation.md)."""

import base64
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import write_files

from bytelm import cli
from bytelm.baselines.bpe import load_tokenizer, train_bpe_on_corpus
from bytelm.bpb import LN2, SegmentScores, UnigramByteModel, breakdown, byte_counts, top_directory
from bytelm.config import load_config
from bytelm.data import load_corpus
from bytelm.evaluation import stats
from bytelm.evaluation.evaluator import EvalSet, evaluate_run, evaluate_runs, unigram_baselines
from bytelm.evaluation.external import read_heldout, write_scores
from bytelm.evaluation.report import REPORT_SCHEMA, schema_errors, validate
from bytelm.rundir import RunDir
from bytelm.training.loop import train

WORDS = "the of and to in is that for it as with was on be by this are from at or an which not".split()
DATA = {"data.segment_bytes": 64, "data.max_eval_bytes": 32768, "data.heldout_fraction": 0.25}


def make_corpus(root, seed=0):
    rng = np.random.default_rng(seed)
    files = {}
    for i in range(60):
        lang = "en" if i % 2 else "de"
        words = rng.choice(WORDS, size=200)
        files[f"{lang}/d{i:02d}.txt"] = (" ".join(words) + ".\n").encode()
    return write_files(root, files)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("eval_corpus"))


def overrides(corpus_dir, **extra):
    base = {
        "data.source": f"files:{corpus_dir}",
        **DATA,
        "model.family": "byte",
        "model.d_model": 32,
        "model.n_layers": 1,
        "model.n_heads": 2,
        "model.mlp_dim": 64,
        "train.steps": 4,
        "train.batch_size": 8,
        "train.seq_len": 64,
        "train.warmup_steps": 1,
        "train.log_every": 2,
        "train.checkpoint_every": 100,
        "train.peak_flops": 1e11,
        "eval.every": 2,
        "eval.eval_bytes": 256,
        "eval.batch_size": 8,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def corpus_of(corpus_dir):
    return load_corpus(
        f"files:{corpus_dir}",
        segment_bytes=DATA["data.segment_bytes"],
        max_eval_bytes=DATA["data.max_eval_bytes"],
        heldout_fraction=DATA["data.heldout_fraction"],
    )


@pytest.fixture(scope="module")
def byte_run(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "byte"
    train(load_config(None, overrides(corpus_dir)), out)
    return out


@pytest.fixture(scope="module")
def tokenizer_dir(corpus_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok") / "tokenizer"
    train_bpe_on_corpus(corpus_of(corpus_dir), vocab_size=300, num_workers=1).save(out)
    return out


@pytest.fixture(scope="module")
def bpe_run(corpus_dir, tokenizer_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "bpe"
    train(
        load_config(None, overrides(corpus_dir, **{"model.family": "bpe", "model.tokenizer": tokenizer_dir})),
        out,
    )
    return out


# -- the protocol's anchors -------------------------------------------------------------------
def test_uniform_model_is_exactly_8_bits_per_byte(corpus_dir):
    eval_set = EvalSet.from_corpus(corpus_of(corpus_dir))
    scores = UnigramByteModel.uniform().score(eval_set.data)
    assert scores.total_bytes == eval_set.n_bytes == corpus_of(corpus_dir).eval_bytes
    assert scores.bpb == pytest.approx(8.0, abs=1e-12)
    # and on arbitrary bytes, segment by segment
    rng = np.random.default_rng(1)
    segs = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in (1, 7, 300)]
    s = UnigramByteModel.uniform().score(segs)
    np.testing.assert_allclose(s.nats / (s.nbytes * LN2), 8.0, rtol=1e-14)


def test_unigram_model_bpb_equals_numpy_cross_entropy(corpus_dir):
    corpus = corpus_of(corpus_dir)
    eval_set = EvalSet.from_corpus(corpus)
    # independent numpy reference: add-one unigram fit on the train documents, cross-entropy on held-out bytes
    train_bytes = np.concatenate([np.frombuffer(d, np.uint8) for d in corpus.documents("train")])
    q = (np.bincount(train_bytes, minlength=256) + 1.0) / (len(train_bytes) + 256.0)
    held = np.concatenate([np.frombuffer(d, np.uint8) for d in eval_set.data])
    expected = float(-np.mean(np.log2(q[held])))
    rows = {r.name: r for r in unigram_baselines(eval_set)}
    assert rows["unigram (train)"].bpb == pytest.approx(expected, rel=1e-12)
    # the eval set's own byte entropy
    p = np.bincount(held, minlength=256) / len(held)
    entropy = float(-(p[p > 0] * np.log2(p[p > 0])).sum())
    assert rows["unigram (eval entropy)"].bpb == pytest.approx(entropy, rel=1e-12)
    assert entropy <= rows["unigram (train)"].bpb


def test_breakdown_sums_to_total_and_groups_by_directory():
    scores = SegmentScores(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1, 2, 3, 4]))
    labels = [top_directory(n) for n in ("en/a.txt", "de/b.txt", "en/c.txt#2", "top.txt")]
    assert labels == ["en", "de", "en", "<top>"]
    b = breakdown(scores, labels, np.array([1.0, 1.0, 1.0, 2.0]))
    assert sum(v["nats"] for v in b.values()) == scores.total_nats
    assert b["en"]["bytes"] == 4 and b["en"]["bpb"] == pytest.approx(4.0 / (4 * LN2))
    assert b["<top>"]["mean_bytes_per_global_step"] == 2.0
    assert byte_counts([b"ab", np.array([97], np.uint8)])[97] == 2


# -- scoring runs -------------------------------------------------------------------------
@pytest.mark.slow
def test_byte_run_scores_every_segment_byte(corpus_dir, byte_run):
    eval_set = EvalSet.from_corpus(corpus_of(corpus_dir))
    r = evaluate_run(byte_run, eval_set)
    assert r.scores.total_bytes == eval_set.n_bytes
    assert np.array_equal(r.scores.nbytes, [len(d) for d in eval_set.data])
    assert r.mean_bytes_per_global_step == 1.0
    run = json.loads((byte_run / "run.json").read_text())
    assert r.flops == pytest.approx(run["train_flops_per_position"] * run["positions_per_step"] * 4)
    assert r.bytes_seen == 4 * 8 * 64 and r.step == 4
    assert r.params["embedding"] > 0 and r.params["non_embedding"] > 0
    assert 0 < r.bpb < 8.5


@pytest.mark.slow
def test_bpe_run_counts_segment_bytes_not_tokens(corpus_dir, bpe_run, tokenizer_dir):
    eval_set = EvalSet.from_corpus(corpus_of(corpus_dir))
    r = evaluate_run(bpe_run, eval_set)
    assert r.scores.total_bytes == eval_set.n_bytes
    assert np.array_equal(r.scores.nbytes, [len(d) for d in eval_set.data])
    tok = load_tokenizer(tokenizer_dir)
    n_tokens = np.array([len(tok.encode_ordinary(d)) for d in eval_set.data])
    np.testing.assert_array_equal(r.global_steps, n_tokens)
    assert r.mean_bytes_per_global_step == pytest.approx(eval_set.n_bytes / n_tokens.sum())
    assert r.mean_bytes_per_global_step > 1.5


def test_eval_cli_writes_valid_report_with_groups(corpus_dir, byte_run, bpe_run, tmp_path, capsys):
    path = tmp_path / "report.json"
    assert cli.main(["eval", str(byte_run), str(bpe_run), "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| byte" in out and "| bpe" in out and "unigram (eval entropy)" in out
    report = json.loads(path.read_text())
    assert schema_errors(report, REPORT_SCHEMA) == []
    corpus = corpus_of(corpus_dir)
    assert report["fingerprint"] == corpus.fingerprint
    for m in report["models"]:
        assert m["bytes"] == corpus.eval_bytes and m["fingerprint"] == corpus.fingerprint
        assert set(m["dirs"]) == {"en", "de"}
        assert sum(g["bytes"] for g in m["groups"].values()) == m["bytes"]
        assert math.isclose(sum(g["nats"] for g in m["dirs"].values()), m["nats"], rel_tol=1e-12)
        for key in ("flops", "bytes_seen", "mean_bytes_per_global_step", "wall_s"):
            assert m[key] > 0
        assert m["bpb_ci95"][0] <= m["bpb"] <= m["bpb_ci95"][1] and m["seeds"] == 1
    # the statistics: a pair of the two runs on the same documents, and the scores as data beside
    (pair,) = report["statistics"]["pairs"]
    assert {pair["a"], pair["b"]} == {byte_run.name, bpe_run.name} and pair["diff"] <= 0
    assert report["statistics"]["documents"] == len({s.doc for s in corpus.segments})
    assert "95% interval" in out and "ranking (lower BPB first" in out
    header, ds = stats.read_scores(tmp_path / "scores.jsonl")
    assert header["fingerprint"] == report["fingerprint"]
    for m in [*report["models"], *report["baselines"]]:
        assert ds.bpb[ds.names.index(m["name"])] == pytest.approx(m["bpb"], rel=1e-12)


def test_schema_rejects_broken_reports(corpus_dir, byte_run):
    report = evaluate_runs([byte_run])
    validate(report)
    bad = json.loads(json.dumps(report))
    del bad["models"][0]["bpb"]
    bad["models"][0]["fingerprint"] = "xyz"
    bad["models"][0]["kind"] = "other"
    errors = schema_errors(bad, REPORT_SCHEMA)
    assert (
        any("'bpb'" in e for e in errors)
        and any("fingerprint" in e for e in errors)
        and any("kind" in e for e in errors)
    )
    with pytest.raises(ValueError, match="schema"):
        validate(bad)


def test_one_changed_heldout_byte_changes_fingerprint_and_eval_refuses(
    corpus_dir, byte_run, tmp_path, capsys
):
    corpus = corpus_of(corpus_dir)
    other = tmp_path / "other"
    shutil.copytree(corpus_dir, other)
    seg = corpus.segments[0]
    path = other / seg.name
    data = bytearray(path.read_bytes())
    data[seg.start] ^= 1
    path.write_bytes(bytes(data))
    changed = corpus_of(other)
    assert changed.fingerprint != corpus.fingerprint
    assert [s.id for s in changed.segments] == [s.id for s in corpus.segments]
    # a copy of the run "trained" on the changed corpus
    run_b = tmp_path / "byte_b"
    shutil.copytree(byte_run, run_b)
    cfg = (run_b / "config.toml").read_text().replace(f"files:{corpus_dir}", f"files:{other}")
    (run_b / "config.toml").write_text(cfg)
    info = RunDir(run_b).info()
    info["fingerprint"] = changed.fingerprint
    RunDir(run_b).write_info(info)
    assert cli.main(["eval", str(byte_run), str(run_b), "--json", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert corpus.fingerprint in err and changed.fingerprint in err and "refusing" in err
    assert not (tmp_path / "r.json").exists()
    # a run whose recorded fingerprint no longer matches its own corpus is refused too
    info["fingerprint"] = corpus.fingerprint
    RunDir(run_b).write_info(info)
    assert cli.main(["eval", str(run_b), "--json", str(tmp_path / "r.json")]) == 2
    assert "changed since it was trained" in capsys.readouterr().err
    # a run trained under evaluation protocol 1 is told why, and how to score it anyway
    info["data"] = {**info["data"], "protocol": 1}
    RunDir(run_b).write_info(info)
    assert cli.main(["eval", str(run_b), "--json", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "evaluation protocol v1" in err and "--data" in err


def test_eval_refuses_bpe_run_with_another_tokenizer(corpus_dir, bpe_run, tokenizer_dir, tmp_path, capsys):
    run = tmp_path / "bpe"
    shutil.copytree(bpe_run, run)
    other_tok = tmp_path / "tok2"
    train_bpe_on_corpus(corpus_of(corpus_dir), vocab_size=290, num_workers=1).save(other_tok)
    (run / "config.toml").write_text(
        (run / "config.toml").read_text().replace(str(tokenizer_dir), str(other_tok))
    )
    assert cli.main(["eval", str(run), "--json", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert "tokenizer" in err and "fingerprint" in err


def test_eval_bad_input_exit_2(tmp_path, capsys):
    assert cli.main(["eval", str(tmp_path)]) == 2
    assert "run directory" in capsys.readouterr().err
    assert cli.main(["eval"]) == 2
    assert "nothing to evaluate" in capsys.readouterr().err


# -- outside models -------------------------------------------------------------------------
def test_export_and_external_scores_round_trip(corpus_dir, byte_run, tmp_path, capsys):
    heldout = tmp_path / "heldout.jsonl"
    data_sets = [x for k, v in DATA.items() for x in ("--set", f"{k}={v}")]
    assert (
        cli.main(
            ["data", "export-heldout", "--data", f"files:{corpus_dir}", *data_sets, "--out", str(heldout)]
        )
        == 0
    )
    capsys.readouterr()
    header, rows = read_heldout(heldout)
    corpus = corpus_of(corpus_dir)
    assert header["fingerprint"] == corpus.fingerprint and header["segments"] == len(rows) == len(
        corpus.segments
    )
    assert [r["data"] for r in rows] == corpus.segment_data()
    assert [r["group"] for r in rows] == [s.group for s in corpus.segments]
    first = json.loads(heldout.read_text().splitlines()[1])
    assert base64.b64decode(first["bytes"]) == corpus.segment_data()[0]

    # "an outside model": the add-one unigram of the train bytes, scored from the exported file alone
    q = byte_counts(corpus.documents("train")) + 1.0
    log_q = np.log(q / q.sum())
    nats = [float(-log_q[np.frombuffer(r["data"], np.uint8)].sum()) for r in rows]
    scores = tmp_path / "scores.jsonl"
    write_scores(
        scores, [r["id"] for r in rows][::-1], nats[::-1], header["fingerprint"], family="unigram-outside"
    )
    report_path = tmp_path / "report.json"
    assert (
        cli.main(["eval", str(byte_run), "--external", f"outside={scores}", "--json", str(report_path)]) == 0
    )
    assert "outside" in capsys.readouterr().out
    report = json.loads(report_path.read_text())
    validate(report)
    ext = next(m for m in report["models"] if m["name"] == "outside")
    base = next(b for b in report["baselines"] if b["name"] == "unigram (train)")
    assert ext["kind"] == "external" and ext["family"] == "unigram-outside"
    assert ext["bpb"] == pytest.approx(base["bpb"], rel=1e-12) and ext["bytes"] == corpus.eval_bytes

    # rejections: another fingerprint, a missing segment, an unknown id, a duplicated id
    def attempt(ids, values, fingerprint=header["fingerprint"]):
        write_scores(scores, ids, values, fingerprint)
        code = cli.main(
            ["eval", str(byte_run), "--external", f"x={scores}", "--json", str(tmp_path / "r.json")]
        )
        return code, capsys.readouterr().err

    ids = [r["id"] for r in rows]
    code, err = attempt(ids, nats, fingerprint="0" * 64)
    assert code == 2 and "fingerprint" in err
    code, err = attempt(ids[1:], nats[1:])
    assert code == 2 and "no score for 1 of" in err
    code, err = attempt([*ids, "999:nope@0"], [*nats, 1.0])
    assert code == 2 and "not a segment" in err
    code, err = attempt([*ids, ids[0]], [*nats, 1.0])
    assert code == 2 and "twice" in err


@pytest.fixture(scope="module")
def heldout_rows(corpus_dir):
    eval_set = EvalSet.from_corpus(corpus_of(corpus_dir))
    return eval_set.fingerprint, eval_set.ids, [8.0 * LN2 * len(d) for d in eval_set.data]  # a uniform model


def test_external_scores_with_only_a_total_parameter_count(byte_run, heldout_rows, tmp_path, capsys):
    """The documented format makes 'embedding' and 'non_embedding' optional: a header with only
    'total' (what nanoGPT prints) is scored and shown, not a schema traceback."""
    fingerprint, ids, nats = heldout_rows
    scores = tmp_path / "scores.jsonl"
    write_scores(scores, ids, nats, fingerprint, family="nanogpt", params={"total": 10_754_816})
    report_path = tmp_path / "report.json"
    assert (
        cli.main(["eval", str(byte_run), "--external", f"nanogpt={scores}", "--json", str(report_path)]) == 0
    )
    out = capsys.readouterr().out
    assert "10.8M total" in out
    report = json.loads(report_path.read_text())
    validate(report)
    ext = next(m for m in report["models"] if m["name"] == "nanogpt")
    assert ext["params"] == {"total": 10_754_816} and ext["bpb"] == pytest.approx(8.0, rel=1e-12)


@pytest.mark.parametrize(
    "header, row_index, row_update, line, field",
    [  # a valid file with one change: to the header, or to the line of segment row_index (None deletes a key)
        ({"params": {"total": 5, "embeddings": 1}}, None, None, 1, "params.embeddings"),
        ({"params": {"total": -5}}, None, None, 1, "params.total"),
        ({"params": {"total": 1.5}}, None, None, 1, "params.total"),
        ({"params": [1, 2]}, None, None, 1, "params"),
        ({"family": 7}, None, None, 1, "family"),
        ({"version": 2}, None, None, 1, "version"),
        ({"format": "bytelm-heldout"}, None, None, 1, "format"),
        ({}, 0, {"id": None}, 2, "id"),
        ({}, 0, {"id": "?"}, 2, "id"),
        ({}, 1, {"nats": "1.0"}, 3, "nats"),
        ({}, 1, {"nats": -1.0}, 3, "nats"),
        ({}, 1, {"global_steps": 0}, 3, "global_steps"),
    ],
)
def test_invalid_scores_files_fail_with_one_line_naming_file_line_and_field(
    byte_run, heldout_rows, tmp_path, capsys, header, row_index, row_update, line, field
):
    fingerprint, ids, nats = heldout_rows
    head = {"format": "bytelm-scores", "version": 1, "fingerprint": fingerprint, **header}
    body = [{"id": i, "nats": x} for i, x in zip(ids, nats)]
    if row_index is not None:
        body[row_index] = {k: v for k, v in {**body[row_index], **row_update}.items() if v is not None}
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in [head, *body]) + "\n")
    code = cli.main(["eval", str(byte_run), "--external", f"x={path}", "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{path} line {line}" in err and f"'{field}'" in err, err


def test_export_detects_an_edited_file(corpus_dir, tmp_path, capsys):
    heldout = tmp_path / "h.jsonl"
    assert cli.main(["data", "export-heldout", "--data", f"files:{corpus_dir}", "--out", str(heldout)]) == 0
    capsys.readouterr()
    lines = heldout.read_text().splitlines()
    row = json.loads(lines[1])
    row["bytes"] = base64.b64encode(base64.b64decode(row["bytes"])[:-1] + b"!").decode()
    lines[1] = json.dumps(row)
    heldout.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="changed"):
        read_heldout(heldout)


def test_report_json_has_no_nan(corpus_dir, byte_run, tmp_path):
    text = Path(tmp_path / "r.json")
    evaluate_runs([byte_run], json_path=text)
    assert "NaN" not in text.read_text()


def test_probe_cli_probes_every_run_on_one_probe_set(corpus_dir, byte_run, bpe_run, tmp_path, capsys):
    out = tmp_path / "probes"
    assert cli.main(["probe", str(byte_run), str(bpe_run), "--out", str(out), "--items", "24"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "probes.json").read_text())
    assert (out / "probe_set.jsonl").is_file()
    if record.get("skipped"):  # (a held-out part too small for the items: said in one line)
        assert "No probes" in printed
        return
    assert set(record["models"]) == {byte_run.name, bpe_run.name} and "## Probes" in printed
    assert (out / "probes.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same command again reuses every run's figures (same probe set, same step)
    assert cli.main(["probe", str(byte_run), str(bpe_run), "--out", str(out), "--items", "24"]) == 0
    assert capsys.readouterr().err.count("done earlier") == 2
    assert json.loads((out / "probes.json").read_text())["models"] == record["models"]
    assert cli.main(["probe", str(byte_run), "--out", str(out), "--items", "0"]) == 2
