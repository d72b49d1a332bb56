"""Analytic FLOPs by one convention, for every family (each family's formula lives in its folder,
``bytelm/families/<name>/``, built from the pieces here).

**The convention.** Count the multiply-adds the model semantically needs, 2 FLOPs each, and
nothing else (elementwise work, norms, softmax and gathers count 0; Kaplan et al. 2020,
Hoffmann et al. 2022 appendix F). For a pre-norm stack of ``L`` layers of width ``d``, SwiGLU
width ``F``, whose positions attend to ``n`` keys on average, the forward FLOPs per position are

    2 * (4 d^2 + 3 d F) * L      the attention projections and the MLP
    + 4 * d * n * L              the scores QK^T and the weighted sum over the values

and the head adds ``2 d V`` (``V`` the padded vocabulary rows). What ``n`` is:

- causal self-attention: position ``t`` (from 0) attends ``min(t + 1, w)`` keys, ``w`` the sliding
  window or the whole context; ``n`` is the mean over the context (:func:`mean_attended`);
- cross-attention: a query attends the keys it is allowed to see: a BLT patch query the bytes of
  its own patch (so ``k`` keys per byte over a patch's ``k`` queries), a byte the ``k`` slots of
  its one source patch;
- a model over patches runs over the real patches of a window, at the measured mean patch length
  (BLT) or the patch size (MegaByte), not over padding slots.

Training = 3 x forward (the backward pass is twice the forward); per byte = per position / bytes
per position (1 for bytes, the mean bytes per token for a subword model). What a model needs
besides its own passes (a BLT's entropy model) is on its compute ledger
(:mod:`bytelm.ledger`).

``dense=True`` counts instead what a dense program computes (every self-attention over its whole
context, every patch slot, every gathered row of a patch): ``tests/test_flops.py`` checks those
counts against XLA's cost analysis of the compiled training step, term by term the same formulas.
"""

from __future__ import annotations

from bytelm.constants import NUM_BYTE_IDS
from bytelm.models.core import pad_vocab


def mean_attended(context: int, window: int = 0, *, dense: bool = False) -> float:
    """Mean number of keys a causal position attends over a ``context`` of positions, with a
    sliding ``window`` (0: none); ``dense``: the whole context, as a dense program computes it.

    >>> mean_attended(4), mean_attended(4, 2), mean_attended(4, dense=True)
    (2.5, 1.75, 4.0)
    """
    if dense:
        return float(context)
    w = window if 0 < window < context else context
    # positions 0 .. w-1 attend 1 .. w keys; the remaining context - w attend w each
    return (w * (w + 1) / 2 + (context - w) * w) / context


def stack_forward_flops_per_position(d_model: int, n_layers: int, mlp_dim: int, attended: float) -> float:
    """Forward FLOPs per position of a stack whose positions attend ``attended`` keys each."""
    return (
        2.0 * (4 * d_model * d_model + 3 * d_model * mlp_dim) * n_layers + 4.0 * d_model * attended * n_layers
    )


def head_flops(d_model: int, vocab_multiple: int, n_valid: int = NUM_BYTE_IDS) -> float:
    return 2.0 * d_model * pad_vocab(n_valid, vocab_multiple)


def decoder_lm_forward_flops_per_position(mcfg, n_valid: int, seq_len: int, *, dense: bool = False) -> float:
    """A :class:`~bytelm.models.lm.DecoderLM` (byte LM, subword LM) over ``seq_len`` positions."""
    attended = mean_attended(seq_len, mcfg.window, dense=dense)
    return stack_forward_flops_per_position(mcfg.d_model, mcfg.n_layers, mcfg.mlp_dim, attended) + head_flops(
        mcfg.d_model, mcfg.vocab_multiple, n_valid
    )
