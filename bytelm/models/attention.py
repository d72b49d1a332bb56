"""Attention, in one function: :func:`attend`, with the implementation chosen by configuration.

Every family's self- and cross-attention goes through :func:`attend`; the implementation comes
from :func:`bytelm.models.kernels.resolve_kernels` (``model.attention``), never from the layer
looking at the backend. The long-sequence CPU paths live here too:

- :func:`halving_causal_attention`: causal self-attention that skips the masked half of the
  scores by recursive halving, merging the parts exactly through their log-sum-exp;
- :func:`blocked_causal_attention`: query blocks over the keys they can see (sliding windows).

And the TPU's: :func:`splash_attention` (Pallas splash attention, per shard under a mesh).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from bytelm.models.kernels import ATTENTION_BLOCK


def attend(
    q_BxTxHxK: jax.Array,
    k_BxSxHxK: jax.Array,
    v_BxSxHxK: jax.Array,
    *,
    causal: bool,
    window: int = 0,
    mask_BxTxS: jax.Array | None = None,
    segments_BxT: jax.Array | None = None,
    implementation: str = "xla",
    block: int = ATTENTION_BLOCK,
) -> jax.Array:
    """Multi-head attention of ``T`` queries over ``S`` keys; returns ``B x T x H x K``.

    ``causal`` (self-attention, ``T == S``) masks the future; ``window`` > 0 keeps only the last
    ``window`` positions (the current one included); ``mask_BxTxS`` (True = may attend) is an
    explicit mask. ``segments_BxT`` (self-attention: integer document ids, one per position) keeps
    each query to the keys of its own document. ``implementation`` is a resolved kernel
    (:mod:`bytelm.models.kernels`): ``xla``, ``cudnn`` (explicit masks keep the XLA path) or ``halving`` (long
    causal self-attention of at least two blocks of ``block`` positions skips the masked scores; anything
    else takes XLA).
    """
    T = q_BxTxHxK.shape[1]
    if (
        implementation == "splash"
        and mask_BxTxS is None
        and T == k_BxSxHxK.shape[1]
        and T % SPLASH_MIN_BLOCK == 0
    ):
        return splash_attention(
            q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, causal=causal, window=window, segments_BxT=segments_BxT
        )
    if implementation == "halving" and causal and mask_BxTxS is None and T >= 2 * block:
        if window <= 0:
            return halving_causal_attention(
                q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, block=block, segments_BxT=segments_BxT
            )
        if segments_BxT is None:
            return blocked_causal_attention(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, window=window, block=block)
    if segments_BxT is not None:
        same_BxTxS = segments_BxT[:, :, None] == segments_BxT[:, None, :]
        mask_BxTxS = same_BxTxS if mask_BxTxS is None else mask_BxTxS & same_BxTxS
    return jax.nn.dot_product_attention(
        q_BxTxHxK,
        k_BxSxHxK,
        v_BxSxHxK,
        mask=None if mask_BxTxS is None else mask_BxTxS[:, None, :, :],
        is_causal=causal,
        local_window_size=(window - 1, 0) if window > 0 else None,
        implementation="cudnn"
        if implementation == "cudnn" and mask_BxTxS is None and _cudnn_head_dim(q_BxTxHxK.shape[-1])
        else "xla",
    )


SPLASH_MIN_BLOCK = 128  # splash's tiles: a multiple of 128 positions (the TPU's lanes)
SPLASH_BLOCK = 512  # its tile where the length allows (MaxText's default for long sequences)


def splash_attention(
    q_BxTxHxK: jax.Array,
    k_BxTxHxK: jax.Array,
    v_BxTxHxK: jax.Array,
    *,
    causal: bool,
    window: int = 0,
    segments_BxT: jax.Array | None = None,
) -> jax.Array:
    """Self-attention by Pallas splash attention: causal (or full), a sliding window of ``window``
    positions (the current one included), and documents (``segments_BxT``) as its segment ids; the
    score scale ``1/sqrt(K)`` of :func:`jax.nn.dot_product_attention`. Under a mesh (``jax.set_mesh``)
    the kernel runs per shard: rows over ``data x fsdp`` and heads over ``tensor``, where they divide
    (a Pallas kernel is opaque to XLA's partitioner). Off a TPU it runs in Pallas's interpreter."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    B, T, H, K = q_BxTxHxK.shape
    interpret = jax.default_backend() != "tpu"
    block = SPLASH_BLOCK if T % SPLASH_BLOCK == 0 else SPLASH_MIN_BLOCK
    block = min(block, T)

    def kernel_for(heads: int):
        one: sm.Mask
        if window > 0:
            one = sm.LocalMask((T, T), window_size=(window - 1, 0 if causal else window - 1), offset=0)
        elif causal:
            one = sm.CausalMask((T, T))
        else:
            one = sm.FullMask((T, T))
        sizes = sk.BlockSizes(
            block_q=block, block_kv=block, block_kv_compute=block,
            block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
            block_q_dq=block, block_kv_dq=block,
        )  # fmt: skip
        return sk.make_splash_mha(
            sm.MultiHeadMask([one] * heads),
            block_sizes=sizes,
            head_shards=1,
            q_seq_shards=1,
            interpret=interpret,
        )

    scale = 1.0 / np.sqrt(K)

    def local(q, k, v, seg):
        kernel = kernel_for(q.shape[2])
        to_heads = lambda x: x.transpose(0, 2, 1, 3)  # noqa: E731 (B x H x T x K, the kernel's layout)
        qh = to_heads((q.astype(jnp.float32) * scale).astype(q.dtype))
        if seg is None:
            out = jax.vmap(kernel)(qh, to_heads(k), to_heads(v))
        else:
            ids = seg.astype(jnp.int32)
            out = jax.vmap(lambda a, b, c, s: kernel(a, b, c, segment_ids=sk.SegmentIds(q=s, kv=s)))(
                qh, to_heads(k), to_heads(v), ids
            )
        return to_heads(out).astype(q.dtype)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or all(size == 1 for size in mesh.shape.values()):
        return local(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, segments_BxT)
    from jax.sharding import PartitionSpec as P

    rows = tuple(a for a in ("data", "fsdp") if a in mesh.shape)
    if B % int(np.prod([mesh.shape[a] for a in rows])):
        rows = ()
    heads = "tensor" if "tensor" in mesh.shape and H % mesh.shape["tensor"] == 0 else None
    qkv = P(rows or None, None, heads, None)
    if segments_BxT is None:
        unsegmented = jax.shard_map(
            lambda q, k, v: local(q, k, v, None), in_specs=(qkv, qkv, qkv), out_specs=qkv, check_vma=False
        )
        return unsegmented(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK)
    segmented = jax.shard_map(
        local, in_specs=(qkv, qkv, qkv, P(rows or None, None)), out_specs=qkv, check_vma=False
    )
    return segmented(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, segments_BxT)


def _cudnn_head_dim(head_dim: int) -> bool:
    """Head dimensions cuDNN's fused attention takes (a multiple of 8, at most 128)."""
    return head_dim % 8 == 0 and head_dim <= 128


def blocked_causal_attention(
    q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, *, window: int = 0, block: int = ATTENTION_BLOCK
) -> jax.Array:
    """Causal (optionally windowed) self-attention that skips key blocks wholly in the future.

    Queries are cut into blocks of ``block`` positions; query block ``i`` attends, through
    ``jax.nn.dot_product_attention``, only to keys ``[start_i, end_i)`` that some query of the block
    may see (``end_i`` = the block's end; ``start_i`` = 0, or the window's reach). Every query's
    softmax runs over all of its visible keys, so the result equals dense masked attention; the
    work on a causal ``T x T`` score matrix falls to about ``(n + 1) / 2n`` of it for ``n`` blocks.
    """
    T = q_BxTxHxK.shape[1]
    outs = []
    for qs in range(0, T, block):
        qe = min(T, qs + block)
        ks = 0 if window <= 0 else max(0, qs - (window - 1))
        q_pos = np.arange(qs, qe)[:, None]
        k_pos = np.arange(ks, qe)[None, :]
        allowed = k_pos <= q_pos
        if window > 0:
            allowed &= q_pos - k_pos < window
        outs.append(
            jax.nn.dot_product_attention(
                q_BxTxHxK[:, qs:qe],
                k_BxTxHxK[:, ks:qe],
                v_BxTxHxK[:, ks:qe],
                mask=jnp.asarray(allowed)[None, None],
            )
        )
    return jnp.concatenate(outs, axis=1)


# The score of a key in another document: finite, so that a query with no key of its document in a
# part (the first half's keys, for a document that starts in the second half) gets a finite
# log-sum-exp about this low, and that part's weight in the merge underflows to exactly 0.
_OTHER_DOCUMENT = -1e30


def _softmax_part(q_NxQxK, k_NxSxK, v_NxSxK, *, causal: bool, seg_q_NxQ=None, seg_k_NxS=None):
    """Attention of the queries over all the given keys (``causal``: Q == S, lower triangle;
    ``seg_q_NxQ``/``seg_k_NxS``: document ids, a query sees only its document's keys).

    Leading dims ``N`` are batch (heads included). Returns the normalised output ``N x Q x K``
    and the log-sum-exp of the scores ``N x Q``, so that parts over disjoint key sets merge
    exactly."""
    scale = q_NxQxK.shape[-1] ** -0.5
    f32 = jnp.float32  # the softmax and the merges in fp32 whatever the compute dtype
    s_NxQxS = jnp.einsum("...qk,...sk->...qs", q_NxQxK * scale, k_NxSxK, preferred_element_type=f32)
    if seg_q_NxQ is not None:
        s_NxQxS = jnp.where(seg_q_NxQ[..., :, None] == seg_k_NxS[..., None, :], s_NxQxS, _OTHER_DOCUMENT)
    if causal:
        n = q_NxQxK.shape[-2]
        s_NxQxS = jnp.where(np.tril(np.ones((n, n), bool)), s_NxQxS, -jnp.inf)
    # the max only keeps exp in range: the output and the log-sum-exp do not depend on its value
    m_NxQx1 = jax.lax.stop_gradient(jnp.max(s_NxQxS, axis=-1, keepdims=True))
    p_NxQxS = jnp.exp(s_NxQxS - m_NxQx1)
    l_NxQ = jnp.sum(p_NxQxS, axis=-1)
    pv_NxQxK = jnp.einsum(
        "...qs,...sk->...qk", p_NxQxS.astype(v_NxSxK.dtype), v_NxSxK, preferred_element_type=f32
    )
    return pv_NxQxK / l_NxQ[..., None], m_NxQx1[..., 0] + jnp.log(l_NxQ)


def _merge_parts(out_a, lse_a, out_b, lse_b):
    """Attention over the union of two disjoint key sets, from the attention over each."""
    lse = jnp.logaddexp(lse_a, lse_b)
    return out_a * jnp.exp(lse_a - lse)[..., None] + out_b * jnp.exp(lse_b - lse)[..., None], lse


def halving_causal_attention(
    q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, *, block: int = ATTENTION_BLOCK, segments_BxT=None
):
    """Causal self-attention that skips the masked half of the score matrix without slicing loops.

    The sequence is halved recursively: each half attends causally to itself (both halves as one
    batched call, through a free reshape), and the second half's queries also attend to all of the
    first half's keys (a dense, unmasked product); the two parts merge exactly through their
    log-sum-exp, as in flash attention. Down to ``block`` positions, the work is ``(1 + 1/n) / 2``
    of dense attention for ``n = T / block`` (5/8 at T=512, block 128), with only matmuls,
    one masked softmax per leaf and small merges of ``T x K`` outputs: on XLA CPU this needs
    about 30% less work than slicing the queries into blocks (``benchmarks/RESULTS.md`` at 3372114). The
    recursion runs heads-major (``B x H x T x K``), where every reshape is free. ``segments_BxT``
    (document ids) keeps each query to its own document's keys: every part masks its scores by it.
    """
    heads_major = lambda x: jnp.swapaxes(x, 1, 2)  # noqa: E731
    out_BxHxTxK = halving_attention_bhtk(
        heads_major(q_BxTxHxK),
        heads_major(k_BxTxHxK),
        heads_major(v_BxTxHxK),
        block=block,
        segments_BxT=segments_BxT,
    )
    return jnp.swapaxes(out_BxHxTxK, 1, 2)


def halving_attention_bhtk(
    q_BxHxTxK, k_BxHxTxK, v_BxHxTxK, *, block: int = ATTENTION_BLOCK, segments_BxT=None
):
    """:func:`halving_causal_attention` on ``B x H x T x K`` arrays (heads before positions)."""
    shape = q_BxHxTxK.shape
    flat = lambda x: x.reshape(-1, *x.shape[-2:])  # noqa: E731
    seg_NxT = None
    if segments_BxT is not None:  # the same ids for every head
        seg_NxT = jnp.broadcast_to(segments_BxT[:, None, :], shape[:3]).reshape(-1, shape[2])
    out_NxTxK, _ = _halving(flat(q_BxHxTxK), flat(k_BxHxTxK), flat(v_BxHxTxK), block, seg_NxT)
    return out_NxTxK.reshape(shape).astype(q_BxHxTxK.dtype)


def _halving(q_NxTxK, k_NxTxK, v_NxTxK, block, seg_NxT=None):
    """Recursion of :func:`halving_causal_attention` on ``N x T x K`` (every level folds its two
    halves into the batch, so the rank stays 3 however deep it goes: XLA CPU's YNNPACK dots
    reject operands of rank 8 or more)."""
    N, T, K = q_NxTxK.shape
    if T <= block or T % 2:
        return _softmax_part(q_NxTxK, k_NxTxK, v_NxTxK, causal=True, seg_q_NxQ=seg_NxT, seg_k_NxS=seg_NxT)
    half = T // 2
    q2, k2, v2 = (x.reshape(N, 2, half, K) for x in (q_NxTxK, k_NxTxK, v_NxTxK))
    seg2 = seg_d = None
    if seg_NxT is not None:
        seg2, seg_d = seg_NxT.reshape(N, 2, half), seg_NxT.reshape(2 * N, half)
    # each half over itself, causally, both halves as one batch of 2N
    out_d, lse_d = _halving(
        q_NxTxK.reshape(2 * N, half, K),
        k_NxTxK.reshape(2 * N, half, K),
        v_NxTxK.reshape(2 * N, half, K),
        block,
        seg_d,
    )
    out_d, lse_d = out_d.reshape(N, 2, half, K), lse_d.reshape(N, 2, half)
    # the second half's queries over all of the first half's keys, merged into their own part
    out_x, lse_x = _softmax_part(
        q2[:, 1],
        k2[:, 0],
        v2[:, 0],
        causal=False,
        seg_q_NxQ=None if seg2 is None else seg2[:, 1],
        seg_k_NxS=None if seg2 is None else seg2[:, 0],
    )
    out_2, lse_2 = _merge_parts(out_d[:, 1], lse_d[:, 1], out_x, lse_x)
    out = jnp.stack([out_d[:, 0], out_2], axis=1).reshape(N, T, K)
    lse = jnp.stack([lse_d[:, 0], lse_2], axis=1).reshape(N, T)
    return out, lse
