"""H-Net's cached decoding, batched: every row its own positions, caches and chunk state.

One call per byte runs, for each row, the stage-1 encoder step (its key/value cache), the router
against the row's previous encoder output, and, **only when some row closes a chunk**
(``jax.lax.cond``), the inner network's step for the rows that close one (a second stage's own
encoder, router and, when a row closes a chunk there too, the main network); the rows that close
none keep their caches and their moving average. Then the average times the straight-through
factor, the residual, the decoder step and the head. A prompt is fed by the same step under
``jax.lax.scan`` (one call), so the prefill and each later byte follow one rule, the rule of the full
pass: :class:`HNetDecoder.recompute` (``HNet.__call__``) is the reference the cache must equal
(``tests/test_hnet.py``).

Within the training context a stage keeps at most its training window's chunk slots (the causal slot
rule of training); past the context the caches slide (ring buffers) and the slot limit is lifted.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bytelm.constants import BOS_ID, NUM_BYTE_IDS
from bytelm.families.hnet.model import P_CLAMP, HNet, straight_through
from bytelm.models.core import head_logits
from bytelm.models.hybrid import HybridStack
from bytelm.models.stack import Transformer
from bytelm.sampling.batched import BatchedSampler, ByteBatchedDecoder


def stack_step(stack: Transformer | HybridStack, x_Bx1xD, caches: list, pos_B, doc_B=None, active_B=None):
    """One position per row (row ``b`` at its position ``pos_B[b]``) through ``stack`` with its
    caches; ``doc_B``: where each row's document starts (its document id: nothing before it is
    attended), None: no document mask; ``active_B``: the rows that step (a Mamba-2 layer keeps the
    state of the others).

    Every row's keys and values are written, those of a row that is not stepping too (its output is
    not used): the slot it writes is its current position's, which its next real step overwrites
    before it attends, so what it left there is never read."""
    segments_Bx1 = None if doc_B is None else doc_B[:, None]
    kw = dict(positions_BxT=pos_B[:, None], segments_BxT=segments_Bx1, cache=caches)
    if isinstance(stack, HybridStack):
        return stack(x_Bx1xD, **kw, active_B=active_B)
    return stack(x_Bx1xD, **kw)


def init_state(model: HNet, batch: int, context: int) -> dict:
    """Empty per-row state: each stage's caches (its training window's positions), moving average,
    previous encoder output and chunk count, and the main network's cache."""
    slots = model.cfg.slot_plan(context)
    stages, positions = [], context
    for stage, n_slots in zip(model.stages(), slots):
        stages.append(
            {
                "enc": stage.encoder.init_cache(batch, positions),
                "dec": stage.decoder.init_cache(batch, positions),
                "pos": jnp.zeros((batch,), jnp.int32),
                "doc": jnp.zeros((batch,), jnp.int32),  # where the row's current document starts
                "chunks": jnp.zeros((batch,), jnp.int32),
                "h_prev": jnp.zeros((batch, stage.d), jnp.float32),
                "z": jnp.zeros((batch, stage.d), jnp.float32),
                "zdoc": jnp.zeros((batch,), jnp.int32),  # the document of the chunk z belongs to
            }
        )
        positions = n_slots
    main = model.main_network()
    return {
        "stages": stages,
        "main": {
            "cache": main.stack.init_cache(batch, positions),
            "pos": jnp.zeros((batch,), jnp.int32),
            "doc": jnp.zeros((batch,), jnp.int32),
        },
    }


def _main_step(main, x_Bx1xD, start_B, active_B, ms, documents: bool):
    doc_B = jnp.where(start_B & active_B, ms["pos"], ms["doc"])
    y, cache = stack_step(
        main.stack, main.widen(x_Bx1xD), ms["cache"], ms["pos"], doc_B if documents else None
    )
    return main.norm(y)[..., : main.d_in], {
        "cache": cache,
        "pos": ms["pos"] + active_B.astype(jnp.int32),
        "doc": doc_B,
    }


def _stage_step(stages, level, x_Bx1xD, start_B, active_B, within_B, states, ms, slots):
    """Level ``level``'s step; ``states``: the states of levels ``level ..``. Returns its output, the
    updated states of levels ``level ..`` and the main network's state."""
    stage, st = stages[level], states[0]
    act = active_B.astype(jnp.int32)
    documents = stage.cfg.document_mask
    first_B = start_B | (st["pos"] == 0)
    doc_B = jnp.where(first_B & active_B, st["pos"], st["doc"])
    mask_doc = doc_B if documents else None
    h, enc = stack_step(stage.encoder, stage.widen(x_Bx1xD), st["enc"], st["pos"], mask_doc, active_B)
    h = stage.encoder_norm(h)
    h_B = h[:, 0].astype(jnp.float32)
    p_B = jnp.where(first_B, 1.0, stage.route(st["h_prev"], h_B))
    b_B = (p_B > 0.5) & ((st["chunks"] < slots[level]) | ~within_B)
    close_B = b_B & active_B

    def run(args):
        inner_states, ms = args
        if level + 1 < len(stages):
            zhat, inner_states, ms = _stage_step(
                stages, level + 1, h, first_B, close_B, within_B, inner_states, ms, slots
            )
        else:
            zhat, ms = _main_step(stage.inner, h, first_B, close_B, ms, documents)
        P_B = jnp.clip(p_B, P_CLAMP, 1.0 - P_CLAMP)
        restart_B = first_B if documents else st["pos"] == 0  # (as the full pass: documents only)
        z_new = (
            P_B[:, None] * zhat[:, 0].astype(jnp.float32)
            + jnp.where(restart_B, 0.0, 1.0 - P_B)[:, None] * st["z"]
        )
        return jnp.where(close_B[:, None], z_new, st["z"]), inner_states, ms

    def skip(args):
        return st["z"], *args

    z_B, inner_states, ms = jax.lax.cond(jnp.any(close_B), run, skip, (states[1:], ms))
    zdoc_B = jnp.where(close_B, doc_B, st["zdoc"])
    if documents:  # (as the full pass: a document whose start lost its slot reads no earlier chunk)
        z_read = jnp.where((zdoc_B == doc_B)[:, None], z_B, 0.0)
    else:
        z_read = z_B
    c_B = jnp.where(b_B, p_B, 1.0 - p_B)
    out = z_read * straight_through(c_B)[:, None] + h_B @ stage.residual[...]
    y, dec = stack_step(
        stage.decoder, out[:, None].astype(stage.dtype), st["dec"], st["pos"], mask_doc, active_B
    )
    y = stage.decoder_norm(y)[..., : stage.d_in]
    new = {
        "enc": enc,
        "dec": dec,
        "pos": st["pos"] + act,
        "doc": doc_B,
        "chunks": st["chunks"] + close_B.astype(jnp.int32),
        "h_prev": jnp.where(active_B[:, None], h_B, st["h_prev"]),
        "z": z_B,
        "zdoc": zdoc_B,
    }
    return y, [new, *inner_states], ms


def model_step(model: HNet, ids_B, active_B, state, context: int):
    """One byte per active row: the logits of the next (``B x V``) and the new state."""
    x = model.embed(ids_B[:, None]).astype(model.dtype)
    within_B = state["stages"][0]["pos"] < context
    y, stages, ms = _stage_step(
        model.stages(),
        0,
        x,
        ids_B == BOS_ID,
        active_B,
        within_B,
        state["stages"],
        state["main"],
        model.cfg.slot_plan(context),
    )
    logits = head_logits(y, model.head[...], NUM_BYTE_IDS, model.dtype)[:, 0]
    return logits, {"stages": stages, "main": ms}


class HNetSampler(BatchedSampler):
    """Batched cached decoding of an H-Net (:class:`~bytelm.sampling.batched.BatchedSampler`)."""

    def __init__(self, model: HNet, context: int):
        super().__init__(model, context, init_state, model_step)

    def chunks(self) -> list[np.ndarray]:
        """Per stage (outside in), each row's chunks so far."""
        return [np.asarray(s["chunks"]) for s in self.state["stages"]]


class HNetDecoder(ByteBatchedDecoder):
    """H-Net: ``[BOS, bytes...]``; the batched sampler with one row."""

    def __init__(self, model: HNet, context: int):
        self.sampler: HNetSampler
        super().__init__(model, context, HNetSampler(model, context))

    @property
    def global_calls(self) -> int:  # type: ignore[override]
        """The main network's steps so far (one per innermost chunk)."""
        return int(np.asarray(self.sampler.state["main"]["pos"])[0]) if hasattr(self.sampler, "state") else 0

    def stats(self) -> dict:
        return {"chunks_per_stage": [int(c[0]) for c in self.sampler.chunks()]}
