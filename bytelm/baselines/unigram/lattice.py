"""The segmentation lattice of many chunks at once, in numpy: its edges, forward-backward in log
space, the Viterbi best path, and sampled paths.

A *chunk* is a byte string (a pre-tokenized piece of text); its lattice has a node before each
byte and one at the end, and an edge ``(i, j)`` for every vocabulary piece equal to bytes
``i..j-1``. A segmentation is a path from the first node to the last. Many chunks are held as
one :class:`Chunks` buffer; node ``k`` of chunk ``c`` is global node ``start[c] + c + k``.

Everything works depth by depth: the nodes at offset ``k`` of every chunk are computed together,
from the edges that end (forward, Viterbi) or start (backward) there, so one pass costs a few
numpy calls per byte of the *longest* chunk plus work proportional to the number of edges.

**Viterbi ties** (part of the encoder's contract, and HF ``tokenizers``' rule): among the
best-scoring ways to reach a node, the one whose last piece is the longest wins. Scores are
summed left to right in float64 (``best[start] + score[piece]``), as HF does, so that equal
inputs give bit-identical sums and the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from bytelm.baselines.bpe.asciisplit import IntTable

MAX_PIECE_BYTES = 16  # pieces are at most this long (SentencePiece's max_sentencepiece_length)
_WORD = 8


@dataclass
class Chunks:
    """Many chunks in one buffer: ``data`` (uint8), ``starts``/``lens`` (int64) and a weight
    ``counts`` (float64: how often each chunk occurs)."""

    data: np.ndarray
    starts: np.ndarray
    lens: np.ndarray
    counts: np.ndarray

    @classmethod
    def of(cls, pieces: list[bytes], counts=None) -> Chunks:
        lens = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
        data = np.frombuffer(b"".join(pieces), dtype=np.uint8)
        weights = np.ones(len(pieces)) if counts is None else np.asarray(counts, dtype=np.float64)
        return cls(data, np.cumsum(lens) - lens, lens, weights)

    def __len__(self) -> int:
        return len(self.lens)

    @property
    def n_nodes(self) -> int:
        return len(self.data) + len(self.lens)

    def first_nodes(self) -> np.ndarray:
        return self.starts + np.arange(len(self.lens))

    def last_nodes(self) -> np.ndarray:
        return self.first_nodes() + self.lens


def _words(data: np.ndarray) -> np.ndarray:
    """``w[p]``: bytes ``p..p+7`` as one little-endian ``uint64`` (zeros past the end), for
    every ``p`` up to ``len(data) + 8``."""
    pad = np.zeros(len(data) + 3 * _WORD, np.uint8)
    pad[: len(data)] = data
    return np.ndarray((len(data) + _WORD + 1,), dtype="<u8", buffer=pad, strides=(1,)).astype(np.uint64)


_MASK = [np.uint64((1 << (8 * n)) - 1) if n < 8 else np.uint64(0xFFFFFFFFFFFFFFFF) for n in range(9)]


def _key_lo(words: np.ndarray, pos: np.ndarray, length: int) -> np.ndarray:
    return words[pos] & _MASK[min(length, _WORD)]


def _key_hi(words: np.ndarray, pos: np.ndarray, length: int) -> np.ndarray:
    return words[pos + _WORD] & _MASK[length - _WORD]


_PAIR = np.dtype([("lo", "<u8"), ("hi", "<u8")])


_K = np.uint64(0xC2B2AE3D27D4EB4F)  # an odd constant: a piece of 9-16 bytes is keyed by lo ^ (hi * _K)


class PieceIndex:
    """Finds vocabulary pieces in byte buffers: one exact hash table per piece length, keyed by
    the bytes as one integer up to 8 bytes; above, by a 64-bit mix of the two integers, each hit
    checked against the piece's own two integers (a key that two pieces share, which is
    astronomically rare, falls back to a sorted array of both integers)."""

    def __init__(self, pieces: list[bytes], ids: np.ndarray | None = None) -> None:
        ids = np.arange(len(pieces)) if ids is None else np.asarray(ids, np.int64)
        self.lengths: list[int] = []
        self._tables: dict[int, tuple] = {}
        by_len: dict[int, list[int]] = {}
        for j, p in enumerate(pieces):
            if not 1 <= len(p) <= MAX_PIECE_BYTES:
                raise ValueError(f"piece {p!r} has {len(p)} bytes; pieces have 1..{MAX_PIECE_BYTES}")
            by_len.setdefault(len(p), []).append(j)
        for n in sorted(by_len):
            js = np.asarray(by_len[n])
            chunk = Chunks.of([pieces[j] for j in js.tolist()])
            words = _words(chunk.data)
            lo = _key_lo(words, chunk.starts, n)
            if n <= _WORD:
                if len(np.unique(lo)) != len(lo):
                    raise ValueError(f"the vocabulary lists a piece of {n} bytes twice")
                self._tables[n] = ("int", IntTable(lo, ids[js]))
            else:
                hi = _key_hi(words, chunk.starts, n)
                pairs = np.empty(len(js), _PAIR)
                pairs["lo"], pairs["hi"] = lo, hi
                if len(np.unique(pairs)) != len(pairs):
                    raise ValueError(f"the vocabulary lists a piece of {n} bytes twice")
                mixed = lo ^ (hi * _K)
                if len(np.unique(mixed)) == len(mixed):
                    self._tables[n] = ("mixed", IntTable(mixed, np.arange(len(js))), lo, hi, ids[js])
                else:
                    order = np.argsort(pairs)
                    self._tables[n] = ("sorted", pairs[order], ids[js][order])
            self.lengths.append(n)

    def find(self, words: np.ndarray, pos: np.ndarray, length: int) -> np.ndarray:
        """The id of the piece of ``length`` bytes at each position (-1 where there is none)."""
        table = self._tables.get(length)
        if table is None or not len(pos):
            return np.full(len(pos), -1, np.int64)
        lo = _key_lo(words, pos, length)
        if table[0] == "int":
            return table[1].get(lo, default=-1)
        hi = _key_hi(words, pos, length)
        if table[0] == "mixed":
            _, index, p_lo, p_hi, p_ids = table
            at = index.get(lo ^ (hi * _K), default=-1)
            hit = at >= 0
            at_hit = at[hit]
            out = np.full(len(pos), -1, np.int64)
            exact = (p_lo[at_hit] == lo[hit]) & (p_hi[at_hit] == hi[hit])
            out[np.flatnonzero(hit)[exact]] = p_ids[at_hit[exact]]
            return out
        _, keys, ids = table
        q = np.empty(len(pos), _PAIR)
        q["lo"], q["hi"] = lo, hi
        at = np.minimum(np.searchsorted(keys, q), len(keys) - 1)
        return np.where(keys[at] == q, ids[at], -1)


@dataclass
class Edges:
    """The lattice edges of :class:`Chunks`: global nodes ``src -> dst``, the piece, and the chunk."""

    src: np.ndarray
    dst: np.ndarray
    piece: np.ndarray
    chunk: np.ndarray

    def __len__(self) -> int:
        return len(self.src)

    def take(self, keep: np.ndarray) -> Edges:
        return Edges(self.src[keep], self.dst[keep], self.piece[keep], self.chunk[keep])


_BLOCK = 1 << 16  # positions looked up together: small temporaries are reused, big ones are page-faulted anew


def find_edges(chunks: Chunks, index: PieceIndex) -> Edges:
    """Every occurrence of every piece inside every chunk (never across two chunks)."""
    n = len(chunks.data)
    owner = np.repeat(np.arange(len(chunks), dtype=np.int32), chunks.lens)
    room = (chunks.starts + chunks.lens)[owner] - np.arange(n)  # bytes left in the chunk from each position
    words = _words(chunks.data)
    srcs: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    pieces: list[np.ndarray] = []
    for p0 in range(0, n, _BLOCK):
        block_room = room[p0 : p0 + _BLOCK]
        for m in index.lengths:
            pos = np.flatnonzero(block_room >= m)
            if not len(pos):
                break  # lengths ascend
            pos += p0
            found = index.find(words, pos, m)
            hit = found >= 0
            srcs.append(pos[hit])
            pieces.append(found[hit].astype(np.int32))
            lengths.append(np.full(len(srcs[-1]), m, np.int64))
    pos = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
    length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    chunk = owner[pos]
    src_node = pos + chunk
    piece = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    return Edges(src_node, src_node + length, piece, chunk)


def _segments(keys: np.ndarray) -> np.ndarray:
    """Start of each run of equal values in sorted ``keys``."""
    return np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.zeros(0, np.int64)


class Lattice:
    """The edges of many chunks sorted for the depth-by-depth passes (built once per edge set;
    the scores can change from pass to pass). ``edges`` are held in the forward order: by end
    depth, then end node, then start node (ascending: the longest piece first). A score of
    ``-inf`` is allowed on any edge but a single byte's (every node keeps a finite way in and out)."""

    def __init__(self, chunks: Chunks, edges: Edges, *, _bwd: np.ndarray | None = None) -> None:
        self.chunks = chunks
        base = chunks.first_nodes()[edges.chunk]
        length = edges.dst - edges.src  # 1..16
        n_nodes = max(chunks.n_nodes, 1)
        if _bwd is None:  # one integer key per edge, unique: (end depth, end node, 31 - length)
            fwd = np.argsort(((edges.dst - base) * n_nodes + edges.dst) * 32 + (31 - length))
            edges, base, length = edges.take(fwd), base[fwd], length[fwd]
        start_depth = edges.src - base
        self.edges = edges
        self.fwd_depth = self._slices(edges.dst - base, _segments(edges.dst))
        # backward order: by start depth (descending), then start node, then length
        if _bwd is None:
            top = int(start_depth.max()) + 1 if len(start_depth) else 1
            _bwd = np.argsort(((top - start_depth) * n_nodes + edges.src) * 32 + length)
        self.bwd = _bwd
        self.bwd_depth = self._slices(-start_depth[_bwd], _segments(edges.src[_bwd]))
        self._bwd_src, self._bwd_dst = edges.src[_bwd], edges.dst[_bwd]

    def take(self, keep: np.ndarray) -> Lattice:
        """The lattice of the edges where ``keep`` (a boolean mask) holds, without sorting again."""
        new = np.cumsum(keep) - 1
        return Lattice(self.chunks, self.edges.take(keep), _bwd=new[self.bwd[keep[self.bwd]]])

    @staticmethod
    def _slices(depth_sorted: np.ndarray, groups: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
        """Per depth: ``(first edge, end, the starts of its groups relative to the first edge)``."""
        starts = _segments(depth_sorted)
        ends = np.append(starts[1:], len(depth_sorted))
        bounds = np.searchsorted(groups, ends)
        out, g = [], 0
        for a, b, hi in zip(starts.tolist(), ends.tolist(), bounds.tolist()):
            out.append((a, b, groups[g:hi] - a))
            g = hi
        return out

    def _pass(self, depth_slices, score, read, write, values, reduce):
        """One depth-by-depth pass over edges held in pass order: ``values[write[e]] =
        reduce(values[read[e]] + score[e])`` over the edges ``e`` of each group (the edges
        sharing a ``write`` node). ``reduce(v, local, a)`` gets the slice's first edge ``a``."""
        for a, b, local in depth_slices:
            v = values[read[a:b]]
            v += score[a:b]
            values[write[a:b][local]] = reduce(v, local, a)

    @staticmethod
    def _logsumexp(v, local, a):
        m = np.maximum.reduceat(v, local)
        sizes = np.diff(np.append(local, len(v)))
        return m + np.log(np.add.reduceat(np.exp(v - np.repeat(m, sizes)), local))

    def forward(self, score: np.ndarray) -> np.ndarray:
        """``alpha[node]``: the log of the total probability of all paths from the chunk's start."""
        alpha = np.full(self.chunks.n_nodes, -np.inf)
        alpha[self.chunks.first_nodes()] = 0.0
        self._pass(self.fwd_depth, score, self.edges.src, self.edges.dst, alpha, self._logsumexp)
        return alpha

    def backward(self, score: np.ndarray) -> np.ndarray:
        """``beta[node]``: the log of the total probability of all paths from ``node`` to the end."""
        beta = np.full(self.chunks.n_nodes, -np.inf)
        beta[self.chunks.last_nodes()] = 0.0
        self._pass(self.bwd_depth, score[self.bwd], self._bwd_dst, self._bwd_src, beta, self._logsumexp)
        return beta

    def expected_counts(self, logp: np.ndarray, n_pieces: int) -> tuple[np.ndarray, float]:
        """E-step: ``(expected occurrences of each piece, total log-likelihood)`` over all
        segmentations of all chunks, each chunk weighted by its count."""
        edges = self.edges
        score = logp[edges.piece]
        alpha, beta = self.forward(score), self.backward(score)
        z = alpha[self.chunks.last_nodes()]
        # each edge's posterior times its chunk's count, in place (the edge arrays are the big ones)
        post = alpha[edges.src]
        post += score
        del score
        post += beta[edges.dst]
        post -= z[edges.chunk]
        np.exp(post, out=post)
        post *= self.chunks.counts[edges.chunk]
        counts = np.bincount(edges.piece, weights=post, minlength=n_pieces)
        return counts, float(np.dot(self.chunks.counts, z))

    def viterbi(self, logp: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """The best segmentation of every chunk: ``(pieces of each chunk, its log-probability)``.
        Ties go to the path whose last piece is longest (see the module's docstring)."""
        edges = self.edges
        score = logp[edges.piece]
        best = np.full(self.chunks.n_nodes, -np.inf)
        best[self.chunks.first_nodes()] = 0.0
        back = np.full(self.chunks.n_nodes, -1, np.int64)

        def argmax_first(v, local, a):
            sizes = np.diff(np.append(local, len(v)))
            m = np.maximum.reduceat(v, local)
            hit = np.flatnonzero(v == np.repeat(m, sizes))
            group = np.repeat(np.arange(len(local)), sizes)[hit]
            first = (
                a + hit[np.r_[True, group[1:] != group[:-1]]]
            )  # edges are by start, ascending: the longest piece
            back[edges.dst[first]] = first
            return m

        self._pass(self.fwd_depth, score, edges.src, edges.dst, best, argmax_first)
        return self._trace(back), best[self.chunks.last_nodes()]

    def sample(self, logp: np.ndarray, alpha_smoothing: float, rng: np.random.Generator) -> list[np.ndarray]:
        """One segmentation of every chunk drawn with probability proportional to
        ``P(segmentation) ** alpha_smoothing`` (subword regularisation, Kudo 2018): forward
        filtering, then backward sampling of each edge in proportion to ``alpha[src] + score``."""
        edges = self.edges
        score = alpha_smoothing * logp[edges.piece]
        alpha = self.forward(score)
        weight = alpha[edges.src] + score  # an edge into dst, in proportion to the paths through it
        order = np.arange(len(edges))
        dst_sorted = edges.dst
        w = weight
        starts = _segments(dst_sorted)
        sizes = np.diff(np.append(starts, len(order)))
        # per destination node, its incoming edges' weights normalised by their maximum, summed up
        # cumulatively over all nodes; a draw in a node's span of the sum picks one of its edges
        p = np.exp(w - np.repeat(np.maximum.reduceat(w, starts), sizes))
        cum = np.cumsum(p)
        below = np.r_[0.0, cum][starts]
        draws = below + rng.random(len(starts)) * (cum[starts + sizes - 1] - below)
        picked = np.clip(np.searchsorted(cum, draws, side="right"), starts, starts + sizes - 1)
        back = np.full(self.chunks.n_nodes, -1, np.int64)
        back[dst_sorted[starts]] = order[picked]
        return self._trace(back)

    def _trace(self, back: np.ndarray) -> list[np.ndarray]:
        """The pieces of each chunk's path, following ``back`` (the edge into each node) from the end."""
        edges = self.edges
        cur = self.chunks.last_nodes().copy()
        first = self.chunks.first_nodes()
        owner_parts, piece_parts, step_parts = [], [], []
        active = np.flatnonzero(cur != first)
        step = 0
        while len(active):
            e = back[cur[active]]
            owner_parts.append(active)
            piece_parts.append(edges.piece[e])
            step_parts.append(np.full(len(active), step, np.int64))
            cur[active] = edges.src[e]
            active = active[cur[active] != first[active]]
            step += 1
        if not owner_parts:
            return [np.zeros(0, np.int64) for _ in range(len(self.chunks))]
        owner = np.concatenate(owner_parts)
        piece = np.concatenate(piece_parts)
        steps = np.concatenate(step_parts)
        order = np.lexsort((-steps, owner))  # per chunk, from its first piece to its last
        piece = piece[order]
        bounds = np.searchsorted(owner[order], np.arange(len(self.chunks) + 1))
        return [piece[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
