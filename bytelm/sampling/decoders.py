"""One decoder per family: next-unit logits from caches, and the same logits by full recomputation.

A :class:`Decoder` turns a prompt into the logits of the first generated unit (:meth:`start`, the
prefill: one call per model), then the logits of each next unit (:meth:`step`), with every model's
key/value caches (:mod:`bytelm.models.cache`). Units are model ids: bytes (``byte + 4``) for the
byte families, tokens (``token + 4``) for the subword LM. :meth:`recompute` runs the full forward
pass on the same prefix, the reference the cached path must equal (``tests/test_sampling.py``) and
the baseline ``benchmarks/generate.py`` measures against.

- **Flat LMs** (byte LM, subword LM): one cache per layer; a sliding-window model keeps its window.
- **MegaByte**: the global model runs once per patch, when the patch before it is complete; the
  local model runs byte by byte within the patch, its cache restarted with every patch.
- **BLT**: the entropy model runs byte by byte with its own cache and decides each boundary with
  exactly the rule of training (:class:`~bytelm.patching.online.OnlineStarts`); the local encoder
  and decoder run byte by byte; the global model runs once per patch, when a patch closes.

Every model's cache holds its training context (``train.seq_len`` input positions, or the patches
of one training window); a prompt must fit it (one position is the BOS for the byte LM, the subword
LM and BLT), or :class:`~bytelm.errors.UserError` says so. Generation may run on past the context:
each cache is a ring buffer, so a model with full attention then attends to its last context's
worth of positions (a sliding window, as a windowed model always does), and BLT's patch-slot limit,
which exists for the training window, is lifted. The full recomputation is defined within the
context only.
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID, NUM_BYTE_IDS, PAD_ID
from bytelm.errors import UserError
from bytelm.models.cache import stack_cache
from bytelm.patching.entropy import entropy_of_logits
from bytelm.patching.online import OnlineStarts
from bytelm.patching.patchers import entropy_starts
from bytelm.patching.lengths import cap_starts, starts_to_lengths


def _jit(fn: Callable, *modules: nnx.Module, donate: tuple[int, ...] = ()):
    """``fn(*modules, *args)`` as a jitted function of ``args`` (the modules' states passed along,
    compiled once per shape). ``donate``: indices into ``args`` of caches the call replaces, so
    that XLA updates them in place instead of copying them every step."""
    splits = [nnx.split(m) for m in modules]
    graphdefs, states = [g for g, _ in splits], [st for _, st in splits]

    def call(sts, *args):
        return fn(*[nnx.merge(g, st) for g, st in zip(graphdefs, sts)], *args)

    jitted = jax.jit(call, donate_argnums=tuple(1 + i for i in donate))
    return lambda *args: jitted(states, *args)


def _i32(x) -> np.ndarray:
    """A host int32 array (or scalar) for a jitted call: no device dispatch of its own."""
    return np.asarray(x, np.int32)


class Decoder(abc.ABC):
    """Generates one family's units with caches (see the module docstring)."""

    allowed_V: np.ndarray  # bool: the ids that may be generated (the units, and EOS)
    family: str = ""  # the run's family, when loaded from a run directory
    global_calls: int = 0  # calls of a global model (MegaByte, BLT), the prefill's included

    def stats(self) -> dict:
        """What this decoder has done so far (the counts ``bytelm sample --stats`` prints)."""
        return {}

    @abc.abstractmethod
    def start(self, prompt: bytes) -> np.ndarray:
        """Prefill the caches with ``prompt``; the logits of the first generated unit."""

    @abc.abstractmethod
    def step(self, unit: int) -> np.ndarray:
        """Feed the unit just generated; the logits of the next one."""

    @abc.abstractmethod
    def recompute(self, prompt: bytes, units: list[int]) -> np.ndarray:
        """The logits after ``prompt`` and ``units`` by the full forward pass, no cache."""

    @abc.abstractmethod
    def unit_bytes(self, unit: int) -> bytes:
        """The bytes a generated unit stands for."""

    def _valid(self, logits_V: jax.Array) -> np.ndarray:
        """The logits of the model's ids (without the padding rows of its output head)."""
        return np.asarray(logits_V[: len(self.allowed_V)])

    def _check_prompt(self, n_positions: int, context: int) -> None:
        if n_positions > context:
            raise UserError(
                f"the prompt needs {n_positions} positions but the model's context is {context} (train.seq_len): "
                "shorten the prompt; generation itself may run past the context (the caches then slide)"
            )

    @staticmethod
    def _check_recompute(n_positions: int, context: int) -> None:
        if n_positions > context:
            raise UserError(f"the full recomputation is defined within the model's context ({context} positions), got {n_positions}")


def byte_of_unit(unit: int) -> bytes:
    return bytes([unit - BYTE_OFFSET])


def byte_units(prompt: bytes) -> list[int]:
    return (np.frombuffer(prompt, np.uint8).astype(np.int64) + BYTE_OFFSET).tolist()


def _allowed(n_valid: int) -> np.ndarray:
    allowed = np.zeros(n_valid, bool)
    allowed[BYTE_OFFSET:] = True
    allowed[EOS_ID] = True
    return allowed


class FlatDecoder(Decoder):
    """The byte LM and the subword LM (:class:`~bytelm.models.lm.DecoderLM`): ``[BOS, units...]``."""

    def __init__(self, model, context: int, encode: Callable[[bytes], list[int]], unit_bytes: Callable[[int], bytes]):
        self.context, self.encode, self._unit_bytes = context, encode, unit_bytes
        self.allowed_V = _allowed(model.n_valid)
        self._model = model
        V = len(self.allowed_V)

        def extend(m, ids_1xN, caches, pos0, context_1xC):
            logits_1xNxV, caches = m.extend(ids_1xN, caches, pos0, context_1xC)
            return logits_1xNxV[0, -1, :V], caches

        self._extend = _jit(extend, model, donate=(1,))
        self._forward = _jit(lambda m, ids: m(ids), model)
        self.n_context = model.n_context  # ids before new ones that the model's n-grams read

    def _context(self, ids: list[int]):
        """The ``n_context`` ids before the next new ones (PAD before the start), or None."""
        C = self.n_context
        return _i32([([PAD_ID] * C + ids)[len(ids) :]]) if C else None

    def start(self, prompt: bytes) -> np.ndarray:
        ids = [BOS_ID, *self.encode(prompt)]
        self._check_prompt(len(ids), self.context)
        logits, self.caches = self._extend(_i32([ids]), self._model.init_cache(1, self.context), _i32(0), self._context([]))
        self.position = len(ids)
        self.recent = ids[-self.n_context :] if self.n_context else []
        return np.asarray(logits)

    def step(self, unit: int) -> np.ndarray:
        logits, self.caches = self._extend(_i32([[unit]]), self.caches, _i32(self.position), self._context(self.recent))
        self.position += 1
        if self.n_context:
            self.recent = [*self.recent, unit][-self.n_context :]
        return np.asarray(logits)

    def recompute(self, prompt: bytes, units: list[int]) -> np.ndarray:
        ids = [BOS_ID, *self.encode(prompt), *units]
        self._check_recompute(len(ids), self.context)
        row = np.full((1, self.context), PAD_ID, np.int32)  # one width: one compiled program
        row[0, : len(ids)] = ids
        return self._valid(self._forward(row)[0, len(ids) - 1])

    def unit_bytes(self, unit: int) -> bytes:
        return self._unit_bytes(unit)


def byte_decoder(model, context: int) -> FlatDecoder:
    """The byte LM's decoder: units are ``byte + 4``."""
    return FlatDecoder(model, context, byte_units, byte_of_unit)


def token_decoder(model, tokenizer, context: int) -> FlatDecoder:
    """The subword LM's decoder: units are ``token + 4``; the prompt is encoded with every special
    token's spelling disallowed (untrusted text cannot inject control tokens), and special tokens
    are never generated."""

    def encode(prompt: bytes) -> list[int]:
        try:
            return [t + BYTE_OFFSET for t in tokenizer.encode(prompt)]
        except ValueError:
            found = [t for t in tokenizer.special_tokens if t.encode() in prompt]
            raise UserError(
                f"the prompt contains the special token {found[0]!r} spelled out; a prompt cannot hold control "
                "tokens: remove it from the prompt"
            ) from None

    dec = FlatDecoder(model, context, encode, lambda u: tokenizer.token_bytes(u - BYTE_OFFSET))
    dec.allowed_V[[i + BYTE_OFFSET for i in tokenizer.special_tokens.values()]] = False
    return dec


class MegaByteDecoder(Decoder):
    """MegaByte: ``[BOS, bytes...]`` in patches (the BOS is the first patch's first byte, as in
    training). One call per byte: the local model's step, or, at a patch boundary, the global
    model's step for the new patch fused with the local model's first position in it (its cache
    restarted)."""

    def __init__(self, model, context: int):
        self.model, self.C, self.context = model, model.patch_size, context
        self.width = model.cfg.padded_length(context + 1)  # the BOS and ``context`` bytes
        self.allowed_V = _allowed(NUM_BYTE_IDS)
        V, C = NUM_BYTE_IDS, self.C

        def prefill(m, prev_1xPxC, local_prev_1xN, caches):
            fg_1xPxCxD, global_cache = m.global_extend(prev_1xPxC, caches["global"], 0)
            fg_1xCxD = fg_1xPxCxD[:, -1]
            N = local_prev_1xN.shape[1]
            logits, local_cache = m.local_extend(fg_1xCxD[:, :N], local_prev_1xN, caches["local"], 0)
            return logits[0, -1, :V], fg_1xCxD, global_cache, local_cache

        def local_step(m, fg_1xCxD, unit_1x1, local_cache, c):
            slot_1x1xD = jax.lax.dynamic_slice_in_dim(fg_1xCxD, c, 1, axis=1)
            logits, local_cache = m.local_extend(slot_1x1xD, unit_1x1, local_cache, c)
            return logits[0, -1, :V], local_cache

        def next_patch(m, patch_1x1xC, global_cache, p):
            fg_1x1xCxD, global_cache = m.global_extend(patch_1x1xC, global_cache, p)
            fg_1xCxD = fg_1x1xCxD[:, 0]
            fresh = stack_cache(m.local_stack, 1, C)  # the local model restarts with every patch
            logits, local_cache = m.local_extend(fg_1xCxD[:, :1], jnp.full((1, 1), -1, jnp.int32), fresh, 0)
            return logits[0, -1, :V], fg_1xCxD, global_cache, local_cache

        self._prefill = _jit(prefill, model, donate=(2,))
        self._local_step = _jit(local_step, model, donate=(2,))
        self._next_patch = _jit(next_patch, model, donate=(1,))
        self._forward = _jit(lambda m, ids: m(ids), model)
        self.global_calls = 0

    def start(self, prompt: bytes) -> np.ndarray:
        ids = [BOS_ID, *byte_units(prompt)]
        self._check_prompt(len(ids), self.context)
        C = self.C
        p = len(ids) // C
        prev = np.zeros((1, p + 1, C), np.int32)  # row q reads patch q - 1 (row 0: the pad)
        prev[0, 1:] = np.asarray(ids[: p * C], np.int32).reshape(p, C)
        self.current = ids[p * C :]
        local_prev = _i32([[-1, *self.current]])  # the learned pad, then the patch's bytes so far
        logits, self.from_global, self.global_cache, self.local_cache = self._prefill(prev, local_prev, self.model.init_cache(1, self.width // C))
        self.global_calls += 1
        self.patch = p
        return np.asarray(logits)

    def step(self, unit: int) -> np.ndarray:
        self.current.append(unit)
        c = len(self.current)
        if c == self.C:  # the patch is complete: the global step for the next one
            self.patch += 1
            logits, self.from_global, self.global_cache, self.local_cache = self._next_patch(
                _i32([[self.current]]), self.global_cache, _i32(self.patch)
            )
            self.global_calls += 1
            self.current = []
        else:
            logits, self.local_cache = self._local_step(self.from_global, _i32([[unit]]), self.local_cache, _i32(c))
        return np.asarray(logits)

    def recompute(self, prompt: bytes, units: list[int]) -> np.ndarray:
        ids = [BOS_ID, *byte_units(prompt), *units]
        self._check_recompute(len(ids), self.context)
        row = np.full((1, self.width), PAD_ID, np.int32)
        row[0, : len(ids)] = ids
        return self._valid(self._forward(row)[0, len(ids)])

    def unit_bytes(self, unit: int) -> bytes:
        return byte_of_unit(unit)

    def stats(self) -> dict:
        return {"global_calls": self.global_calls, "patch_size": self.C}


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
        self.allowed_V = _allowed(NUM_BYTE_IDS)
        cfg = model.cfg
        self.n_context = max([*cfg.ngram_sizes, 1]) - 1  # ids before a chunk its n-grams need
        if entropy_model is not None and getattr(entropy_model, "n_context", 0):
            raise UserError(
                f"this BLT's entropy model ({cfg.entropy_run}) has hashed n-gram embeddings (model.ngram_sizes), which "
                "BLT sampling does not support yet: patch with an entropy model trained without them"
            )
        self._entropy_model = entropy_model
        V, J, k, dl = NUM_BYTE_IDS, cfg.max_patch_len, cfg.queries_per_patch, cfg.local_d_model

        def prefill(m, ent, ids_1xN, context_1xC, encoder_cache, entropy_cache):
            logits_e, entropy_cache = ent.extend(ids_1xN, entropy_cache, 0)
            states, encoder_cache = m.encode_extend(ids_1xN, context_1xC, encoder_cache, 0)
            return entropy_of_logits(logits_e)[0], states, encoder_cache, entropy_cache

        def prefill_decode(m, closed_states, inputs_1xNxD, lengths_1xP, src_1xN, caches):
            """The prompt's closed patches (``closed_states``: their bytes' encoder states; None when
            none) through the global model in one call, the prompt's bytes through the decoder."""
            if closed_states is not None:
                patches = m.close_patches(closed_states, lengths_1xP)
                slots_1xPxkxD, global_cache = m.global_extend(patches, caches["global"], 0)
            else:
                slots_1xPxkxD, global_cache = jnp.zeros((1, 1, k, dl), m.dtype), caches["global"]
            src_slots = jnp.take(slots_1xPxkxD[0], jnp.maximum(src_1xN[0], 0), axis=0)[None]
            logits, decoder_cache = m.decode_extend(inputs_1xNxD, src_slots, src_1xN >= 0, caches["decoder"], 0)
            return logits[0, -1, :V], slots_1xPxkxD[:, -1], global_cache, decoder_cache

        def byte_step(m, ent, unit_1x1, recent_1xC, entropy_cache, encoder_cache, buffers, n_open, pos):
            logits_e, entropy_cache = ent.extend(unit_1x1, entropy_cache, pos)
            states, encoder_cache = m.encode_extend(unit_1x1, recent_1xC, encoder_cache, pos)
            # a patch keeps its first J bytes (as in training); later ones are not pooled
            row = jnp.minimum(n_open, J - 1)
            buffers = [jnp.where(n_open < J, jax.lax.dynamic_update_slice_in_dim(b, st, row, axis=1), b) for b, st in zip(buffers, states)]
            recent_1xC = jnp.concatenate([recent_1xC, unit_1x1], axis=1)[:, 1:] if recent_1xC.shape[1] else recent_1xC
            return entropy_of_logits(logits_e)[0, 0], states[-1], recent_1xC, entropy_cache, encoder_cache, buffers

        def decode(m, h_1x1xD, slots_1xkxD, has_src, decoder_cache, pos):
            logits, decoder_cache = m.decode_extend(h_1x1xD, slots_1xkxD[:, None], jnp.reshape(has_src, (1, 1)), decoder_cache, pos)
            return logits[0, -1, :V], decoder_cache

        def close_and_decode(m, buffers, n_open, global_cache, n_closed, h_1x1xD, decoder_cache, pos):
            patch_1x1xG = m.close_patches(buffers, jnp.reshape(n_open, (1, 1)))
            slots_1x1xkxD, global_cache = m.global_extend(patch_1x1xG, global_cache, n_closed)
            logits, decoder_cache = m.decode_extend(h_1x1xD, slots_1x1xkxD, jnp.ones((1, 1), bool), decoder_cache, pos)
            return logits[0, -1, :V], slots_1x1xkxD[:, 0], global_cache, decoder_cache

        self._prefill = _jit(prefill, model, entropy_model, donate=(2, 3))
        self._prefill_decode = _jit(prefill_decode, model, donate=(4,))
        self._byte_step = _jit(byte_step, model, entropy_model, donate=(2, 3, 4))
        self._decode = _jit(decode, model, donate=(3,))
        self._close_and_decode = _jit(close_and_decode, model, donate=(2, 5))
        self._entropy_forward = _jit(lambda ent, ids: ent(ids), entropy_model)
        self._forward = _jit(lambda m, ids, lengths: m(ids, lengths), model)
        self.global_calls = 0
        self.starts: list[bool] = []  # starts[i]: a patch starts at position i (as decided online)

    def _rule(self) -> OnlineStarts:
        s = self.settings
        return OnlineStarts(s.get("threshold"), s.get("monotonic_threshold"), s.get("max_patch_len"), self.max_patches)

    def start(self, prompt: bytes) -> np.ndarray:
        ids = [BOS_ID, *byte_units(prompt)]
        n, C, J = len(ids), self.n_context, self.model.cfg.max_patch_len
        self._check_prompt(n, self.context)
        caches = self.model.init_cache(1, self.context, self.max_patches)
        before = [PAD_ID] * C  # PAD before the start, as the n-gram hashes see it in training
        h, states, self.encoder_cache, self.entropy_cache = self._prefill(
            _i32([ids]), _i32([before]).reshape(1, C), caches.pop("encoder"), self._entropy_model.init_cache(1, self.context)
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
            closed, states[-1], _i32([lengths]).reshape(1, -1), _i32([src]), caches
        )
        self.global_calls += 1 if self.n_closed else 0
        self.has_src = self.n_closed > 0
        # the open patch's first J encoder states, in a J-row buffer
        self.buffers = [jnp.pad(st[:, open_from : open_from + J], ((0, 0), (0, J - min(n - open_from, J)), (0, 0))) for st in states]
        self.n_open = n - open_from
        self.recent = _i32([(before + ids)[len(before + ids) - C :]]).reshape(1, C)
        self.position = n
        return np.asarray(logits)

    def step(self, unit: int) -> np.ndarray:
        i = self.position  # the new id's position
        if i + 1 > self.context:  # the next position lies past any training window: no slot limit
            self.rule.lift_slot_limit()
        h, h_dec, self.recent, self.entropy_cache, self.encoder_cache, self.buffers = self._byte_step(
            _i32([[unit]]), self.recent, self.entropy_cache, self.encoder_cache, self.buffers, _i32(self.n_open), _i32(i)
        )
        self.n_open += 1
        closes = self.rule.next(float(h))
        self.starts.append(closes)
        if closes:  # the patch holding position i is complete: one global step, fused with the decoder's
            logits, self.last_slots, self.global_cache, self.decoder_cache = self._close_and_decode(
                self.buffers, _i32(self.n_open), self.global_cache, _i32(self.n_closed), h_dec, self.decoder_cache, _i32(i)
            )
            self.global_calls += 1
            self.n_closed, self.n_open, self.has_src = self.n_closed + 1, 0, True
        else:
            logits, self.decoder_cache = self._decode(h_dec, self.last_slots, np.asarray(self.has_src), self.decoder_cache, _i32(i))
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
        row[0, n] = BYTE_OFFSET  # a (dummy) target after the prefix: whether it starts a patch decides what n - 1 reads
        h = np.asarray(entropy_of_logits(self._entropy_forward(jnp.asarray(row)))[0])
        s = self.settings
        start_row = entropy_starts(
            row[0], h, threshold=s.get("threshold"), monotonic_threshold=s.get("monotonic_threshold"), max_patch_len=s.get("max_patch_len")
        )
        real = n + 1
        capped, _ = cap_starts(start_row[None], [real], self.max_patches)
        lengths = starts_to_lengths(capped, [real], self.max_patches)
        logits = self._forward(jnp.asarray(row[:, :-1]), jnp.asarray(lengths))
        return self._valid(logits[0, n - 1])

    def unit_bytes(self, unit: int) -> bytes:
        return byte_of_unit(unit)

    def stats(self) -> dict:
        """``global_calls`` (the prefill's one call counted when the prompt closed a patch), ``patches`` (the starts decided so far, the
        BOS's patch included) and ``positions`` (BOS, prompt and generated bytes fed so far)."""
        return {"global_calls": self.global_calls, "patches": int(sum(self.starts[: self.position])), "positions": self.position}
