"""What the worker processes of :mod:`.parallel` start with: imported once by the fork server
before it forks any worker, so that each worker inherits it instead of building it again.

That is the modules whose functions the workers run, and the pre-tokenizers of the named patterns
(deriving their ``re`` equivalents from the ``regex`` module's tables takes about 0.2 s).
"""

from __future__ import annotations

import bytelm.baselines.bpe.fast
import bytelm.baselines.bpe.trainer
import bytelm.baselines.subword  # noqa: F401
from bytelm.baselines.bpe.pretokenize import PATTERNS, PreTokenizer

for _name in PATTERNS:
    PreTokenizer(_name)
