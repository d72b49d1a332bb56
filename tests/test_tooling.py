"""The code's own gate: ruff's formatting and lint (pyproject.toml [tool.ruff], line length 110) over
the package, its tests and benchmarks, and mypy's type check over the package, all clean. The
tools come with the test extras, so the README's test command runs them."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
CODE = ["bytelm", "tests", "benchmarks"]


def run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True)


@pytest.mark.parametrize(
    "argv", [("ruff", "format", "--check", *CODE), ("ruff", "check", *CODE)], ids=["format", "lint"]
)
def test_ruff_is_clean(argv):
    result = run(*argv)
    assert result.returncode == 0, (
        f"{' '.join(argv)}:\n{result.stdout}{result.stderr}(fix: ruff format / ruff check --fix)"
    )


@pytest.mark.slow
def test_mypy_is_clean():
    result = run("mypy", "bytelm")
    assert result.returncode == 0, f"mypy bytelm:\n{result.stdout}{result.stderr}"
