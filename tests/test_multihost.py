"""Two real processes on localhost (``jax.distributed``, CPU devices, Gloo collectives) train the
byte LM and BLT, save and resume collectively, and agree with one process.

Each process has 2 simulated CPU devices, so the job's mesh has 4 devices over 2 hosts (data=4).
The job trains the byte LM 2 steps and stops (checkpoint at step 2), then restores that
checkpoint into a new trainer and trains the third step; BLT trains its 3 steps in one go. The
reference is one uninterrupted process (this one), which then restores the two-process
checkpoints onto its own one-device mesh (resharded by orbax) and compares them with its own
trained weights. Tolerance as in tests/test_sharding.py: the collectives sum in another order
(float32 reassociation), and Adam turns that into parameter differences of a few 1e-6 at
learning rate 1e-3; 1e-5 leaves margin.
"""

from __future__ import annotations

import json
import random
import re
import signal
import subprocess
import textwrap

import jax
import numpy as np
import pytest
from conftest import finished, spawn_two, word_corpus
from flax import nnx

from bytelm.config import load_config
from bytelm.training.loop import train
from bytelm.training.restore import restore_model

WORKER = textwrap.dedent(
    """
    import json, sys
    from bytelm.training import distributed
    port, pid, jobs = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    distributed.initialize(coordinator=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    import jax
    from bytelm.config import load_config
    from bytelm.training.loop import train
    assert jax.process_count() == 2 and jax.device_count() == 4, (jax.process_count(), jax.device_count())
    for out, overrides, stop_after in jobs:
        r = train(load_config(None, overrides), out, stop_after=stop_after)
        status = json.load(open(out + "/run.json"))["status"]  # as process 0 wrote it
        reads = r.trainer.task.require_corpus().reads  # this process's loader counters
        print(json.dumps({"out": out, "step": r.step, "status": status, "reads": reads}), flush=True)
    """
)


def _job(jobs: list) -> list[dict]:
    """Run ``jobs`` (``[run_dir, overrides, stop_after]``) in turn as one two-process job; what
    each job's ``train`` returned, as both processes saw it."""
    outs = finished(spawn_two(WORKER, json.dumps(jobs), devices=2), timeout=600)
    seen = [[json.loads(line) for line in out.splitlines() if line.startswith("{")] for out, _ in outs]
    reads = [[r.pop("reads") for r in process] for process in seen]
    assert seen[0] == seen[1] and len(seen[0]) == len(jobs)
    # each process gathered its half of every batch's rows (and the documents they touch)
    for r0, r1 in zip(*reads):
        assert r0["rows"] == r1["rows"] > 0 and r0["ids"] == r1["ids"]
    return seen[0]


def _flat(model) -> dict:
    state = nnx.state(model, nnx.Param)
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(state)}


def _records(run_dir, kind: str) -> list[dict]:
    return [
        r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind
    ]


def _runs(root):
    """The two-process job and the one-process references (in this process), under ``root``."""
    corpus = word_corpus(root / "corpus")
    base = [
        f"data.source=files:{corpus}",
        "data.segment_bytes=64",
        "data.max_eval_bytes=2048",
        "train.batch_size=8",
        "train.seq_len=64",
        "train.steps=3",
        "train.learning_rate=1e-3",
        "train.warmup_steps=2",
        "train.log_every=1",
        "train.checkpoint_every=2",
        "train.peak_flops=1e11",
        "eval.every=3",
    ]
    entropy = [
        "model.family=byte",
        "model.d_model=32",
        "model.n_layers=1",
        "model.n_heads=2",
        "model.mlp_dim=64",
        "model.window=16",
    ]
    train(load_config(None, [*base, *entropy, "train.steps=2", "eval.every=0"]), root / "entropy")
    families = {
        "byte": [
            "model.family=byte",
            "model.d_model=32",
            "model.n_layers=1",
            "model.n_heads=2",
            "model.mlp_dim=64",
        ],
        "blt": [
            "model.family=blt",
            f"model.entropy_run={root / 'entropy'}",
            "model.target_patch_len=3.0",
            "model.local.d_model=32",
            "model.local.heads=2",
            "model.local.mlp_dim=64",
            "model.local.window=16",
            "model.global.d_model=32",
            "model.global.heads=2",
            "model.global.mlp_dim=64",
            "model.global.layers=1",
            "model.hash_table_size=64",
            "model.ngram_sizes=3",
            "model.local.decoder_layers=1",
        ],
    }
    # the byte LM stops after 2 steps and resumes; BLT trains its 3 steps in one go
    stops = {"byte": (2, None), "blt": (None,)}
    # the job prepares its corpus afresh: process 0 builds it, process 1 waits and opens it
    job_data = [f"data.cache_dir={root / 'job-cache'}"]
    jobs = [
        [str(root / f"two-{f}"), [*base, *o, *job_data], stop]
        for f, o in families.items()
        for stop in stops[f]
    ]
    results = iter(_job(jobs))
    one = {f: train(load_config(None, [*base, *o]), root / f"one-{f}").trainer for f, o in families.items()}
    return root, {f: [next(results) for _ in stops[f]] for f in families}, one


@pytest.mark.slow
def test_two_processes_agree_with_one_across_a_resume(tmp_path):
    """One test for both families: the job runs once (a module fixture would run once per
    pytest-xdist worker that gets one of its tests)."""
    root, results, one = _runs(tmp_path)
    for family in ("byte", "blt"):
        _check_family(root, results, family, one[family])


def _check_family(root, results, family, reference):
    two, one = root / f"two-{family}", root / f"one-{family}"
    assert [(r["step"], r["status"]) for r in results[family]] == [(2, "stopped"), (3, "finished")][
        -len(results[family]) :
    ]
    run = json.loads((two / "run.json").read_text())
    assert run["devices"] == 4 and run["step"] == 3
    # process 0 alone wrote the records: one line per step (the byte LM's first lines kept on resume)
    assert [r["step"] for r in _records(two, "train")] == [1, 2, 3]
    for a, b in zip(_records(two, "train"), _records(one, "train")):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
    (eval_two,), (eval_one,) = _records(two, "eval"), _records(one, "eval")
    assert eval_two["bytes"] == eval_one["bytes"] and eval_two["bpb"] == pytest.approx(
        eval_one["bpb"], abs=1e-5
    )
    assert sorted(p.name for p in (two / "checkpoints").iterdir() if p.name.isdigit()) == ["2", "3"]
    # the two-process checkpoint restores onto this process's single-device mesh
    params_two, params_one = _flat(restore_model(two)), _flat(nnx.merge(reference.graphdef, reference.params))
    assert params_two.keys() == params_one.keys()
    worst = max(float(np.max(np.abs(params_two[k] - params_one[k]))) for k in params_one)
    assert worst < 1e-5, (family, worst)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"coordinator": "127.0.0.1:1234"}, "missing --num-processes, --process-id"),
        ({"coordinator": "127.0.0.1", "num_processes": 2, "process_id": 0}, "must be HOST:PORT"),
        (
            {"coordinator": "h:1", "num_processes": 2, "process_id": 2},
            "--process-id must lie in [0, --num-processes 2)",
        ),
        ({"coordinator": "h:1", "num_processes": 0, "process_id": 0}, "--num-processes must be >= 1"),
        ({"auto": True, "process_id": 1}, "drop --process-id or --distributed"),
    ],
)
def test_a_bad_process_layout_names_the_option(kwargs, message):
    from bytelm.errors import UserError
    from bytelm.training import distributed

    with pytest.raises(UserError, match=re.escape(message)):
        distributed.initialize(**kwargs)
    assert distributed.initialize() is False and jax.process_count() == 1  # nothing asked: nothing done


def _tiny_byte(corpus, **changes) -> list[str]:
    """Overrides for a one-layer byte LM on ``corpus`` (the two-process tests below), with ``changes``."""
    values = {
        "data.source": f"files:{corpus}",
        "data.segment_bytes": 64,
        "data.max_eval_bytes": 2048,
        "model.family": "byte",
        "model.d_model": 32,
        "model.n_layers": 1,
        "model.n_heads": 2,
        "model.mlp_dim": 64,
        "train.batch_size": 8,
        "train.seq_len": 64,
        "train.learning_rate": 1e-3,
        "train.warmup_steps": 2,
        "train.log_every": 1,
        "eval.every": 0,
        **changes,
    }
    return [f"{k}={v}" for k, v in values.items()]


SIGNALLED = textwrap.dedent(
    """
    import json, os, signal, sys
    from bytelm.training import distributed
    port, pid, out, at = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[5])
    overrides = json.loads(sys.argv[4])
    distributed.initialize(coordinator=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from bytelm.config import load_config
    from bytelm.training.loop import train

    def progress(step, total, text):
        if pid == 1 and step == at:  # a preemption notice to this process only
            os.kill(os.getpid(), signal.SIGTERM)

    from bytelm.training import loop
    write = loop._Run._write

    def spy(self, record):  # every process's learning rate per step (process 0 alone writes them)
        if record.get("kind") == "train":
            print(json.dumps({"step": record["step"], "lr": record["lr"]}), flush=True)
        write(self, record)

    loop._Run._write = spy
    r = train(load_config(None, overrides), out, progress=progress if at else None)
    print(json.dumps({"step": r.step, "stopped": r.stopped_by_signal}), flush=True)
    """
)


def _two(out, overrides, at: int, *, rates=(1.0, 1.0), lrs: list | None = None) -> list[dict]:
    """The job on two processes (``rates``: each one's clock rate, a test-only skew); what each
    process's train() returned, and (into ``lrs``) each process's learning rate per step."""
    procs = spawn_two(
        SIGNALLED,
        out,
        json.dumps(overrides),
        at,
        env_of=lambda pid: {"BYTELM_TEST_CLOCK_RATE": str(rates[pid])},
    )
    try:
        outs = [p.communicate(timeout=240) for p in procs]
    except subprocess.TimeoutExpired:  # (what a stop decided per process does: the other one waits)
        for p in procs:
            p.kill()
        pytest.fail("the two processes did not finish: one stopped while the other waited in a collective")
    for pid, (p, (stdout, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"process {pid} failed:\n{stdout}\n{err[-4000:]}"
    lines = [[json.loads(x) for x in stdout.strip().splitlines() if x.startswith("{")] for stdout, _ in outs]
    if lrs is not None:
        lrs.extend([[r for r in mine if "lr" in r] for mine in lines])
    return [mine[-1] for mine in lines]


@pytest.mark.slow
def test_a_signal_to_one_process_stops_both_at_one_step_and_the_resume_equals_one_run(tmp_path):
    """SIGTERM to process 1 alone (at a random step of 2..4 of 6, after its log line): both processes
    agree to stop at the next step, checkpoint there collectively and return; resumed, the job ends
    where one uninterrupted process does."""
    at = random.randint(2, 4)  # (any step before the last one: the property holds for each)
    corpus = word_corpus(tmp_path / "corpus")
    overrides = _tiny_byte(corpus, **{"train.steps": 6, "train.checkpoint_every": 100})
    stopped = _two(tmp_path / "two", overrides, at=at)
    assert stopped == [{"step": at + 1, "stopped": True}] * 2, at  # the same step on both
    steps = sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [str(at + 1)], (at, steps)
    resumed = _two(tmp_path / "two", overrides, at=0)
    assert resumed == [{"step": 6, "stopped": False}] * 2
    one = train(load_config(None, overrides), tmp_path / "one").trainer
    params_two, params_one = (
        _flat(restore_model(tmp_path / "two")),
        _flat(nnx.merge(one.graphdef, one.params)),
    )
    worst = max(float(np.max(np.abs(params_two[k] - params_one[k]))) for k in params_one)
    assert worst < 1e-5, worst


@pytest.mark.slow
def test_a_skewed_clock_on_one_process_changes_neither_learning_rates_nor_the_stop_step(tmp_path):
    """A time-budgeted run whose process 1 has a clock running 3x fast: both processes plan with
    process 0's clock, so their learning rate is the same at every step and they stop at the same
    step (a clock each would give process 1 a horizon a third as long, and stop it first)."""
    corpus = word_corpus(tmp_path / "corpus")
    overrides = _tiny_byte(corpus, **{"train.time_budget_s": 6, "train.checkpoint_every": 1000})
    lrs: list = []
    ends = _two(tmp_path / "skewed", overrides, at=0, rates=(1.0, 3.0), lrs=lrs)
    assert ends[0] == ends[1] and ends[0]["stopped"] is False and ends[0]["step"] > 5
    assert lrs[0] == lrs[1] and len(lrs[0]) == ends[0]["step"]
    assert len({r["lr"] for r in lrs[0][3:]}) > 1  # (a schedule that moves: the comparison means something)


def test_only_process_0_logs_info_and_the_others_prefix_their_warnings(capsys):
    import logging

    from bytelm import console
    from bytelm.training.distributed import configure_process_logging

    root = logging.getLogger()
    saved = (root.level, [(h, h.formatter) for h in root.handlers])
    try:
        console.configure_logging(verbose=False, quiet=False)
        configure_process_logging(0, 2)  # process 0: as configured
        assert root.level == logging.INFO
        configure_process_logging(3, 4)
        assert root.level == logging.WARNING
        logging.getLogger("bytelm.test").info("not shown")
        logging.getLogger("bytelm.test").warning("a problem")
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["[process 3] WARNING bytelm.test: a problem"]
    finally:
        root.setLevel(saved[0])
        for handler, formatter in saved[1]:
            handler.setFormatter(formatter)
        console.configure_logging(verbose=False, quiet=False)
        root.setLevel(saved[0])


EVAL = textwrap.dedent(
    """
    import sys
    from bytelm import cli
    port, pid, run, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    layout = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", pid]
    raise SystemExit(cli.main(["eval", run, "--json", out, *layout]))
    """
)


@pytest.mark.slow
def test_two_process_eval_writes_the_one_process_report(tmp_path, capsys):
    """`bytelm eval` on two processes (2 devices each): process 0 alone writes the report and prints
    the table; its numbers are one process's, to the float32 reassociation of a sharded score."""
    from bytelm import cli

    corpus = word_corpus(tmp_path / "corpus")
    overrides = _tiny_byte(corpus, **{"train.steps": 3})
    train(load_config(None, overrides), tmp_path / "run")
    assert cli.main(["eval", str(tmp_path / "run"), "--json", str(tmp_path / "one.json")]) == 0
    outs = finished(spawn_two(EVAL, tmp_path / "run", tmp_path / "two.json", devices=2))
    # one table, from process 0 (Gloo's C++ threads print connection lines too, at times cut mid-line)
    assert "report:" in outs[0][0] and "BPB" in outs[0][0]
    assert "report:" not in outs[1][0] and "BPB" not in outs[1][0]
    one = json.loads((tmp_path / "one.json").read_text())
    two = json.loads((tmp_path / "two.json").read_text())

    def rows(report):
        return {m["name"]: m for m in report["models"]}

    for name, row in rows(one).items():
        other = rows(two)[name]
        assert other["bytes"] == row["bytes"] and other["bpb"] == pytest.approx(row["bpb"], abs=1e-5), name


KILLED = textwrap.dedent(
    """
    import json, os, signal, sys
    from bytelm.training import distributed
    port, pid, out, kill_at = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[5])
    overrides = json.loads(sys.argv[4])
    distributed.initialize(coordinator=f"127.0.0.1:{port}", num_processes=2, process_id=pid)
    from bytelm.config import load_config
    from bytelm.training import checkpoint
    from bytelm.training.loop import train

    save = checkpoint.Checkpointer.save

    def dying(self, step, state, meta):
        save(self, step, state, meta)  # orbax writes on in the background
        if pid == 1 and step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a host lost while its checkpoint is written

    checkpoint.Checkpointer.save = dying
    r = train(load_config(None, overrides), out)
    print(json.dumps({"step": r.step}), flush=True)
    """
)


@pytest.mark.slow
def test_a_host_killed_while_a_checkpoint_is_written_resumes_from_the_last_complete_one(tmp_path):
    corpus = word_corpus(tmp_path / "corpus")
    overrides = _tiny_byte(corpus, **{"train.steps": 6, "train.checkpoint_every": 2})

    def job(kill_at: int):
        return spawn_two(KILLED, tmp_path / "two", json.dumps(overrides), kill_at)

    first = job(kill_at=4)
    first[1].wait(timeout=240)
    assert first[1].returncode == -signal.SIGKILL
    try:  # the survivor cannot go on without its peer: the scheduler kills it too
        first[0].wait(timeout=5)
    except subprocess.TimeoutExpired:
        first[0].kill()
    for p in first:
        p.communicate()
    steps = sorted(int(p.name) for p in (tmp_path / "two" / "checkpoints").iterdir() if p.name.isdigit())
    assert 2 in steps and max(steps) <= 4, steps
    again = job(kill_at=0)
    for out, _ in finished(again):
        assert json.loads(out.strip().splitlines()[-1]) == {"step": 6}
    one = train(load_config(None, overrides), tmp_path / "one").trainer
    params_two = _flat(restore_model(tmp_path / "two"))
    params_one = _flat(nnx.merge(one.graphdef, one.params))
    worst = max(float(np.max(np.abs(params_two[k] - params_one[k]))) for k in params_one)
    assert worst < 1e-5, worst


SAMPLE = textwrap.dedent(
    """
    import sys
    from bytelm import cli
    port, pid, run = sys.argv[1], sys.argv[2], sys.argv[3]
    layout = ["--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", pid]
    args = ["sample", run, "--prompt", "the ", "--max-bytes", "32", "--seed", "3"]
    raise SystemExit(cli.main([*args, *layout]))
    """
)


@pytest.mark.slow
def test_two_process_sample_prints_the_one_process_bytes_once(tmp_path, capsysbinary):
    """`bytelm sample` on two processes (2 devices each): the model restored onto the 4-device mesh,
    the same seeded bytes as one process, printed by process 0 alone."""
    from bytelm import cli

    corpus = word_corpus(tmp_path / "corpus")
    train(load_config(None, _tiny_byte(corpus, **{"train.steps": 3})), tmp_path / "run")
    assert (
        cli.main(["sample", str(tmp_path / "run"), "--prompt", "the ", "--max-bytes", "32", "--seed", "3"])
        == 0
    )
    one = capsysbinary.readouterr().out
    outs = finished(spawn_two(SAMPLE, tmp_path / "run", devices=2))

    def printed(stdout: str) -> str:
        # (Gloo's C++ threads print "[Gloo] Rank N is connected to M peer ranks. ..." on stdout too, and
        # unsynchronised with Python's writes: its prefix and the rest can land apart, so a line is
        # Gloo's if it holds either part)
        return "".join(
            line
            for line in stdout.splitlines(keepends=True)
            if not ("[Gloo]" in line or "peer ranks" in line)
        )

    assert printed(outs[0][0]).encode("utf-8", "surrogateescape") == one and len(one) > 32
    assert printed(outs[1][0]) == ""
