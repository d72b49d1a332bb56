"""The run directory type: the one module that names a run's files, and how it reads them."""

import json
import pathlib
import re

import pytest

import bytelm
from bytelm.errors import UserError
from bytelm.rundir import RunDir, RunRecordDamaged


def test_only_rundir_names_the_run_files():
    """``run.json``, ``config.toml``, ``metrics.jsonl`` and ``checkpoints`` are spelled as file names in
    bytelm/rundir.py alone; everything else asks a RunDir."""
    root = pathlib.Path(bytelm.__file__).parent
    names = re.compile(r"""["'](run\.json|config\.toml|metrics\.jsonl|checkpoints)["']""")
    where = {str(p.relative_to(root)) for p in root.rglob("*.py") if names.search(p.read_text())}
    assert where == {"rundir.py"}


def test_record_status_and_metrics(tmp_path, caplog):
    rd = RunDir(tmp_path / "run")
    assert not rd.started() and rd.info_or_empty() == {} and not rd.finished() and rd.metrics() == []
    with pytest.raises(
        UserError, match=r"is not a trained run directory \(no run.json\); train one with 'bytelm train"
    ):
        rd.info()
    rd.write_info({"status": "finished", "step": 7, "converted_from": "x"})
    assert rd.finished() and rd.finished(7) and not rd.finished(8) and rd.converted()
    rd.write_config("[train]\nsteps = 7\n")
    assert rd.started() and rd.require_config().read_text().startswith("[train]")
    # a torn last line (a crash mid-write) is left out with a warning; damage elsewhere is an error
    rd.metrics_path.write_text(
        json.dumps({"step": 1}) + "\n" + json.dumps({"step": 2}) + "\n" + '{"step": 3, "lo'
    )
    assert [r["step"] for r in rd.metrics()] == [1, 2] and "incomplete" in caplog.text
    rd.metrics_path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(UserError, match="line 2 is not JSON"):
        rd.metrics()
    rd.info_path.write_text('{"status": "fini')
    with pytest.raises(RunRecordDamaged, match="run.json cannot be read .*damaged: it is rebuilt"):
        rd.info()
    rd.info_path.write_text("[1, 2]")
    with pytest.raises(UserError, match="holds no run record"):
        rd.info()
    with pytest.raises(UserError, match="is not a run directory \\(no config.toml\\)"):
        RunDir(tmp_path / "none").require_config()
