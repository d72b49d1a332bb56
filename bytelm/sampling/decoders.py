"""What every family's decoder shares: next-unit logits from caches, and the same logits by full
recomputation.

A :class:`Decoder` turns a prompt into the logits of the first generated unit (:meth:`start`, the
prefill: one call per model), then the logits of each next unit (:meth:`step`), with every model's
key/value caches (:mod:`bytelm.models.cache`). Each call is the forward pass of training, the
``__call__`` of the model (or of its parts) given its caches and the positions of the new inputs.
Units are model ids: bytes (``byte + 4``) for the byte families, tokens (``token + 4``) for the
subword LM. :meth:`recompute` runs the full forward pass on the same prefix, the reference the
cached path must equal (``tests/test_sampling.py``) and the baseline ``benchmarks/generate.py``
measures against.

- **Flat LMs** (byte LM, subword LM: :class:`FlatDecoder`, here): one cache per layer; a
  sliding-window model keeps its window.
- **MegaByte** (``bytelm/families/megabyte/decoder.py``): the global model runs once per patch, when
  the patch before it is complete; the local model runs byte by byte within the patch, its cache
  restarted with every patch.
- **BLT** (``bytelm/families/blt/decoder.py``): the entropy model runs byte by byte with its own cache
  and decides each boundary with exactly the rule of training
  (:class:`~bytelm.patching.online.OnlineStarts`); the local encoder and decoder run byte by byte;
  the global model runs once per patch, when a patch closes.

A family names its decoder through its task's ``decoder(model)`` (:mod:`bytelm.families`).

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
import numpy as np
from flax import nnx

from bytelm.constants import BOS_ID, BYTE_OFFSET, EOS_ID, PAD_ID
from bytelm.errors import UserError


def jit_call(fn: Callable, *modules: nnx.Module, donate: tuple[int, ...] = ()):
    """``fn(*modules, *args)`` as a jitted function of ``args`` (the modules' states passed along,
    compiled once per shape). ``donate``: indices into ``args`` of caches the call replaces, so
    that XLA updates them in place instead of copying them every step."""
    splits = [nnx.split(m) for m in modules]
    graphdefs, states = [g for g, _ in splits], [st for _, st in splits]

    def call(sts, *args):
        return fn(*[nnx.merge(g, st) for g, st in zip(graphdefs, sts)], *args)

    jitted = jax.jit(call, donate_argnums=tuple(1 + i for i in donate))
    return lambda *args: jitted(states, *args)


def host_i32(x) -> np.ndarray:
    """A host int32 array (or scalar) for a jitted call: no device dispatch of its own."""
    return np.asarray(x, np.int32)


class Decoder(abc.ABC):
    """Generates one family's units with caches (see the module docstring)."""

    allowed_V: np.ndarray  # bool: the ids that may be generated (the units, and EOS)
    family: str = ""  # the run's family, when loaded from a run directory
    checkpoint_step: int | None = None  # the checkpoint's step, when loaded from a run directory
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
                f"the prompt needs {n_positions} positions but the model's context is {context} "
                "(train.seq_len): shorten the prompt; generation itself may run past the context (the caches "
                "then slide)"
            )

    @staticmethod
    def _check_recompute(n_positions: int, context: int) -> None:
        if n_positions > context:
            raise UserError(
                f"the full recomputation is defined within the model's context ({context} positions), got "
                f"{n_positions}"
            )


def byte_of_unit(unit: int) -> bytes:
    return bytes([unit - BYTE_OFFSET])


def byte_units(prompt: bytes) -> list[int]:
    return (np.frombuffer(prompt, np.uint8).astype(np.int64) + BYTE_OFFSET).tolist()


def allowed_ids(n_valid: int) -> np.ndarray:
    allowed = np.zeros(n_valid, bool)
    allowed[BYTE_OFFSET:] = True
    allowed[EOS_ID] = True
    return allowed


class FlatDecoder(Decoder):
    """The byte LM and the subword LM (:class:`~bytelm.models.lm.DecoderLM`): ``[BOS, units...]``."""

    def __init__(
        self, model, context: int, encode: Callable[[bytes], list[int]], unit_bytes: Callable[[int], bytes]
    ):
        self.context, self.encode, self._unit_bytes = context, encode, unit_bytes
        self.allowed_V = allowed_ids(model.n_valid)
        self._model = model
        V = len(self.allowed_V)

        def extend(m, ids_1xN, caches, pos0, context_1xC):
            logits_1xNxV, caches = m(ids_1xN, cache=caches, pos0=pos0, context_BxC=context_1xC)
            return logits_1xNxV[0, -1, :V], caches

        self._extend = jit_call(extend, model, donate=(1,))
        self._forward = jit_call(lambda m, ids: m(ids), model)
        self.n_context = model.n_context  # ids before new ones that the model's n-grams read

    def _context(self, ids: list[int]):
        """The ``n_context`` ids before the next new ones (PAD before the start), or None."""
        C = self.n_context
        return host_i32([([PAD_ID] * C + ids)[len(ids) :]]) if C else None

    def start(self, prompt: bytes) -> np.ndarray:
        ids = [BOS_ID, *self.encode(prompt)]
        self._check_prompt(len(ids), self.context)
        logits, self.caches = self._extend(
            host_i32([ids]), self._model.init_cache(1, self.context), host_i32(0), self._context([])
        )
        self.position = len(ids)
        self.recent = ids[-self.n_context :] if self.n_context else []
        return np.asarray(logits)

    def step(self, unit: int) -> np.ndarray:
        logits, self.caches = self._extend(
            host_i32([[unit]]), self.caches, host_i32(self.position), self._context(self.recent)
        )
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
