"""BLT's cached decoder (:class:`~bytelm.sampling.decoders.Decoder`): online patching with the
entropy model, the global model once per patch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bytelm.constants import BOS_ID, BYTE_OFFSET, NUM_BYTE_IDS, PAD_ID
from bytelm.errors import UserError
from bytelm.patching.entropy import entropy_of_logits
from bytelm.patching.lengths import cap_starts, starts_to_lengths
from bytelm.patching.online import OnlineStarts
from bytelm.patching.patchers import entropy_starts
from bytelm.sampling.decoders import Decoder, allowed_ids, byte_of_unit, byte_units, host_i32, jit_call


def decode_own_slots(model, h_BxNxD, slots_BxNxkxD, has_src_BxN, cache, pos0):
    """The local decoder (:class:`~bytelm.families.blt.model.LocalDecoder`) over ``N`` new positions
    ``pos0 ..`` after the cached ones, each reading the ``k`` slots given for it (``has_src`` False:
    none): ``(logits_BxNxV, caches)``."""
    B, N, k, dl = slots_BxNxkxD.shape
    index_BxNxk = jnp.broadcast_to(jnp.arange(N)[:, None] * k + jnp.arange(k)[None, :], (B, N, k))
    return model.decoder(
        h_BxNxD, slots_BxNxkxD.reshape(B, N * k, dl), index_BxNxk, has_src_BxN, cache=cache, pos0=pos0
    )


class BLTDecoder(Decoder):
    """BLT: ``[BOS, bytes...]`` patched online by its entropy model, the global model once per patch.

    Two calls per byte: (1) the entropy model's and the local encoder's step, which also keeps the
    open patch's encoder states in a buffer of ``max_patch_len`` rows on the device; the host reads
    the entropy back and decides, with :class:`~bytelm.patching.online.OnlineStarts`, whether the
    next position starts a patch; (2) the local decoder's step, fused, when the patch just closed,
    with its pooling and cross-attention and one step of the global model.
    """

    def __init__(self, model, entropy_model, settings: dict, context: int, max_patches: int):
        self.model, self.context, self.max_patches = model, context, max_patches
        self.settings = settings
        self.allowed_V = allowed_ids(NUM_BYTE_IDS)
        cfg = model.cfg
        self.n_context = max([*cfg.ngram_sizes, 1]) - 1  # ids before a chunk its n-grams need
        entropy_context: int = getattr(entropy_model, "n_context", 0)
        if entropy_model is not None and entropy_context:
            raise UserError(
                f"this BLT's entropy model ({cfg.entropy_run}) has hashed n-gram embeddings "
                "(model.ngram_sizes), which BLT sampling does not support yet: patch with an entropy model "
                "trained without them"
            )
        self._entropy_model = entropy_model
        V, J, k, dl = NUM_BYTE_IDS, cfg.max_patch_len, cfg.queries_per_patch, cfg.local.d_model

        def prefill(m, ent, ids_1xN, context_1xC, encoder_cache, entropy_cache):
            logits_e, entropy_cache = ent(ids_1xN, cache=entropy_cache, pos0=0)
            states, encoder_cache = m.encoder(ids_1xN, context_BxC=context_1xC, cache=encoder_cache, pos0=0)
            return entropy_of_logits(logits_e)[0], states, encoder_cache, entropy_cache

        def prefill_decode(m, closed_states, inputs_1xNxD, lengths_1xP, src_1xN, caches):
            """The prompt's closed patches (``closed_states``: their bytes' encoder states; None when
            none) through the global model in one call, the prompt's bytes through the decoder."""
            if closed_states is not None:
                patches = m.encoder.patches(closed_states, lengths_1xP)
                slots_1xPxkxD, global_cache = m.latent(patches, cache=caches["global"], pos0=0)
            else:
                slots_1xPxkxD, global_cache = jnp.zeros((1, 1, k, dl), m.dtype), caches["global"]
            src_slots = jnp.take(slots_1xPxkxD[0], jnp.maximum(src_1xN[0], 0), axis=0)[None]
            logits, decoder_cache = decode_own_slots(
                m, inputs_1xNxD, src_slots, src_1xN >= 0, caches["decoder"], 0
            )
            return logits[0, -1, :V], slots_1xPxkxD[:, -1], global_cache, decoder_cache

        def byte_step(m, ent, unit_1x1, recent_1xC, entropy_cache, encoder_cache, buffers, n_open, pos):
            logits_e, entropy_cache = ent(unit_1x1, cache=entropy_cache, pos0=pos)
            states, encoder_cache = m.encoder(unit_1x1, context_BxC=recent_1xC, cache=encoder_cache, pos0=pos)
            # a patch keeps its first J bytes (as in training); later ones are not pooled
            row = jnp.minimum(n_open, J - 1)
            buffers = [
                jnp.where(n_open < J, jax.lax.dynamic_update_slice_in_dim(b, st, row, axis=1), b)
                for b, st in zip(buffers, states)
            ]
            recent_1xC = (
                jnp.concatenate([recent_1xC, unit_1x1], axis=1)[:, 1:] if recent_1xC.shape[1] else recent_1xC
            )
            return (
                entropy_of_logits(logits_e)[0, 0],
                states[-1],
                recent_1xC,
                entropy_cache,
                encoder_cache,
                buffers,
            )

        def decode(m, h_1x1xD, slots_1xkxD, has_src, decoder_cache, pos):
            logits, decoder_cache = decode_own_slots(
                m, h_1x1xD, slots_1xkxD[:, None], jnp.reshape(has_src, (1, 1)), decoder_cache, pos
            )
            return logits[0, -1, :V], decoder_cache

        def close_and_decode(m, buffers, n_open, global_cache, n_closed, h_1x1xD, decoder_cache, pos):
            patch_1x1xG = m.encoder.patches(buffers, jnp.reshape(n_open, (1, 1)))
            slots_1x1xkxD, global_cache = m.latent(patch_1x1xG, cache=global_cache, pos0=n_closed)
            logits, decoder_cache = decode_own_slots(
                m, h_1x1xD, slots_1x1xkxD, jnp.ones((1, 1), bool), decoder_cache, pos
            )
            return logits[0, -1, :V], slots_1x1xkxD[:, 0], global_cache, decoder_cache

        self._prefill = jit_call(prefill, model, entropy_model, donate=(2, 3))
        self._prefill_decode = jit_call(prefill_decode, model, donate=(4,))
        self._byte_step = jit_call(byte_step, model, entropy_model, donate=(2, 3, 4))
        self._decode = jit_call(decode, model, donate=(3,))
        self._close_and_decode = jit_call(close_and_decode, model, donate=(2, 5))
        self._entropy_forward = jit_call(lambda ent, ids: ent(ids), entropy_model)
        self._forward = jit_call(lambda m, ids, lengths: m(ids, lengths), model)
        self.global_calls = 0
        self.starts: list[bool] = []  # starts[i]: a patch starts at position i (as decided online)

    def _rule(self) -> OnlineStarts:
        s = self.settings
        return OnlineStarts(
            s.get("threshold"), s.get("monotonic_threshold"), s.get("max_patch_len"), self.max_patches
        )

    def start(self, prompt: bytes) -> np.ndarray:
        ids = [BOS_ID, *byte_units(prompt)]
        n, C, J = len(ids), self.n_context, self.model.cfg.max_patch_len
        self._check_prompt(n, self.context)
        caches = self.model.init_cache(1, self.context, self.max_patches)
        before = [PAD_ID] * C  # PAD before the start, as the n-gram hashes see it in training
        h, states, self.encoder_cache, self.entropy_cache = self._prefill(
            host_i32([ids]),
            host_i32([before]).reshape(1, C),
            caches.pop("encoder"),
            self._entropy_model.init_cache(1, self.context),
        )
        h = np.asarray(h)
        self.rule = self._rule()
        self.starts = [self.rule.start_at_zero()] + [self.rule.next(float(x)) for x in h]  # positions 0 .. n
        bounds = [i for i in range(n + 1) if self.starts[i]]  # the last: where the open patch starts
        lengths = np.diff(bounds)  # the patches closed within the prompt
        self.n_closed, open_from = len(lengths), bounds[-1]
        src = np.searchsorted(bounds, np.arange(1, n + 1), side="right") - 2  # each target's source patch
        closed = [st[:, :open_from] for st in states] if self.n_closed else None
        logits, self.last_slots, self.global_cache, self.decoder_cache = self._prefill_decode(
            closed, states[-1], host_i32([lengths]).reshape(1, -1), host_i32([src]), caches
        )
        self.global_calls += 1 if self.n_closed else 0
        self.has_src = self.n_closed > 0
        # the open patch's first J encoder states, in a J-row buffer
        self.buffers = [
            jnp.pad(st[:, open_from : open_from + J], ((0, 0), (0, J - min(n - open_from, J)), (0, 0)))
            for st in states
        ]
        self.n_open = n - open_from
        self.recent = host_i32([(before + ids)[len(before + ids) - C :]]).reshape(1, C)
        self.position = n
        return np.asarray(logits)

    def step(self, unit: int) -> np.ndarray:
        i = self.position  # the new id's position
        if i + 1 > self.context:  # the next position lies past any training window: no slot limit
            self.rule.lift_slot_limit()
        h, h_dec, self.recent, self.entropy_cache, self.encoder_cache, self.buffers = self._byte_step(
            host_i32([[unit]]),
            self.recent,
            self.entropy_cache,
            self.encoder_cache,
            self.buffers,
            host_i32(self.n_open),
            host_i32(i),
        )
        self.n_open += 1
        closes = self.rule.next(float(h))
        self.starts.append(closes)
        if closes:  # the patch holding position i is complete: one global step, fused with the decoder's
            logits, self.last_slots, self.global_cache, self.decoder_cache = self._close_and_decode(
                self.buffers,
                host_i32(self.n_open),
                self.global_cache,
                host_i32(self.n_closed),
                h_dec,
                self.decoder_cache,
                host_i32(i),
            )
            self.global_calls += 1
            self.n_closed, self.n_open, self.has_src = self.n_closed + 1, 0, True
        else:
            logits, self.decoder_cache = self._decode(
                h_dec, self.last_slots, np.asarray(self.has_src), self.decoder_cache, host_i32(i)
            )
        self.position = i + 1
        return np.asarray(logits)

    def recompute(self, prompt: bytes, units: list[int]) -> np.ndarray:
        """The full forward pass over the prefix, its patches from the entropy model's full pass
        through the batch rule of training (the entropy model as :class:`~bytelm.patching.EntropyModel`
        runs it, on the ``T + 1`` ids of a window)."""
        ids = [BOS_ID, *byte_units(prompt), *units]
        n = len(ids)
        self._check_recompute(n, self.context)
        row = np.full((1, self.context + 1), PAD_ID, np.int32)  # the T + 1 ids of a training window
        row[0, :n] = ids
        # a (dummy) target after the prefix: whether it starts a patch decides what n - 1 reads
        row[0, n] = BYTE_OFFSET
        h = np.asarray(entropy_of_logits(self._entropy_forward(jnp.asarray(row)))[0])
        s = self.settings
        start_row = entropy_starts(
            row[0],
            h,
            threshold=s.get("threshold"),
            monotonic_threshold=s.get("monotonic_threshold"),
            max_patch_len=s.get("max_patch_len"),
        )
        real = n + 1
        capped, _ = cap_starts(start_row[None], [real], self.max_patches)
        lengths = starts_to_lengths(capped, [real], self.max_patches)
        logits = self._forward(jnp.asarray(row[:, :-1]), jnp.asarray(lengths))
        return self._valid(logits[0, n - 1])

    def unit_bytes(self, unit: int) -> bytes:
        return byte_of_unit(unit)

    def stats(self) -> dict:
        """``global_calls`` (the prefill's one call counted when the prompt closed a patch), ``patches`` (the
        starts decided so far, the BOS's patch included) and ``positions`` (BOS, prompt and generated bytes
        fed so far)."""
        return {
            "global_calls": self.global_calls,
            "patches": int(sum(self.starts[: self.position])),
            "positions": self.position,
        }
