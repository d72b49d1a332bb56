"""``python -m bytelm`` is the ``bytelm`` command."""

from bytelm.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
