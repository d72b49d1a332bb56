"""Runs that never lose work and bad input that fails in one line: the run lock, torn files,
damaged checkpoints, signals on any step, output paths, config values, pipes, encodings, file
modes, logging, overwrites. One test per case of the issue that asked for them, each reproducing
the case as a user would meet it, then a fuzz test over damaged run directories."""

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import subprocess_env, word_corpus

from bytelm import cli, console
from bytelm.atomic import atomic_directory, atomic_write_text
from bytelm.baselines.bpe import train_bpe
from bytelm.cli import data as data_cli
from bytelm.config import load_config
from bytelm.data import load_corpus
from bytelm.errors import UserError
from bytelm.rundir import CONFIG_END, RunDir
from bytelm.training.loop import train

TINY = {
    "data.segment_bytes": 64,
    "data.max_eval_bytes": 1024,
    "model.family": "byte",
    "model.d_model": 16,
    "model.n_layers": 1,
    "model.n_heads": 2,
    "model.mlp_dim": 32,
    "train.steps": 6,
    "train.batch_size": 4,
    "train.seq_len": 64,
    "train.warmup_steps": 2,
    "train.log_every": 1,
    "train.checkpoint_every": 2,
    "train.peak_flops": 1e11,
    "eval.every": 0,
    "eval.eval_bytes": 256,
    "eval.batch_size": 4,
}


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return word_corpus(tmp_path_factory.mktemp("robust_corpus"), n_docs=40, words_per_doc=200)


def sets(corpus_dir, **extra) -> list[str]:
    values = {"data.source": f"files:{corpus_dir}", **TINY, **extra}
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "c.toml"
    path.write_text("")
    return path


def one_line_error(err: str, *fragments: str) -> None:
    """``err`` (stderr) holds exactly one error line, no traceback, and the ``fragments`` in it."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("bytelm: error:")]
    assert len(errors) == 1, err
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])


@pytest.fixture(scope="module")
def finished_run(corpus_dir, tmp_path_factory):
    """A finished tiny byte run (checkpoints 2, 4, 6); tests copy it before they damage it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train(load_config(None, sets(corpus_dir)[1::2]), out)
    return out


def copy_run(run: Path, tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(run, tmp_path / name))


def bytelm_process(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "bytelm", *args],
        env=subprocess_env(1, PYTHONUNBUFFERED="1"),
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=subprocess.PIPE,
        **kw,
    )


def wait_for_step(run: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and any(f'"step": {step},' in line for line in metrics.read_text().splitlines()):
            return
        time.sleep(0.02)
    raise AssertionError(f"the run never reached step {step}: {proc.stderr.read().decode()[-2000:]}")


# -- signals ----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_signal_on_a_checkpoint_step_saves_once_exits_130_and_resumes_to_the_same_loss(
    corpus_dir, tmp_path
):
    """SIGINT at step 3 of a run that saves (and evaluates) every step: once saved, status "stopped"
    at that step, exit 130; the resumed run ends at the loss of an uninterrupted one."""
    config = config_file(tmp_path)
    args = sets(corpus_dir, **{"train.steps": 8, "train.checkpoint_every": 1, "eval.every": 1})
    proc = bytelm_process(["train", str(config), "--out", str(tmp_path / "a"), *args])
    wait_for_step(tmp_path / "a", 3, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err.decode()[-2000:]
    assert b"Traceback" not in err and b"StepAlreadyExistsError" not in err
    record = RunDir(tmp_path / "a").info()
    assert record["status"] == "stopped" and 3 <= record["step"] < 8
    assert RunDir(tmp_path / "a").checkpoint_steps()[-1] == record["step"]
    env = subprocess_env(1)
    for out in ("a", "b"):  # resume; and the same config uninterrupted
        done = subprocess.run(
            [sys.executable, "-m", "bytelm", "train", str(config), "--out", str(tmp_path / out), *args],
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    a, b = RunDir(tmp_path / "a").info(), RunDir(tmp_path / "b").info()
    assert a["status"] == b["status"] == "finished" and a["step"] == b["step"] == 8
    assert a["final_loss"] == b["final_loss"]


def _wait_for_any_step(out: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    """Until some training under ``out`` has logged a step (the job is inside a training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for metrics in out.rglob("metrics.jsonl"):
            if '"kind": "train"' in metrics.read_text():
                return
        time.sleep(0.05)
    raise AssertionError(f"no training started: {proc.stderr.read().decode()[-2000:]}")


@pytest.mark.slow  # (the fast tier: pytest -m "not slow")
@pytest.mark.parametrize("command", ["compare", "ablate"])
def test_sigterm_stops_a_multi_run_job_with_exit_0_and_the_same_command_resumes(
    command, corpus_dir, tmp_path
):
    """The signal contract (bytelm/console.py): SIGTERM to compare or ablate in a training saves its
    checkpoint and exits 0 with one line; the same command then finishes the job."""
    out = tmp_path / "out"
    if command == "compare":
        from bytelm.config import shipped_configs  # noqa: PLC0415

        preset = tmp_path / "one.toml"  # the test preset with one model (its model list replaced)
        preset.write_text(
            f'include = "{shipped_configs() / "compare" / "test.toml"}"\n[compare]\nprobes = false\n'
            f'[[model]]\nname = "byte"\nconfig = "{shipped_configs() / "tiny" / "byte.toml"}"\n'
            'set = ["model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.mlp_dim=64"]\n'
        )
        args = ["compare", "--preset", str(preset), "--data", f"files:{corpus_dir}", "--out", str(out)]
        done_file = out / "report.json"
    else:
        from helpers import micro_grid  # noqa: PLC0415

        grid = micro_grid(tmp_path, families={"byte"})
        args = ["ablate", str(grid), "--data", f"files:{corpus_dir}", "--out", str(out)]
        done_file = out / "ablation.json"
    proc = bytelm_process(args)
    _wait_for_any_step(out, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    text = err.decode()
    assert proc.returncode == 0, text[-2000:]
    assert "Traceback" not in text and "stopped at step" in text and "resume" in text, text[-2000:]
    assert not done_file.exists()
    done = subprocess.run(
        [sys.executable, "-m", "bytelm", *args], env=subprocess_env(1), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done_file.is_file() and "Traceback" not in done.stderr


def test_sigterm_outside_a_training_exits_0_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    """SIGTERM while a corpus is being prepared (no training: the CLI's own handler): exit 0, one line,
    no cache directory half written; the same command then prepares it."""
    root = word_corpus(tmp_path / "corpus", n_docs=30, words_per_doc=50)
    cache = tmp_path / "cache"
    real = data_cli.load_corpus_from_config

    def interrupted(cfg, progress=None, **kw):
        def tick(done, total):
            if done >= 5:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # (the handler raises here)
            if progress:
                progress(done, total)

        return real(cfg, progress=tick, **kw)

    monkeypatch.setattr(data_cli, "load_corpus_from_config", interrupted)
    assert (
        cli.main(["data", "prepare", "--data", f"files:{root}", "--out", str(cache), "--workers", "1"]) == 0
    )
    err = capsys.readouterr().err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    corpora = cache / "corpora"
    assert not corpora.exists() or not any((p / "index.json").is_file() for p in corpora.iterdir())
    assert signal.getsignal(signal.SIGTERM) is not console.terminate  # (the handler is the command's only)
    monkeypatch.setattr(data_cli, "load_corpus_from_config", real)
    assert (
        cli.main(["data", "prepare", "--data", f"files:{root}", "--out", str(cache), "--workers", "1"]) == 0
    )
    assert any((p / "index.json").is_file() for p in corpora.iterdir())


# -- two writers -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_second_writer_stops_at_once_naming_the_first_and_no_metrics_are_lost(corpus_dir, tmp_path, capsys):
    config = config_file(tmp_path)
    out = tmp_path / "run"
    args = sets(corpus_dir, **{"train.steps": 100000, "train.checkpoint_every": 50})
    first = bytelm_process(["train", str(config), "--out", str(out), *args])
    try:
        wait_for_step(out, 2, first)
        assert cli.main(["train", str(config), "--out", str(out), *args]) == 2
        one_line_error(capsys.readouterr().err, f"{out} is being written by pid {first.pid} on ")
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err.decode()[-2000:]  # (a preemption notice: a clean, resumable stop)
    assert RunDir(out).info()["status"] == "stopped"
    final = RunDir(out).info()["step"]
    logged = [r["step"] for r in RunDir(out).metrics() if r["kind"] == "train"]
    assert logged == list(range(1, final + 1))  # every step the survivor logged is in the file


# -- torn files ------------------------------------------------------------------------------------
def test_a_torn_metrics_tail_is_dropped_on_resume_with_a_warning(corpus_dir, tmp_path, caplog):
    cfg = load_config(None, sets(corpus_dir)[1::2])
    train(cfg, tmp_path / "run", stop_after=4)
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"kind": "train", "step": 5, "lo')  # a write cut off by a crash
    result = train(cfg, tmp_path / "run")
    assert result.step == 6 and "its last line is incomplete" in caplog.text
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3, 4, 5, 6]  # each line whole, none twice


def test_a_config_cut_at_a_line_boundary_is_refused_not_read_with_defaults(finished_run, tmp_path, capsys):
    run = copy_run(finished_run, tmp_path)
    text = (run / "config.toml").read_text()
    assert text.endswith(CONFIG_END + "\n")
    (run / "config.toml").write_text(text[: text.index("[train]")])  # whole lines, [train] lost
    for command in (["eval", str(run), "--json", str(tmp_path / "r.json")], ["sample", str(run)]):
        assert cli.main(command) == 2
        one_line_error(capsys.readouterr().err, "config.toml is incomplete")


def test_a_truncated_run_json_is_rebuilt_and_eval_gives_the_same_bpb(finished_run, tmp_path, capsys, caplog):
    """A run.json cut in half: every reader rebuilds it from config.toml, the newest checkpoint and
    metrics.jsonl (one warning), and eval scores exactly what it scored before the damage."""
    run = copy_run(finished_run, tmp_path)
    assert cli.main(["eval", str(run), "--json", str(tmp_path / "before.json")]) == 0
    before = json.loads((tmp_path / "before.json").read_text())["models"][0]
    original = RunDir(run).info()
    text = (run / "run.json").read_text()
    for command in (
        ["eval", str(run), "--json", str(tmp_path / "r.json")],
        ["sample", str(run), "--max-bytes", "4"],
        ["patch", str(run), "--text", "the", "--threshold", "1"],
    ):
        (run / "run.json").write_text(text[: len(text) // 2])
        caplog.clear()
        assert cli.main(command) == 0, (command, capsys.readouterr().err[-2000:])
        assert "rebuilt from config.toml, checkpoint 6 and metrics.jsonl" in caplog.text, command
        capsys.readouterr()
    after = json.loads((tmp_path / "r.json").read_text())["models"][0]
    assert after["bpb"] == before["bpb"] and after["step"] == before["step"] == 6
    rebuilt = RunDir(run).info()
    assert rebuilt["rebuilt"]["from_checkpoint"] == 6 and rebuilt["status"] == "finished"
    for key in ("family", "fingerprint", "params", "train_flops_per_position", "positions_per_step", "step"):
        assert rebuilt[key] == original[key], key
    assert rebuilt["final_loss"] == original["final_loss"]
    # a run without a checkpoint to rebuild from says so in one line
    (run / "run.json").write_text("{")
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    assert cli.main(["eval", str(run), "--json", str(tmp_path / "x.json")]) == 2
    one_line_error(capsys.readouterr().err, "run.json", "no checkpoint")


def test_a_cut_metrics_file_is_reported_with_the_records_lost(
    finished_run, corpus_dir, tmp_path, capsys, caplog
):
    """metrics.jsonl cut to half a line (5 of its 6 train records lost) or ending in garbage: eval, a
    resumed training and bytelm run check each say how many records were lost and from which step."""
    run = copy_run(finished_run, tmp_path)
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert sum('"kind": "train"' in x for x in lines) == 6
    (run / "metrics.jsonl").write_text(lines[0][: len(lines[0]) // 2])
    assert cli.main(["eval", str(run), "--json", str(tmp_path / "r.json")]) == 0
    assert "lost 6 of its 6 train records (from step 1)" in caplog.text
    caplog.clear()
    assert cli.main(["run", "check", str(run), "--json", str(tmp_path / "check.json")]) == 0
    out = capsys.readouterr().out
    assert "lost records" in out and "lost 6 of its 6 train records (from step 1)" in out
    states = {Path(f["what"]).name: f["state"] for f in json.loads((tmp_path / "check.json").read_text())}
    assert states["config.toml"] == states["run.json"] == states["6"] == "ok"
    # garbage at the end of an intact file: the records before it are kept, the torn line is lost
    run2 = copy_run(finished_run, tmp_path, "run2")
    kept = [x for x in lines if '"kind": "train"' in x][:4]
    (run2 / "metrics.jsonl").write_text("".join(kept) + "\x00garbage{")
    assert cli.main(["run", "check", str(run2)]) == 0
    assert "lost 2 of its 6 train records (from step 5)" in capsys.readouterr().out
    # a resumed training (steps 6 -> 8: its records up to 6 are checked first)
    cfg = load_config(None, sets(corpus_dir, **{"train.steps": 6})[1::2])
    train(cfg, tmp_path / "resumed", stop_after=4)
    metrics = tmp_path / "resumed" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines(keepends=True)[0])
    caplog.clear()
    train(cfg, tmp_path / "resumed")
    assert "lost 3 of its 4 train records (from step 2)" in caplog.text


def test_run_check_names_a_damaged_checkpoint_and_an_unusable_run(finished_run, tmp_path, capsys):
    run = copy_run(finished_run, tmp_path)
    empty_the_data_files(run, 6)
    assert cli.main(["run", "check", str(run)]) == 0  # checkpoints 2 and 4 restore
    out = capsys.readouterr().out
    assert "damaged" in out and "checkpoints/6" in out and "ok           " in out
    for step in (2, 4):
        empty_the_data_files(run, step)
    assert cli.main(["run", "check", str(run)]) == 2
    assert "no checkpoint restores" in capsys.readouterr().out
    assert cli.main(["run", "check", str(tmp_path / "nothing")]) == 2


def test_the_misleading_lines_are_true(corpus_dir, tmp_path, capsys):
    """Each line the new-user trial found misleading, now saying what is the case."""
    from bytelm.training.checkpoint import restore_reason  # noqa: PLC0415

    # an empty data file is called empty, not a held-out part without documents
    (tmp_path / "empty.txt").write_bytes(b"")
    assert cli.main(["data", "info", "--data", f"files:{tmp_path / 'empty.txt'}"]) == 2
    one_line_error(capsys.readouterr().err, "holds no bytes (the file is empty)")
    # a failed restore names the file tensorstore could not read, not the repr of its objects
    error = ValueError(
        '<bound method pybind11_detail_function_record_v1.spec of TensorStore({"driver": "ocdbt", '
        '"kvstore": {"path": "/r/checkpoints/4/state/d/abc"}})>: CRC mismatch'
    )
    assert (
        restore_reason(error)
        == "ValueError: a file of the checkpoint cannot be read (/r/checkpoints/4/state/d/abc)"
    )
    assert restore_reason(OSError("disk gone")) == "OSError: disk gone"
    # a config name that does not exist lists the shipped ones of its folder
    assert cli.main(["train", "tiny/nonexistent", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    one_line_error(err, "config file not found", "tiny/byte", "tiny/blt")
    # a train that fails its checks leaves no --out behind (not even a .lock)
    assert (
        cli.main(
            ["train", "tiny/byte", *sets(corpus_dir, **{"train.seq_len": 32}), "--out", str(tmp_path / "v")]
        )
        == 2
    )
    one_line_error(capsys.readouterr().err, "evaluation segment needs")
    assert not (tmp_path / "v").exists()
    # convert hf-blt on another model's folder names its model type before looking for weights
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text('{"model_type": "llama"}')
    assert cli.main(["convert", "hf-blt", str(tmp_path / "llama"), "--out", str(tmp_path / "conv")]) == 2
    one_line_error(capsys.readouterr().err, "model_type 'llama' is not 'blt'")


# -- damaged checkpoints ---------------------------------------------------------------------------
def empty_the_data_files(run: Path, step: int) -> None:
    for path in (run / "checkpoints" / str(step)).rglob("*"):
        if path.is_file() and path.parent.name == "d":
            path.write_bytes(b"")


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one_without_noise(finished_run, tmp_path):
    """sample and eval (processes, so that what they print at exit is seen too) report the
    damaged checkpoint with its step and reason and use checkpoint 4."""
    run = copy_run(finished_run, tmp_path)
    (run / "checkpoints" / "6" / "state" / "manifest.ocdbt").write_bytes(b"")
    empty_the_data_files(run, 6)
    for command in (
        ["sample", str(run), "--max-bytes", "8", "--seed", "1"],
        ["eval", str(run), "--json", str(tmp_path / "r.json")],
    ):
        proc = bytelm_process(command)
        _, err = proc.communicate(timeout=300)
        text = err.decode()
        assert proc.returncode == 0, text[-3000:]
        assert "Traceback" not in text and "Event loop is closed" not in text, text[-3000:]
        assert "checkpoint 6 in" in text and "cannot be restored" in text and "using checkpoint 4" in text
    assert json.loads((tmp_path / "r.json").read_text())["models"][0]["step"] == 4


def test_training_resumes_from_the_newest_checkpoint_that_restores(corpus_dir, tmp_path, caplog):
    cfg = load_config(None, sets(corpus_dir, **{"train.checkpoint_every": 1})[1::2])
    train(cfg, tmp_path / "run", stop_after=4)
    train(cfg, tmp_path / "straight")
    empty_the_data_files(tmp_path / "run", 4)
    result = train(cfg, tmp_path / "run")
    assert "checkpoint 4 in" in caplog.text and "using checkpoint 3" in caplog.text
    assert (tmp_path / "run" / "damaged-checkpoints" / "4").is_dir()  # moved aside, not deleted
    assert result.step == 6 and result.loss == RunDir(tmp_path / "straight").info()["final_loss"]


@pytest.mark.slow  # (the fast tier: pytest -m "not slow")
def test_a_bit_flip_anywhere_in_an_array_file_is_caught_by_the_digests(finished_run, tmp_path):
    """Every bit position class of every byte of every array file of the newest checkpoint: the
    restore check names the file (orbax alone restores most such flips without complaint)."""
    from bytelm.training.checkpoint import DIGEST_FILE, file_digest, verify_digests  # noqa: PLC0415

    run = copy_run(finished_run, tmp_path)
    step_dir = run / "checkpoints" / "6"
    assert (step_dir / DIGEST_FILE).is_file() and verify_digests(step_dir) is None
    arrays = sorted(p for p in step_dir.rglob("*") if p.is_file() and p.parent.name == "d")
    assert arrays and sum(p.stat().st_size for p in arrays) < 200_000  # (a small checkpoint: every byte)
    recorded = json.loads((step_dir / DIGEST_FILE).read_text())["files"]
    for path in arrays:
        data = path.read_bytes()
        want = recorded[path.relative_to(step_dir).as_posix()]
        fd = os.open(path, os.O_WRONLY)
        try:
            for i, byte in enumerate(data):
                os.pwrite(fd, bytes([byte ^ (1 << (i % 8))]), i)  # one bit of byte i, in place
                assert file_digest(path) != want, (path, i)  # (what the restore check compares)
                if i in (0, len(data) // 2, len(data) - 1):  # and the check itself names the file
                    why = verify_digests(step_dir)
                    assert why is not None and str(path) in why, (path, i)
                os.pwrite(fd, bytes([byte]), i)
        finally:
            os.close(fd)
    assert verify_digests(step_dir) is None


def test_a_bit_flip_in_the_newest_checkpoint_leads_to_the_previous_one_not_to_divergence(
    corpus_dir, tmp_path, caplog
):
    cfg = load_config(None, sets(corpus_dir, **{"train.checkpoint_every": 2})[1::2])
    train(cfg, tmp_path / "run", stop_after=4)
    train(cfg, tmp_path / "straight")
    (array,) = [p for p in (tmp_path / "run" / "checkpoints" / "4").rglob("*") if p.parent.name == "d"][:1]
    data = bytearray(array.read_bytes())
    data[len(data) // 2] ^= 0x40  # (an exponent bit of some weight: orbax restores it as it is)
    array.write_bytes(bytes(data))
    result = train(cfg, tmp_path / "run")
    assert "checkpoint 4 in" in caplog.text and "does not match the digest" in caplog.text
    assert "using checkpoint 2" in caplog.text and (tmp_path / "run" / "damaged-checkpoints" / "4").is_dir()
    assert result.step == 6 and result.loss == RunDir(tmp_path / "straight").info()["final_loss"]


def test_a_partial_run_says_so_in_eval_and_sample(corpus_dir, finished_run, tmp_path, capsys):
    cfg = load_config(None, sets(corpus_dir)[1::2])
    train(cfg, tmp_path / "part", stop_after=4)
    assert (
        cli.main(["eval", str(tmp_path / "part"), str(finished_run), "--json", str(tmp_path / "r.json")]) == 0
    )
    out = capsys.readouterr().out
    assert "PARTIAL: part is at step 4 of 6, stopped" in out and "part (PARTIAL: step 4 of 6, stopped)" in out
    rows = {m["name"]: m for m in json.loads((tmp_path / "r.json").read_text())["models"]}
    assert rows["part"]["complete"] is False and rows["part"]["partial"] == "step 4 of 6, stopped"
    assert rows[finished_run.name]["complete"] is True and rows[finished_run.name]["partial"] is None
    assert cli.main(["sample", str(tmp_path / "part"), "--max-bytes", "2"]) == 0
    assert "is at step 4 of 6, stopped: a partial run" in capsys.readouterr().err
    # a finished run sampled at an older checkpoint says which
    assert cli.main(["sample", str(finished_run), "--max-bytes", "2", "--step", "4"]) == 0
    assert "step 4 of 6, finished (the run is at step 6)" in capsys.readouterr().err
    assert cli.main(["sample", str(finished_run), "--max-bytes", "2"]) == 0
    assert "partial" not in capsys.readouterr().err


def test_sample_step_that_does_not_exist_lists_the_steps_that_do(finished_run, capsys):
    assert cli.main(["sample", str(finished_run), "--step", "99"]) == 2
    one_line_error(capsys.readouterr().err, "no checkpoint of step 99", "2, 4, 6")


# -- output paths ----------------------------------------------------------------------------------
def test_every_output_path_is_checked_before_any_work(finished_run, corpus_dir, tmp_path, capsys):
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    data = f"files:{corpus_dir}"
    cases = [
        (["train", "tiny/byte", "--out", str(a_file)], "is a file"),
        (["train", "tiny/byte", "--out", str(a_file / "run")], "which is a file"),
        (["eval", str(finished_run), "--json", str(a_dir)], "is a directory"),
        (["eval", str(finished_run), "--json", str(a_file / "r.json")], "which is a file"),
        (["compare", "--preset", "test", "--data", data, "--out", str(a_file)], "is a file"),
        (["ablate", "micro", "--data", data, "--out", str(a_file / "x")], "which is a file"),
        (["data", "export-heldout", "--data", data, "--out", str(a_dir)], "is a directory"),
        (["tokenizer", "train", "--data", data, "--vocab-size", "300", "--out", str(a_file)], "is a file"),
        (["tokenizer", "stats", "--tokenizer", str(a_dir), "--json", str(a_dir)], "is a directory"),
        (["patch", str(finished_run), "--text", "the", "--threshold", "1", "--png", str(a_dir)], "directory"),
        (["export", "hf", str(finished_run), "--out", str(a_file)], "is a file"),
        (["convert", "hf-blt", str(a_dir), "--out", str(a_file / "run")], "which is a file"),
    ]
    for command, fragment in cases:
        assert cli.main(command) == 2, command
        one_line_error(capsys.readouterr().err, fragment)
    assert list(a_dir.iterdir()) == []  # nothing was written anywhere


# -- config values ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "setting, fragment",
    [
        ("train.learning_rate=-1", "train.learning_rate must be a finite number > 0"),
        ("train.learning_rate=nan", "train.learning_rate must be a finite number > 0"),
        ("train.beta1=1.0", "train.beta1 must be in [0, 1)"),
        ("train.beta2=-0.1", "train.beta2 must be in [0, 1)"),
        ("train.grad_clip=-1", "train.grad_clip must be a finite number >= 0"),
        ("train.weight_decay=inf", "train.weight_decay must be a finite number >= 0"),
        ("train.min_lr_ratio=1.5", "train.min_lr_ratio must be in [0, 1]"),
    ],
)
def test_bad_optimiser_values_are_refused_at_load(setting, fragment, tmp_path, capsys):
    with pytest.raises(UserError, match=fragment.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [setting])
    assert cli.main(["train", "tiny/byte", "--out", str(tmp_path / "r"), "--set", setting]) == 2
    one_line_error(capsys.readouterr().err, fragment)
    assert not (tmp_path / "r").exists()


def test_a_context_shorter_than_the_evaluation_segments_stops_before_training(corpus_dir, tmp_path, capsys):
    out = tmp_path / "r"
    assert (
        cli.main(
            [
                "train",
                str(config_file(tmp_path)),
                "--out",
                str(out),
                *sets(corpus_dir),
                "--set",
                "train.seq_len=8",
            ]
        )
        == 2
    )
    one_line_error(capsys.readouterr().err, "needs 64 positions but the model trains on train.seq_len = 8")
    assert not (out / "checkpoints").exists() and not (out / "run.json").exists()


def test_a_config_that_is_not_utf8_fails_in_one_line(tmp_path, capsys):
    path = tmp_path / "latin1.toml"
    path.write_bytes("[train]\nsteps = 3  # é\n".encode("latin-1"))
    assert cli.main(["train", str(path), "--out", str(tmp_path / "r")]) == 2
    one_line_error(capsys.readouterr().err, "is not UTF-8 text (byte 0xe9")


# -- pipes -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_closed_pipe_ends_quietly(finished_run, tmp_path):
    """`bytelm sample RUN | head -c1` and `bytelm tokenizer encode ... | head -c 10`: exit 0, no
    traceback."""
    proc = bytelm_process(["sample", str(finished_run), "--max-bytes", "100000"])
    assert len(proc.stdout.read(1)) == 1
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()[-2000:]
    tok = train_bpe([b"the cat sat on the mat " * 20], vocab_size=270, num_workers=1)
    tok.save(tmp_path / "tok")
    proc = bytelm_process(
        ["tokenizer", "encode", "--tokenizer", str(tmp_path / "tok")], stdin=subprocess.PIPE
    )
    proc.stdin.write(b"a b c d e f g h " * 200000)
    proc.stdin.close()
    assert len(proc.stdout.read(10)) == 10
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()[-2000:]


# -- file modes ------------------------------------------------------------------------------------
def test_written_files_honour_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        with atomic_directory(tmp_path / "d") as d:
            (d / "f").write_text("y")
        assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o644
        assert stat.S_IMODE((tmp_path / "d").stat().st_mode) == 0o755
        os.umask(0o027)
        atomic_write_text(tmp_path / "b.txt", "x")
        tok = train_bpe([b"the cat sat on the mat " * 20], vocab_size=270, num_workers=1)
        tok.save(tmp_path / "tok")
        assert stat.S_IMODE((tmp_path / "b.txt").stat().st_mode) == 0o640
        assert {stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "tok").iterdir()} == {0o640}
    finally:
        os.umask(old)


# -- logging, version, exit status -----------------------------------------------------------------
def test_verbosity_works_anywhere_and_replaces_the_root_logger_set_up_at_import(
    finished_run, tmp_path, capsys
):
    import logging

    absl_like = logging.StreamHandler()  # what absl's logging.basicConfig() at import leaves on the root
    absl_like.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    logging.getLogger().addHandler(absl_like)
    run = copy_run(finished_run, tmp_path)
    empty_the_data_files(run, 6)
    assert cli.main(["sample", str(run), "--max-bytes", "2", "-v"]) == 0
    err = capsys.readouterr().err
    assert "WARNING bytelm.training.checkpoint: checkpoint 6" in err and "WARNING:bytelm" not in err
    assert "DEBUG " in err  # -v after the command
    assert cli.main(["-q", "sample", str(run), "--max-bytes", "2"]) == 0
    assert "checkpoint 6" in capsys.readouterr().err  # -q keeps warnings
    assert cli.main(["sample", str(finished_run), "--max-bytes", "2", "--quiet"]) == 0
    assert "DEBUG" not in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.startswith("bytelm ")


# -- overwrites ------------------------------------------------------------------------------------
def test_tokenizer_train_refuses_to_write_over_a_tokenizer_or_a_run(
    finished_run, corpus_dir, tmp_path, capsys
):
    data = f"files:{corpus_dir}"
    train_args = ["tokenizer", "train", "--data", data, "--vocab-size", "300", "--workers", "1"]
    assert cli.main([*train_args, "--out", str(tmp_path / "tok")]) == 0
    before = (tmp_path / "tok" / "bytelm_bpe.json").read_bytes()
    capsys.readouterr()
    assert cli.main([*train_args, "--vocab-size", "290", "--out", str(tmp_path / "tok")]) == 2
    one_line_error(capsys.readouterr().err, "holds a tokenizer already", "--force")
    assert (tmp_path / "tok" / "bytelm_bpe.json").read_bytes() == before
    assert cli.main([*train_args, "--out", str(finished_run)]) == 2
    one_line_error(capsys.readouterr().err, "is a run directory")
    assert cli.main([*train_args, "--vocab-size", "290", "--out", str(tmp_path / "tok"), "--force"]) == 0
    assert (tmp_path / "tok" / "bytelm_bpe.json").read_bytes() != before
    # a vocabulary larger than the corpus gives says so in the summary
    assert cli.main([*train_args, "--vocab-size", "100000", "--out", str(tmp_path / "big")]) == 0
    assert "not the 100,000 asked for" in capsys.readouterr().out


# -- the smaller cases -----------------------------------------------------------------------------
def test_the_smaller_cases(finished_run, tmp_path, capsys):
    # eval --help: --data defaults to the runs' own corpus, not stdlib
    with pytest.raises(SystemExit):
        cli.main(["eval", "--help"])
    assert "default: the corpus the runs were trained on" in " ".join(capsys.readouterr().out.split())
    # a tokenizer's file given for its directory
    (tmp_path / "tok.json").write_text("{}")
    assert cli.main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "tok.json")]) == 2
    one_line_error(capsys.readouterr().err, "is a file; a tokenizer is the directory")
    # a threshold that is not a number of nats
    assert cli.main(["patch", str(finished_run), "--text", "the", "--threshold", "nan"]) == 2
    one_line_error(capsys.readouterr().err, "must be a finite number of nats")
    # ablate --collect with nothing trained in --out
    assert cli.main(["ablate", "micro", "--collect", "--out", str(tmp_path / "empty")]) == 2
    one_line_error(capsys.readouterr().err, "nothing to collect")


# -- fuzz ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bpe_run(corpus_dir, tmp_path_factory):
    """A BPE run stopped at step 4 of 6 (checkpoints 2 and 4), with its tokenizer beside it."""
    root = tmp_path_factory.mktemp("fuzz")
    corpus = load_corpus(f"files:{corpus_dir}", cache_dir=root / "cache")
    train_bpe(corpus.documents("train"), vocab_size=300, num_workers=1).save(root / "tok")
    cfg = load_config(
        None,
        sets(corpus_dir, **{"model.family": "bpe", "model.tokenizer": root / "tok", "train.seq_len": 32})[
            1::2
        ],
    )
    train(cfg, root / "run", stop_after=4)
    return root


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lock"
    }


@pytest.mark.slow
def test_fuzz_damaged_run_directories_work_or_fail_in_one_line(bpe_run, tmp_path, capfd):
    """50 random truncations and byte flips of the run's files (run.json, config.toml,
    metrics.jsonl, every checkpoint file, the tokenizer's files): eval, sample and train (resume)
    each work or exit 2 with one line, never a traceback; a command that fails changes no file,
    and eval and sample change none either way."""
    rng = random.Random(0)
    work = tmp_path / "w"
    targets: dict[str, list[Path]] = {}
    for p in sorted(bpe_run.rglob("*")):
        rel = p.relative_to(bpe_run)
        # (TensorBoard's event files are written, never read, by bytelm: not a target)
        if (
            p.is_file()
            and rel.parts[0] in ("run", "tok")
            and p.name != ".lock"
            and "tensorboard" not in rel.parts
        ):
            kind = (
                "checkpoint"
                if "checkpoints" in rel.parts
                else rel.parts[0]
                if rel.parts[0] == "tok"
                else p.name
            )
            targets.setdefault(kind, []).append(rel)
    assert set(targets) == {"run.json", "config.toml", "metrics.jsonl", "checkpoint", "tok"}
    outcomes: dict[int, int] = {}
    for case in range(50):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(bpe_run, work)
        kind = rng.choice(sorted(targets))  # a kind of file, then one of its files
        target = work / rng.choice(targets[kind])
        data = target.read_bytes()
        if data and rng.random() < 0.5:
            i = rng.randrange(len(data))
            target.write_bytes(data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :])
            what = f"case {case}: bit flip at {i} of {target}"
        else:
            target.write_bytes(data[: rng.randrange(len(data) + 1)] if data else b"")
            what = f"case {case}: truncated {target}"
        run = str(work / "run")
        for command in (
            ["eval", run, "--json", str(tmp_path / "r.json")],
            ["sample", run, "--max-bytes", "4"],
            ["train", str(work / "run" / "config.toml"), "--out", run],
        ):
            before = digests(work)
            try:
                rc = cli.main(["-q", *command])
            except BaseException as e:  # noqa: BLE001  (anything but a return is the failure sought)
                raise AssertionError(f"{what}: {command[0]} raised {type(e).__name__}: {e}") from e
            out, err = capfd.readouterr()
            assert rc in (0, 2), (what, command[0], rc, err[-2000:])
            outcomes[rc] = outcomes.get(rc, 0) + 1
            assert "Traceback" not in err, (what, command[0], err[-3000:])
            if rc == 2:
                one_line_error(err)
            after = digests(work)
            changed = after.get("run/run.json") != before.get("run/run.json")
            if kind == "run.json" and rc == 0 and command[0] != "train" and changed:
                # a damaged record is rebuilt by every reader (from the config and the checkpoints)
                assert "rebuilt" in RunDir(work / "run").info(), (what, command[0])
                before["run/run.json"] = after["run/run.json"]
            if rc == 2 or command[0] != "train":
                assert after == before, (what, command[0], "changed a file")
    print(outcomes)
    assert outcomes.get(2, 0) >= 10 and outcomes.get(0, 0) >= 10  # (both outcomes exercised)


def test_asyncio_reports_of_abandoned_checkpoint_reads_are_dropped_and_nothing_else():
    """The filter on the asyncio logger (installed with the restore-noise hooks) drops a "... exception
    was never retrieved" report whose failure lies in orbax's files (Task, Future or _GatheringFuture,
    the class asyncio names at interpreter exit), and passes every other record."""
    import logging
    import sys

    from bytelm.training.checkpoint import _asyncio_noise

    def raiser(filename: str):
        namespace: dict = {}
        exec(compile("def read():\n    raise ValueError('Requested shape')\n", filename, "exec"), namespace)
        return namespace["read"]

    def record(message, exc_info=None):
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, None, exc_info)

    infos = []
    for filename in ("/x/orbax/checkpoint/s.py", "/x/elsewhere/s.py"):
        try:
            raiser(filename)()
        except ValueError:
            infos.append(sys.exc_info())
    from_orbax, from_elsewhere = infos
    for kind in ("Task", "Future", "_GatheringFuture"):
        text = f"{kind} exception was never retrieved\nfuture: <{kind} finished exception=ValueError(...)>"
        assert _asyncio_noise(record(text, from_orbax)) is False
        assert _asyncio_noise(record(text, from_elsewhere)) is True
    assert _asyncio_noise(record("Task was destroyed but it is pending! orbax")) is True
