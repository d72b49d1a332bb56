"""``python -m bytelm`` and the ``bytelm`` command (:func:`entry`)."""

import os
import sys

from bytelm.training.host import huge_page_malloc_env


def entry() -> int:
    """Run :func:`bytelm.cli.main` in a process whose ``malloc`` uses huge pages for XLA's
    per-step buffers: the process re-executes itself once with the glibc tunable set (see
    :func:`bytelm.training.host.huge_page_malloc_env`) before anything heavy is imported.
    ``cli.main`` itself never re-executes, so calling it in-process (tests, notebooks) is unaffected."""
    env = huge_page_malloc_env()
    if env is not None:
        try:
            os.execve(sys.executable, [sys.executable, "-m", "bytelm", *sys.argv[1:]], env)
        except OSError:
            pass  # run as we are
    from bytelm.cli import main  # noqa: PLC0415  (after the re-exec: the CLI imports JAX, worth doing once)

    return main()


if __name__ == "__main__":
    raise SystemExit(entry())
