"""``python -m bytelm`` is the ``bytelm`` command."""

from bytelm.cli import entry

if __name__ == "__main__":
    raise SystemExit(entry())
