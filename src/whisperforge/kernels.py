"""The decode step's Triton kernels (CUDA only) and the functions that launch them.

`runtime.py` runs the step with them on a GPU; its torch path (the CPU, the tests) is their
reference, and Triton's CPU interpreter (`TRITON_INTERPRET=1`) runs them in the tests.

- The few-row matmuls are streams over the weights (`skinny_linear`, `linear`): int8 and fp8
  weights widen in registers; each runs the config tuned for its role in the whole graphed
  step (`STEP_CONFIGS`), so every process sums in the same order and gives the same tokens.
- The layer norms and residual adds fold into the epilogues of the matmuls around them
  (`folded_linear`, `StreamStats`); at one row the self-attention and its output projection
  are one kernel (`self_attention_out`).
- Attention: the self-attention of one new token by each row's length (`decode_attention`),
  the cross-attention split over the keys and combined (`cross_attention`).
- The step's start (`embed_layer_norm`), the greedy or sampled choice folded into the logits
  matmul (`_logits_select_kernel`, `_greedy_select_kernel`), the timestamp rules
  (`timestamp_rules`), beam search's step (`beam_step`) and its reorder of the self K,V
  (`reorder_rows`).
- On Hopper the kernels chain by programmatic dependent launch (`USE_PDL`): each loads what
  does not depend on the kernel before (weights, scales, past K,V) before it waits.

benchmarks/GPU_NOTES.md tells what each of these choices measured.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from .quantize import QuantizedWeight

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter, for tests

# Triton runs only on a CUDA GPU or in its interpreter. Elsewhere it is not even imported:
# PyTorch's CUDA wheels install it for CPU users too, and importing it holds ~50 MB of memory.
# `device_count` asks NVML, so a process that forks workers has not initialized CUDA here.
triton = tl = gdc_wait = gdc_launch_dependents = None
if _INTERPRETED or torch.cuda.device_count() > 0:
    try:
        import triton
        import triton.language as tl
    except ImportError:  # no Triton: the runtime runs its plain torch path
        pass
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
    except ImportError:  # no Triton, or one without grid dependency control: no PDL
        pass


# Programmatic dependent launch (Hopper and later): each step kernel is launched while the one
# before it still runs, streams its weights into L2, and only then waits for its inputs. A
# decode step is a chain of ~12 small kernels per layer, each reading a few MB: without this,
# every kernel's ramp-up and tail leave the memory idle. None: on where the GPU has it; the
# benchmarks set USE_PDL to compare.
USE_PDL: bool | None = None


def step_pdl() -> bool:
    """Whether the step kernels launch with PDL now."""
    if USE_PDL is not None:
        return USE_PDL and gdc_wait is not None
    return _pdl_supported()


@functools.cache
def _pdl_supported() -> bool:
    if triton is None or gdc_wait is None or _INTERPRETED or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability()[0] >= 9


def _launch(like: Tensor) -> dict:
    """Launch options of a step kernel on `like`'s device (the interpreter knows no
    launch_pdl)."""
    return {"PDL": True, "launch_pdl": True} if step_pdl() and like.is_cuda else {"PDL": False}


if triton is not None:

    @triton.jit
    def _wait_for_inputs(PDL: tl.constexpr, EARLY: tl.constexpr = True):
        """Under PDL: let the next kernel launch (it preloads while this one runs), and wait
        until the kernel before has finished (its writes are visible). EARLY: launch the next
        before the wait, so that it preloads while this kernel and the one before run too.
        Every read before a wait is of data no kernel of the step writes (weights, cross K,V,
        the positions and K,V of earlier steps), and every write comes after it; a step's
        first kernel is not EARLY, so none of the step reads what the step before writes
        until it has finished. The matmuls at more rows are not EARLY either: there the next
        kernel's preload slowed their stream (+4 % a 16-row step)."""
        if PDL:
            if EARLY:
                gdc_launch_dependents()
                gdc_wait()
            else:
                gdc_wait()
                gdc_launch_dependents()

    _PREFETCH = tl.constexpr(not _INTERPRETED)  # the interpreter runs no inline assembly

    @triton.jit
    def _prefetch_l2(pointers):
        """Ask L2 for the 128-byte line at each pointer; nothing waits for it."""
        if _PREFETCH:
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1]; // $0", "=r,l", [pointers], dtype=tl.int32,
                is_pure=False, pack=1,
            )  # fmt: skip

    @triton.jit
    def _last_to_arrive(ticket, arrivals):
        """Whether this program is the last of `arrivals` to count in at the zeroed int32
        `ticket` (which it then zeroes for the next kernel); its stores before the call are
        visible to that last program, whose loads after the call see every program's."""
        tl.debug_barrier()  # every thread's stores are issued before the release
        last = tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu") == arrivals - 1
        if last:
            tl.atomic_xchg(ticket, 0, sem="relaxed", scope="gpu")
        return last

    @triton.jit
    def _sum_partials(ptr, offsets, mask, SPLITS: tl.constexpr, stride, dtype: tl.constexpr):
        """A matmul's output at offsets, in float32: as is (SPLITS = 0), or its float32 partial
        sums [SPLITS, stride] added up and rounded to dtype, as the whole matmul would write."""
        y = tl.load(ptr + offsets, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        if SPLITS > 0:
            for s in range(1, SPLITS):
                y += tl.load(ptr + s * stride + offsets, mask=mask, other=0.0, cache_modifier=".cg")
            y = y.to(dtype).to(tl.float32)
        return y

    @triton.jit
    def _layer_norm_row(x, w_ptr, b_ptr, cols, mask, D, eps):
        """layer_norm of one row x (float32, zero past D) with weight and bias, in float32."""
        mean = tl.sum(x, axis=0) / D
        diff = tl.where(mask, x - mean, 0.0)
        var = tl.sum(diff * diff, axis=0) / D
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        return diff * tl.rsqrt(var + eps) * w + b

    @triton.jit
    def _band_stats(
        stats_ptr, m, eps, M, K: tl.constexpr, BAND: tl.constexpr, BLOCK_BANDS: tl.constexpr
    ):
        """Mean and 1 / std (layer_norm's) of rows m of the residual stream [M, K], from the
        count-BAND means and squared deviations its writer left per band of columns
        (`_residual_epilogue`) in stats [K / BAND, M, 2]."""
        loaded = _load_band_stats(stats_ptr, m, M, K, BAND, BLOCK_BANDS)
        return _combine_band_stats(loaded, eps, K, BAND)

    @triton.jit
    def _load_band_stats(
        stats_ptr, m, M, K: tl.constexpr, BAND: tl.constexpr, BLOCK_BANDS: tl.constexpr
    ):
        """`_band_stats`' loads (issued early, they are waited for where they are used)."""
        b = tl.arange(0, BLOCK_BANDS)  # K / BAND, to a power of two
        at = stats_ptr + (b[None, :] * M + m[:, None]) * 2
        valid = (b[None, :] < K // BAND) & (m[:, None] < M)
        band_mean = tl.load(at, mask=valid, other=0.0, cache_modifier=".cg")
        squares = tl.load(at + 1, mask=valid, other=0.0, cache_modifier=".cg")
        return band_mean, squares, valid

    @triton.jit
    def _combine_band_stats(loaded, eps, K: tl.constexpr, BAND: tl.constexpr):
        """Chan et al.'s pairwise combination of the bands: as stable as two passes over the
        row."""
        band_mean, squares, valid = loaded
        mean = tl.sum(band_mean, axis=1) / (K // BAND)
        spread = tl.where(valid, band_mean - mean[:, None], 0.0)
        squares = tl.sum(squares, axis=1) + BAND * tl.sum(spread * spread, axis=1)
        return mean, tl.rsqrt(squares / K + eps)

    @triton.jit
    def _residual_epilogue(acc, stream, stats_ptr, m, band, M, dtype: tl.constexpr):
        """A tile of the residual stream as loaded (rows m, one band of columns) plus acc (a
        matmul's output and bias, float32), rounded once as `add_layer_norm` rounds, in
        float32; the band's mean and squared deviations per row go to stats [bands, M, 2] for
        the next layer norm (`_band_stats`)."""
        acc = (acc + stream.to(tl.float32)).to(dtype).to(tl.float32)
        band_mean = tl.sum(acc, axis=1) / acc.shape[1]
        diff = acc - band_mean[:, None]
        at = stats_ptr + (band * M + m) * 2
        tl.store(at, band_mean, mask=m < M)
        tl.store(at + 1, tl.sum(diff * diff, axis=1), mask=m < M)
        return acc

    @triton.jit
    def _add_layer_norm_kernel(
        x_ptr, y_ptr, bias_ptr, w_ptr, b_ptr, h_ptr, rows, D, eps,
        SPLITS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """x += y + bias, in place (the residual stream); h = layer_norm(x). One row per program.
        SPLITS > 0: y is a split matmul's float32 partial sums [SPLITS, rows, D], added here."""
        _wait_for_inputs(PDL)
        row = tl.program_id(0).to(tl.int64) * D
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        x = tl.load(x_ptr + row + cols, mask=mask, other=0.0).to(tl.float32)
        y = _sum_partials(y_ptr, row + cols, mask, SPLITS, rows * D, x_ptr.dtype.element_ty)
        y += tl.load(bias_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = (x + y).to(x_ptr.dtype.element_ty)  # the stream is kept in the compute dtype
        tl.store(x_ptr + row + cols, x, mask=mask)
        h = _layer_norm_row(x.to(tl.float32), w_ptr, b_ptr, cols, mask, D, eps)
        tl.store(h_ptr + row + cols, h.to(h_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _embed_layer_norm_kernel(
        token_ptr, pos_ptr, token_emb_ptr, scale_ptr, pos_emb_ptr, w_ptr, b_ptr, x_ptr, h_ptr, D,
        eps, GROUP: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """x = token_embedding[token] + positional_embedding[pos]; h = layer_norm(x). One row
        per program: the start of a decode step. GROUP: the embedding is quantize's, int8 rows
        times a scale per GROUP columns (GROUP = D: one per row), rounded to x's dtype as
        `QuantizedEmbedding` rounds."""
        _wait_for_inputs(PDL, EARLY=False)
        r = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < D
        token = tl.load(token_ptr + r).to(tl.int64)
        pos = tl.load(pos_ptr + r).to(tl.int64)
        x = tl.load(token_emb_ptr + token * D + cols, mask=mask, other=0)
        if GROUP:
            at = token * (D // GROUP) + cols // GROUP
            x = x.to(tl.float32) * tl.load(scale_ptr + at, mask=mask, other=0.0).to(tl.float32)
        x = x.to(x_ptr.dtype.element_ty)
        x += tl.load(pos_emb_ptr + pos * D + cols, mask=mask, other=0.0)  # in the dtype, as torch
        tl.store(x_ptr + r.to(tl.int64) * D + cols, x, mask=mask)
        h = _layer_norm_row(x.to(tl.float32), w_ptr, b_ptr, cols, mask, D, eps)
        tl.store(h_ptr + r.to(tl.int64) * D + cols, h.to(h_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _decode_attention_kernel(
        qkv_ptr, bias_ptr, cache_ptr, pos_ptr, out_ptr, n_head, scale,
        T: tl.constexpr, DH: tl.constexpr, BLOCK_T: tl.constexpr, BY_LENGTH: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        """`_self_attention_head` of (row, head) = program ids (0, 1). The past K,V were
        written by earlier steps, as was the row's position, so before this step's query is
        ready their first BLOCK_T positions are loaded into registers, and the rest
        prefetched into L2 (H100, a step: -3.8 % large-v3 at one row, -1 to -2.6 % else)."""
        r, h = tl.program_id(0), tl.program_id(1)
        p = tl.load(pos_ptr + r)
        k_base, v_base = _past_keys(cache_ptr, r, h, n_head, T, DH)
        first = _past_tile(k_base, v_base, tl.arange(0, BLOCK_T), p, DH)
        if PDL:
            for start in range(BLOCK_T, p, BLOCK_T):
                t = tl.minimum(start + tl.arange(0, BLOCK_T), p - 1)
                _prefetch_l2(k_base + t * DH)  # a line each: all of a 16-bit key of 64
                _prefetch_l2(v_base + t * DH)
        _wait_for_inputs(PDL)
        _self_attention_head(
            qkv_ptr, bias_ptr, cache_ptr, pos_ptr, out_ptr, r, h, n_head, scale, T, DH, BLOCK_T,
            BY_LENGTH, first, True,
        )  # fmt: skip

    @triton.jit
    def _past_keys(cache_ptr, r, h, n_head, T: tl.constexpr, DH: tl.constexpr):
        """Where row r's cached K and V of head h start (the cache: [rows, 2H, T, DH])."""
        k_base = cache_ptr + (r * 2 * n_head + h).to(tl.int64) * T * DH
        return k_base, k_base + n_head * T * DH

    @triton.jit
    def _past_tile(k_base, v_base, t, p, DH: tl.constexpr):
        """The cached K and V [len(t), DH] at positions t (where below p)."""
        return _past_rows(k_base, t, p, DH), _past_rows(v_base, t, p, DH)

    @triton.jit
    def _past_rows(base, t, p, DH: tl.constexpr):
        """The cached K or V (from `_past_keys`) [len(t), DH] at positions t (where below p)."""
        d = tl.arange(0, DH)
        return tl.load(base + t[:, None] * DH + d[None, :], mask=(t < p)[:, None], other=0.0)

    @triton.jit
    def _self_attention_head(
        qkv_ptr, bias_ptr, cache_ptr, pos_ptr, out_ptr, r, h, n_head, scale,
        T: tl.constexpr, DH: tl.constexpr, BLOCK_T: tl.constexpr, BY_LENGTH: tl.constexpr,
        first, PRELOADED: tl.constexpr,
    ):  # fmt: skip
        """`_self_attention_row`, its output stored in out [rows, D]."""
        out = _self_attention_row(
            qkv_ptr, bias_ptr, cache_ptr, pos_ptr, r, h, n_head, scale, T, DH, BLOCK_T,
            BY_LENGTH, first, PRELOADED, True,
        )  # fmt: skip
        d = tl.arange(0, DH)
        tl.store(out_ptr + r * n_head * DH + h * DH + d, out.to(out_ptr.dtype.element_ty))

    @triton.jit
    def _self_attention_row(
        qkv_ptr, bias_ptr, cache_ptr, pos_ptr, r, h, n_head, scale,
        T: tl.constexpr, DH: tl.constexpr, BLOCK_T: tl.constexpr, BY_LENGTH: tl.constexpr,
        first, PRELOADED: tl.constexpr, WRITE,
    ):  # fmt: skip
        """Row r, head h: write this token's K,V at the row's position p (where WRITE), then
        attend over positions [0, p] of the row's cache; returns the output [DH] in float32.
        The length comes from memory, so one kernel (and one graph) serves every length: no
        buckets, no mask. PRELOADED: `first` holds the past's first BLOCK_T positions
        (`_past_tile`), loaded already."""
        p = tl.load(pos_ptr + r)
        D = n_head * DH
        d = tl.arange(0, DH)
        row = qkv_ptr + r * 3 * D
        # The projection's bias is added here, so the qkv projection is a plain matmul.
        dtype = qkv_ptr.dtype.element_ty
        q = _biased(row, bias_ptr, h * DH + d, dtype).to(tl.float32) * scale
        k_new = _biased(row, bias_ptr, D + h * DH + d, dtype)
        v_new = _biased(row, bias_ptr, 2 * D + h * DH + d, dtype)
        k_base, v_base = _past_keys(cache_ptr, r, h, n_head, T, DH)
        tl.store(k_base + p * DH + d, k_new, mask=(d < DH) & WRITE)
        tl.store(v_base + p * DH + d, v_new, mask=(d < DH) & WRITE)
        # Online softmax, seeded with the new token from registers (its stores may not be
        # visible to this program's loads yet).
        m = tl.sum(q * k_new.to(tl.float32), axis=0)
        l = tl.full([], 1.0, tl.float32)
        acc = v_new.to(tl.float32)
        if PRELOADED:
            k, v = first
            s = _scores_one(q, k, tl.arange(0, BLOCK_T) < p)
            m, l, acc = _accumulate_one(s, v, m, l, acc)
        for start in range(BLOCK_T if PRELOADED else 0, p if BY_LENGTH else T, BLOCK_T):
            t = start + tl.arange(0, BLOCK_T)  # T: the interpreter (tests)
            s = _scores_one(q, _past_rows(k_base, t, p, DH), t < p)
            # V after the scores (loaded beside K: +2 % a large-v3 step, H100).
            m, l, acc = _accumulate_one(s, _past_rows(v_base, t, p, DH), m, l, acc)
        return acc / l

    @triton.jit
    def _scores_one(q, k, valid):
        """One query vector's (float32, scaled) scores against keys k (-inf where not valid)."""
        return tl.where(valid, tl.sum(k.to(tl.float32) * q[None, :], axis=1), float("-inf"))

    @triton.jit
    def _accumulate_one(s, v, m, l, acc):
        """Online softmax for one query vector: its running max m, sum l and unnormalized output
        acc after one more tile of scores s over values v."""
        m_new = tl.maximum(m, tl.max(s, axis=0))
        alpha = tl.exp(m - m_new)
        e = tl.exp(s - m_new)
        l = l * alpha + tl.sum(e, axis=0)
        return m_new, l, acc * alpha + tl.sum(e[:, None] * v.to(tl.float32), axis=0)

    @triton.jit
    def _biased(x_ptr, bias_ptr, at, dtype: tl.constexpr):
        """x[at] + bias[at], rounded to dtype as torch's biased projection output."""
        x = tl.load(x_ptr + at, cache_modifier=".cg").to(tl.float32)
        return (x + tl.load(bias_ptr + at).to(tl.float32)).to(dtype)

    @triton.jit
    def _cross_head(kv_ptr, w, h, A, D, DH: tl.constexpr):
        """Where head h's K of window w starts in the cross K,V [windows, A, 2D]; its V at + D."""
        return kv_ptr + w.to(tl.int64) * A * 2 * D + h * DH

    @triton.jit
    def _prefetch_cross_keys(kv_ptr, w, h, s, A, D, DH: tl.constexpr, KEYS: tl.constexpr,
                             BLOCK_T: tl.constexpr):  # fmt: skip
        """Ask L2 for the K and V of head h, keys [s KEYS, (s + 1) KEYS) of window w: one
        128-byte line per key (DH = 64 at 2 bytes) for K and for V."""
        kv = _cross_head(kv_ptr, w, h, A, D, DH)
        for t0 in range(0, KEYS, BLOCK_T):
            t = tl.minimum(s * KEYS + t0 + tl.arange(0, BLOCK_T), A - 1)
            _prefetch_l2(kv + t * 2 * D)
            _prefetch_l2(kv + t * 2 * D + D)

    @triton.jit
    def _cross_attention_kernel(
        q_ptr, q_bias_ptr, kv_ptr, m_ptr, l_ptr, acc_ptr, A, n_head, scale,
        Q_SPLITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, DH: tl.constexpr,
        KEYS: tl.constexpr, BLOCK_T: tl.constexpr, PRELOAD: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """`_cross_attention_split` of (window, head, split) = program ids (0, 1, 2); the
        window's K,V are prefetched into L2, and the query's bias loaded, before the query is
        ready. PRELOAD (KEYS = BLOCK_T): the split's K,V tile, static since the window was
        encoded, is loaded into registers before the wait instead."""
        w, h, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        first = (0.0, 0.0)
        if PRELOAD:
            D = n_head * DH
            t = s * KEYS + tl.arange(0, BLOCK_T)
            first = _cross_tile(_cross_head(kv_ptr, w, h, A, D, DH), t, t < A, D, DH)
        elif PDL:
            _prefetch_cross_keys(kv_ptr, w, h, s, A, n_head * DH, DH, KEYS, BLOCK_T)
        q_bias = tl.load(q_bias_ptr + h * DH + tl.arange(0, DH)).to(tl.float32)
        _wait_for_inputs(PDL)
        _cross_attention_split(
            q_ptr, q_bias, kv_ptr, m_ptr, l_ptr, acc_ptr, w, h, s, tl.num_programs(2),
            tl.num_programs(0) * GROUP, A, n_head, scale, Q_SPLITS, GROUP, BLOCK_G, DH, KEYS,
            BLOCK_T, first, PRELOAD,
        )  # fmt: skip

    @triton.jit
    def _cross_attention_split(
        q_ptr, q_bias, kv_ptr, m_ptr, l_ptr, acc_ptr, w, h, s, S, rows, A, n_head, scale,
        Q_SPLITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, DH: tl.constexpr,
        KEYS: tl.constexpr, BLOCK_T: tl.constexpr, first, PRELOADED: tl.constexpr,
    ):  # fmt: skip
        """Window w, head h, split s of S of the keys: the window's GROUP rows attend to KEYS of
        its A cross keys. Writes the split's running max m, sum l and unnormalized output
        (flash decoding); `_combine_head` joins the splits. The window's K,V are read once for
        all its rows (beams). The query comes without its bias: [rows, D], or Q_SPLITS > 0
        float32 partial sums [Q_SPLITS, rows, D]; its bias q_bias (float32 [DH]) is added
        here. PRELOADED: `first` holds the split's first BLOCK_T keys' K,V (`_cross_tile`),
        loaded already."""
        D = n_head * DH
        kv = _cross_head(kv_ptr, w, h, A, D, DH)
        dtype = kv_ptr.dtype.element_ty
        q = _cross_query(q_ptr, q_bias, w, h, rows, n_head, Q_SPLITS, GROUP, BLOCK_G, DH, dtype)
        m = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, DH], tl.float32)
        if PRELOADED:
            k, v = first
            t = s * KEYS + tl.arange(0, BLOCK_T)
            m, l, acc = _attend(q, k, v, t < A, m, l, acc, scale)
        for t0 in range(BLOCK_T if PRELOADED else 0, KEYS, BLOCK_T):
            t = s * KEYS + t0 + tl.arange(0, BLOCK_T)
            k, v = _cross_tile(kv, t, t < A, D, DH)
            m, l, acc = _attend(q, k, v, t < A, m, l, acc, scale)
        _store_split(m, l, acc, m_ptr, l_ptr, acc_ptr, w, h, s, S, n_head, GROUP, BLOCK_G, DH)

    @triton.jit
    def _cross_query(
        q_ptr, q_bias, w, h, rows, n_head, Q_SPLITS: tl.constexpr, GROUP: tl.constexpr,
        BLOCK_G: tl.constexpr, DH: tl.constexpr, dtype: tl.constexpr,
    ):  # fmt: skip
        """Head h's query of window w's GROUP rows [BLOCK_G, DH], its bias added, in dtype."""
        D = n_head * DH
        g = tl.arange(0, BLOCK_G)
        at = (w * GROUP + g)[:, None] * D + h * DH + tl.arange(0, DH)[None, :]
        q = _sum_partials(q_ptr, at, g[:, None] < GROUP, Q_SPLITS, rows * D, dtype)
        return (q + q_bias[None, :]).to(dtype)

    @triton.jit
    def _cross_tile(kv, t, valid, D, DH: tl.constexpr):
        """The K and V [len(t), DH] of keys t (where valid) of a head (kv: its K; V at + D).
        V with K, before the scores: the tile's loads are in flight together."""
        d = tl.arange(0, DH)
        k = tl.load(kv + t[:, None] * 2 * D + d[None, :], mask=valid[:, None], other=0.0)
        v = tl.load(kv + D + t[:, None] * 2 * D + d[None, :], mask=valid[:, None], other=0.0)
        return k, v

    @triton.jit
    def _attend(q, k, v, valid, m, l, acc, scale):
        """Online softmax: the running max m, sum l and unnormalized output acc of the rows q
        after one more tile of keys k, values v (where valid)."""
        scores = tl.dot(q, tl.trans(k)) * scale
        scores = tl.where(valid[None, :], scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(scores - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l, acc

    @triton.jit
    def _store_split(
        m, l, acc, m_ptr, l_ptr, acc_ptr, w, h, s, S, n_head, GROUP: tl.constexpr,
        BLOCK_G: tl.constexpr, DH: tl.constexpr,
    ):  # fmt: skip
        """A split's partial softmax of window w's rows, head h: partials [rows, heads, S(, DH)]."""
        g = tl.arange(0, BLOCK_G)
        at = ((w * GROUP + g) * n_head + h) * S + s
        keep = g < GROUP
        tl.store(m_ptr + at, m, mask=keep)
        tl.store(l_ptr + at, l, mask=keep)
        tl.store(acc_ptr + at[:, None] * DH + tl.arange(0, DH)[None, :], acc, mask=keep[:, None])

    @triton.jit
    def _combine_kernel(
        m_ptr, l_ptr, acc_ptr, out_ptr, n_head, S,
        DH: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """`_combine_head` of (row, head) = program ids (0, 1)."""
        _wait_for_inputs(PDL)
        _combine_head(
            m_ptr, l_ptr, acc_ptr, out_ptr, tl.program_id(0), tl.program_id(1), n_head, S, DH,
            BLOCK_S,
        )  # fmt: skip

    @triton.jit
    def _combine_head(
        m_ptr, l_ptr, acc_ptr, out_ptr, r, h, n_head, S, DH: tl.constexpr, BLOCK_S: tl.constexpr
    ):
        """Row r, head h: join the key splits' partial softmaxes into the attention output."""
        s = tl.arange(0, BLOCK_S)
        d = tl.arange(0, DH)
        at = (r * n_head + h) * S + s
        m = tl.load(m_ptr + at, mask=s < S, other=float("-inf"), cache_modifier=".cg")
        weight = tl.exp(m - tl.max(m, axis=0))  # 0 for the padding splits
        l = tl.load(l_ptr + at, mask=s < S, other=0.0, cache_modifier=".cg")
        l = tl.sum(l * weight, axis=0)
        acc = tl.load(
            acc_ptr + at[:, None] * DH + d[None, :], mask=(s < S)[:, None], other=0.0,
            cache_modifier=".cg",
        )  # fmt: skip
        out = tl.sum(acc * weight[:, None], axis=0) / l
        tl.store(out_ptr + (r * n_head + h) * DH + d, out.to(out_ptr.dtype.element_ty))

    @triton.jit
    def _self_attention_out_kernel(
        qkv_ptr, qkv_bias_ptr, cache_ptr, pos_ptr, w_ptr, s_ptr, b_ptr, x_ptr, part_ptr,
        stats_ptr, count_ptr, z_ptr, g_ptr, scale, H: tl.constexpr, T: tl.constexpr,
        DH: tl.constexpr, BLOCK_T: tl.constexpr, BY_LENGTH: tl.constexpr, SCALE: tl.constexpr,
        BLOCK_N: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """One row's self-attention through its output projection w [D, D] into the residual
        stream x (`self_attention_out`). Program (band, h) attends head h as
        `_decode_attention_kernel` does (band 0 writes the K,V), takes the head's output
        through its columns of the band's rows of w, and leaves that partial sum in part
        [H, D] (float32); the band's last program to finish adds the heads' partials, the bias
        and x, as `_skinny_linear_kernel`'s RESIDUAL does for a split matmul. Before the wait
        (all static): the columns of w, the band's scales, bias and next norm weight, and the
        past's first BLOCK_T K,V."""
        band, h = tl.program_id(0), tl.program_id(1)
        D: tl.constexpr = H * DH
        dtype = x_ptr.dtype.element_ty
        n = band * BLOCK_N + tl.arange(0, BLOCK_N)
        w = _widen(tl.load(w_ptr + n[:, None] * D + h * DH + tl.arange(0, DH)[None, :]), dtype)
        w_scale = _columns(s_ptr, n, D, SCALE)
        bias, g = _columns(b_ptr, n, D, True), _columns(g_ptr, n, D, True)
        p = tl.load(pos_ptr)
        k_base, v_base = _past_keys(cache_ptr, 0, h, H, T, DH)
        first = _past_tile(k_base, v_base, tl.arange(0, BLOCK_T), p, DH)
        if PDL and band == 0:  # the rest into L2, once for the head's programs
            for start in range(BLOCK_T, p, BLOCK_T):
                t = tl.minimum(start + tl.arange(0, BLOCK_T), p - 1)
                _prefetch_l2(k_base + t * DH)
                _prefetch_l2(v_base + t * DH)
        _wait_for_inputs(PDL)
        at = n[None, :]
        stream = tl.load(x_ptr + at, cache_modifier=".cg")  # overlaps the attention
        a = _self_attention_row(
            qkv_ptr, qkv_bias_ptr, cache_ptr, pos_ptr, 0, h, H, scale, T, DH, BLOCK_T,
            BY_LENGTH, first, True, band == 0,
        )  # fmt: skip
        a = a.to(dtype).to(tl.float32)  # the output as the attention kernel stores it
        acc = tl.sum(w.to(tl.float32) * a[None, :], axis=1)[None, :]
        if SCALE:
            acc *= w_scale
        tl.store(part_ptr + h * D + at, acc)
        if _last_to_arrive(count_ptr + band, H):
            acc = _sum_partials(part_ptr, at, at < D, H, D, dtype) + bias
            row = tl.zeros([1], tl.int32)
            acc = _residual_epilogue(acc, stream, stats_ptr, row, band, 1, dtype)
            tl.store(x_ptr + at, acc.to(dtype))
            _scaled_stream(acc, z_ptr, g, at, at < D)

    @triton.jit
    def _copy_blocks_kernel(
        src_ptr, dst_ptr, source_ptr, R, H2, src_rows, src_stride, dst_rows, dst_stride, size,
        length_ptr, position, BLOCK: tl.constexpr, GATHER: tl.constexpr, BY_ROW: tl.constexpr,
    ):  # fmt: skip
        """Block (layer, row i, head) = program id: its first `size` elements (BY_ROW: its
        first length_ptr[i] positions of `position` elements), from row source[i] (GATHER)
        or row i of src into row i of dst, for the rows i that change (source[i] != i; beam
        search leaves most in place). src and dst hold `*_rows` rows a layer and H2 heads a
        row, their blocks `*_stride` elements apart."""
        b = tl.program_id(0)
        h, i, layer = b % H2, (b // H2) % R, b // (H2 * R)
        source = tl.load(source_ptr + i)
        length = size
        if BY_ROW:
            length = tl.load(length_ptr + i) * position
        if source != i:
            row = source if GATHER else i
            src = src_ptr + ((layer * src_rows + row) * H2 + h).to(tl.int64) * src_stride
            dst = dst_ptr + ((layer * dst_rows + i) * H2 + h).to(tl.int64) * dst_stride
            start = length * 0  # of length's type: loaded (BY_ROW) or an argument
            while start < length:
                at = start + tl.arange(0, BLOCK)
                keep = at < length
                tl.store(dst + at, tl.load(src + at, mask=keep), mask=keep)
                start += BLOCK

    @triton.jit
    def _timestamp_rules_kernel(
        logits_ptr, tokens_ptr, start_ptr, length_ptr, bias_ptr, parts_ptr, T, n, max_initial,
        V: tl.constexpr, tb: tl.constexpr, eot: tl.constexpr, no_timestamps: tl.constexpr,
        PER_ROW: tl.constexpr, INITIAL: tl.constexpr, BIAS: tl.constexpr,
        BLOCK_T: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """`decoding.ApplyTimestampRules` for band b = program id 0 of row r = program id 1 of
        logits [rows, V], in place, given the row's sampled tokens: tokens[r, :n] (rows T apart),
        or with PER_ROW tokens[r, start[r]:length[r]] (the greedy loop's history after each
        row's prompt). BIAS: the rules see logits + bias (the loop's suppressed tokens). The
        band's rules that need only the tokens are applied here; the last rule (the timestamps'
        logsumexp against the best text logit, where log_softmax's normalizer cancels) needs the
        whole row, so the band leaves its part of both in parts [3, rows, bands] for
        `_timestamps_win_kernel`."""
        _wait_for_inputs(PDL)
        b, r = tl.program_id(0), tl.program_id(1).to(tl.int64)
        tokens = tokens_ptr + r * T
        if PER_ROW:
            start = tl.load(start_ptr + r)
            n = tl.load(length_ptr + r) - start
            tokens += start
        first = n == 0  # the first sampled token is a timestamp
        t = tl.arange(0, BLOCK_T)
        sampled = tl.load(tokens + t, mask=t < n, other=0)
        is_timestamp = (sampled >= tb) & (t < n)
        last = tl.sum(tl.where(t == n - 1, is_timestamp, 0)) > 0
        penultimate = (n < 2) | (tl.sum(tl.where(t == n - 2, is_timestamp, 0)) > 0)
        pair_closed = last & penultimate  # text must follow
        segment_ended = last & ~penultimate  # a timestamp or EOT must follow
        last_index = tl.max(tl.where(is_timestamp, t, -1))
        latest = tl.sum(tl.where(t == last_index, sampled, 0))
        limit = tl.where(segment_ended, latest, latest + 1)  # never back in time
        limit = tl.where(last_index < 0, 0, limit)  # no timestamp yet: no bound
        v = b * BLOCK_V + tl.arange(0, BLOCK_V)
        row = logits_ptr + r * V
        x = tl.load(row + v, mask=v < V, other=float("-inf")).to(tl.float32)
        if BIAS:
            x += tl.load(bias_ptr + v, mask=v < V, other=0.0)
        kill = (v == no_timestamps) | (first & (v < tb))
        kill |= pair_closed & (v >= tb)
        kill |= segment_ended & (v < eot)
        kill |= (v >= tb) & (v < limit)
        if INITIAL:
            kill |= first & (v > tb + max_initial)
        x = tl.where(kill, float("-inf"), x)
        tl.store(row + v, x.to(logits_ptr.dtype.element_ty), mask=(v < V) & kill)
        stamp = tl.where(v >= tb, x, float("-inf"))
        stamp_max = tl.max(stamp)
        at = r * tl.num_programs(0) + b
        size = tl.num_programs(0) * tl.num_programs(1)
        tl.store(parts_ptr + at, tl.max(tl.where(v < tb, x, float("-inf"))))
        tl.store(parts_ptr + size + at, stamp_max)
        tl.store(parts_ptr + 2 * size + at, _sum_exp(stamp, 1.0, stamp_max, 0))

    @triton.jit
    def _timestamps_win_kernel(
        logits_ptr, parts_ptr, bands: tl.constexpr, V: tl.constexpr, tb: tl.constexpr,
        BLOCK_BANDS: tl.constexpr, BLOCK_V: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """The last of `_timestamp_rules_kernel`'s rules for band b = program id 0 of the text
        ids of row r = program id 1: where the timestamps' logsumexp beats the best text logit
        (from the bands' parts), the band's text logits become -inf."""
        _wait_for_inputs(PDL)
        b, r = tl.program_id(0), tl.program_id(1).to(tl.int64)
        size = bands * tl.num_programs(1)
        k = tl.arange(0, BLOCK_BANDS)
        at = r * bands + k
        text_max = tl.max(tl.load(parts_ptr + at, mask=k < bands, other=float("-inf")))
        maxima = tl.load(parts_ptr + size + at, mask=k < bands, other=float("-inf"))
        sums = tl.load(parts_ptr + 2 * size + at, mask=k < bands, other=0.0)
        stamp_max = tl.max(maxima)
        if stamp_max + tl.log(_sum_exp(maxima, sums, stamp_max, 0)) > text_max:  # timestamps win
            v = b * BLOCK_V + tl.arange(0, BLOCK_V)
            x = tl.full([BLOCK_V], float("-inf"), tl.float32)
            tl.store(logits_ptr + r * V + v, x.to(logits_ptr.dtype.element_ty), mask=v < tb)

    @triton.jit
    def _beam_top_kernel(
        logits_ptr, bias_ptr, value_ptr, index_ptr, max_ptr, sum_ptr,
        V: tl.constexpr, K: tl.constexpr, KPAD: tl.constexpr, BANDS: tl.constexpr,
        BLOCK_V: tl.constexpr, BIAS: tl.constexpr,
    ):  # fmt: skip
        """Band b = program id 1 of row r = program id 0 of logits [rows, V] (+ bias [V]):
        its K best values and where they are (ties: the first), its max and its sum of
        exp(x - max)."""
        r, b = tl.program_id(0).to(tl.int64), tl.program_id(1)
        at = tl.arange(0, BLOCK_V)
        x = tl.load(logits_ptr + r * V + b * BLOCK_V + at, mask=b * BLOCK_V + at < V,
                    other=float("-inf")).to(tl.float32)  # fmt: skip
        if BIAS:
            x += tl.load(bias_ptr + b * BLOCK_V + at, mask=b * BLOCK_V + at < V, other=0.0)
        band_max = tl.max(x)
        total = tl.sum(tl.exp(x - tl.where(band_max == float("-inf"), 0.0, band_max)))
        k = tl.arange(0, KPAD)
        values = tl.full([KPAD], float("-inf"), tl.float32)
        indices = tl.zeros([KPAD], tl.int32)
        for i in tl.static_range(K):
            value, where = tl.max(
                x, axis=0, return_indices=True, return_indices_tie_break_left=True
            )
            values = tl.where(k == i, value, values)
            indices = tl.where(k == i, b * BLOCK_V + where, indices)
            x = tl.where(at == where, float("-inf"), x)
        part = r * BANDS + b
        tl.store(value_ptr + part * KPAD + k, values)
        tl.store(index_ptr + part * KPAD + k, indices)
        tl.store(max_ptr + part, band_max)
        tl.store(sum_ptr + part, total)

    @triton.jit
    def _beam_join_kernel(
        value_ptr, index_ptr, max_ptr, sum_ptr, top_ptr, top_index_ptr, K: tl.constexpr,
        KPAD: tl.constexpr, BANDS: tl.constexpr, BANDS_PAD: tl.constexpr,
    ):  # fmt: skip
        """Row r = program id: its bands' K best (`_beam_top_kernel`) joined into the row's K
        best log-probabilities (ties: the first) and their tokens, [rows, KPAD] each. A program
        a row, so the rows join at once (in the rank kernel, an audio's beams joined one after
        another: 19 µs a step at one window)."""
        r = tl.program_id(0).to(tl.int64)
        flat = tl.arange(0, BANDS_PAD * KPAD)
        band = flat // KPAD
        parts = r * BANDS + band
        values = tl.load(value_ptr + parts * KPAD + flat % KPAD, mask=band < BANDS,
                         other=float("-inf"))  # fmt: skip
        indices = tl.load(index_ptr + parts * KPAD + flat % KPAD, mask=band < BANDS, other=0)
        maxima = tl.load(max_ptr + parts, mask=(band < BANDS) & (flat % KPAD == 0),
                         other=float("-inf"))  # fmt: skip
        sums = tl.load(sum_ptr + parts, mask=(band < BANDS) & (flat % KPAD == 0), other=0.0)
        top = tl.max(maxima)
        logsumexp = top + tl.log(_sum_exp(maxima, sums, top, 0))
        k = tl.arange(0, KPAD)
        best = tl.full([KPAD], float("-inf"), tl.float32)
        tokens = tl.zeros([KPAD], tl.int32)
        for i in tl.static_range(K):
            value, where = tl.max(values, axis=0, return_indices=True,
                                  return_indices_tie_break_left=True)  # fmt: skip
            tokens = tl.where(k == i, tl.sum(tl.where(flat == where, indices, 0)), tokens)
            best = tl.where(k == i, value - logsumexp, best)
            values = tl.where(flat == where, float("-inf"), values)
        tl.store(top_ptr + r * KPAD + k, best)
        tl.store(top_index_ptr + r * KPAD + k, tokens)

    @triton.jit
    def _beam_rank_kernel(
        top_ptr, top_index_ptr, before_ptr, sums_ptr, tokens_ptr, next_ptr,
        source_ptr, finished_ptr, lengths_ptr, scores_ptr, count_ptr, T, width, first,
        tokens_stride, next_stride, pos_ptr, token_ptr, done_ptr,
        BEAM: tl.constexpr, K: tl.constexpr, KPAD: tl.constexpr, CPAD: tl.constexpr,
        MAX_CANDIDATES: tl.constexpr, eot: tl.constexpr, BLOCK_T: tl.constexpr,
        LOOP: tl.constexpr,
    ):  # fmt: skip
        """`decoding.BeamSearch`'s step for audio a = program id: from each beam's K best
        log-probabilities (`_beam_join_kernel`), ranks the BEAM * K candidates best first (ties
        in candidate order, as a stable sort), keeps the first BEAM unfinished ones as the next
        beams (tokens, source rows, sums) and records the finished ones ranked above them.
        The beams' tokens are rows tokens_stride apart, the next beams' next_stride apart.
        LOOP (`Runtime.beam`): the audio's beams hold T = pos[a * BEAM] tokens, the next
        beams' last tokens also go to token_ptr (the step's input), and once done_ptr is set
        (the search completed) nothing changes: every row continues itself."""
        a = tl.program_id(0).to(tl.int64)
        c = tl.arange(0, CPAD)
        live = tl.full([], True, tl.int1)
        if LOOP:
            T = tl.load(pos_ptr + a * BEAM)
            live = tl.load(done_ptr) == 0
            rows = a * BEAM + c
            tl.store(source_ptr + rows, rows, mask=(c < BEAM) & ~live)
        j, k = c // K, c % K  # candidate c is beam j's k-th best
        valid = c < BEAM * K
        r = a * BEAM + j
        tokens = tl.load(top_index_ptr + r * KPAD + k, mask=valid, other=0)
        scores = tl.load(before_ptr + r, mask=valid, other=0.0) + tl.load(
            top_ptr + r * KPAD + k, mask=valid, other=float("-inf")
        )
        # The beams are still one sequence at the first step: rank the first alone.
        scores = tl.where((j > 0) & (first != 0), float("-inf"), scores)
        source = r
        # Candidate i ranks before c: a better score, or an equal one earlier.
        s_i, s_c = scores[:, None], scores[None, :]
        ahead = ((s_i > s_c) | ((s_i == s_c) & (c[:, None] < c[None, :]))) & valid[:, None]
        ended = tokens == eot
        unfinished = tl.sum((ahead & ~ended[:, None]).to(tl.int32), axis=0) + (~ended).to(tl.int32)
        kept = valid & ~ended & (unfinished <= BEAM)  # unfinished counts itself
        finishing = valid & ended & (unfinished < BEAM)
        order = tl.sum((ahead & finishing[:, None]).to(tl.int32), axis=0)
        count = tl.load(count_ptr + a)
        added = finishing & (count + order < MAX_CANDIDATES) & live
        slot = a * BEAM + unfinished - 1
        tl.store(source_ptr + slot, source, mask=kept & live)
        tl.store(sums_ptr + slot, scores, mask=kept & live)
        t = tl.arange(0, BLOCK_T)
        for s in tl.static_range(BEAM):
            this = kept & (unfinished == s + 1)
            row = tl.sum(tl.where(this, source, 0))
            token = tl.sum(tl.where(this, tokens, 0))
            sequence = tl.load(tokens_ptr + row * tokens_stride + t, mask=t < T, other=0)
            sequence = tl.where(t == T, token, sequence)
            tl.store(next_ptr + (a * BEAM + s) * next_stride + t, sequence, mask=(t <= T) & live)
            if LOOP:
                tl.store(token_ptr + a * BEAM + s, token, mask=live)
        for f in tl.static_range(BEAM):  # a beam's top K holds at most one EOT
            this = added & (order == f)
            has = tl.sum(this.to(tl.int32)) > 0
            row = tl.sum(tl.where(this, source, 0))
            sequence = tl.load(tokens_ptr + row * tokens_stride + t, mask=(t < T) & has, other=0)
            sequence = tl.where(t == T, eot, sequence)
            at = a * (MAX_CANDIDATES + 1) + count + f
            tl.store(finished_ptr + at * width + t, sequence, mask=(t <= T) & has)
            tl.store(lengths_ptr + at, T + 1, mask=has)
            tl.store(scores_ptr + at, tl.sum(tl.where(this, scores, 0.0)), mask=has)
        tl.store(count_ptr + a, count + tl.sum(added.to(tl.int32)))

    @triton.jit
    def _greedy_select_kernel(
        logits_ptr, bias_ptr, parts_ptr, index_ptr, count_ptr, token_ptr, pos_ptr, finished_ptr,
        sum_ptr, history_ptr, eot_ptr, seed_ptr, temperature_ptr, history_stride, M,
        bands: tl.constexpr, V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_V: tl.constexpr,
        BLOCK_BANDS: tl.constexpr, SAMPLE: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """`Runtime._select` of the logits: each program takes a band of BLOCK_V ids of
        BLOCK_M rows (program ids 0, 1), and `_choose_band` chooses (the bands' last joins
        them), so a row's pass over its logits is spread over the GPU."""
        _wait_for_inputs(PDL)
        m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        valid = (m[:, None] < M) & (n[None, :] < V)
        z = tl.load(logits_ptr + m[:, None].to(tl.int64) * V + n[None, :], mask=valid,
                    other=float("-inf"))  # fmt: skip
        z += tl.load(bias_ptr + n, mask=n < V, other=0.0)[None, :]
        _choose_band(
            z, m, n, M, V, bands, logits_ptr, bias_ptr, parts_ptr, index_ptr,
            count_ptr + tl.program_id(1), token_ptr, pos_ptr, finished_ptr, sum_ptr,
            history_ptr, eot_ptr, seed_ptr, temperature_ptr, history_stride, BLOCK_M,
            BLOCK_BANDS, SAMPLE, False,
        )  # fmt: skip

    @triton.jit
    def _choose_band(
        z, m, n, M, N, bands, logits_ptr, bias_ptr, parts_ptr, index_ptr, ticket, token_ptr,
        pos_ptr, finished_ptr, sum_ptr, history_ptr, eot_ptr, seed_ptr, temperature_ptr,
        history_stride, BLOCK_M: tl.constexpr, BLOCK_BANDS: tl.constexpr, SAMPLE: tl.constexpr,
        ADVANCE: tl.constexpr,
    ):  # fmt: skip
        """Greedy's choice for rows m from their scores z (logits + bias) at ids n, a band of
        the vocabulary (program id 0 of `bands`): the band leaves its rows' `_choice` (with
        SAMPLE, the best of `_gumbel_keys` too) in parts [3, bands, M] and index [bands, M];
        the last band to finish (counted at `ticket`) joins them and updates the loop state
        (`_greedy_update`; ADVANCE: positions grow by one first)."""
        value, index, subtotal = _choice(z, 1.0, 1)
        # parts: value, subtotal, the draw's key; index: the argmax's, or with SAMPLE the draw's
        at = tl.program_id(0) * M + m
        tl.store(parts_ptr + at, value, mask=m < M)
        tl.store(parts_ptr + bands * M + at, subtotal, mask=m < M)
        if SAMPLE:
            position = tl.load(pos_ptr + m, mask=m < M, other=0) + ADVANCE  # the choice's
            keys = _gumbel_keys(z, seed_ptr, temperature_ptr, m[:, None], position[:, None], n)
            key, index = tl.max(keys, axis=1, return_indices=True)
            tl.store(parts_ptr + 2 * bands * M + at, key, mask=m < M)
        tl.store(index_ptr + at, tl.program_id(0) * n.shape[0] + index, mask=m < M)
        if _last_to_arrive(ticket, bands):
            best_value = tl.full([BLOCK_M], float("-inf"), tl.float32)
            best = tl.zeros([BLOCK_M], tl.int32)
            total = tl.zeros([BLOCK_M], tl.float32)
            if SAMPLE:
                best_key = tl.full([BLOCK_M], float("-inf"), tl.float32)
            for b0 in range(0, bands, BLOCK_BANDS):  # the bands' choices, joined per block
                b = b0 + tl.arange(0, BLOCK_BANDS)
                valid = (b[None, :] < bands) & (m[:, None] < M)
                band_at = b[None, :] * M + m[:, None]
                values = tl.load(
                    parts_ptr + band_at, mask=valid, other=float("-inf"), cache_modifier=".cg"
                )
                subtotals = tl.load(
                    parts_ptr + bands * M + band_at, mask=valid, other=0.0, cache_modifier=".cg"
                )
                indices = tl.load(index_ptr + band_at, mask=valid, other=0, cache_modifier=".cg")
                top, where, top_total = _choice(values, subtotals, 1)
                if SAMPLE:  # the best key's band holds the draw
                    band_keys = tl.load(
                        parts_ptr + 2 * bands * M + band_at, mask=valid, other=float("-inf"),
                        cache_modifier=".cg",
                    )  # fmt: skip
                    key, where = tl.max(band_keys, axis=1, return_indices=True)
                top_index = tl.sum(tl.where(b[None, :] - b0 == where[:, None], indices, 0), axis=1)
                if SAMPLE:
                    best_key, best = _join_draw(best_key, best, key, top_index)
                    best_value, _, total = _join_choice(best_value, 0, total, top, 0, top_total)
                else:
                    best_value, best, total = _join_choice(
                        best_value, best, total, top, top_index, top_total
                    )
            logprob = -tl.log(total)
            if SAMPLE:
                logprob = _drawn_logprob(
                    logits_ptr + m.to(tl.int64) * N, bias_ptr, best, best_value, total, m < M
                )
            _greedy_update(
                m, best, logprob, m < M, token_ptr, pos_ptr, finished_ptr, sum_ptr, history_ptr,
                eot_ptr, history_stride, ADVANCE,
            )  # fmt: skip

    @triton.jit
    def _gumbel_keys(z, seed_ptr, temperature_ptr, row, position, v):
        """Sampling's keys for logits z [rows, ids] of rows `row` at vocabulary ids v (from a
        multiple of 4), for the choices written at `position`: z + temperature * Gumbel(0, 1)
        noise, whose argmax is a draw from softmax(z / temperature) (the Gumbel-max trick), as
        `Categorical` would draw. Each (row, position, id) has its own Philox number under the
        call's seed: one Philox call gives four, for ids 4j .. 4j + 3."""
        quads = tl.min(tl.reshape(v, (v.shape[0] // 4, 4)), axis=1) // 4  # the ids' j
        # rows < 2^16, ids < 2^17
        offset = (position.to(tl.int64) * 65536 + row) * 32768 + quads[None, :]
        r0, r1, r2, r3 = tl.rand4x(tl.load(seed_ptr), offset)
        u = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), z.shape)  # id 4j + c: r_c
        u = tl.maximum(u, 1e-20)  # [0, 1) -> (0, 1)
        return z + tl.load(temperature_ptr) * -tl.log(-tl.log(u))

    @triton.jit
    def _join_draw(best_key, best, key, index):
        """A running draw (the best key so far, its id) joined with the next part's."""
        return tl.maximum(best_key, key), tl.where(key > best_key, index, best)

    @triton.jit
    def _drawn_logprob(logits_ptr, bias_ptr, drawn, best_value, total, mask):
        """The log-probability of the drawn ids (logits + bias at them, rows at logits_ptr)
        under the logits' softmax, whose logsumexp is best_value + log(total)."""
        z = tl.load(logits_ptr + drawn, mask=mask, other=0.0, cache_modifier=".cg")
        z += tl.load(bias_ptr + drawn, mask=mask, other=0.0)
        return z - best_value - tl.log(total)

    @triton.jit
    def _choice(z, totals, AXIS: tl.constexpr):
        """Greedy's choice along AXIS of values z, each standing for `totals` (1.0 for logits
        + bias; for earlier choices, their sums of exp relative to their value): the best
        value, where it first is, and the sum of exp(logit - best) over all it stands for (its
        softmax's denominator; relative to 0 where everything is -inf)."""
        value, where = tl.max(z, axis=AXIS, return_indices=True, return_indices_tie_break_left=True)
        return value, where, _sum_exp(z, totals, value, AXIS)

    @triton.jit
    def _sum_exp(z, totals, value, AXIS: tl.constexpr):
        """The sum along AXIS of totals * exp(z - value), value being z's max there (relative
        to 0 where everything is -inf): a softmax's denominator, or one joined from parts'
        maxima and their sums."""
        base = tl.expand_dims(tl.where(value == float("-inf"), 0.0, value), AXIS)
        return tl.sum(totals * tl.exp(z - base), axis=AXIS)

    @triton.jit
    def _join_choice(best_value, best, total, value, index, subtotal):
        """A running `_choice` joined with the next part's (value, index, subtotal): ties keep
        the earlier part's index, and total stays the sum of exp(z - best_value)."""
        best = tl.where(value > best_value, index, best)
        new = tl.maximum(best_value, value)
        base = tl.where(new == float("-inf"), 0.0, new)
        total = total * tl.exp(best_value - base) + subtotal * tl.exp(value - base)
        return new, best, total

    @triton.jit
    def _greedy_update(
        r, best, logprob, keep, token_ptr, pos_ptr, finished_ptr, sum_ptr, history_ptr, eot_ptr,
        history_stride, ADVANCE: tl.constexpr,
    ):  # fmt: skip
        """Rows r (where keep) take token `best` of log-probability `logprob`, or EOT once
        finished: the loop state of
        `Runtime._select`. ADVANCE: the rows' positions grow by one first (the step's own
        `pos += 1`)."""
        pos = tl.load(pos_ptr + r, mask=keep, other=0)
        if ADVANCE:
            pos += 1
            tl.store(pos_ptr + r, pos, mask=keep)
        finished = tl.load(finished_ptr + r, mask=keep, other=0) != 0
        eot = tl.load(eot_ptr)
        token = tl.where(finished, eot, best.to(tl.int64))
        logprob = tl.where(finished, 0.0, logprob)
        tl.store(sum_ptr + r, tl.load(sum_ptr + r, mask=keep, other=0.0) + logprob, mask=keep)
        tl.store(history_ptr + r * history_stride + pos, token, mask=keep)
        finished = (finished | (token == eot)).to(finished_ptr.dtype.element_ty)
        tl.store(finished_ptr + r, finished, mask=keep)
        tl.store(token_ptr + r, token, mask=keep)

    @triton.jit
    def _logits_select_kernel(
        x_ptr, w_ptr, s_ptr, logits_ptr, parts_ptr, index_ptr, count_ptr, bias_ptr, token_ptr,
        pos_ptr, finished_ptr, sum_ptr, history_ptr, eot_ptr, seed_ptr, temperature_ptr,
        history_stride, M, N, bands: tl.constexpr, K: tl.constexpr, SCALE: tl.constexpr,
        GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr, BLOCK_BANDS: tl.constexpr, LINE: tl.constexpr,
        SAMPLE: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """A greedy step's logits matmul with the choice folded in: each program streams a
        band of the embedding as `_skinny_linear_kernel` does (int8 with SCALE or GROUP), writes
        its logits (float32, rounded as the matmul's output) and chooses from them
        (`_choose_band`: the bands' last program joins them and updates the loop state, the
        positions advanced). So the choice costs no kernel and no second pass over the
        logits."""
        m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        if PDL:
            _prefetch_band(w_ptr, n, N, 0, K, K, BLOCK_K, LINE)
        # Before the wait (`_columns`): the scales, and the loop's bias, set before it runs.
        scale = _columns(s_ptr, n, N, SCALE)
        bias = tl.load(bias_ptr + n, mask=n < N, other=float("-inf"))
        _wait_for_inputs(PDL)
        acc = _stream_tile(
            x_ptr, w_ptr, s_ptr, m, n, 0, M, N, K, K, BLOCK_K, GROUP, w_ptr, w_ptr, 0.0, 0.0,
            False,
        )  # fmt: skip
        dtype = x_ptr.dtype.element_ty
        acc = _linear_epilogue(acc, scale, 0.0, dtype, SCALE, False, False)
        tl.store(
            logits_ptr + m[:, None] * N + n[None, :], acc, mask=(m[:, None] < M) & (n[None, :] < N)
        )
        _choose_band(
            acc + bias[None, :], m, n, M, N, bands, logits_ptr, bias_ptr, parts_ptr, index_ptr,
            count_ptr + tl.program_id(1), token_ptr, pos_ptr, finished_ptr, sum_ptr,
            history_ptr, eot_ptr, seed_ptr, temperature_ptr, history_stride, BLOCK_M,
            BLOCK_BANDS, SAMPLE, True,
        )  # fmt: skip

    @triton.jit
    def _prefetch_band(
        w_ptr, n, N, k_start, K: tl.constexpr, K_SPLIT: tl.constexpr, BLOCK_K: tl.constexpr,
        LINE: tl.constexpr,
    ):  # fmt: skip
        """Ask L2 for rows n (clamped to N) of w [N, K], columns [k_start, k_start + K_SPLIT),
        a LINE of elements at a time."""
        band = w_ptr + tl.minimum(n, N - 1)[:, None].to(tl.int64) * K
        for k0 in range(0, K_SPLIT, BLOCK_K):  # constant trip counts, here and below
            _prefetch_l2(band + (k_start + k0 + tl.arange(0, BLOCK_K // LINE) * LINE)[None, :])

    @triton.jit
    def _stream_tile(
        x_ptr, w_ptr, s_ptr, m, n, k_start, M, N, K: tl.constexpr, K_SPLIT: tl.constexpr,
        BLOCK_K: tl.constexpr, GROUP: tl.constexpr, ln_w_ptr, ln_b_ptr, mean, rstd,
        NORM: tl.constexpr,
    ):  # fmt: skip
        """x[m, k_start:k_start + K_SPLIT] @ w[n, same columns]^T in float32: the weights are
        widened to x's dtype in registers (exact for int8 and fp8). GROUP: w's scales are one
        per GROUP columns (s_ptr [N, K // GROUP], float32), each group's sums scaled by its own
        (the tile's loads stay BLOCK_K wide). NORM (benchmarks/layer.py): x's rows are
        layer-normed on the way in (their mean and rstd, the norm's weight and bias), rounded
        to x's dtype as a stored layer_norm output would be."""
        acc = tl.zeros((m.shape[0], n.shape[0]), dtype=tl.float32)
        for k0 in range(0, K_SPLIT, BLOCK_K):  # constant trip counts, here and below
            if GROUP:
                for g in tl.static_range(0, BLOCK_K, GROUP):
                    k = k_start + k0 + g
                    sums = _dot_columns(
                        x_ptr, w_ptr, m, n, k, M, N, K, GROUP, ln_w_ptr, ln_b_ptr, mean, rstd,
                        NORM,
                    )  # fmt: skip
                    at = n * (K // GROUP) + k // GROUP
                    acc += sums * tl.load(s_ptr + at, mask=n < N, other=0.0)[None, :]
            else:
                acc += _dot_columns(
                    x_ptr, w_ptr, m, n, k_start + k0, M, N, K, BLOCK_K, ln_w_ptr, ln_b_ptr,
                    mean, rstd, NORM,
                )  # fmt: skip
        return acc

    @triton.jit
    def _dot_columns(
        x_ptr, w_ptr, m, n, k_start, M, N, K: tl.constexpr, COLUMNS: tl.constexpr, ln_w_ptr,
        ln_b_ptr, mean, rstd, NORM: tl.constexpr,
    ):  # fmt: skip
        """x[m, k_start:k_start + COLUMNS] @ w[n, same columns]^T in float32 (`_stream_tile`)."""
        w = _weight_columns(w_ptr, n, N, k_start, K, COLUMNS)
        return _dot_loaded(
            x_ptr, w, m, k_start, M, K, COLUMNS, ln_w_ptr, ln_b_ptr, mean, rstd, NORM
        )  # fmt: skip

    @triton.jit
    def _weight_columns(w_ptr, n, N, k_start, K: tl.constexpr, COLUMNS: tl.constexpr):
        """w[n, k_start:k_start + COLUMNS] as stored. No `other`: a masked row only feeds
        outputs n >= N, which are not stored (and no constant casts to fp8)."""
        kk = k_start + tl.arange(0, COLUMNS)
        return tl.load(w_ptr + n[:, None] * K + kk[None, :], mask=n[:, None] < N)

    @triton.jit
    def _dot_loaded(
        x_ptr, w, m, k_start, M, K: tl.constexpr, COLUMNS: tl.constexpr, ln_w_ptr, ln_b_ptr,
        mean, rstd, NORM: tl.constexpr,
    ):  # fmt: skip
        """x[m, k_start:k_start + COLUMNS] @ w^T in float32, w loaded (`_weight_columns`)."""
        kk = k_start + tl.arange(0, COLUMNS)
        # .cg (past L1) here and in the helpers: the same code runs as phases of one grid
        # in benchmarks/layer.py, whose other programs' writes L1 would not see.
        x = tl.load(
            x_ptr + m[:, None] * K + kk[None, :], mask=m[:, None] < M, other=0.0,
            cache_modifier=".cg",
        )  # fmt: skip
        if NORM:
            g = tl.load(ln_w_ptr + kk).to(tl.float32)
            b = tl.load(ln_b_ptr + kk).to(tl.float32)
            x = (x.to(tl.float32) - mean[:, None]) * rstd[:, None] * g[None, :] + b[None, :]
            x = x.to(x_ptr.dtype.element_ty)
        return tl.dot(x, tl.trans(_widen(w, x.dtype)))

    @triton.jit
    def _preloaded_dot(
        x_ptr, w, m, k_start, M, K: tl.constexpr, COLUMNS: tl.constexpr, ONE_ROW: tl.constexpr
    ):  # fmt: skip
        """x[m, k_start:k_start + COLUMNS] @ w^T in float32, w preloaded and widened. ONE_ROW
        (M = 1): on the CUDA cores, w kept in the layout it was loaded in, instead of an MMA
        on a 16-row tile of x and w moved into the MMA's layout after the wait."""
        if ONE_ROW:
            kk = k_start + tl.arange(0, COLUMNS)
            x = tl.load(x_ptr + kk, cache_modifier=".cg").to(tl.float32)  # .cg: `_dot_loaded`
            row = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            return tl.where(m[:, None] == 0, row[None, :], 0.0)
        return _dot_loaded(x_ptr, w, m, k_start, M, K, COLUMNS, x_ptr, x_ptr, 0.0, 0.0, False)

    @triton.jit
    def _widen(w, dtype: tl.constexpr):
        """Weights to the activations' dtype, exactly. int8 to float16 by its bits: v + 0x6480
        is the float16 1152 + v, so one integer add, a reinterpretation and one subtraction
        replace the int-to-float conversion, whose throughput (a quarter of the integer
        units') makes the conversion, not the bytes, the cost of an int8 GEMV."""
        if w.dtype == tl.int8 and dtype == tl.float16:
            return (w.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0
        return w.to(dtype)

    @triton.jit
    def _columns(ptr, n, N, LOAD: tl.constexpr):
        """ptr[n] as a float32 row [1, len(n)] (0 past N), where LOAD: a matmul's weights per
        output column (scales, bias, the folded norms' terms). They are static, so the stream
        kernels load them before they wait for their inputs: off the epilogue's path, where
        each was a round trip to memory (the step's weights evict them from L2)."""
        if LOAD:
            return tl.load(ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
        else:
            return tl.zeros([1, n.shape[0]], tl.float32)

    @triton.jit
    def _linear_epilogue(
        acc, scale, bias, dtype: tl.constexpr, SCALE: tl.constexpr, BIAS: tl.constexpr,
        GELU: tl.constexpr,
    ):  # fmt: skip
        """A whole matmul's float32 sums -> its output in float32, rounded where torch rounds:
        * scale per output channel, to dtype, + bias, then GELU (scale, bias: `_columns`)."""
        if SCALE:
            acc *= scale
        acc = acc.to(dtype).to(tl.float32)  # rounded as the matmul's output
        if BIAS:
            acc += bias
        if GELU:
            acc = acc.to(dtype).to(tl.float32)
            acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
            acc = acc.to(dtype).to(tl.float32)
        return acc

    @triton.jit
    def _skinny_linear_kernel(
        x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, part_ptr, stats_ptr, count_ptr, wg_ptr, wb_ptr,
        z_ptr, g_ptr, eps, M, N,
        K: tl.constexpr, K_SPLIT: tl.constexpr, SCALE: tl.constexpr, GROUP: tl.constexpr,
        GELU: tl.constexpr, BIAS: tl.constexpr, NORM: tl.constexpr, BAND: tl.constexpr,
        BLOCK_BANDS: tl.constexpr, RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LINE: tl.constexpr, PRELOAD: tl.constexpr,
        ONE_ROW: tl.constexpr, PDL: tl.constexpr,
    ):  # fmt: skip
        """y[M, N] = x[M, K] @ w[N, K]^T (* scale[N], + bias, then GELU) for a few rows: a
        decode step's matmul is a stream over the weights, each program a band of BLOCK_N rows
        for BLOCK_M rows of x. int8 or fp8 weights (quantize.py, with SCALE or GROUP: see
        `scale_layout`) are widened to x's dtype in registers (exact), so a step reads half the
        bytes. Under PDL the band is prefetched into L2 (a LINE of elements at a time) before
        the inputs are waited for.
        K_SPLIT < K: program (., ., s) sums columns [s K_SPLIT, (s + 1) K_SPLIT) into float32
        partials part[s] (scaled, no bias), which `add_layer_norm` or `cross_attention` add
        up, or, with RESIDUAL, the tile's last program to finish (counted in count_ptr).
        PRELOAD (> 0): the program's columns of its band, a few registers a thread, are
        loaded before the wait, as a tile of PRELOAD columns and one of the rest (K_SPLIT -
        PRELOAD, a power of two too, or none; `preload`): they stream in while the kernel
        before runs, and none of them is read from L2 once the inputs are ready. ONE_ROW
        (M = 1): they are multiplied on the CUDA cores (`_preloaded_dot`).

        The layer norms fold into the matmuls around them (`Runtime._layer_folded`):
        RESIDUAL: y is the residual stream x: x += the output (+ bias); each band leaves its
        rows' mean and squared deviations in stats_ptr, and z = x * g (the next norm's
        weight) in z_ptr. NORM: x_ptr is that z, and the output is layer_norm(x) @ w^T, as
        rstd (z @ w^T - mean w g) + w b: mean and rstd from the band statistics (BAND columns
        a band), w g and w b (the norm's weight and bias through w) in wg_ptr, wb_ptr. So the
        norm costs the matmul an epilogue and no kernel, nor any work in its stream."""
        m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        k_start = tl.program_id(2) * K_SPLIT
        dtype = x_ptr.dtype.element_ty
        if PRELOAD:  # two tiles where K_SPLIT is not a power of two (`preload`)
            w = _widen(_weight_columns(w_ptr, n, N, k_start, K, PRELOAD), dtype)
            if PRELOAD < K_SPLIT:
                w_rest = _weight_columns(w_ptr, n, N, k_start + PRELOAD, K, K_SPLIT - PRELOAD)
                w_rest = _widen(w_rest, dtype)
        elif PDL:
            _prefetch_band(w_ptr, n, N, k_start, K, K_SPLIT, BLOCK_K, LINE)
        scale = _columns(s_ptr, n, N, SCALE)  # static: before the wait (`_columns`)
        bias = _columns(b_ptr, n, N, BIAS)
        wg = _columns(wg_ptr, n, N, NORM)
        wb = _columns(wb_ptr, n, N, NORM)
        g = _columns(g_ptr, n, N, RESIDUAL)
        _wait_for_inputs(PDL, EARLY=ONE_ROW)
        at = m[:, None] * N + n[None, :]
        keep = (m[:, None] < M) & (n[None, :] < N)
        # Loaded before the stream, used after it: the loads overlap.
        if NORM:
            stats = _load_band_stats(stats_ptr, m, M, K, BAND, BLOCK_BANDS)
        if RESIDUAL:  # .cg: see `_stream_tile`. Split, only the last program uses it: a tile
            # of L2 reads in the others, a memory round trip off its tail.
            stream = tl.load(y_ptr + at, mask=keep, other=0.0, cache_modifier=".cg")
        if PRELOAD:
            acc = _preloaded_dot(x_ptr, w, m, k_start, M, K, PRELOAD, ONE_ROW)
            if PRELOAD < K_SPLIT:
                acc += _preloaded_dot(
                    x_ptr, w_rest, m, k_start + PRELOAD, M, K, K_SPLIT - PRELOAD, ONE_ROW
                )  # fmt: skip
        else:
            acc = _stream_tile(
                x_ptr, w_ptr, s_ptr, m, n, k_start, M, N, K, K_SPLIT, BLOCK_K, GROUP, w_ptr,
                w_ptr, 0.0, 0.0, False,
            )  # fmt: skip
        if SCALE:
            acc *= scale
        if NORM:
            mean, rstd = _combine_band_stats(stats, eps, K, BAND)
            shift = wb - (rstd * mean)[:, None] * wg
            first = tl.program_id(2) == 0  # of the splits, the first adds the constant terms
            acc = acc * rstd[:, None] + tl.where(first, shift, 0.0)
        if K_SPLIT < K:
            tl.store(part_ptr + tl.program_id(2) * M * N + at, acc, mask=keep)
            if RESIDUAL:
                tile = count_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
                if _last_to_arrive(tile, K // K_SPLIT):
                    acc = _sum_partials(part_ptr, at, keep, K // K_SPLIT, M * N, dtype)
                    if BIAS:
                        acc += bias
                    acc = _residual_epilogue(acc, stream, stats_ptr, m, tl.program_id(0), M, dtype)
                    tl.store(y_ptr + at, acc.to(y_ptr.dtype.element_ty), mask=keep)
                    _scaled_stream(acc, z_ptr, g, at, keep)
        else:
            acc = _linear_epilogue(acc, scale, bias, dtype, False, BIAS, GELU)
            if RESIDUAL:
                acc = _residual_epilogue(acc, stream, stats_ptr, m, tl.program_id(0), M, dtype)
                _scaled_stream(acc, z_ptr, g, at, keep)
            tl.store(y_ptr + at, acc.to(y_ptr.dtype.element_ty), mask=keep)

    @triton.jit
    def _scaled_stream(x, z_ptr, g, at, keep):
        """z = x * g, the residual stream times the next layer norm's weight (`_columns`), in
        z's dtype: what the matmul after that norm streams (see `_skinny_linear_kernel`)."""
        tl.store(z_ptr + at, (x * g).to(z_ptr.dtype.element_ty), mask=keep)


# (block_n, block_k, warps, stages) of the stream kernel. Deeper pipelines pay on the long
# matmuls: the logits GEMV reaches 2.5 TB/s at 6 stages, 2.2 at 3 (benchmarks/gemv.py).
StreamConfig = tuple[int, int, int, int]
# The configs STEP_CONFIGS was tuned among (benchmarks/tune_step.py, gemv.py).
STREAM_CANDIDATES: list[StreamConfig] = [
    (16, 128, 4, 3), (16, 256, 4, 3), (32, 128, 4, 3), (32, 256, 8, 3), (64, 128, 8, 3),
    (32, 256, 4, 4), (64, 256, 8, 4), (64, 256, 8, 6),
]  # fmt: skip
_linear_choice: dict[tuple, StreamConfig | None] = {}  # `_linear_config`'s, by shape
# The step matmuls' configs, chosen in the whole graphed greedy step under PDL
# (benchmarks/tune_step.py on an H200, large-v3 and turbo, fp16) and used for every model on
# every GPU. Configs timed per shape and process instead missed what a kernel overlaps with its
# neighbours, moved the step by up to 20 % between processes, and the transcripts with it
# (split sums round by config); on an H200 without PDL (as on GPUs before Hopper) this table is
# 6-17 % faster than they were (RESULTS, session 23). Keys: (1 row or up to 16, `step_role`).
STEP_CONFIGS: dict[tuple[int, str], StreamConfig] = {
    (1, "out"): (64, 128, 8, 3),
    (1, "fc2"): (64, 128, 8, 3),
    (1, "qkv"): (16, 256, 4, 3),  # unsplit, preloaded (session 32; was (32, 256, 4, 4))
    (1, "fc1"): (16, 256, 4, 3),
    (1, "logits"): (32, 256, 4, 4),
    (16, "out"): (32, 256, 4, 4),  # out, qkv, fc1: re-tuned with the early launches
    (16, "fc2"): (64, 128, 8, 3),
    (16, "qkv"): (64, 256, 8, 4),  # (session 33; were (32, 128, 4, 3), (32, 256, 4, 4),
    (16, "fc1"): (32, 256, 4, 4),  # (16, 256, 4, 3))
    (16, "logits"): (64, 128, 8, 3),
}


@dataclass
class StreamStats:
    """What folds the layer norms into the step's matmuls (`_skinny_linear_kernel`): the
    residual stream's statistics as the matmul that last added into it left them, per band of
    `band` columns each row's mean and squared deviations (float32, room for [D / 16, rows,
    2]); the stream times the next norm's weight (`scaled`, [rows, D] in the compute dtype);
    and zeroed counters for the programs of a folded kernel to count their arrivals in (per
    output tile of a split matmul, per block of rows of `_logits_select_kernel`); each
    kernel leaves them zeroed."""

    stats: Tensor
    scaled: Tensor
    counters: Tensor
    band: int = 0


def skinny_linear(
    x: Tensor,
    w: Tensor,
    b: Tensor | None,
    gelu: bool,
    config: StreamConfig,
    scale: Tensor | None = None,
    *,
    out: Tensor | None = None,
    partial: bool = False,
    stats: StreamStats | None = None,
    norm: tuple[Tensor, Tensor, float] | None = None,
    residual: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """The Triton stream kernel: x [M, K] @ w^T (* quantize's scales, + b, then GELU)
    into `out` or a new [M, N] in x's dtype. config: (block_n, block_k, warps, stages); K must
    be a multiple of block_k, and block_k of the scales' group if they have one. `partial`
    (with no bias nor GELU): the caller also takes float32 partial sums [splits, M, N]
    (`add_layer_norm`, `cross_attention`), which let a matmul with few output bands split its K
    over more programs (`stream_splits`).
    The folded layer norms (see `_skinny_linear_kernel`), with `stats`: `residual` (stream,
    g), no GELU: the output is added into the residual stream [M, N] in place, which is
    returned, leaving its statistics and stream * g in `stats` for the next `norm`. `norm`
    (w g, w b, eps): x is that stream * g, and the output is of the norm's output."""
    x = x.contiguous()  # the kernel indexes rows of K
    M, K = x.shape
    N = w.shape[0]
    block_n, block_k, warps, stages = config
    split = (partial and b is None or residual is not None) and not gelu
    splits = stream_splits(N, K, config) if split else 1
    bands = K // stats.band if norm is not None else 1  # the bands the stream's writer left
    wg, wb, eps = (w, w, 0.0) if norm is None else norm
    stream, g = (w, w) if residual is None else residual
    if residual is not None:
        y, part = stream, stream.new_empty(splits, M, N, dtype=torch.float32)
        stats.band = block_n
    elif splits > 1:
        y = part = torch.empty(splits, M, N, device=x.device, dtype=torch.float32)
    else:
        y = part = torch.empty(M, N, device=x.device, dtype=x.dtype) if out is None else out
    _skinny_linear_kernel[(triton.cdiv(N, block_n), triton.cdiv(M, 16), splits)](
        x, w, scale if scale is not None else w, b if b is not None else w, y, part,
        stats.stats if stats is not None else w, stats.counters if stats is not None else w,
        wg, wb, stats.scaled if stats is not None else w, g, eps, M, N, K=K,
        K_SPLIT=K // splits, **scale_layout(scale, K), GELU=gelu, BIAS=b is not None,
        NORM=norm is not None, BAND=K // bands, BLOCK_BANDS=triton.next_power_of_2(bands),
        RESIDUAL=residual is not None, BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
        LINE=128 // w.element_size(), PRELOAD=preload(M, block_n, K // splits, scale),
        ONE_ROW=M == 1,
        num_warps=warps, num_stages=stages, **_launch(x),
    )  # fmt: skip
    return y


# The most weight elements a stream kernel's program loads before its PDL wait (PRELOAD): 64
# KiB of fp16, 64 registers a thread at 8 warps.
PRELOAD_ELEMENTS = 32768


def preload(rows: int, block_n: int, k_split: int, scale: Tensor | None) -> int:
    """The columns of the first tile in which a stream kernel's program loads its weights
    [block_n, k_split] before it waits (`_skinny_linear_kernel`'s PRELOAD), or 0 for none:
    where they fit a few registers a thread (PRELOAD_ELEMENTS), 16-bit weights at any rows,
    int8 / fp8 ones (scaled per output channel; not per group) at one row. One tile a power of
    two long, or at one row (on the CUDA cores, `_preloaded_dot`) two: 1280 = 1024 + 256, as
    every Whisper width is such a sum, so qkv and fc1 preload unsplit. (H100, large-v3, a
    step: fp16 -4.5 % at one row, -1.6 % at 16; int8 -3.5 % at one, +5 % at 16, where the
    widened tile and 16 rows of x crowd the registers. H200: qkv and fc1 unsplit at one row
    -19 %; two tiles through the MMA at 16 rows +9 %.)"""
    first = triton.next_power_of_2(k_split + 1) // 2  # the largest power of two <= k_split
    rest = k_split - first
    fits = (
        (scale is None or rows == 1 and scale.dim() == 1)
        and block_n * k_split <= PRELOAD_ELEMENTS
        and (rest == 0 or rows == 1 and rest == triton.next_power_of_2(rest))
    )
    return first if fits else 0


def _torch_linear(x: Tensor, w: Tensor, b: Tensor | None, gelu: bool) -> Tensor:
    y = F.linear(x, w, b)
    return F.gelu(y) if gelu else y


def linear(
    x: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    gelu: bool = False,
    *,
    out: Tensor | None = None,
    partial: bool = False,
) -> Tensor:
    """F.linear (then GELU) for a decode step, into `out` if given. `partial`: the caller also
    takes float32 partial sums [splits, M, N] (add_layer_norm, cross_attention), which let a
    matmul with few output bands split its K over more programs. Up to 16 rows of a 16-bit
    step matmul on CUDA run the Triton stream kernel in STEP_CONFIGS' config for the matmul's
    role (`tuned_config`), the rest cuBLAS: the same kernels in every process, so the same
    transcripts."""
    if not isinstance(w, Tensor):  # int8 / fp8 weights (quantize.QuantizedWeight): own kernels
        return w.linear(x, b, gelu, out=out, partial=partial)
    partial = partial and b is None and not gelu
    config = _linear_config(x, w)
    if config is not None:
        return skinny_linear(x, w, b, gelu, config, out=out, partial=partial)
    y = _torch_linear(x, w, b, gelu)
    return y if out is None else out.copy_(y)


def _linear_config(x: Tensor, w: Tensor) -> StreamConfig | None:
    """The stream kernel config `linear` runs x @ w^T with, or None where it runs cuBLAS."""
    M, K = x.shape
    key = (M, w.shape[0], K, w.dtype)
    if key not in _linear_choice:
        # Not for float32: tl.dot would round its inputs to tf32, and float32 means float32.
        usable = M <= 16 and w.dtype != torch.float32
        _linear_choice[key] = tuned_config(STEP_CONFIGS, x, w.shape[0]) if usable else None
    return _linear_choice[key]


def tuned_config(
    table: dict[tuple, StreamConfig], x: Tensor, N: int, *rest: torch.dtype
) -> StreamConfig | None:
    """The config a table of step matmuls (STEP_CONFIGS, quantize.STREAM_CONFIGS) has for x
    [rows, K] @ w[N, K]^T where the stream kernel runs (CUDA with Triton, or its interpreter):
    keyed by 1 row or more (the configs tuned at 16), the matmul's `step_role` and the rest of
    the table's key (the weight's dtype, if not x's). Its tile of K narrows to 128 where K is
    not a multiple of it (tiny's 384, small's 768), and its pipeline to what the GPU's shared
    memory holds."""
    role = step_role(N, x.shape[1])
    if triton is None or role is None or not (x.is_cuda or _INTERPRETED):
        return None
    config = table.get((1 if x.shape[0] == 1 else 16, role, *rest))
    if config is None:
        return None
    block_n, block_k, warps, stages = config
    if x.shape[1] % block_k:
        block_k = 128
    if x.is_cuda:  # each stage holds a tile of the weight and one of 16 rows of x
        weight_bytes = rest[0].itemsize if rest else x.element_size()
        tile = block_k * (block_n * weight_bytes + 16 * x.element_size())
        stages = pipeline_stages(stages, tile, _shared_memory(x.device.index))
    return block_n, block_k, warps, stages


def pipeline_stages(stages: int, tile_bytes: int, shared_memory: int) -> int:
    """`stages` (at least 1), fewer where that many tiles and 8 KiB for the epilogue would not
    fit a program's shared memory (an H100 has 227 KiB, an A100 163, consumer GPUs ~99, a T4 64;
    the tables were tuned on an H200)."""
    while stages > 1 and stages * tile_bytes + 8192 > shared_memory:
        stages -= 1
    return stages


@functools.cache
def _shared_memory(index: int | None) -> int:
    properties = torch.cuda.get_device_properties(index)
    return getattr(properties, "shared_memory_per_block_optin", properties.shared_memory_per_block)


def step_role(N: int, K: int) -> str | None:
    """Which of a decode step's matmuls x [rows, K] @ w[N, K]^T is, by its shape (None: none of
    them): the tuned tables' key, the same for every model size. "out" is each N = K projection
    (self-attention's output, the cross query and output)."""
    if N > 8 * K:
        return "logits"
    return {3 * K: "qkv", K: "out", 4 * K: "fc1", K // 4: "fc2"}.get(N)


def folded_linear(
    x: Tensor,
    w: Tensor,
    b: Tensor | None = None,
    gelu: bool = False,
    *,
    stats: StreamStats,
    partial: bool = False,
    norm: tuple[Tensor, Tensor, float] | None = None,
    residual: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """`linear` on the stream kernel with a folded layer norm (`skinny_linear`'s `norm` and
    `residual`), in `stream_config`'s config."""
    config = stream_config(x, w)
    data, scale = weight_and_scale(w)
    return skinny_linear(
        x, data, b, gelu, config, scale, partial=partial, stats=stats, norm=norm,
        residual=residual,
    )  # fmt: skip


def weight_and_scale(w: Tensor | QuantizedWeight) -> tuple[Tensor, Tensor | None]:
    """A weight as the stream kernel takes it: a float tensor and no scale, or quantize's int8 /
    fp8 data and its scales."""
    return (w, None) if isinstance(w, Tensor) else (w.data, w.scale)


def scale_layout(scale: Tensor | None, K: int) -> dict[str, int]:
    """The kernels' SCALE and GROUP for quantize's scales of a [N, K] weight: one per output
    channel (SCALE, applied to the sums) or one per GROUP columns of each row (GROUP, applied
    to each group's sums, as the stream goes; the token embedding's)."""
    if scale is None or scale.dim() == 1:
        return {"SCALE": scale is not None, "GROUP": 0}
    return {"SCALE": False, "GROUP": K // scale.shape[1]}


def stream_config(x: Tensor, w: Tensor | QuantizedWeight) -> StreamConfig:
    """The stream kernel's config for a matmul whose epilogue does more than `linear`'s (the
    folds of `Runtime._layer_folded` and `_logits_select`): the one `linear` runs the plain
    matmul with; int8 / fp8 weights (quantize.QuantizedWeight) bring their own table."""
    if isinstance(w, Tensor):
        config, shape = _linear_config(x, w), w.shape
    else:
        config, shape = w.stream_config(x), w.data.shape
    if config is None:
        raise RuntimeError(
            f"no stream kernel config for a {tuple(x.shape)} x {tuple(shape)} matmul (not a "
            f"decode step's shape of a Whisper model); use Runtime(..., fused=False)"
        )
    return config


@torch.no_grad()  # else autograd keeps each float32 weight for a backward (large-v3: 1.7 GB)
def norm_through(w: Tensor, ln: nn.LayerNorm) -> tuple[Tensor, Tensor, float]:
    """(w g, w b, eps) in float32 for a layer norm (weight g, bias b) before the matmul by w
    [N, K] (or a quantize.QuantizedWeight): what `folded_linear` computes it with."""
    weight = w.float()  # a QuantizedWeight dequantizes
    return weight @ ln.weight.float(), weight @ ln.bias.float(), ln.eps


def stream_splits(N: int, K: int, config: StreamConfig) -> int:
    """Parts to split K into, for a step matmul whose caller takes partial sums: the fewest that
    make ~2 programs per multiprocessor (a GEMV is bound by the loads in flight, and a matmul
    with N = 1280 has only 40 to 80 bands of output), each part at least 256 long."""
    block_n, block_k = config[:2]
    bands, splits = triton.cdiv(N, block_n), 1
    for s in (2, 4, 5, 8, 10):
        if bands * splits >= 264 or K // s < 256:
            break
        if K % (s * block_k) == 0:
            splits = s
    return splits


def add_layer_norm(
    x: Tensor, y: Tensor, bias: Tensor, ln: nn.LayerNorm, out: Tensor | None = None
) -> Tensor:
    """x += y + bias in place; returns layer_norm(x) (into `out` if given). x: contiguous
    [rows, D]; y: the same, or a split matmul's float32 partial sums [splits, rows, D]."""
    rows, D = x.shape
    h = torch.empty_like(x) if out is None else out
    block = triton.next_power_of_2(D)
    warps = 8 if block >= 2048 else 4
    _add_layer_norm_kernel[(rows,)](
        x, y.contiguous(), bias, ln.weight, ln.bias, h, rows, D, ln.eps,
        SPLITS=y.shape[0] if y.dim() == 3 else 0, BLOCK=block, num_warps=warps,
        **_launch(x),
    )  # fmt: skip
    return h


def embed_layer_norm(
    token: Tensor, pos: Tensor, token_embedding: Tensor, positional_embedding: Tensor,
    ln: nn.LayerNorm, scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The start of a decode step in one kernel: (x, layer_norm(x)) for
    x = token_embedding[token] (times its `scale`s: quantize's int8 rows) +
    positional_embedding[pos], one row per token, in the positional embedding's dtype."""
    rows, D = token.shape[0], token_embedding.shape[1]
    x = torch.empty(rows, D, device=token.device, dtype=positional_embedding.dtype)
    h = torch.empty_like(x)
    block = triton.next_power_of_2(D)
    # columns per scale: quantize's scales are per row ([V], one group of D) or [V, D // group]
    group = 0 if scale is None else D // (scale.numel() // scale.shape[0])
    _embed_layer_norm_kernel[(rows,)](
        token, pos, token_embedding, scale if scale is not None else token_embedding,
        positional_embedding, ln.weight, ln.bias, x, h, D, ln.eps, GROUP=group, BLOCK=block,
        num_warps=8 if block >= 2048 else 4, **_launch(x),
    )  # fmt: skip
    return x, h


def decode_attention(qkv: Tensor, bias: Tensor, cache: Tensor, pos: Tensor, n_head: int) -> Tensor:
    """qkv [rows, 3D] of this step (before its bias [3D]); cache [>= rows, 2H, T, dh];
    pos [rows] -> out [rows, D]."""
    rows, D = qkv.shape[0], qkv.shape[1] // 3
    out = torch.empty(rows, D, device=qkv.device, dtype=qkv.dtype)
    dh = D // n_head
    # 128 past keys a tile, not 64: with a 200-token past, -7 % a large-v3 step at one row.
    _decode_attention_kernel[(rows, n_head)](
        qkv, bias, cache, pos, out, n_head, dh**-0.5, T=cache.shape[2],
        DH=dh, BLOCK_T=128, BY_LENGTH=not _INTERPRETED, num_warps=4,
        **_launch(qkv),
    )  # fmt: skip
    return out


def cross_attention(
    q: Tensor, q_bias: Tensor, kv: Tensor, windows: int, n_head: int, keys: int | None = None
) -> Tensor:
    """A decode step's cross-attention: the query before its bias, [windows * group, D] or a
    split matmul's partial sums [splits, windows * group, D], rows grouped by window;
    kv [>= windows, n_audio_ctx, 2D], each window's K then V -> out [rows, D]. Each program
    attends to `keys` of a window's keys for a head (by default `cross_keys`').
    For 16-bit dtypes with 64-wide heads (every Whisper), whose key rows are 128-byte lines."""
    rows, D = q.shape[-2:]
    group, A, dh = rows // windows, kv.shape[1], D // n_head
    keys = keys or cross_keys(windows * n_head, A, q.device)
    splits = triton.cdiv(A, keys)
    m = torch.empty(rows, n_head, splits, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(rows, n_head, splits, dh, device=q.device, dtype=torch.float32)
    pdl = _launch(q)
    _cross_attention_kernel[(windows, n_head, splits)](
        q.contiguous(), q_bias, kv, m, l, acc, A, n_head, dh**-0.5,
        Q_SPLITS=q.shape[0] if q.dim() == 3 else 0, GROUP=group,
        BLOCK_G=max(16, triton.next_power_of_2(group)), DH=dh, KEYS=keys, BLOCK_T=128,
        PRELOAD=keys == 128, num_warps=4, **pdl,
    )  # fmt: skip
    out = torch.empty(rows, D, device=q.device, dtype=kv.dtype)
    _combine_kernel[(rows, n_head)](
        m, l, acc, out, n_head, splits, DH=dh, BLOCK_S=triton.next_power_of_2(splits),
        num_warps=1, **pdl,
    )  # fmt: skip
    return out


# Output columns a program of `self_attention_out` takes its head through (fewer where D is
# not a multiple: tiny's 384), and its warps (at 8: +1.5 % a large-v3 step).
SELF_OUT_BLOCK = 128
SELF_OUT_WARPS = 4


def self_attention_out(
    qkv: Tensor, bias: Tensor, cache: Tensor, pos: Tensor, n_head: int,
    w: Tensor | QuantizedWeight, b: Tensor, *, residual: tuple[Tensor, Tensor], stats: StreamStats,
) -> None:  # fmt: skip
    """One row's `decode_attention` through its output projection w, b into the residual
    stream, as `folded_linear`'s `residual` (x, g) adds it and leaves `stats`, in one kernel
    (`_self_attention_out_kernel`): each band of the projection's programs attends its head
    itself, instead of a stage waiting for an attention kernel's output (H200, large-v3 at
    one row: -1.6 % a step; RESULTS, session 39)."""
    data, scale = weight_and_scale(w)
    x, g = residual
    D, dh = x.shape[1], x.shape[1] // n_head
    block_n = SELF_OUT_BLOCK
    while D % block_n:
        block_n //= 2
    stats.band = block_n  # the bands the next norm reads the statistics of
    part = torch.empty(n_head, D, device=x.device, dtype=torch.float32)
    _self_attention_out_kernel[(D // block_n, n_head)](
        qkv, bias, cache, pos, data, scale if scale is not None else data, b, x, part,
        stats.stats, stats.counters, stats.scaled, g, dh**-0.5, H=n_head, T=cache.shape[2],
        DH=dh, BLOCK_T=128, BY_LENGTH=not _INTERPRETED, SCALE=scale is not None,
        BLOCK_N=block_n, num_warps=SELF_OUT_WARPS, **_launch(x),
    )  # fmt: skip


def cross_keys(heads: int, A: int, device: torch.device) -> int:
    """Keys per program of `cross_attention` over `heads` (windows x heads) of A keys: 256
    where that still makes two programs per multiprocessor, else 128. With many windows the
    longer programs stream their K,V faster (H200, 16 windows: -7 % a large-v3 step); with
    one, 128 keeps more programs in flight (-2 %)."""
    sms = _multiprocessors(device.index) if device.type == "cuda" else 132  # 132: an H100's
    return 256 if heads * triton.cdiv(A, 256) >= 2 * sms else 128


# Scores a program of `Runtime._select`'s choice takes (rows x ids), and logits a program of
# `timestamp_rules` (H100, tiny.en's 51866 logits at 1, 5 and 80 rows: 1024 to 8192 tried).
CHOICE_TILE = 2048
RULES_BAND = 2048

# Above this many bytes beam search's reorder runs `reorder_rows`; below, Triton's two launches
# cost more host time than PyTorch's indexed copy (turbo, one window of 5 beams: 0.20 vs 0.13 ms).
REORDER_COPY_BYTES = 16 << 20


@dataclass(frozen=True)
class TimestampRules:
    """What `decoding.ApplyTimestampRules` needs of its tokenizer and options, for the kernel."""

    timestamp_begin: int
    eot: int
    no_timestamps: int
    max_initial: int | None  # the first timestamp's bound, as an index past timestamp_begin


def timestamp_rules(
    logits: Tensor,
    tokens: Tensor,
    rules: TimestampRules,
    n: int = 0,
    *,
    per_row: tuple[Tensor, Tensor] | None = None,
    bias: Tensor | None = None,
) -> None:
    """`decoding.ApplyTimestampRules.apply` in two kernels over bands of each row (a program a
    row was 31-37 µs a step on an H100; two over bands ~10): logits [rows, V] (contiguous) in
    place, given each row's sampled tokens, tokens[:, :n] (a view of the tokens so far, its
    rows' elements adjacent) or, with `per_row` (start, length), tokens[r, start[r]:length[r]]
    (the greedy loop's history); the rules see logits + `bias` if given. The tokens are read
    512 at a time (a row holds up to 448), so one compiled kernel serves every step."""
    rows, V = logits.shape
    start, length = per_row if per_row is not None else (tokens, tokens)
    block_v = RULES_BAND
    bands = triton.cdiv(V, block_v)
    parts = torch.empty(3, rows, bands, device=logits.device)
    launch = _launch(logits)
    _timestamp_rules_kernel[(bands, rows)](
        logits, tokens, start, length, bias if bias is not None else logits, parts,
        tokens.stride(0), n, rules.max_initial or 0, V=V, tb=rules.timestamp_begin,
        eot=rules.eot, no_timestamps=rules.no_timestamps, PER_ROW=per_row is not None,
        INITIAL=rules.max_initial is not None, BIAS=bias is not None,
        BLOCK_T=max(512, triton.next_power_of_2(n)), BLOCK_V=block_v, num_warps=4, **launch,
    )  # fmt: skip
    _timestamps_win_kernel[(triton.cdiv(rules.timestamp_begin, block_v), rows)](
        logits, parts, bands, V=V, tb=rules.timestamp_begin,
        BLOCK_BANDS=triton.next_power_of_2(bands), BLOCK_V=block_v, num_warps=4, **launch,
    )  # fmt: skip


# The beam kernels unroll a loop over each row's beam + 1 best tokens and rank an audio's
# beam x (beam + 1) candidates in one program: a wider beam compiles for longer (on an H200,
# once per machine: beam 8 8.7 s, 12 12.8 s, 16 36 s) and from 32 on fails (more than Triton's
# 2^20 elements a tensor). Wider searches run decoding's torch step: JFK at beam 16 in 0.04 s
# against the kernels' 0.03 (RESULTS, session 50).
MAX_KERNEL_BEAM = 12


def beam_kernels_fit(beam_size: int) -> bool:
    """Whether `beam_step` and the runtime's beam loop take a search of `beam_size` beams."""
    return triton is not None and beam_size <= MAX_KERNEL_BEAM


@dataclass
class BeamFinished:
    """Beam search's finished candidates per audio, in the order found: the tokens (EOT last)
    of the first `count` slots; one more slot takes the writes of candidates not kept."""

    tokens: Tensor  # [n_audio, max_candidates + 1, width]
    lengths: Tensor  # [n_audio, max_candidates + 1]
    scores: Tensor  # [n_audio, max_candidates + 1]
    count: Tensor  # [n_audio]


def beam_step(
    logits: Tensor, tokens: Tensor, before: Tensor, sum_logprobs: Tensor,
    finished: BeamFinished, beam: int, eot: int, first: bool,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """`decoding.BeamSearch`'s step in two kernels (its ~40 torch calls, topk's ~0.2 ms among
    them, cost the host more than a small model's step): logits [rows, V] (contiguous) and
    tokens [rows, T] of the current beams, their sums of log-probabilities `before`. Writes
    the next beams' sums into `sum_logprobs`, records finished candidates in `finished`;
    returns the next beams' tokens [rows, T + 1] and the rows they continue."""
    rows, T = tokens.shape
    next_tokens = torch.empty(rows, T + 1, device=tokens.device, dtype=tokens.dtype)
    source = torch.empty(rows, device=tokens.device, dtype=torch.long)
    _beam_kernels(
        logits, None, tokens, next_tokens, source, before, sum_logprobs, finished, beam, eot,
        first, T,
    )  # fmt: skip
    return next_tokens, source


def _beam_kernels(
    logits: Tensor, bias: Tensor | None, tokens: Tensor, next_tokens: Tensor, source: Tensor,
    before: Tensor, sum_logprobs: Tensor, finished: BeamFinished, beam: int, eot: int,
    first: bool, T: int, loop: tuple[Tensor, Tensor, Tensor] | None = None,
) -> None:  # fmt: skip
    """`beam_step`'s kernels on logits (+ bias), the beams' tokens rows of `tokens` (T of
    them, or with `loop` = (pos, token, done) each audio's own count: `Runtime.beam`)."""
    rows, V = logits.shape
    n_audio = rows // beam
    K, BLOCK_V = beam + 1, 2048
    KPAD, bands = triton.next_power_of_2(K), triton.cdiv(V, BLOCK_V)
    values = torch.empty(rows, bands, KPAD, device=logits.device)
    indices = torch.empty(rows, bands, KPAD, device=logits.device, dtype=torch.int32)
    maxima = torch.empty(rows, bands, device=logits.device)
    sums = torch.empty(rows, bands, device=logits.device)
    _beam_top_kernel[(rows, bands)](
        logits, bias if bias is not None else logits, values, indices, maxima, sums, V=V, K=K,
        KPAD=KPAD, BANDS=bands, BLOCK_V=BLOCK_V, BIAS=bias is not None, num_warps=4,
    )  # fmt: skip
    top = torch.empty(rows, KPAD, device=logits.device)
    top_index = torch.empty(rows, KPAD, device=logits.device, dtype=torch.int32)
    _beam_join_kernel[(rows,)](
        values, indices, maxima, sums, top, top_index, K=K, KPAD=KPAD, BANDS=bands,
        BANDS_PAD=triton.next_power_of_2(bands), num_warps=4,
    )  # fmt: skip
    pos, token, done = loop if loop is not None else (source, source, source)
    _beam_rank_kernel[(n_audio,)](
        top, top_index, before, sum_logprobs, tokens, next_tokens, source,
        finished.tokens, finished.lengths, finished.scores, finished.count, T,
        finished.tokens.shape[2], int(first), tokens.stride(0), next_tokens.stride(0), pos,
        token, done, BEAM=beam, K=K, KPAD=KPAD, CPAD=triton.next_power_of_2(beam * K),
        MAX_CANDIDATES=finished.lengths.shape[1] - 1, eot=eot,
        BLOCK_T=max(512, triton.next_power_of_2(T + 1)), LOOP=loop is not None,
        num_warps=4,  # 1, 2, 8 or 16: slower (H100)
    )  # fmt: skip


def reorder_rows(cache: Tensor, source: Tensor, length: int | Tensor) -> None:
    """cache [layers, rows, 2H, T, dh]: row i of every layer takes the first `length` positions
    (an int, or each row's own count [rows] on the device: the beam loop's) of row source[i]
    (i < len(source)), gathered into a scratch copy first, since rows may be each other's
    sources. Two streaming copies of the rows that change only (source[i] != i; at ~28 % of
    beam search's rows a step, a third of the bytes): PyTorch's indexed copy moved every row
    at ~1.1 TB/s (RESULTS, sessions 23 and 24)."""
    L, rows, H2, T, dh = cache.shape
    R, source = source.shape[0], source.contiguous()  # the kernel reads it by i
    by_row = isinstance(length, Tensor)
    n = T if by_row else length
    scratch = torch.empty(L, R, H2, n, dh, device=cache.device, dtype=cache.dtype)
    lengths = length if by_row else source
    grid = (L * R * H2,)
    _copy_blocks_kernel[grid](
        cache, scratch, source, R, H2, rows, T * dh, R, n * dh, n * dh, lengths, dh,
        BLOCK=1024, GATHER=True, BY_ROW=by_row,
    )  # fmt: skip
    _copy_blocks_kernel[grid](
        scratch, cache, source, R, H2, R, n * dh, rows, T * dh, n * dh, lengths, dh,
        BLOCK=1024, GATHER=False, BY_ROW=by_row,
    )  # fmt: skip


@functools.cache
def _multiprocessors(index: int | None) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count
