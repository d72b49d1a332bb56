"""Vocabulary extension for a trained token LM: new embedding rows from the old pieces.

Adding tokens to a trained model means new embedding rows (and output rows, if untied). A new
token's row starts as the mean of the rows of the pieces its bytes split into under the *old*
tokenizer (docs/tokenizers.md), so the model initially reads it roughly as it read those pieces.

>>> import numpy as np
>>> old = Tokenizer([], pattern=r"\\S+|\\s+")
>>> new = Tokenizer([], pattern=r"\\S+|\\s+"); ids = new.add_tokens(["hi"])
>>> emb = np.arange(256 * 2, dtype=np.float32).reshape(256, 2)
>>> out = extend_embeddings(old, new, emb)
>>> out.shape, out[ids[0]].tolist() == ((emb[ord("h")] + emb[ord("i")]) / 2).tolist()
((257, 2), True)
"""

from __future__ import annotations

import logging

import numpy as np

from bytelm.baselines.bpe.tokenizer import Tokenizer

log = logging.getLogger(__name__)


def extend_embeddings(
    old: Tokenizer,
    new: Tokenizer,
    embeddings: np.ndarray,
    *,
    pad_to_multiple: int = 1,
) -> np.ndarray:
    """Resize an embedding matrix trained with ``old`` for ``new``.

    Row ``i`` of the result is ``embeddings[i]`` when id ``i`` means the same token in both
    tokenizers (same bytes, and both special or both not); otherwise it is the mean of the rows
    of ``old.encode_ordinary(new.token_bytes(i))``, the pieces the old tokenizer splits the new
    token's bytes into. The result has ``new.n_vocab`` rows rounded up to ``pad_to_multiple``
    (padding rows are zero) and the dtype of ``embeddings``.

    Raises ``ValueError`` if ``embeddings`` is not 2-D or has fewer rows than ``old.n_vocab``.
    """
    emb = np.asarray(embeddings)
    if emb.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D [rows, width] matrix, got shape {emb.shape}")
    if emb.shape[0] < old.n_vocab:
        raise ValueError(
            f"embeddings have {emb.shape[0]} rows but the old tokenizer has {old.n_vocab} ids: "
            "pass the matrix trained with that tokenizer"
        )
    if not isinstance(pad_to_multiple, int) or pad_to_multiple < 1:
        raise ValueError(f"pad_to_multiple must be a positive integer, got {pad_to_multiple!r}")
    rows = -(-new.n_vocab // pad_to_multiple) * pad_to_multiple
    out = np.zeros((rows, emb.shape[1]), dtype=emb.dtype)
    old_special = set(old.special_tokens.values())
    new_special = set(new.special_tokens.values())
    initialised = 0
    for i in range(new.n_vocab):
        data = new.token_bytes(i)
        same = i < old.n_vocab and old.token_bytes(i) == data and ((i in old_special) == (i in new_special))
        if same:
            out[i] = emb[i]
            continue
        pieces = old.encode_ordinary(data)
        out[i] = emb[pieces].mean(axis=0, dtype=np.float64).astype(emb.dtype)
        initialised += 1
    log.info(
        "extended embeddings %s -> %s rows; %d rows initialised from old pieces",
        emb.shape[0],
        rows,
        initialised,
    )
    return out
