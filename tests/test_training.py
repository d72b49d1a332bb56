"""The trainer: golden step, resume after SIGKILL, data parallelism, bad input, divergence."""

import json
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import TESTS_DIR, subprocess_env
from helpers import corpus_dir, metrics, tiny_overrides  # noqa: F401  (corpus_dir: a fixture)

from bytelm import cli
from bytelm.config import load_config, with_values
from bytelm.errors import UserError
from bytelm.rundir import RunDir
from bytelm.training.clock import Clock
from bytelm.training.loop import train
from bytelm.training.optim import learning_rate_schedule
from bytelm.training.restore import restore_scorer
from bytelm.training.trainer import TrainingDiverged


def test_golden_one_step_loss(corpus_dir, tmp_path):  # noqa: F811
    """Golden values for seed 0 on the fixed corpus. Update them only when a change is *meant* to alter
    initialisation, the data order or the numerics (and say so in the commit message)."""
    cfg = load_config(None, tiny_overrides(corpus_dir, **{"train.steps": 2, "eval.every": 0}))
    train(cfg, tmp_path / "run")
    losses = [m["loss"] for m in metrics(tmp_path / "run")]
    assert losses[0] == pytest.approx(6.23182, abs=1e-3), losses
    assert losses[1] == pytest.approx(5.72748, abs=1e-3), losses
    assert losses[0] > np.log(260) - 1  # near-uniform start over 260 ids


def test_training_reduces_loss_and_records_run(corpus_dir, tmp_path):  # noqa: F811
    cfg = load_config(None, tiny_overrides(corpus_dir, **{"train.steps": 30, "eval.every": 30}))
    result = train(cfg, tmp_path / "run")
    rows = metrics(tmp_path / "run")
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.0
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "finished" and run["step"] == 30 and len(run["fingerprint"]) == 64
    assert result.eval_bpb == metrics(tmp_path / "run", "eval")[-1]["bpb"] < 8.0
    assert (tmp_path / "run" / "config.toml").read_text().startswith("[data]")
    for key in ("loss", "bpb", "bytes_s", "tokens_s", "lr", "grad_norm"):
        assert np.isfinite(rows[-1][key])
    assert all(r["mfu"] is None or 0 < r["mfu"] <= 1 for r in rows)


def test_grad_accumulation_matches_full_batch(corpus_dir, tmp_path):  # noqa: F811
    a = load_config(None, tiny_overrides(corpus_dir, **{"train.steps": 3, "eval.every": 0}))
    b = load_config(
        None, tiny_overrides(corpus_dir, **{"train.steps": 3, "eval.every": 0, "train.grad_accum": 4})
    )
    train(a, tmp_path / "a")
    train(b, tmp_path / "b")
    la = [m["loss"] for m in metrics(tmp_path / "a")]
    lb = [m["loss"] for m in metrics(tmp_path / "b")]
    np.testing.assert_allclose(la, lb, rtol=2e-5)


def _read_final_params(run_dir):
    trainer = restore_scorer(run_dir)
    import jax

    return trainer.step, [np.asarray(x) for x in jax.tree.leaves(trainer.params)]


@pytest.mark.slow
def test_resume_after_sigkill_equals_uninterrupted(corpus_dir, tmp_path):  # noqa: F811
    overrides = tiny_overrides(corpus_dir, **{"train.steps": 16})
    config = tmp_path / "c.toml"
    config.write_text("")

    def cli_train(out):
        cmd = [sys.executable, "-m", "bytelm", "train", str(config), "--out", str(tmp_path / out)]
        for o in overrides:
            cmd += ["--set", o]
        return cmd

    # Every phase runs as a fresh `bytelm train` process on one CPU device, so all steps reduce in
    # the same order whatever this test process has already set up.
    env = subprocess_env(1, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cli_train("killed"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    metrics_file = tmp_path / "killed" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics_file.exists() and any(
            json.loads(x)["step"] >= 10 for x in metrics_file.read_text().splitlines()
        ):
            break
        time.sleep(0.05)
    assert proc.poll() is None, (
        f"trainer ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert max(json.loads(x)["step"] for x in metrics_file.read_text().splitlines()) < 16
    # resume to the end, then run the same config uninterrupted
    for out in ("killed", "straight"):
        done = subprocess.run(cli_train(out), env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
    step_a, params_a = _read_final_params(tmp_path / "killed")
    step_b, params_b = _read_final_params(tmp_path / "straight")
    assert step_a == step_b == 16
    for x, y in zip(params_a, params_b):
        np.testing.assert_array_equal(x, y)
    strip = lambda rows: [(r["step"], r["loss"], r["bpb"], r["grad_norm"]) for r in rows]  # noqa: E731
    assert strip(metrics(tmp_path / "killed")) == strip(metrics(tmp_path / "straight"))
    assert [(r["step"], r["bpb"]) for r in metrics(tmp_path / "killed", "eval")] == [
        (r["step"], r["bpb"]) for r in metrics(tmp_path / "straight", "eval")
    ]


@pytest.mark.slow
def test_data_parallel_step_equals_single_device(corpus_dir, tmp_path):  # noqa: F811
    code = textwrap.dedent(
        f"""
        import jax, numpy as np
        from bytelm.config import load_config
        from bytelm.data import load_corpus
        from bytelm.training.sharding import make_mesh
        from bytelm.training.restore import make_task
        from bytelm.training.trainer import Trainer
        import sys; sys.path.insert(0, {TESTS_DIR!r})
        from conftest import param_gap
        assert jax.device_count() == 8
        cfg = load_config(None, {tiny_overrides(corpus_dir)!r})
        corpus = load_corpus(cfg.data.source, segment_bytes=64, max_eval_bytes=4096)
        task = make_task(cfg, corpus)
        batch = next(task.train_batches(0))
        multi = Trainer(cfg, task, mesh=make_mesh(cfg.train))
        single = Trainer(cfg, task, mesh=make_mesh(cfg.train, devices=jax.devices()[:1]))
        assert multi.mesh.shape["data"] == 8 and single.mesh.shape["data"] == 1
        init = [np.array(x) for x in jax.tree.leaves(single.params)]  # copies: steps may donate buffers
        for _ in range(2):
            lm = float(multi.train_step(batch)["loss"]); ls = float(single.train_step(batch)["loss"])
        # differently sharded programs (gradients all-reduced over 8 devices vs summed on one): float32
        # reassociation only, ~1e-7 relative per value; 1e-5 absolute leaves two orders of margin
        assert abs(lm - ls) < 1e-5, (lm, ls)
        worst, rel = param_gap(
            jax.tree.leaves(multi.params), jax.tree.leaves(single.params), init
        )  # see its docstring
        print("max param diff", worst, "relative", rel)
        assert rel < 1e-3, (rel, worst)
        """
    )
    env = subprocess_env(8)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "max param diff" in r.stdout


def test_nan_loss_stops_with_step_and_keeps_last_good_checkpoint(corpus_dir, tmp_path):  # noqa: F811
    cfg = load_config(
        None,
        tiny_overrides(
            corpus_dir,
            **{
                "train.steps": 50,
                "train.learning_rate": 1e9,
                "train.grad_clip": 0.0,
                "train.warmup_steps": 0,
                "train.checkpoint_every": 1,
                "eval.every": 0,
            },
        ),
    )
    with pytest.raises(
        TrainingDiverged, match=r"at step (\d+); the last good checkpoint \(step (\d+)\)"
    ) as e:
        train(cfg, tmp_path / "run")
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["status"] == "diverged" and run["last_good_checkpoint"] == run["diverged_at_step"] - 1
    trainer = restore_scorer(tmp_path / "run")
    import jax

    assert trainer.step == run["last_good_checkpoint"]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(trainer.params))
    assert "Lower train.learning_rate" in str(e.value)


@pytest.mark.slow  # (the fast tier: pytest -m "not slow")
def test_an_extended_run_equals_the_unextended_one_up_to_its_steps_and_goes_on(corpus_dir, tmp_path):  # noqa: F811
    """train.steps raised on a finished run (and on an interrupted one) continues it: the first N
    steps are the unextended run's, then a new warmup + cosine segment to the floor at M; the change
    is recorded in run.json and every checkpoint; other differences are still refused, by key."""
    base = {"eval.every": 0, "train.checkpoint_every": 2, "train.warmup_steps": 2}
    six = load_config(None, tiny_overrides(corpus_dir, **{**base, "train.steps": 6}))
    nine = load_config(None, tiny_overrides(corpus_dir, **{**base, "train.steps": 9}))
    train(six, tmp_path / "short")
    import shutil  # noqa: PLC0415

    shutil.copytree(tmp_path / "short", tmp_path / "long")
    result = train(nine, tmp_path / "long")
    assert result.step == 9
    short, long = metrics(tmp_path / "short"), metrics(tmp_path / "long")
    assert [r["loss"] for r in long[:6]] == [r["loss"] for r in short]  # the first 6 steps: the same
    assert [r["step"] for r in long] == list(range(1, 10))
    # steps 7-9 run the schedule of a fresh run of 3 steps (warmup again, cosine to the floor at 9)
    schedule = learning_rate_schedule(nine.train)
    fresh = [float(schedule(c, 3)) for c in range(3)]
    assert [r["lr"] for r in long[6:]] == pytest.approx(fresh, rel=1e-6)
    assert [r["lr"] for r in long[:6]] == pytest.approx([r["lr"] for r in short], rel=1e-6)
    info = RunDir(tmp_path / "long").info()
    assert info["status"] == "finished" and info["step"] == 9 and info["planned_steps"] == 9
    assert info["extensions"] == [{"from": 6, "to": 9, "steps_before": 6}]
    # an interrupted extended run resumes inside its segment (kept in the checkpoints' meta)
    twelve = load_config(None, tiny_overrides(corpus_dir, **{**base, "train.steps": 12}))
    shutil.copytree(tmp_path / "short", tmp_path / "split")
    train(twelve, tmp_path / "split", stop_after=2)
    train(twelve, tmp_path / "split")
    shutil.copytree(tmp_path / "short", tmp_path / "whole")
    train(twelve, tmp_path / "whole")
    assert [r["loss"] for r in metrics(tmp_path / "split")] == [
        r["loss"] for r in metrics(tmp_path / "whole")
    ]
    # fewer steps, or any other key, is refused naming it
    with pytest.raises(UserError, match=r"train.steps: checkpoint has 9, now 6 \(a run can be extended"):
        train(six, tmp_path / "long")
    other = load_config(
        None, tiny_overrides(corpus_dir, **{**base, "train.steps": 12, "train.learning_rate": 1e-2})
    )
    with pytest.raises(UserError, match=r"train.learning_rate: checkpoint has 0.003, now 0.01"):
        train(other, tmp_path / "long")


def test_resume_refuses_a_different_config(corpus_dir, tmp_path):  # noqa: F811
    cfg = load_config(None, tiny_overrides(corpus_dir, **{"train.steps": 2, "eval.every": 0}))
    train(cfg, tmp_path / "run")
    other = load_config(
        None, tiny_overrides(corpus_dir, **{"train.steps": 2, "eval.every": 0, "model.d_model": 64})
    )
    with pytest.raises(UserError, match=r"model.d_model: checkpoint has 32, now 64.*new --out"):
        train(other, tmp_path / "run")
    # a config.toml edited behind the checkpoint's back is caught when restoring
    text = (tmp_path / "run" / "config.toml").read_text().replace("d_model = 32", "d_model = 64")
    (tmp_path / "run" / "config.toml").write_text(text)
    with pytest.raises(
        UserError, match="no checkpoint in .* restores onto the model built from the run's config"
    ):
        restore_scorer(tmp_path / "run")


def test_batch_not_divisible_by_data_axis(corpus_dir, tmp_path):  # noqa: F811
    code = textwrap.dedent(
        f"""
        from bytelm.config import load_config
        from bytelm.errors import UserError
        from bytelm.training.loop import train
        cfg = load_config(
            None, {tiny_overrides(corpus_dir, **{"train.batch_size": 6, "train.mesh_data": 4})!r}
        )
        try:
            train(cfg, {str(tmp_path / "run")!r})
        except UserError as e:
            print("ERR", e)
        """
    )
    env = subprocess_env(4)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "ERR" in r.stdout, r.stderr[-2000:]
    assert (
        "micro-batch train.batch_size/train.grad_accum = 6 is not divisible by the data-parallel mesh size"
        in r.stdout
    )


def test_default_cpu_mesh_fits_the_batch(corpus_dir):  # noqa: F811
    code = textwrap.dedent(
        f"""
        from bytelm.config import load_config
        from bytelm.training.trainer import default_mesh
        for bs, ebs, want in [(8, 8, 4), (6, 8, 2), (5, 8, 1), (16, 12, 4)]:
            cfg = load_config(
                None,
                {tiny_overrides(corpus_dir)!r} + [f"train.batch_size={{bs}}", f"eval.batch_size={{ebs}}"]
            )
            assert default_mesh(cfg).shape["data"] == want, (bs, ebs, default_mesh(cfg).shape)
        print("OK")
        """
    )
    env = subprocess_env(4)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "OK" in r.stdout, r.stderr[-2000:]


def test_cli_train_bad_config_exit_2(tmp_path, capsys, monkeypatch):
    import socket

    from bytelm import cli

    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nfamily = "byte"\nd_modle = 3\n')
    assert cli.main(["train", str(cfg), "--out", str(tmp_path / "r")]) == 2
    assert "did you mean 'model.d_model'" in capsys.readouterr().err
    cfg.write_text('[model]\nfamily = "byte"\n')
    with socket.socket() as s:  # a store that cannot be reached: a closed port on this machine
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", str(cfg), "--out", "gs://bucket/run"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot reach gs://bucket/run" in err[0] and f"127.0.0.1:{port}" in err[0], err
    assert list(tmp_path.iterdir()) == [cfg]  # (no local directory named after the URL)
    # a command that writes only to a file system names the option and the way to a bucket
    assert cli.main(["compare", "--preset", "test", "--out", "gs://bucket/cmp"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out gs://bucket/cmp is a URL" in err[0], err


@pytest.mark.slow
def test_resume_on_two_devices_and_finished_run_is_left_alone(corpus_dir, tmp_path):  # noqa: F811
    code = textwrap.dedent(
        f"""
        import json, jax
        from bytelm.config import load_config
        from bytelm.training.loop import train
        assert jax.device_count() == 2
        cfg = load_config(None, {tiny_overrides(corpus_dir, **{"train.steps": 4, "eval.every": 0})!r})
        run = {str(tmp_path / "run")!r}
        first = train(cfg, run, stop_after=2)
        assert first.step == 2
        done = train(cfg, run)  # restores onto the 2-device mesh and continues
        assert done.step == 4
        before = open(run + "/run.json").read()
        again = train(cfg, run)
        assert again.step == 4 and again.loss == done.loss
        assert open(run + "/run.json").read() == before
        print("OK")
        """
    )
    env = subprocess_env(2)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "OK" in r.stdout, r.stderr[-3000:]


# -- time budgets -----------------------------------------------------------------------------

BUDGET_S = 5.0


BUDGET_OVERRIDES = {
    "train.steps": 1,
    "train.warmup_steps": 20,
    "train.log_every": 1,
    "eval.every": 0,
    "train.checkpoint_every": 10**6,
}


def budget_cfg(corpus_dir, **extra):  # noqa: F811
    over = {"train.time_budget_s": BUDGET_S, **BUDGET_OVERRIDES, **extra}
    return load_config(None, tiny_overrides(corpus_dir, **over))


def _lr_matches_the_planned_schedule(cfg, run_dir, planned):
    """Every step after the probe ran with the schedule at the horizon planned before it (the last
    plan is ``planned``)."""
    schedule = learning_rate_schedule(cfg.train)
    plans = metrics(run_dir, "plan")
    assert plans[-1]["planned_steps"] == planned
    recs = [
        r for r in metrics(run_dir) if r["step"] > 1 + Clock.PROBE_STEPS
    ]  # the first plan is made after the probe
    assert recs
    for r in recs:
        horizon = [p["planned_steps"] for p in plans if p["step"] < r["step"]][-1]
        assert r["lr"] == pytest.approx(float(schedule(r["step"] - 1, horizon)), rel=1e-6), r


@pytest.mark.slow
def test_time_budget_stops_the_run_with_a_checkpoint_and_a_final_eval(corpus_dir, tmp_path):  # noqa: F811
    """``train.steps`` is ignored; the run plans its horizon from its first steps and stops when the
    budget is spent (or at the horizon, if the steps got faster), within one step of it."""
    cfg = budget_cfg(corpus_dir, **{"eval.every": 10**6})
    # the same step compiled once beforehand (JAX's compilation cache): the budget then goes to
    # steps, not to a compilation that a loaded machine can stretch past it
    train(load_config(None, tiny_overrides(corpus_dir, **BUDGET_OVERRIDES)), tmp_path / "warm")
    result = train(cfg, tmp_path / "run")
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    plans = metrics(tmp_path / "run", "plan")
    assert plans and info["planned_steps"] == plans[-1]["planned_steps"] > 1  # steps = 1 ignored
    # planned after the probe, then again at doublings of the steps: inside the warmup or the first
    # fifth of the decay of the plan before, or later to correct a plan that would miss the budget
    steps_planned = [p["step"] for p in plans]
    assert steps_planned[0] == 1 + Clock.PROBE_STEPS and all(s & (s - 1) == 0 for s in steps_planned[1:]), (
        steps_planned
    )
    warmup = BUDGET_OVERRIDES["train.warmup_steps"]
    for before, p in zip(plans, plans[1:]):
        early = p["step"] < warmup or p["step"] - warmup <= Clock.REPLAN_DECAY * (
            before["planned_steps"] - warmup
        )
        missed = p["train_s"] + (before["planned_steps"] - p["step"]) * p["step_s"]
        assert early or abs(missed - BUDGET_S) > Clock.LATE_MISS * BUDGET_S, (before, p)
    steps = metrics(tmp_path / "run")
    longest = max(r["step_s"] for r in steps[1:])  # (the first includes the compilation)
    assert info["status"] == "finished" and result.step == info["step"] == steps[-1]["step"]
    if info["step"] < info["planned_steps"]:  # stopped by the budget, within one step of it
        assert BUDGET_S <= info["train_s"] <= BUDGET_S + 2 * longest
    else:  # reached the horizon first: the budget is nearly spent
        assert info["step"] == info["planned_steps"] and info["train_s"] <= BUDGET_S + 2 * longest
    assert [e["step"] for e in metrics(tmp_path / "run", "eval")] == [info["step"]]  # the final evaluation
    assert sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit()) == [
        info["step"]
    ]
    _lr_matches_the_planned_schedule(cfg, tmp_path / "run", info["planned_steps"])
    assert train(cfg, tmp_path / "run").step == info["step"]  # finished: left alone


def _clock_plans(monkeypatch, step_times, *, budget=100.0, warmup=60):
    """Drive a :class:`_Clock` with the given step durations (a fake timer); the horizon after each
    step and the steps at which it was (re)planned."""
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    clock = Clock(budget, 0.0, None, warmup)
    clock.start()
    horizons, planned_at = [], []
    for n, dt in enumerate(step_times, start=1):
        now[0] += dt
        if clock.plan(n, n):
            planned_at.append(n)
        horizons.append(clock.horizon)
    return horizons, planned_at


def test_time_budget_replans_from_the_steady_pace(monkeypatch):
    """Steps that start slow and settle (as on a CPU right after compiling): the probe alone would
    plan from the slow pace; the re-plans at doublings of the steps move the horizon to the budget
    at the steady pace, inside the warmup and the first fifth of the decay, and after it only when
    the plan would miss the budget by more than 3%."""
    times = [10.0, 0.9, 0.9, 0.9, 0.7, 0.7, 0.6, 0.6] + [0.5] * 200
    horizons, planned_at = _clock_plans(monkeypatch, times)
    # 64 is past the warmup of 60 but inside the first fifth of the decay; 128 is not
    assert planned_at == [4, 8, 16, 32, 64]
    assert abs(horizons[3] - (4 + (100 - 12.7) / 0.9)) <= 1  # the probe's plan: about 101 steps
    spent32 = sum(times[:32])
    assert abs(horizons[-1] - (32 + (100 - spent32) / 0.5)) <= 1 and horizons[-1] > horizons[3] + 50
    assert sum(times[: horizons[-1]]) == pytest.approx(100.0, abs=0.5)  # the budget ends at the horizon
    # a steady pace from the start: the re-plans agree with the probe to within a step
    horizons, planned_at = _clock_plans(monkeypatch, [10.0] + [0.5] * 300)
    assert planned_at == [4, 8, 16, 32, 64] and abs(horizons[-1] - horizons[3]) <= 1
    # the pace improves after a short warmup (10): the re-plans at 16 and 32 (in the decay) follow
    # it, and the budget ends at the horizon; planned inside the warmup alone, the run would have
    # stopped at step 149 after 73 s of its 100
    times = [10.0, 0.9, 0.9, 0.9] + [0.6] * 12 + [0.4] * 400
    horizons, planned_at = _clock_plans(monkeypatch, times, warmup=10)
    assert planned_at == [4, 8, 16, 32]  # 64 - 10 is past a fifth of the decay
    assert abs(horizons[7] - 149) <= 1 and sum(times[:149]) < 75
    assert sum(times[: horizons[-1]]) == pytest.approx(100.0, abs=0.5)
    # no warmup: re-planned while inside the first fifth of the decay (64 > 0.2 x 176)
    horizons, planned_at = _clock_plans(
        monkeypatch, [10.0, 0.9, 0.9, 0.9, 0.7, 0.7, 0.6, 0.6] + [0.5] * 200, warmup=0
    )
    assert planned_at == [4, 8, 16, 32] and abs(horizons[-1] - 176) <= 2
    # a slow spell over steps 129-256 (a plan at 256, inside the first fifth of the decay, takes its
    # pace), then faster steps: the doubling at 512 corrects the plan, which would have stopped the
    # run 6% of its budget early, and the budget ends at the horizon; at 1024 the plan holds
    times = [10.0] + [0.48] * 127 + [0.525] * 128 + [0.46] * 2000
    horizons, planned_at = _clock_plans(monkeypatch, times, budget=600.0, warmup=60)
    assert planned_at == [4, 8, 16, 32, 64, 128, 256, 512]
    assert sum(times[: horizons[255]]) < 0.95 * 600  # the plan made at 256
    assert sum(times[: horizons[-1]]) == pytest.approx(600.0, abs=1.0)
    # a budget of a few steps, shorter than the warmup: planned once, never stretched to the warmup
    horizons, planned_at = _clock_plans(monkeypatch, [10.0] + [0.5] * 100, budget=25.0, warmup=60)
    assert planned_at == [4] and set(horizons[3:]) == {31}


def test_time_budget_resume_continues_the_schedule_and_the_budget(corpus_dir, tmp_path):  # noqa: F811
    """Interrupted twice (``stop_after``) long before its budget: the second and third invocations
    keep the first one's plan and add to its clock. (A budget of minutes is never spent here.)"""
    cfg = budget_cfg(corpus_dir, **{"train.checkpoint_every": 1, "train.time_budget_s": 600.0})
    first = train(cfg, tmp_path / "run", stop_after=1 + Clock.PROBE_STEPS + 2)  # interrupted after the plan
    planned = metrics(tmp_path / "run", "plan")[0]["planned_steps"]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "stopped" and info["planned_steps"] == planned > first.step
    second = train(cfg, tmp_path / "run", stop_after=3)
    assert len(metrics(tmp_path / "run", "plan")) == 1  # not planned again
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["planned_steps"] == planned and second.step == first.step + 3
    assert second.train_s > first.train_s  # the time already spent counts
    train_s = [r["train_s"] for r in metrics(tmp_path / "run")]
    assert train_s == sorted(train_s)  # one clock across the invocations
    _lr_matches_the_planned_schedule(cfg, tmp_path / "run", planned)


def test_schedule_with_a_horizon_equals_optax():
    import optax

    for steps, warmup in ((300, 60), (12, 2), (1, 5), (5, 0)):
        t = load_config(None, [f"train.steps={steps}", f"train.warmup_steps={warmup}"]).train
        w = min(warmup, max(steps - 1, 0))
        ref = optax.warmup_cosine_decay_schedule(
            t.learning_rate / max(w, 1),
            t.learning_rate,
            w,
            max(steps, w + 1),
            t.learning_rate * t.min_lr_ratio,
        )
        ours = learning_rate_schedule(t)
        for c in range(steps + 3):
            # the same formula in float32 with the operations in another order: ~2e-6 apart at most
            assert float(ours(c, steps)) == pytest.approx(float(ref(c)), rel=1e-5)


def _tensorboard_scalars(directory) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under ``directory``, read back from the record
    framing (length, CRC, event, CRC) with the Event protobuf that tensorboardX ships."""
    import struct

    from tensorboardX.proto import event_pb2

    scalars: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(directory.rglob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (n,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + n])
            at += 12 + n + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_tensorboard_holds_the_logged_scalars_and_a_profile_window_is_written(corpus_dir, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    args = ["train", "tiny/byte", "-q", "--out", str(out), "--profile-steps", "2:3"]
    for o in tiny_overrides(corpus_dir, **{"train.steps": 4, "eval.every": 4}):
        args += ["--set", o]
    assert cli.main(args) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    board = _tensorboard_scalars(out / "tensorboard")
    train = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
    assert [s for s, _ in board["train/loss"]] == [s for s, _ in train] == [1, 2, 3, 4]
    assert [v for _, v in board["train/loss"]] == pytest.approx([v for _, v in train], rel=1e-6)
    (ev,) = [r for r in records if r["kind"] == "eval"]
    assert board["eval/bpb"] == [(4, pytest.approx(ev["bpb"], rel=1e-6))]
    assert {"train/lr", "train/grad_norm", "train/input_wait_s"} <= set(board)
    assert list((out / "profile").rglob("*.xplane.pb")), "no profiler trace written"
    with pytest.raises(UserError, match="train.profile_steps must be A:B"):
        load_config(None, ["train.profile_steps=3:2"])


def test_weights_and_biases_offline_writes_its_run_into_the_run_directory(corpus_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    cfg = load_config(None, tiny_overrides(corpus_dir, **{"train.steps": 2, "eval.every": 0}))
    train(with_values(cfg, {"train.wandb_project": "bytelm-test", "train.tensorboard": False}), out)
    (run,) = (out / "wandb").glob("offline-run-*")
    (log,) = run.glob("run-*.wandb")
    assert log.stat().st_size > 0 and not (out / "tensorboard").exists()

    # what is logged: a stand-in for wandb.init records the calls (the real one's files are binary)
    import wandb

    calls = []

    class Run:
        def log(self, scalars, step):
            calls.append((step, scalars))

        def finish(self):
            calls.append("finish")

    monkeypatch.setattr(wandb, "init", lambda **kwargs: calls.append(kwargs) or Run())
    out2 = tmp_path / "run2"
    train(with_values(cfg, {"train.wandb_project": "p", "eval.every": 2}), out2)
    init, *logged, end = calls
    assert init["project"] == "p" and init["dir"] == str(out2) and init["config"]["train"]["steps"] == 2
    assert end == "finish"
    records = [json.loads(line) for line in (out2 / "metrics.jsonl").read_text().splitlines()]
    want = [(r["step"], f"{r['kind']}/bpb", r["bpb"]) for r in records if r["kind"] in ("train", "eval")]
    got = []
    for step, scalars in logged:
        (key,) = [k for k in scalars if k.endswith("/bpb")]
        got.append((step, key, scalars[key]))
    assert got == want and len(want) == 3  # two train lines, one eval


@pytest.mark.parametrize(
    "kind, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.4e12),
        ("NVIDIA H200", 989.4e12),
        ("NVIDIA H200 NVL", 989.4e12),  # (contains a table name)
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA A100-SXM4-40GB", 312e12),
        ("TPU v5 lite", 197e12),  # v5e: not v5p's "TPU v5", which it starts with
        ("TPU v5", 459e12),
        ("TPU v6 lite", 918e12),
        ("TPU v4", 275e12),
        ("cpu", None),
    ],
)
def test_the_mfu_denominator_is_the_datasheet_peak_on_accelerators_and_none_on_cpu(kind, peak):
    from bytelm.training.peak import datasheet_peak, device_peak

    assert datasheet_peak(kind) == peak
    measured = lambda: 1.5e12  # noqa: E731
    if peak is not None:
        assert device_peak("gpu", kind, measure=measured) == (peak, "datasheet")
    assert device_peak("cpu", "cpu", measure=measured) == (None, "none")  # no MFU on a CPU without a peak
    assert device_peak("cpu", "cpu", 5e10, measure=measured) == (5e10, "config")
    assert device_peak("tpu", "TPU v99", measure=measured) == (1.5e12, "measured")  # unknown: warned
    assert device_peak("gpu", kind, 2e14, measure=measured) == (2e14, "config")


def test_a_run_that_would_take_days_on_the_cpu_stops_before_it_allocates(corpus_dir, tmp_path, capsys):  # noqa: F811
    """`bytelm train` where JAX has only the CPU: a run of more than a day there (here a tiny model for
    10^9 steps; in practice a small or base preset) stops in one line naming the accelerator extras
    and --allow-cpu; a time-budgeted run and a CPU-sized one pass the check."""
    args = ["train", "tiny/byte", "--out", str(tmp_path / "run")]
    for o in tiny_overrides(corpus_dir, **{"train.steps": 10**9}):
        args += ["--set", o]
    assert cli.main(args) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert "JAX found no GPU or TPU" in err and "'.[cuda]'" in err and "--allow-cpu" in err
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "run.json").exists()
    from bytelm.data import load_corpus_from_config
    from bytelm.training.loop import check_not_stranded_on_cpu
    from bytelm.training.restore import make_task

    cfg = load_config("tiny/byte", tiny_overrides(corpus_dir, **{"train.steps": 10**9}))
    task = make_task(cfg, load_corpus_from_config(cfg.data))
    with pytest.raises(UserError, match="--allow-cpu"):
        check_not_stranded_on_cpu(cfg, task)
    check_not_stranded_on_cpu(with_values(cfg, {"train.time_budget_s": 60}), task)  # a budget: passes
    check_not_stranded_on_cpu(with_values(cfg, {"train.steps": 1000}), task)  # a CPU-sized run: passes


MFU_WORKER = textwrap.dedent(
    """
    import json, sys
    from bytelm.training import distributed
    port, pid, overrides, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    distributed.initialize(coordinator=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from bytelm.config import load_config
    from bytelm.training.loop import train
    train(load_config(None, overrides), out)
    """
)


@pytest.mark.slow  # (the fast tier: pytest -m "not slow")
def test_mfu_is_never_above_1_with_two_processes_and_a_busy_neighbour(corpus_dir, tmp_path, caplog):  # noqa: F811
    """A process spinning beside the training (the load that made MFU read 1.04-2.40): on a CPU
    without train.peak_flops there is no MFU at all, one process or two; with a peak below what is
    achieved the ratio is recorded apart, never as MFU, and said once; throughput in the progress
    lines is averaged over a window."""
    from conftest import finished, spawn_two  # noqa: PLC0415

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        two = tiny_overrides(corpus_dir, **{"train.peak_flops": 0, "train.steps": 5, "eval.every": 0})
        outs = finished(spawn_two(MFU_WORKER, json.dumps(two), tmp_path / "two"), timeout=600)
        assert all("Traceback" not in err for _, err in outs), outs
        rows = metrics(tmp_path / "two")
        assert len(rows) == 5 and all(r["mfu"] is None for r in rows)
        assert json.loads((tmp_path / "two" / "run.json").read_text())["peak_source"] == "none"
        low = tiny_overrides(corpus_dir, **{"train.peak_flops": 1e3, "train.steps": 4, "eval.every": 0})
        train(load_config(None, low), tmp_path / "low")
        rows = metrics(tmp_path / "low")
        assert all(r["mfu"] is None and r["flops_over_peak"] > 1 for r in rows)
        assert caplog.text.count("exceed the peak MFU is measured against") == 1
        high = tiny_overrides(corpus_dir, **{"train.peak_flops": 1e15, "train.steps": 4, "eval.every": 0})
        train(load_config(None, high), tmp_path / "high")
        assert all(0 < r["mfu"] <= 1 and "flops_over_peak" not in r for r in metrics(tmp_path / "high"))
    finally:
        busy.kill()
        busy.wait()
