"""Importing a Hugging Face ``tokenizer.json`` whose model is BPE, WordPiece or Unigram.

Supported (the combinations HF's trainers produce, checked component by component; anything
else is refused with a :class:`UserError` naming the JSON key and its value):

- ``BPE`` + ``ByteLevel`` pre-tokenizer (its GPT-2 regex or none, ``add_prefix_space`` either
  way): the inner tokenizer is bytelm's own BPE (the merges, over GPT-2's byte characters); all
  256 bytes must be in the vocabulary (HF silently drops a byte it has no token for).
- ``WordPiece`` (``continuing_subword_prefix = "##"``) + ``BertPreTokenizer``: whitespace
  removed, every punctuation character a word of its own (:func:`~.bert.bert_words`: HF's
  definition, ASCII symbols and the Unicode ``P*`` categories of HF's own Unicode tables), then
  bytelm's character-level WordPiece on each word.
- ``Unigram`` + ``Metaspace`` (``prepend_scheme`` always/first/never, ``split`` either way):
  spaces become ``▁``, then HF's Viterbi over the pieces (:meth:`~.pipelines.MetaspaceUnigram.viterbi`,
  unknown characters fused into one ``unk_id``).

- **bytelm's own files** (what ``bytelm tokenizer train`` writes): the pre-tokenizer is the
  ``Sequence`` bytelm writes, and the tokenizer is rebuilt as the bytelm class it came from, with
  the file's ids (:mod:`.bytelm_files`).

Every file is checked for shape first (:func:`~.reading.check_shape`): a missing key, a wrong type,
an empty vocabulary, two tokens with one id, a merge that is not two tokens: one :class:`UserError`
naming the key. The normalizer must be absent or an identity (``BertNormalizer`` with every option
off); the post-processor is not applied (ids as HF's ``encode(text, add_special_tokens=False)``);
``truncation`` is refused; the decoder is not read.

**Added tokens** (``added_tokens``: the special tokens a trainer was given, and any added later) are
applied as HF applies them (:mod:`.added`): the text is cut at each occurrence first, and each piece
between them goes through the pre-tokenizer and the model by itself.

**Byte-exactness.** Only ``ByteLevel`` BPE without ``add_prefix_space`` gives tokens whose bytes
reproduce the text; every other import records why not (``lossy``: whitespace dropped, a space
prepended, ``▁`` and space one character, unknown characters) and the subword LM refuses it.

The modules: :mod:`.reading` (reading and checking the file), :mod:`.bert` (HF's
``BertPreTokenizer``), :mod:`.added` (added tokens), :mod:`.pipelines` (the tokenizers written here
around HF's pre-tokenizers), :mod:`.hf_models` (the files of HF's trainers), :mod:`.bytelm_files`
(bytelm's own files).
"""

from __future__ import annotations

from pathlib import Path

from bytelm.baselines.hf_import.added import AddedTokens, read_added_tokens
from bytelm.baselines.hf_import.bert import BERT_WHITESPACE, bert_words, is_bert_punct
from bytelm.baselines.hf_import.bytelm_files import LongestMatchTokenizer, bytelm_form, import_bytelm_form
from bytelm.baselines.hf_import.hf_models import import_bpe, import_unigram, import_wordpiece
from bytelm.baselines.hf_import.pipelines import BertWordPiece, ByteLevelBPE, HFPipeline, MetaspaceUnigram
from bytelm.baselines.hf_import.reading import (
    HF_MODELS,
    SOURCE_KIND,
    check_common,
    check_shape,
    read_tokenizer_json,
)
from bytelm.errors import UserError

__all__ = [
    "BERT_WHITESPACE",
    "HF_MODELS",
    "SOURCE_KIND",
    "AddedTokens",
    "BertWordPiece",
    "ByteLevelBPE",
    "HFPipeline",
    "LongestMatchTokenizer",
    "MetaspaceUnigram",
    "bert_words",
    "inner_from_tokenizer_json",
    "is_bert_punct",
    "read_tokenizer_json",
]


def inner_from_tokenizer_json(path: str | Path) -> tuple[object, list[int]]:
    """``(inner tokenizer, source id of each inner id)`` for a ``tokenizer.json`` (module docstring)."""
    doc = read_tokenizer_json(path)
    if doc is None:
        raise UserError(f"{path} is not a tokenizer.json (it does not start with '{{')")
    check_shape(path, doc)
    check_common(path, doc)
    relevant = {k: doc.get(k) for k in ("normalizer", "pre_tokenizer", "model", "added_tokens")}
    added = read_added_tokens(path, doc)
    try:
        kind = doc["model"]["type"]
        form = bytelm_form(path, doc.get("pre_tokenizer"))
        if form is not None:
            return import_bytelm_form(path, relevant, added, form)
        if kind == "BPE":
            return import_bpe(path, relevant, added)
        importer = import_wordpiece if kind == "WordPiece" else import_unigram
        inner = importer(path, relevant, added)
    except UserError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise UserError(f"{path}: a malformed tokenizer.json ({type(e).__name__}: {e})") from None
    return inner, list(range(inner.n_vocab))
