"""Model families, one folder each (``bytelm/families/<name>/``: its config dataclass, model, task
with its pipeline hooks, FLOP formula, size rule and decoder), and the public registry.

>>> from bytelm.families import register, task_class      # doctest: +SKIP
>>> register(MyTask)                                       # doctest: +SKIP

A family outside the package registers the same way (see :mod:`bytelm.families.registry` and
docs/architecture.md, "Adding a model family").
"""

from bytelm.families import blt, bpe, byte, hnet, mambabyte, megabyte, spacebyte
from bytelm.families.base import ARTEFACT_KINDS, STATS_KEY, ArtefactKind, Task, Trunk
from bytelm.families.registry import FAMILIES, config_class, names, register, task_class

# the built-in families: one line each
register(byte.ByteTask)
register(bpe.TokenTask)
register(megabyte.MegaByteTask)
register(blt.BLTTask)
register(hnet.HNetTask)
register(mambabyte.MambaByteTask)
register(spacebyte.SpaceByteTask)

__all__ = [
    "ARTEFACT_KINDS",
    "FAMILIES",
    "STATS_KEY",
    "ArtefactKind",
    "Task",
    "Trunk",
    "config_class",
    "names",
    "register",
    "task_class",
]
