"""Generation: a run (or a decoder) and a prompt in, bytes out, as they come.

The byte families generate byte by byte; the subword LM generates tokens and hands out their
bytes. Generation stops at EOS or after ``max_bytes`` bytes (a token that would overshoot is cut).
The families are trained without end-of-document targets (the evaluation protocol scores none),
so their EOS probability is small: in practice ``max_bytes`` ends a sample. The other control ids
(PAD, BOS, SEP) are never generated. The same seed gives the same sample.
"""

from __future__ import annotations

import codecs
import itertools
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from bytelm.constants import EOS_ID
from bytelm.errors import UserError
from bytelm.sampling.decoders import Decoder
from bytelm.sampling.sampler import SamplingOptions, choose
from bytelm.training.restore import restore_scorer


def load_decoder(run_dir: str | Path, *, step: int | None = None) -> Decoder:
    """The decoder of a run directory's family, on its latest checkpoint (or ``step``); the corpus
    is not read."""
    scorer = restore_scorer(run_dir, load_corpus=False, step=step)
    decoder = scorer.task.decoder(scorer.model)
    decoder.family = scorer.task.family
    decoder.checkpoint_step = scorer.step  # (the checkpoint restored: the newest that restores, or ``step``)
    return decoder


def stream(
    run_or_decoder: str | Path | Decoder,
    prompt: bytes,
    *,
    max_bytes: int = 256,
    options: SamplingOptions | None = None,
) -> Iterator[bytes]:
    """The bytes generated after ``prompt``, a unit's worth at a time. The arguments are checked,
    the run loaded and the prompt prefilled when it is called, before the first byte is asked for
    (a prompt too long for the context is refused even with ``max_bytes=0``)."""
    if not isinstance(prompt, bytes | bytearray):
        raise UserError(f"the prompt must be bytes, got {type(prompt).__name__}")
    if max_bytes < 0:
        raise UserError(f"max_bytes must be >= 0, got {max_bytes}")
    decoder = run_or_decoder if isinstance(run_or_decoder, Decoder) else load_decoder(run_or_decoder)
    options = options or SamplingOptions()
    logits = decoder.start(bytes(prompt))
    return _units(decoder, logits, max_bytes, options)


def _units(decoder: Decoder, logits: np.ndarray, max_bytes: int, options: SamplingOptions) -> Iterator[bytes]:
    rng = np.random.default_rng(options.seed)
    if max_bytes == 0:
        return
    produced = 0
    while True:
        unit = choose(logits, decoder.allowed_V, options, rng)
        if unit == EOS_ID:
            return
        data = decoder.unit_bytes(unit)[: max_bytes - produced]
        produced += len(data)
        yield data
        if produced >= max_bytes:
            return
        logits = decoder.step(unit)


def generate(
    run_or_decoder: str | Path | Decoder,
    prompt: bytes,
    *,
    max_bytes: int = 256,
    options: SamplingOptions | None = None,
) -> bytes:
    """All of :func:`stream`'s bytes."""
    return b"".join(stream(run_or_decoder, prompt, max_bytes=max_bytes, options=options))


def text_pieces(chunks: Iterable[bytes], *, after: bytes = b"") -> Iterator[str]:
    """The text of a byte stream as it comes: each chunk's completed UTF-8 characters, an incomplete
    character held back until its bytes arrive, invalid bytes as U+FFFD. ``after``: bytes that came
    before the stream (a prompt), so that a character the prompt left open and the stream completes
    decodes whole; their own text is not yielded."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(after)
    for chunk in chunks:
        piece = decoder.decode(chunk)
        if piece:
            yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail


def read_prompt(prompt: str = "", prompt_file: str | None = None) -> bytes:
    """A prompt's bytes: those of the file ``prompt_file`` (``"-"``: standard input), else those of
    the string ``prompt`` as the command line gave it (whatever they are)."""
    if prompt_file is None:
        return os.fsencode(prompt)
    if prompt_file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(prompt_file).read_bytes()
    except OSError as e:
        raise UserError(f"cannot read the prompt file {prompt_file}: {e.strerror}") from None


class Generation:
    """One sample from ``decoder`` after ``prompt``: its text as it comes (:meth:`pieces`), then what
    it took (:meth:`stats`). Generation starts when the pieces are first asked for."""

    def __init__(
        self, decoder: Decoder, prompt: bytes, *, max_bytes: int, options: SamplingOptions, echo: bool = False
    ):
        self.decoder, self.prompt, self.max_bytes, self.options, self.echo = (
            decoder,
            prompt,
            max_bytes,
            options,
            echo,
        )
        self.started = time.perf_counter()
        self.produced = 0  # bytes generated so far

    def _generated(self) -> Iterator[bytes]:
        for data in stream(self.decoder, self.prompt, max_bytes=self.max_bytes, options=self.options):
            self.produced += len(data)
            yield data

    def pieces(self) -> Iterator[str]:
        """The text (:func:`text_pieces`) of the generated bytes, after the prompt's own with ``echo``."""
        if self.echo:
            return text_pieces(itertools.chain([self.prompt], self._generated()))
        return text_pieces(self._generated(), after=self.prompt)

    def stats(self) -> dict:
        """The family, the prompt's and the generated bytes, the seconds since the start, bytes per
        second, and the decoder's own counts (global-model calls)."""
        wall = time.perf_counter() - self.started
        return {
            "family": self.decoder.family,
            "prompt_bytes": len(self.prompt),
            "generated_bytes": self.produced,
            "seconds": round(wall, 4),
            "bytes_per_s": round(self.produced / wall, 2) if wall > 0 else None,
            **self.decoder.stats(),
        }
