"""Can a decoder layer run faster as one persistent kernel than as ~12 kernels chained by PDL?
A design tried in session 16 and not kept (RESULTS.md, GPU_NOTES.md): `decoder_layer` runs a
layer of a decode step as the phases of one persistent grid, separated by grid barriers in
global memory instead of kernel boundaries, each program asking L2 for its next phase's weights
before it waits, the layer norms computed on the way into each matmul tile from band
statistics the residual's writer leaves. This times it against the runtime's chain
(`Runtime._layer_fused`), phase by phase (run up to phase k = 1..10), at a few grid shapes,
after checking both give the same layer output. Random fp16 weights of a preset, each layer
distinct (as a step reads them), replayed as one CUDA graph.

    python3 benchmarks/layer.py [--preset large-v3-turbo] [--rows 1 16] [--per-sm 1 2] [--warps 4 8]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch import Tensor, nn
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from whisperforge.kernels import (
    _band_stats,
    _columns,
    _combine_head,
    _cross_attention_split,
    _launch,
    _layer_norm_row,
    _linear_epilogue,
    _prefetch_band,
    _prefetch_cross_keys,
    _residual_epilogue,
    _self_attention_head,
    _stream_tile,
    _wait_for_inputs,
)
from whisperforge.model import Whisper
from whisperforge.presets import preset, random_model
from whisperforge.runtime import Runtime


@triton.jit
def _grid_sync(sync_ptr, arrivals, GRID_SYNC: tl.constexpr):
    """A barrier across the programs of a persistent kernel: wait until sync[0] (arrivals
    so far) reaches `arrivals` (programs x barriers passed, this one included). The
    program's stores before it are visible to the .cg loads after it. Gives up after ~2^22
    polls (seconds), raising sync[2], rather than hang a GPU where the programs could not
    all be resident."""
    if GRID_SYNC:
        tl.debug_barrier()  # every thread's stores are issued before the release
        tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
        polls = 0
        while (tl.load(sync_ptr, volatile=True) < arrivals) & (polls < 4194304):
            polls += 1
        # The acquire that orders the loads after the barrier (its value is used, or the
        # compiler drops it).
        arrived = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
        if arrived < arrivals:
            tl.atomic_xchg(sync_ptr + 2, 1, sem="relaxed", scope="gpu")
        tl.debug_barrier()


@triton.jit
def _grid_exit(sync_ptr, programs, GRID_SYNC: tl.constexpr):
    """The last program out resets the arrivals for the kernel's next launch: every program
    has then passed every barrier."""
    if GRID_SYNC:
        tl.debug_barrier()
        if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == programs - 1:
            tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _prefetch_tiles(
    w_ptr, program, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
    PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, LINE: tl.constexpr,
):  # fmt: skip
    """Ask L2 for the weight bands of this program's `_linear_tiles`."""
    bands: tl.constexpr = tl.cdiv(N, BLOCK_N)
    for start in range(0, bands * tl.cdiv(M, BLOCK_M), PROGRAMS):
        tile = start + program
        if tile < bands * tl.cdiv(M, BLOCK_M):
            n = (tile % bands) * BLOCK_N + tl.arange(0, BLOCK_N)
            _prefetch_band(w_ptr, n, N, 0, K, K, BLOCK_K, LINE)


@triton.jit
def _linear_tiles(
    x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, ln_w_ptr, ln_b_ptr, stats_ptr, eps, program,
    M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, PROGRAMS: tl.constexpr,
    NORM: tl.constexpr, SCALE: tl.constexpr, BIAS: tl.constexpr, GELU: tl.constexpr,
    RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_BANDS: tl.constexpr,
):  # fmt: skip
    """A step matmul as a phase of a persistent kernel: y = f(x) @ w^T (* scale, + bias,
    then GELU) over the (rows, band) tiles program, program + PROGRAMS, ... f: layer_norm
    (NORM, with ln_w, ln_b, eps and the stream's band statistics) or none. RESIDUAL: y
    is the residual stream [M, N]: y += that, and each band of BLOCK_N columns leaves its
    rows' mean and squared deviations in stats [N / BLOCK_N, M, 2] for the next norm."""
    bands: tl.constexpr = tl.cdiv(N, BLOCK_N)
    dtype = x_ptr.dtype.element_ty
    for start in range(0, bands * tl.cdiv(M, BLOCK_M), PROGRAMS):
        tile = start + program
        if tile < bands * tl.cdiv(M, BLOCK_M):
            band = tile % bands
            m = (tile // bands) * BLOCK_M + tl.arange(0, BLOCK_M)
            n = band * BLOCK_N + tl.arange(0, BLOCK_N)
            out = y_ptr + m[:, None] * N + n[None, :]
            keep = (m[:, None] < M) & (n[None, :] < N)
            mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
            rstd = mean
            if NORM:
                mean, rstd = _band_stats(stats_ptr, m, eps, M, K, BLOCK_N, BLOCK_BANDS)
            acc = _stream_tile(
                x_ptr, w_ptr, s_ptr, m, n, 0, M, N, K, K, BLOCK_K, 0, ln_w_ptr, ln_b_ptr, mean,
                rstd, NORM,
            )  # fmt: skip
            scale, bias = _columns(s_ptr, n, N, SCALE), _columns(b_ptr, n, N, BIAS)
            acc = _linear_epilogue(acc, scale, bias, dtype, SCALE, BIAS, GELU)
            if RESIDUAL:  # as add_layer_norm: one rounding of x + (rounded output + bias)
                stream = tl.load(out, mask=keep, other=0.0, cache_modifier=".cg")
                acc = _residual_epilogue(acc, stream, stats_ptr, m, band, M, dtype)
            tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _decoder_layer_kernel(
    x_ptr, x_in_ptr, stats_ptr, qkv_ptr, a_ptr, q_ptr, m_ptr, l_ptr, part_ptr, c_ptr, h_ptr,
    hidden_ptr, cache_ptr, pos_ptr, kv_ptr, sync_ptr,
    ln1_w, ln1_b, qkv_w, qkv_s, qkv_b, out_w, out_s, out_b,
    ln2_w, ln2_b, query_w, query_s, query_b, cross_w, cross_s, cross_b,
    ln3_w, ln3_b, fc1_w, fc1_s, fc1_b, fc2_w, fc2_s, fc2_b, final_w, final_b,
    A, scale, eps,
    M: tl.constexpr, W: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_BANDS: tl.constexpr, T: tl.constexpr, BLOCK_G: tl.constexpr, KEYS: tl.constexpr,
    SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, LINE: tl.constexpr, SCALE: tl.constexpr, FINAL: tl.constexpr,
    NORMED: tl.constexpr, PROGRAMS: tl.constexpr, FIRST: tl.constexpr, LAST: tl.constexpr,
    GRID_SYNC: tl.constexpr, BY_LENGTH: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """A whole decoder layer of a decode step in one launch of PROGRAMS programs: the step's
    ~12 kernels per layer become phases of one persistent grid, separated by grid barriers
    (`_grid_sync`) instead of kernel boundaries, and each program asks L2 for its next
    phase's weights before it waits at the barrier. x [M, D], the residual stream of M rows
    (W windows of M / W rows), is updated in place; the layer norms are computed by each
    matmul tile on the way in, from band statistics (`_band_stats`) the writer of x left in
    stats. x_in: phase 1's input, x, or its layer norm already (NORMED: the first layer,
    after the embedding kernel). Phases:
    1 qkv = ln1(x) @ Wqkv; 2 self-attention per (row, head) -> a; 3 x += a @ Wout + b;
    4 q = ln2(x) @ Wquery; 5 cross-attention per (window, head, key split); 6 joined -> c;
    7 x += c @ Wcross + b; 8 h = GELU(ln3(x) @ Wfc1 + b); 9 x += h @ Wfc2 + b;
    10 (FINAL) hidden = final_ln(x). FIRST..LAST: the phases this launch runs (`bench_rows`
    stops early to time them; a launch per phase with GRID_SYNC off is how it ran in Triton's
    interpreter, whose programs run one after another)."""
    program = tl.program_id(0)
    DH: tl.constexpr = D // H
    G: tl.constexpr = M // W
    CROSS_UNITS: tl.constexpr = W * H * SPLITS
    if PDL and FIRST == 1:
        _prefetch_tiles(qkv_w, program, M, 3 * D, D, PROGRAMS, 16, BLOCK_N, BLOCK_K, LINE)
    _wait_for_inputs(PDL)
    if FIRST <= 1 and 1 <= LAST:
        _linear_tiles(
            x_in_ptr, qkv_w, qkv_s, qkv_b, qkv_ptr, ln1_w, ln1_b, stats_ptr, eps, program, M,
            3 * D, D, PROGRAMS, not NORMED, SCALE, False, False, False, 16, BLOCK_N,
            BLOCK_K, BLOCK_BANDS,
        )  # fmt: skip
        _prefetch_tiles(out_w, program, M, D, D, PROGRAMS, 16, BLOCK_N, BLOCK_K, LINE)
        _grid_sync(sync_ptr, PROGRAMS, GRID_SYNC)
    if FIRST <= 2 and 2 <= LAST:
        for start in range(0, M * H, PROGRAMS):
            unit = start + program
            if unit < M * H:
                _self_attention_head(
                    qkv_ptr, qkv_b, cache_ptr, pos_ptr, a_ptr, unit // H, unit % H, H,
                    scale, T, DH, 64, BY_LENGTH, (0.0, 0.0), False,
                )  # fmt: skip
        _grid_sync(sync_ptr, 2 * PROGRAMS, GRID_SYNC)
    if FIRST <= 3 and 3 <= LAST:
        _linear_tiles(
            a_ptr, out_w, out_s, out_b, x_ptr, ln1_w, ln1_b, stats_ptr, eps, program, M, D,
            D, PROGRAMS, False, SCALE, True, False, True, 16, BLOCK_N, BLOCK_K,
            BLOCK_BANDS,
        )  # fmt: skip
        _prefetch_tiles(query_w, program, M, D, D, PROGRAMS, 16, BLOCK_N, BLOCK_K, LINE)
        _grid_sync(sync_ptr, 3 * PROGRAMS, GRID_SYNC)
    if FIRST <= 4 and 4 <= LAST:
        _linear_tiles(
            x_ptr, query_w, query_s, query_b, q_ptr, ln2_w, ln2_b, stats_ptr, eps, program,
            M, D, D, PROGRAMS, True, SCALE, False, False, False, 16, BLOCK_N, BLOCK_K,
            BLOCK_BANDS,
        )  # fmt: skip
        for start in range(0, CROSS_UNITS, PROGRAMS):
            unit = start + program
            if unit < CROSS_UNITS:
                w, h, s = unit // (H * SPLITS), unit // SPLITS % H, unit % SPLITS
                _prefetch_cross_keys(kv_ptr, w, h, s, A, D, DH, KEYS, 64)
        _grid_sync(sync_ptr, 4 * PROGRAMS, GRID_SYNC)
    if FIRST <= 5 and 5 <= LAST:
        for start in range(0, CROSS_UNITS, PROGRAMS):
            unit = start + program
            if unit < CROSS_UNITS:
                w, h, s = unit // (H * SPLITS), unit // SPLITS % H, unit % SPLITS
                q_bias = tl.load(query_b + h * DH + tl.arange(0, DH)).to(tl.float32)
                _cross_attention_split(
                    q_ptr, q_bias, kv_ptr, m_ptr, l_ptr, part_ptr, w, h, s, SPLITS, M, A,
                    H, scale, 0, G, BLOCK_G, DH, KEYS, 64, (0.0, 0.0), False,
                )  # fmt: skip
        _prefetch_tiles(cross_w, program, M, D, D, PROGRAMS, 16, BLOCK_N, BLOCK_K, LINE)
        _grid_sync(sync_ptr, 5 * PROGRAMS, GRID_SYNC)
    if FIRST <= 6 and 6 <= LAST:
        for start in range(0, M * H, PROGRAMS):
            unit = start + program
            if unit < M * H:
                _combine_head(
                    m_ptr, l_ptr, part_ptr, c_ptr, unit // H, unit % H, H, SPLITS, DH,
                    BLOCK_S,
                )  # fmt: skip
        _grid_sync(sync_ptr, 6 * PROGRAMS, GRID_SYNC)
    if FIRST <= 7 and 7 <= LAST:
        _linear_tiles(
            c_ptr, cross_w, cross_s, cross_b, x_ptr, ln1_w, ln1_b, stats_ptr, eps, program,
            M, D, D, PROGRAMS, False, SCALE, True, False, True, 16, BLOCK_N, BLOCK_K,
            BLOCK_BANDS,
        )  # fmt: skip
        _prefetch_tiles(fc1_w, program, M, 4 * D, D, PROGRAMS, 16, BLOCK_N, BLOCK_K, LINE)
        _grid_sync(sync_ptr, 7 * PROGRAMS, GRID_SYNC)
    if FIRST <= 8 and 8 <= LAST:
        _linear_tiles(
            x_ptr, fc1_w, fc1_s, fc1_b, h_ptr, ln3_w, ln3_b, stats_ptr, eps, program, M,
            4 * D, D, PROGRAMS, True, SCALE, True, True, False, 16, BLOCK_N, BLOCK_K,
            BLOCK_BANDS,
        )  # fmt: skip
        _prefetch_tiles(fc2_w, program, M, D, 4 * D, PROGRAMS, 16, BLOCK_N, BLOCK_K, LINE)
        _grid_sync(sync_ptr, 8 * PROGRAMS, GRID_SYNC)
    if FIRST <= 9 and 9 <= LAST:
        _linear_tiles(
            h_ptr, fc2_w, fc2_s, fc2_b, x_ptr, ln1_w, ln1_b, stats_ptr, eps, program, M, D,
            4 * D, PROGRAMS, False, SCALE, True, False, True, 16, BLOCK_N, BLOCK_K,
            BLOCK_BANDS,
        )  # fmt: skip
    if FINAL and FIRST <= 10 and 10 <= LAST:
        _grid_sync(sync_ptr, 9 * PROGRAMS, GRID_SYNC)
        cols = tl.arange(0, BLOCK_D)
        for start in range(0, M, PROGRAMS):
            r = start + program
            if r < M:
                at = r.to(tl.int64) * D + cols
                x = tl.load(x_ptr + at, mask=cols < D, other=0.0, cache_modifier=".cg")
                y = _layer_norm_row(x.to(tl.float32), final_w, final_b, cols, cols < D, D, eps)
                tl.store(hidden_ptr + at, y.to(hidden_ptr.dtype.element_ty), mask=cols < D)
    _grid_exit(sync_ptr, PROGRAMS, GRID_SYNC)


LAYER_PROGRAMS_PER_SM = 1  # the persistent grid: programs per multiprocessor (all resident)
LAYER_WARPS = 4
_layer_programs: dict[tuple, int] = {}


def _weight_and_scale(linear: nn.Module) -> tuple[Tensor, Tensor | None]:
    """A linear's weight, and its per-channel scale where it is quantized (quantize.py)."""
    w = linear.weight
    return (w, None) if isinstance(w, Tensor) else (w.data, w.scale)


def decoder_layer(
    block: nn.Module, x: Tensor, stats: Tensor, cache: Tensor, pos: Tensor, kv: Tensor,
    windows: int, n_head: int, sync: Tensor, *, normed: Tensor | None = None,
    final: nn.LayerNorm | None = None, hidden: Tensor | None = None, last_phase: int = 10,
) -> None:  # fmt: skip
    """One decoder layer of a decode step as one persistent kernel (`_decoder_layer_kernel`).
    x [rows, D], the residual stream (rows grouped by window), is updated in place, and stats
    [D / 16, rows, 2] (float32) with its band statistics, which the next layer norm starts from:
    the previous layer's, or `normed` = the first norm of x already (the first layer). With
    `final`, hidden = final(x). cache: the layer's self K,V [>= rows, 2H, T, dh]; kv: its cross
    K,V [>= windows, A, 2D]; sync: the layer's int32 [3] barrier counters (zeros; the kernel
    leaves them so). The weights are all 16-bit or all quantized (int8 / fp8 with scales).
    `last_phase` < 10: stop there (`bench_rows` times the phases)."""
    M, D = x.shape
    H, dh, A = n_head, D // n_head, kv.shape[1]
    wanted = _grid_size(x.device)
    # Cross-attention: key splits of 64-key blocks, as many as fill the grid in one round.
    blocks = triton.cdiv(A, 64)
    keys = 64 * triton.cdiv(blocks, max(1, min(blocks, wanted // (windows * H))))
    splits = triton.cdiv(A, keys)
    modules = (block.attn.qkv, block.attn.out, block.cross_attn.query, block.cross_attn.out)
    weights = [_weight_and_scale(m) for m in (*modules, block.mlp[0], block.mlp[2])]
    scaled = weights[0][1] is not None
    f32 = functools.partial(torch.empty, device=x.device, dtype=torch.float32)
    qkv, h = x.new_empty(M, 3 * D), x.new_empty(M, 4 * D)
    a, q, c = x.new_empty(M, D), x.new_empty(M, D), x.new_empty(M, D)
    m, l, part = f32(M, H, splits), f32(M, H, splits), f32(M, H, splits, dh)
    norms = [block.attn_ln, block.cross_attn_ln, block.mlp_ln]
    params = []
    for i, (w, scale) in enumerate(weights):
        if i in (0, 2, 4):
            params += [norms[i // 2].weight, norms[i // 2].bias]
        bias = modules[i].bias if i < 4 else block.mlp[2 * (i - 4)].bias
        params += [w, scale if scaled else w, bias]
    final_ln = final if final is not None else block.attn_ln
    args = [
        x, normed if normed is not None else x, stats, qkv, a, q, m, l, part, c, h,
        hidden if hidden is not None else x, cache, pos, kv, sync, *params, final_ln.weight,
        final_ln.bias, A, dh**-0.5, block.attn_ln.eps,
    ]  # fmt: skip
    constants = dict(  # noqa: C408 - the kernel's keyword arguments
        M=M, W=windows, H=H, D=D, BLOCK_D=triton.next_power_of_2(D),
        BLOCK_BANDS=triton.next_power_of_2(D // 16), T=cache.shape[2],
        BLOCK_G=max(16, triton.next_power_of_2(M // windows)), KEYS=keys, SPLITS=splits,
        BLOCK_S=triton.next_power_of_2(splits), BLOCK_N=16,
        BLOCK_K=next(b for b in (256, 128, 64, 32, 16) if D % b == 0),
        LINE=128 // weights[0][0].element_size(), SCALE=scaled, FINAL=final is not None,
        NORMED=normed is not None, BY_LENGTH=True, num_warps=LAYER_WARPS,
        num_stages=3,
    )  # fmt: skip
    kernel = _decoder_layer_kernel
    launch = dict(FIRST=1, LAST=last_phase, GRID_SYNC=True, **constants, **_launch(x))
    key = (x.device, last_phase, LAYER_PROGRAMS_PER_SM, *sorted(constants.items()))
    if key not in _layer_programs:
        _layer_programs[key] = _resident_programs(kernel, args, launch, wanted)
    programs = _layer_programs[key]
    kernel[(programs,)](*args, PROGRAMS=programs, **launch)


def _grid_size(device: torch.device) -> int:
    """The persistent grid's size wanted: LAYER_PROGRAMS_PER_SM per multiprocessor."""
    return torch.cuda.get_device_properties(device).multi_processor_count * LAYER_PROGRAMS_PER_SM


def _resident_programs(kernel, args: list, launch: dict, wanted: int) -> int:
    """`wanted` programs, or fewer where the compiled kernel's registers or shared memory would
    not let them all be resident at once (a grid barrier would wait for programs that cannot
    start): a multiple of the multiprocessors."""
    props = torch.cuda.get_device_properties(args[0].device)
    sms = props.multi_processor_count
    fits = [wanted // sms]
    try:  # Triton's compiled-kernel metadata: not a stable API, so 1 per SM where it moves
        compiled = kernel.warmup(*args, grid=(wanted,), PROGRAMS=wanted, **launch)
        compiled._init_handles()
        threads = 32 * compiled.metadata.num_warps
        fits.append(props.max_threads_per_multi_processor // threads)
        fits.append(props.regs_per_multiprocessor // max(1, compiled.n_regs * threads))
        if compiled.metadata.shared:
            fits.append(props.shared_memory_per_multiprocessor // compiled.metadata.shared)
    except (AttributeError, TypeError):
        fits = [1]
    return sms * max(1, min(fits))


def graphed_us(run: Callable[[], None], calls: int) -> float:
    """Median microseconds per call of `run` (which makes `calls` calls), as one CUDA graph."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    return do_bench(graph.replay, warmup=10, rep=100, return_mode="median") * 1e3 / calls


@torch.inference_mode()
def bench_rows(model: Whisper, rows: int, args: argparse.Namespace) -> None:
    blocks, D = model.decoder.blocks, model.config.n_text_state
    layers = len(blocks)
    rt = Runtime(model, "float16", max_windows=rows)
    for tensor in (*rt.cross_kv, *rt.self_kv):
        tensor.normal_()
    rt.pos[:rows] = args.position
    x = torch.randn(rows, D, device="cuda", dtype=torch.float16)
    h = torch.randn_like(x)
    stats = torch.rand(D // 16 * rows * 2, device="cuda")  # the stream's band statistics
    sync = torch.zeros(layers, 3, dtype=torch.int32, device="cuda")  # barrier counters

    def kernels(normed: torch.Tensor = h) -> None:
        for i, block in enumerate(blocks):
            last = i + 1 == layers
            next_ln = model.decoder.ln if last else blocks[i + 1].attn_ln
            normed = rt._layer_fused(block, i, x, normed, rows, next_ln, last)

    x0 = x.clone()
    kernels()
    expected, x[:] = x.clone(), x0
    for i, block in enumerate(blocks):
        decoder_layer(
            block, x, stats, rt.self_kv[i], rt.pos[:rows], rt.cross_kv[i], rows, rt.n_head,
            sync[i], normed=h if i == 0 else None,
        )  # fmt: skip
    error = float((x.float() - expected.float()).norm() / expected.float().norm())
    print(f"rows {rows}: persistent vs ~12 kernels, layers' output rel. error {error:.1e}")
    print(f"rows {rows}: ~12 kernels per layer {graphed_us(kernels, layers):.1f} us", flush=True)

    def persistent(last: int) -> None:
        for i, block in enumerate(blocks):
            decoder_layer(
                block, x, stats, rt.self_kv[i], rt.pos[:rows], rt.cross_kv[i], rows, rt.n_head,
                sync[i], final=model.decoder.ln, hidden=rt.hidden[:rows],
                last_phase=last,
            )  # fmt: skip

    for per_sm, warps in itertools.product(args.per_sm, args.warps):
        global LAYER_PROGRAMS_PER_SM, LAYER_WARPS
        LAYER_PROGRAMS_PER_SM, LAYER_WARPS = per_sm, warps
        cells = []
        for last in range(1, 11):
            try:
                cells.append(f"{graphed_us(functools.partial(persistent, last), layers):.1f}")
            except Exception as error:  # noqa: BLE001 - reported, the sweep goes on
                cells.append(type(error).__name__)
        programs = sorted(set(_layer_programs.values()))
        print(
            f"rows {rows}: persistent, {per_sm}/SM ({programs} programs), {warps} warps,"
            f" us per layer up to phase 1..10: {' '.join(cells)}",
            flush=True,
        )
        _layer_programs.clear()
    print(f"rows {rows}: barrier give-up flag {int(sync[:, 2].max())}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="large-v3-turbo")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--per-sm", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--warps", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--position", type=int, default=100, help="each row's length so far")
    args = parser.parse_args()
    config = preset(args.preset)
    model = random_model(config, seed=0, device="cuda", dtype=torch.float16)
    print(
        f"{torch.cuda.get_device_name()}, {args.preset}: {config.n_text_layer} layers of"
        f" D = {config.n_text_state}",
        flush=True,
    )
    for rows in args.rows:
        bench_rows(model, rows, args)


if __name__ == "__main__":
    main()
