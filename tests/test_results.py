"""Benchmark results as data (benchmarks/results.py): one JSON line per measurement, and
benchmarks/RESULTS.md generated from them (benchmarks/results_table.py), always up to date."""

import ast
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))  # (as when a benchmark runs: its helpers beside it)

import results  # noqa: E402
import results_table  # noqa: E402


def test_a_record_is_one_line_with_its_machine_command_and_revision(tmp_path):
    path = results.record(
        "probe", {"ratio": 0.5, "ms": 12.25}, note="a test", command="python x.py --y", directory=tmp_path
    )
    results.record("probe", {"ratio": 0.4}, command="python x.py --y --out /tmp/o", directory=tmp_path)
    rows = results.load(tmp_path)["probe"]
    assert path == tmp_path / "probe.jsonl" and len(rows) == 2
    first = rows[0]
    assert set(first) == set(results.FIELDS) and first["figures"] == {"ratio": 0.5, "ms": 12.25}
    assert first["command"] == "python x.py --y" and first["note"] == "a test" and first["machine"]
    assert first["revision"] is None or len(first["revision"].removesuffix("+dirty")) == 12
    page = results_table.render(results.load(tmp_path))
    # the latest measurement by a command (wherever it wrote) on a machine is the current one
    assert "ratio: 0.4" in page and "ratio: 0.5" not in page
    (tmp_path / "bad.jsonl").write_text(json.dumps({"benchmark": "other", "figures": {}}) + "\n")
    try:
        results.load(tmp_path)
    except ValueError as e:
        assert "bad.jsonl line 1" in str(e)
    else:
        raise AssertionError("a line without the fields was read")


def test_every_recorded_result_is_well_formed_and_results_md_is_generated_from_them():
    recorded = results.load(results.DIR)
    assert recorded, "benchmarks/results/ holds no measurements"
    for name, rows in recorded.items():
        assert (BENCH / f"{name}.py").is_file() or name in ("compare", "ablate", "suite"), name
        for row in rows:
            assert len(row["date"]) == 10 and row["machine"] and row["command"] and row["figures"], (
                name,
                row,
            )
    page = (BENCH / "RESULTS.md").read_text()
    assert page == results_table.render(recorded), (
        "benchmarks/RESULTS.md is out of date: run python benchmarks/results_table.py"
    )
    assert page.count("\n") < 300
    card = BENCH.parent / "docs" / "cpu.md"  # the recipe card: what each recipe is, not how it was found
    assert card.read_text().count("\n") < 200


def _records_unguarded(source: str) -> list[int]:
    """Lines of ``source`` that call ``record(...)`` outside an ``if args.record:`` block."""
    tree = ast.parse(source)
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "record" in ast.unparse(node.test):
            guarded |= {n.lineno for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    return [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "record"
        and n.lineno not in guarded
    ]


def test_a_benchmark_writes_into_the_tree_only_with_record():
    scripts = [p for p in sorted(BENCH.glob("*.py")) if p.name not in ("results.py", "results_table.py")]
    assert len(scripts) > 10
    offenders = {}
    for path in scripts:
        source = path.read_text()
        lines = _records_unguarded(source)
        if lines or ("record(" in source and '"--record"' not in source):
            offenders[path.name] = lines
    assert offenders == {}
    assert _records_unguarded("record('x', {})\nif args.record:\n    record('y', {})\n") == [1]
