"""`bytelm ablate`: the micro grid end to end (with a broken cell), skipping on re-run, the
scheduler path (--print-commands, then --collect) against the in-process grid, the size rule."""

import json
import math
import shlex
import shutil

import numpy as np
import pytest
from conftest import word_corpus
from helpers import micro_grid

from bytelm import cli
from bytelm.config import load_config, shipped_configs
from bytelm.errors import UserError
from bytelm.experiments.ablate import load_grid
from bytelm.experiments.runner import StageStopped
from bytelm.experiments.spec import SizeRule


@pytest.fixture(scope="module")
def grid_run(tmp_path_factory):
    """The micro grid (plus a broken cell) trained in this process, then run again."""
    root = tmp_path_factory.mktemp("ablate")
    corpus = word_corpus(root / "corpus", words_per_doc=200, two_dirs=True)
    grid = micro_grid(root, broken=True)
    out = root / "out"
    args = ["ablate", str(grid), "--data", f"files:{corpus}", "--out", str(out)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BYTELM_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "bytelm-cache"))
        assert cli.main(args) == 0
        first = json.loads((out / "ablation.json").read_text())
        mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("**/checkpoints/*")}
        assert cli.main(args) == 0  # everything finished: nothing trains, the report is rebuilt
        again = json.loads((out / "ablation.json").read_text())
        again_mtimes = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("**/checkpoints/*")}
    return {
        "root": root,
        "corpus": corpus,
        "grid": grid,
        "out": out,
        "report": first,
        "again": again,
        "mtimes": (mtimes, again_mtimes),
    }


def cells(report, budget_index):
    return [
        r for r in report["runs"] if r["in_grid"] and r["seed"] == 0 and r["budget_index"] == budget_index
    ]


@pytest.mark.slow
def test_micro_grid_end_to_end(grid_run, tmp_path, capsys):
    """The micro grid trained once, checked four ways (one test: the grid is trained once per
    process, and pytest-xdist's grouping of tests onto one worker does not hold here)."""
    check_outputs_and_the_broken_cell(grid_run)
    check_learning_rates_chosen_on_the_validation_split(grid_run)
    check_rerun_skips_every_finished_run(grid_run)
    check_print_commands_then_collect_equal_the_in_process_grid(
        grid_run, tmp_path, capsys
    )  # rewrites the grid's files: last


def check_outputs_and_the_broken_cell(grid_run):
    out, report = grid_run["out"], grid_run["report"]
    assert report["stage"] == "done"
    assert report["data"]["dirs"] == ["de", "en"]  # groups: the per-directory panel is drawn
    for name in (
        "ablation.json",
        "ablation.md",
        "bpb_vs_bytes_per_step.png",
        "bpb_vs_flops.png",
        "bpb_per_group.png",
    ):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    for name in ("bpb_vs_bytes_per_step.png", "bpb_vs_flops.png", "bpb_per_group.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    grid = load_grid(grid_run["grid"])
    assert len(report["budgets"]) == 2 and report["budgets"][1] == 4 * report["budgets"][0]
    for b in range(2):
        rows = cells(report, b)
        expected = sum(len(f.cells()) for f in grid.members)
        assert len(rows) == expected
        broken = [r for r in rows if r["family"] == "broken"]
        assert [r["status"] for r in broken] == ["failed"] and "patch_size 3" in broken[0]["error"]
        for r in rows:
            if r["family"] != "broken":
                assert r["status"] == "done" and math.isfinite(r["bpb"]) and 0 < r["bpb"] < 9, r
                # the budget is matched on the total: own + auxiliary (BLT: its entropy model), up to whole
                # steps
                aux = r["auxiliary_flops"] or {}
                per_step = (
                    r["train_flops"] + aux.get("entropy model forward over the training bytes", 0.0)
                ) / r["steps"]
                assert abs(r["flops_total"] - r["budget"]) <= 0.5 * per_step + 1e-6 * r["budget"], r["id"]
                assert r["flops_total"] == pytest.approx(r["train_flops"] + sum(aux.values()))
                if (
                    r["family"] == "blt"
                ):  # the grid's one entropy model: unamortised in the total, shared in the amortised one
                    shared = report["shared_auxiliary"]["entropy model training"]
                    assert aux["entropy model training"] == shared["flops"] and shared["runs"] >= 3
                    assert r["flops_total_amortised"] == pytest.approx(
                        r["flops_total"] - shared["flops"] * (1 - 1 / shared["runs"])
                    )
                else:
                    assert (
                        "entropy model training" not in aux and r["flops_total_amortised"] == r["flops_total"]
                    )
    # per budget the statistics: every scored cell's interval, the best cells of the families paired
    for b in range(2):
        st = report["statistics"][str(b)]
        scored = [r for r in cells(report, b) if r["status"] == "done"]
        assert set(st["ci95"]) == {f"{r['family']} ({r['cell']})" for r in scored}
        for r in scored:
            lo, hi = r["bpb_ci95"]
            assert lo <= r["bpb"] <= hi
        families = {r["family"] for r in scored}
        assert len(st["pairs"]) == len(families) * (len(families) - 1) // 2
    assert (out / "scores.jsonl").is_file() and "95% interval" in (out / "ablation.md").read_text()
    # the probes of each family's best cell at the largest budget, or the line saying why there are none
    assert report["probes"].get("models") or report["probes"].get("skipped")
    assert "## Probes" in (out / "ablation.md").read_text()
    done = [r for r in report["runs"] if r["status"] == "done"]
    by_family = {r["family"]: r for r in cells(report, 0) if r["status"] == "done"}
    assert by_family["byte"]["mean_bytes_per_global_step"] == 1.0
    assert {r["mean_bytes_per_global_step"] for r in cells(report, 0) if r["family"] == "megabyte"} == {
        2.0,
        4.0,
    }
    # BLT's inference FLOPs per byte include its entropy model's; space patching runs no model
    assert (
        by_family["blt"]["entropy_inference_flops_per_byte"] > 0
        and by_family["blt-space"]["entropy_inference_flops_per_byte"] == 0
    )
    assert by_family["blt"]["inference_flops_per_byte"] > by_family["blt"]["entropy_inference_flops_per_byte"]
    assert by_family["bpe"]["mean_bytes_per_global_step"] > 1.0
    # the byte LM with BLT's n-gram tables (3 of 512 rows; at width 16, BLT's local width 16 too)
    assert by_family["byte_ngram"]["params"]["ngram"] == 3 * 512 * 16 == by_family["blt"]["params"]["ngram"]
    assert by_family["byte"]["params"]["ngram"] == 0
    assert (
        by_family["unigram"]["mean_bytes_per_global_step"] > 1.0
    )  # a Unigram tokenizer, trained by the grid
    assert (out / "tokenizers" / "unigram-320-cl100k" / "bytelm_unigram.json").is_file()
    # the size rule: one trunk per budget for every family (the micro budgets sit on its floor)
    assert report["trunks"] == {f"{b:.3g}": {"d_model": 16, "layers": 2} for b in report["budgets"]}
    md = (out / "ablation.md").read_text()
    assert "patch_size 3" in md and "bpb_vs_bytes_per_step.png" in md and report["fingerprint"] in md
    assert "UNAMORTISED" in md and "amortised total" in md
    assert len(report["sentences"]) == 2 and all(
        s.startswith("At ") and "wins with" in s for s in report["sentences"]
    )
    assert all("seed-to-seed spread" in s for s in report["sentences"])
    assert len(done) >= 20


def check_learning_rates_chosen_on_the_validation_split(grid_run):
    report = grid_run["report"]
    sweeps = [r for r in report["runs"] if r["stage"] == "sweep"]
    assert {r["family"] for r in sweeps} == {
        "byte",
        "megabyte",
        "blt",
        "bpe",
    }  # blt-space, unigram and broken borrow a rate
    for fam, s in report["sweep"].items():
        scored = {float(lr): bpb for lr, bpb in s["validation_bpb"].items()}
        assert s["chosen"] == min(scored, key=scored.get)
        # the grid's rates, then extensions x / / 10/3 (its ratio) past the end the best sat at, at most two
        assert {3e-3, 1e-2} <= set(scored) and s["extensions"] == len(scored) - 2 <= 2
        assert sorted(scored) in (
            [3e-3, 1e-2],
            [3e-3, 1e-2, 3.33e-2],
            [3e-3, 1e-2, 3.33e-2, 0.111],
            [9e-4, 3e-3, 1e-2],
            [2.7e-4, 9e-4, 3e-3, 1e-2],
            [9e-4, 3e-3, 1e-2, 3.33e-2],
        )
        assert s["at_edge"] == (s["chosen"] in (min(scored), max(scored)))
        assert {r["lr"] for r in sweeps if r["family"] == fam} == set(scored)
        for r in sweeps:
            if r["family"] == fam:  # the validation score is not the held-out one
                assert r["validation_bpb"] == scored[r["lr"]] and r["validation_bpb"] != r["bpb"]
    lr_of = {r["family"]: r["lr"] for r in cells(report, 1) if r["status"] == "done"}
    assert lr_of["blt-space"] == report["sweep"]["blt"]["chosen"]
    assert lr_of["unigram"] == report["sweep"]["bpe"]["chosen"]
    assert lr_of["byte_ngram"] == report["sweep"]["byte"]["chosen"]
    assert report["validation_fingerprint"] != report["fingerprint"]
    spread = report["seed_spread"]
    assert set(spread) == {"byte", "byte_ngram", "megabyte", "blt", "blt-space", "bpe", "unigram"}
    for s in spread.values():
        assert len(s["bpb"]) == 2 and s["spread"] == pytest.approx(max(s["bpb"]) - min(s["bpb"]))


def check_rerun_skips_every_finished_run(grid_run):
    before, after = grid_run["mtimes"]
    assert before and before == after
    strip = lambda rep: [(r["id"], r["status"], r.get("bpb")) for r in rep["runs"]]  # noqa: E731
    assert strip(grid_run["again"]) == strip(grid_run["report"])


def check_print_commands_then_collect_equal_the_in_process_grid(grid_run, tmp_path, capsys):
    """A scheduler's path: each stage's printed commands run on their own (here: in this process),
    then --collect; the same runs and the same numbers as the in-process grid. A family's runs
    depend only on its own (its sweep, its best cell), so one family (with an artefact: its
    tokenizer) stands for the grid. In the in-process grid's directory, that family's tokenizer
    and one run per stage (a sweep rate that lost, the larger budget, the extra seed) are
    deleted; the printed commands must make exactly those again. (It rewrites that directory's
    ablation.json: it comes last.)"""
    families = {"bpe"}
    grid = micro_grid(tmp_path, families=families)
    out = grid_run["out"]
    ours = {r["id"]: r for r in grid_run["report"]["runs"] if r["family"] in families}
    chosen = grid_run["report"]["sweep"]["bpe"]["chosen"]
    lost = next(r for r in ours.values() if r["stage"] == "sweep" and r["lr"] != chosen)
    larger = next(r for r in ours.values() if r["stage"] == "grid" and r["budget_index"] == 1)
    seed = next(r for r in ours.values() if r["seed"] == 1)
    shutil.rmtree(out / "tokenizers" / "bpe-320-cl100k")
    for r in (lost, larger, seed):
        shutil.rmtree(out / "runs" / r["id"])
        for cached in (out / "evals").glob(f"{r['id'].replace('/', '__')}.*.json"):
            cached.unlink()
    base = ["ablate", str(grid), "--data", f"files:{grid_run['corpus']}", "--out", str(out)]
    stages = []
    for _ in range(6):
        capsys.readouterr()
        assert cli.main([*base, "--print-commands"]) == 0
        printed = capsys.readouterr()
        commands = [line for line in printed.out.splitlines() if line.startswith("bytelm ")]
        if not commands:
            assert "complete" in printed.err
            break
        stages.append(len(commands))
        for command in commands:
            assert cli.main(shlex.split(command)[1:]) == 0, command
    assert stages == [1, 1, 1, 1]  # artefacts, sweep, grid, seeds: one missing each
    assert cli.main([*base, "--collect"]) == 0
    collected = json.loads((out / "ablation.json").read_text())
    assert collected["stage"] == "done"
    theirs = {r["id"]: r for r in collected["runs"]}
    assert set(theirs) == set(ours)
    for key, r in theirs.items():
        assert r["steps"] == ours[key]["steps"] and r["lr"] == ours[key]["lr"]
        assert r["bpb"] == pytest.approx(ours[key]["bpb"], rel=1e-6, abs=1e-6), key
    assert collected["sweep"] == {f: s for f, s in grid_run["report"]["sweep"].items() if f in families}


def test_shipped_grids_load_and_their_sizes_follow_the_rule():
    for name in ("micro", "tiny", "small", "base"):
        grid = load_grid(name)
        # four budgets or more, log-spaced, for the scaling fits (the test grid: two)
        assert len(grid.budgets) >= (2 if name == "micro" else 4) and grid.budgets[-1] >= 4 * grid.budgets[0]
        ratios = np.diff(np.log(grid.budgets))
        assert np.allclose(ratios, ratios[0])
        families = {"byte", "megabyte", "blt", "bpe"} | ({"hnet", "mambabyte"} if name != "micro" else set())
        assert {load_config(f.config).model.family for f in grid.members} == families
        if name != "tiny":  # (the CPU grid keeps to the six families its 45 minutes allow)
            assert any(f.ngram_from == "blt" for f in grid.members)  # a byte LM with BLT's n-gram tables
        assert grid.entropy_budget <= 0.25 * grid.budgets[0]  # every BLT cell can pay for its entropy model
        d_prev = 0
        for b in grid.budgets:
            d, L = grid.size.trunk(b)
            assert d % grid.size.head_dim == 0 and d >= d_prev
            d_prev = d
    # the rule itself: N = sqrt(C / (6 x 20)), d = 32 L, 12 L d^2 = N, rounded
    rule = SizeRule(width_multiple=16, head_dim=16)
    C = 6 * 20 * (12 * 4 * 128**2) ** 2  # N = 12 L d^2 for L = 4, d = 128 exactly
    assert rule.trunk(C) == (128, 4)
    assert rule.trunk(C * 64) == (256, 8)  # 8x the parameters: 2x the depth and 2x the width


def test_bad_grids_fail_with_the_key(tmp_path):
    def bad(text, match):
        p = tmp_path / "g.toml"
        p.write_text(text)
        with pytest.raises(UserError, match=match):
            load_grid(str(p))

    head = "[ablation]\nbudgets = [1e9]\nlearning_rates = [1e-3]\n"
    fam = f'[[family]]\nname = "byte"\nconfig = "{shipped_configs() / "tiny" / "byte.toml"}"\n'
    bad(head.replace("budgets", "budget") + fam, "unknown key")
    bad(head + fam + 'grid = { "model.patch_size" = 4 }\n', "grid must map")
    bad(head + fam + 'lr_from = "nobody"\n', "lr_from")
    bad(head + fam + 'ngram_from = "byte"\n', "ngram_from 'byte' must name another family")
    bad(head + "[size]\nwidth_multiple = 24\nhead_dim = 16\n" + fam, "whole heads")
    bad(head, "needs \\[\\[family\\]\\]")
    with pytest.raises(UserError, match="no ablation grid"):
        load_grid("nonexistent")


@pytest.mark.slow
def test_an_interrupted_run_resumes_and_a_failed_one_is_not_retried(tmp_path, monkeypatch):
    """A run stopped mid-way (Ctrl-C) stops the grid with its checkpoint saved; the same command
    continues it from there. A run whose training failed is recorded and reported, not retried."""
    from bytelm.experiments import ablate as ab  # noqa: PLC0415
    from bytelm.training import loop as trainer_mod  # noqa: PLC0415

    grid = micro_grid(tmp_path, families={"byte"})
    out = tmp_path / "out"
    real_train = trainer_mod.train
    calls = []

    def interrupted(cfg, run_dir, **kw):
        calls.append(run_dir)
        if len(calls) == 1:
            return real_train(
                cfg, run_dir, stop_after=6, **kw
            )  # past the first log record (train.log_every = 5)
        if len(calls) == 3:  # the second sweep run: its training fails
            raise FloatingPointError("loss is nan")
        return real_train(cfg, run_dir, **kw)

    monkeypatch.setattr(trainer_mod, "train", interrupted)
    data = f"files:{word_corpus(tmp_path / 'corpus', words_per_doc=200, two_dirs=True)}"
    with pytest.raises(StageStopped, match="stopped at step 6"):
        ab.ablate(str(grid), out, data_spec=data)
    report = ab.ablate(str(grid), out, data_spec=data).report
    first = calls[0]
    records = [json.loads(x) for x in (first / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert (
        steps == sorted(set(steps)) and 5 in steps and steps[-1] > 6
    )  # continued, not restarted (no step twice)
    failed = [r for r in report["runs"] if r["status"] == "failed"]
    assert len(failed) == 1 and "loss is nan" in failed[0]["error"] and failed[0]["stage"] == "sweep"
    assert report["sweep"]["byte"]["chosen"] != failed[0]["lr"]  # a failed rate loses
    n = len(calls)
    again = ab.ablate(str(grid), out, data_spec=data).report
    assert len(calls) == n  # nothing retrained, the failure kept
    assert [r["status"] for r in again["runs"]] == [r["status"] for r in report["runs"]]
