import argparse
import subprocess
import sys

import pytest

from bytelm import cli


def _walk(parser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))


def test_every_command_and_option_has_help():
    for path, parser in _walk(cli.build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, (
                f"'bytelm {' '.join(path)}' option {action.option_strings or action.dest} has no help"
            )


@pytest.mark.parametrize("path", [p for p, _ in _walk(cli.build_parser())])
def test_help_exits_zero(path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([*path, "--help"])
    assert e.value.code == 0
    assert "usage: bytelm" in capsys.readouterr().out


@pytest.mark.slow
def test_python_m_data_info_stdlib_is_reproducible_across_processes(tmp_path):
    """The acceptance check: `bytelm data info` with no flags, twice, in two fresh processes and caches."""
    outs = []
    for i in range(2):
        env = {**__import__("os").environ, "BYTELM_CACHE_DIR": str(tmp_path / f"cache{i}")}
        r = subprocess.run(
            [sys.executable, "-m", "bytelm", "data", "info"], capture_output=True, text=True, env=env
        )
        assert r.returncode == 0, r.stderr
        outs.append(r.stdout)
    fps = [[line.split()[-1] for line in o.splitlines() if line.startswith("fingerprint")][0] for o in outs]
    assert fps[0] == fps[1] and len(fps[0]) == 64
    strip = lambda o: [line for line in o.splitlines() if not line.startswith("cache")]  # noqa: E731
    assert strip(outs[0]) == strip(outs[1])
