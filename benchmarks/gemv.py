"""How close does a decode step's matmul come to the memory's bandwidth? Each of a step's
weight shapes, at a few rows, as a chain of calls on distinct weights (more than L2 holds),
captured in a CUDA graph with the runtime's PDL: microseconds per call and TB/s, for cuBLAS
(no PDL), the runtime's stream kernel per config, and three kernel designs that were tried and not
kept (RESULTS.md, session 15): a GEMV on the CUDA cores (`rows_fma`) and a persistent grid that
prefetches its whole weight into L2 before it waits (`persistent`); and bands of any number of
rows, spread evenly over the multiprocessors (`even`, session 30).

    python3 benchmarks/gemv.py [--rows 1 5 16] [--variants stream rows_fma persistent even]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from whisperforge import kernels
from whisperforge.kernels import _prefetch_band, _stream_tile, _wait_for_inputs


def chain_us(calls: list[Callable[[], object]]) -> float:
    """Median microseconds per call of the chain, replayed as one CUDA graph."""
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = do_bench(graph.replay, warmup=10, rep=60, return_mode="median")
    return ms * 1e3 / len(calls)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--d", type=int, default=1280)
    parser.add_argument("--vocab", type=int, default=51866)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=["stream"], choices=sorted(VARIANTS))
    parser.add_argument("--fold", action="store_true", help="the folded layer norm's costs")
    args = parser.parse_args()
    d = args.d
    if args.fold:
        fold_costs(d, args.rows)
        return
    shapes = {"qkv": (3 * d, d), "out": (d, d), "fc1": (4 * d, d), "fc2": (d, 4 * d)}
    shapes["logits"] = (args.vocab, d)
    print(torch.cuda.get_device_name(), flush=True)
    print(f"copy 128 MB: {copy_tbps():.2f} TB/s (read + write)", flush=True)
    for name, (N, K) in shapes.items():
        copies = min(64, max(2, math.ceil(200e6 / (N * K * 2))))
        weights = [
            torch.randn(N, K, device="cuda", dtype=torch.float16) / K**0.5 for _ in range(copies)
        ]
        for rows in args.rows:
            x = torch.randn(rows, K, device="cuda", dtype=torch.float16)
            report(f"{name} {N}x{K} rows {rows}", x, weights, args.variants, args.top)


def fold_costs(d: int, rows: list[int]) -> None:
    """What folding a layer norm into the matmuls costs per call, chained as in a step: the
    stream kernel plain; with the norm in its epilogue (NORM); as a residual add whose split
    programs count in (RESIDUAL); and the unfolded pair these replace, partial sums +
    `add_layer_norm`."""
    ln = torch.nn.LayerNorm(d, device="cuda", dtype=torch.float16)
    for (N, K), M in itertools.product([(3 * d, d), (d, d), (d, 4 * d)], rows):
        copies = min(64, max(2, math.ceil(200e6 / (N * K * 2))))
        weights = [
            torch.randn(N, K, device="cuda", dtype=torch.float16) / K**0.5 for _ in range(copies)
        ]
        x = torch.randn(M, K, device="cuda", dtype=torch.float16)
        stream = torch.randn(M, N, device="cuda", dtype=torch.float16)
        stats = kernels.StreamStats(
            torch.zeros(max(N, K) // 16 * M * 2, device="cuda"),
            torch.zeros(M, max(N, K), device="cuda", dtype=torch.float16),
            torch.zeros(1024, device="cuda", dtype=torch.int32),
        )
        kernels.USE_PDL = True
        config = kernels._linear_config(x, weights[0])  # the same with or without splits
        bias = torch.zeros(N, device="cuda", dtype=torch.float16)
        folded = functools.partial(kernels.skinny_linear, x, stats=stats)
        residual = functools.partial(folded, residual=(stream, ln.weight))
        residual(weights[0], bias, False, config)  # band statistics for the norm below
        line = [f"{N}x{K} rows {M}: plain {config}"]
        line.append(
            f"{chain_us([functools.partial(folded, w, None, False, config) for w in weights]):.2f} us"
        )
        if K == d:  # a norm before it
            norm = functools.partial(folded, norm=kernels.norm_through(weights[0], ln))
            line.append(
                f"norm {chain_us([functools.partial(norm, w, None, False, config) for w in weights]):.2f}"
            )
        if N == d:  # a residual add after it
            calls = [functools.partial(residual, w, bias, False, config) for w in weights]
            line.append(f"residual {config} {chain_us(calls):.2f}")
            calls = [
                functools.partial(_partial_add_norm, x, w, config, stream, bias, ln)
                for w in weights
            ]
            line.append(f"partial + add_layer_norm {chain_us(calls):.2f}")
        print(" | ".join(line), flush=True)


def _partial_add_norm(x, w, config, stream, bias, ln) -> torch.Tensor:
    parts = kernels.skinny_linear(x, w, None, False, config, partial=True)
    return kernels.add_layer_norm(stream, parts, bias, ln)


def copy_tbps() -> float:
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    ms = do_bench(lambda: big[: 128 << 20].copy_(big[128 << 20 :]), return_mode="median")
    return 2 * (128 << 20) / ms / 1e9


def report(
    title: str, x: torch.Tensor, weights: list[torch.Tensor], variants: list[str], top: int
) -> None:
    """Time cuBLAS and each variant's configs on the chain of weights; print the best few."""
    N, K = weights[0].shape
    nbytes = N * K * 2
    reference = F.linear(x, weights[0]).float()
    results: list[tuple[float, str]] = []

    def measure(label: str, make: Callable[[torch.Tensor], Callable[[], torch.Tensor]]) -> None:
        try:
            y = make(weights[0])()
            y = y.sum(0) if y.dim() == 3 else y
            error = ((y.float() - reference).norm() / reference.norm()).item()
            if not error < 1e-2:
                print(f"  {title} {label}: wrong ({error:.2e})", flush=True)
                return
            results.append((chain_us([make(w) for w in weights]), label))
        except (triton.CompilationError, triton.OutOfResources) as e:
            print(f"  {title} {label}: {type(e).__name__}: {str(e)[:80]}", flush=True)

    kernels.USE_PDL = False
    measure("cublas", lambda w: lambda: F.linear(x, w))
    kernels.USE_PDL = True
    for variant in variants:
        for label, make in VARIANTS[variant](x, N, K):
            measure(f"{variant} {label}", make)
    results.sort()
    cublas = next(us for us, label in results if label == "cublas")
    print(
        f"{title} ({nbytes / 1e6:.1f} MB): cublas {cublas:.2f} us ({nbytes / cublas / 1e6:.2f} TB/s)"
    )
    for variant in variants:
        mine = [(us, label) for us, label in results if label.startswith(variant)]
        for us, label in mine[:top]:
            print(f"    {label}: {us:.2f} us ({nbytes / us / 1e6:.2f} TB/s)", flush=True)


def _stream(x: torch.Tensor, N: int, K: int):
    """The runtime's stream kernel, its configs, whole or split into partial sums."""
    for config in kernels.STREAM_CANDIDATES:
        if K % config[1]:
            continue
        for partial in (False, True):
            splits = kernels.stream_splits(N, K, config) if partial else 1
            if partial and splits == 1:
                continue

            def make(w, config=config, partial=partial):
                return lambda: kernels.skinny_linear(x, w, None, False, config, partial=partial)

            yield f"{config} splits {splits}", make


def _rows_fma(x: torch.Tensor, N: int, K: int):
    """A GEMV on the CUDA cores: [ROWS, BLOCK_N, BLOCK_K] products summed once at the end."""
    M = x.shape[0]
    rows = triton_next_pow2(M)
    if rows > 8:
        return
    for block_n, block_k, warps, splits in itertools.product(
        (4, 8, 16, 32), (256, 512, 1024), (4, 8), (1, 2, 4)
    ):
        regs = rows * block_n * block_k / (32 * warps)
        if not 8 <= regs <= 128 or K % (block_k * splits) or (splits > 1 and N > 2 * K):
            continue

        def make(w, block_n=block_n, block_k=block_k, warps=warps, splits=splits):
            y = torch.empty(
                (splits, M, N) if splits > 1 else (M, N),
                device=x.device,
                dtype=torch.float32 if splits > 1 else x.dtype,
            )
            grid = (triton_cdiv(N, block_n), 1, splits)

            def launch() -> torch.Tensor:
                _gemv_fma_kernel[grid](
                    x, w, y, M, N, K=K, K_SPLIT=K // splits, ROWS=rows, BLOCK_N=block_n,
                    BLOCK_K=block_k, LINE=64, num_warps=warps, **kernels._launch(x),
                )  # fmt: skip
                return y

            return launch

        yield f"({block_n}, {block_k}, {warps}) splits {splits}", make


triton_cdiv, triton_next_pow2 = triton.cdiv, triton.next_power_of_2


@triton.jit
def _gemv_fma_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, K_SPLIT: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LINE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_start = tl.program_id(2) * K_SPLIT
    m = tl.arange(0, ROWS)
    k = tl.arange(0, BLOCK_K)
    band = w_ptr + tl.minimum(n, N - 1)[:, None].to(tl.int64) * K  # clamped: unmasked loads
    if PDL:
        _prefetch_band(w_ptr, n, N, k_start, K, K_SPLIT, BLOCK_K, LINE)
    _wait_for_inputs(PDL)
    acc = tl.zeros((ROWS, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K_SPLIT, BLOCK_K):
        kk = k_start + k0 + k
        w = tl.load(band + kk[None, :]).to(tl.float32)
        xs = tl.load(x_ptr + m[:, None] * K + kk[None, :], mask=m[:, None] < M, other=0.0)
        acc += xs.to(tl.float32)[:, None, :] * w[None, :, :]
    y = tl.sum(acc, axis=2)
    out = y_ptr + m[:, None] * N + n[None, :]
    keep = (m[:, None] < M) & (n[None, :] < N)
    if K_SPLIT < K:
        tl.store(out + tl.program_id(2) * M * N, y, mask=keep)
    else:
        tl.store(out, y.to(y_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _persistent_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, K_SPLIT: tl.constexpr, TILES: tl.constexpr,
    PROGRAMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    LINE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """The stream kernel as a persistent grid: program p takes tiles p, p + PROGRAMS, ... (a
    tile: BLOCK_N output rows over one K part). All of a program's tiles are prefetched into L2
    before it waits for its inputs, so under PDL the whole weight streams in while the kernel
    before still runs."""
    SPLITS: tl.constexpr = K // K_SPLIT
    pid = tl.program_id(0)
    if PDL:
        for i in range(0, TILES, PROGRAMS):
            t = tl.minimum(pid + i, TILES - 1)
            n = (t // SPLITS) * BLOCK_N + tl.arange(0, BLOCK_N)
            _prefetch_band(w_ptr, n, N, (t % SPLITS) * K_SPLIT, K, K_SPLIT, BLOCK_K, LINE)
    _wait_for_inputs(PDL)
    m = tl.arange(0, BLOCK_M)
    for i in range(0, TILES, PROGRAMS):  # a constant trip count; the last round may repeat
        t = tl.minimum(pid + i, TILES - 1)
        n = (t // SPLITS) * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = _stream_tile(
            x_ptr, w_ptr, w_ptr, m, n, (t % SPLITS) * K_SPLIT, M, N, K, K_SPLIT, BLOCK_K, 0,
            w_ptr, w_ptr, 0.0, 0.0, False,
        )  # fmt: skip
        out = y_ptr + m[:, None] * N + n[None, :]
        keep = (m[:, None] < M) & (n[None, :] < N) & (pid + i < TILES)
        if SPLITS > 1:
            tl.store(out + (t % SPLITS) * M * N, acc, mask=keep)
        else:
            tl.store(out, acc.to(y_ptr.dtype.element_ty), mask=keep)


def _persistent(x: torch.Tensor, N: int, K: int):
    M = x.shape[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for (block_n, block_k, warps, stages), splits, per_sm in itertools.product(
        [(32, 128, 4, 3), (64, 128, 8, 3), (32, 256, 4, 4), (64, 256, 8, 4), (16, 256, 4, 3)],
        (1, 2, 5),
        (1, 2),
    ):
        if K % (block_k * splits) or (splits > 1 and N > 2 * K):
            continue
        tiles = triton_cdiv(N, block_n) * splits
        programs = min(tiles, per_sm * sms)

        def make(
            w,
            block_n=block_n,
            block_k=block_k,
            warps=warps,
            stages=stages,
            splits=splits,
            tiles=tiles,
            programs=programs,
        ):
            y = torch.empty(
                (splits, M, N) if splits > 1 else (M, N),
                device=x.device,
                dtype=torch.float32 if splits > 1 else x.dtype,
            )

            def launch() -> torch.Tensor:
                _persistent_kernel[(programs,)](
                    x, w, y, M, N, K=K, K_SPLIT=K // splits, TILES=tiles, PROGRAMS=programs,
                    BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k, LINE=64, num_warps=warps,
                    num_stages=stages, **kernels._launch(x),
                )  # fmt: skip
                return y

            return launch

        yield f"({block_n}, {block_k}, {warps}, {stages}) splits {splits} x{per_sm}", make


@triton.jit
def _even_kernel(
    x_ptr, w_ptr, y_ptr, M, N, K: tl.constexpr, K_SPLIT: tl.constexpr, ROWS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, LINE: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    """The stream kernel with ROWS rows of the weight a program, in a tile of BLOCK_N >= ROWS:
    bands that need not be a power of two, so that they come out at a whole number a
    multiprocessor. Writes float32 partial sums [splits, M, N]."""
    m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(0) * ROWS + tl.arange(0, BLOCK_N)
    end = tl.minimum(N, tl.program_id(0) * ROWS + ROWS)  # the band's rows are n < end
    k_start = tl.program_id(2) * K_SPLIT
    if PDL:
        _prefetch_band(w_ptr, n, end, k_start, K, K_SPLIT, BLOCK_K, LINE)
    _wait_for_inputs(PDL)
    acc = _stream_tile(
        x_ptr, w_ptr, w_ptr, m, n, k_start, M, end, K, K_SPLIT, BLOCK_K, 0, w_ptr, w_ptr, 0.0,
        0.0, False,
    )  # fmt: skip
    at = tl.program_id(2) * M * N + m[:, None] * N + n[None, :]
    tl.store(y_ptr + at, acc, mask=(m[:, None] < M) & (n[None, :] < end))


def _even(x: torch.Tensor, N: int, K: int):
    """Bands of ceil(N / programs) rows for a half, one or two programs a multiprocessor (tried
    in session 30: faster alone, level in the whole step; RESULTS.md)."""
    M = x.shape[0]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pipelines = [(128, 4, 4), (256, 4, 4), (256, 8, 3), (128, 8, 6)]
    for programs, splits, (block_k, warps, stages) in itertools.product(
        (sms, 2 * sms, sms // 2), (1, 2, 4), pipelines
    ):
        rows = math.ceil(N / (programs // splits))
        if rows > 64 or K % (splits * block_k):
            continue

        def make(w, rows=rows, splits=splits, block_k=block_k, warps=warps, stages=stages):
            y = torch.empty(splits, M, N, device=x.device, dtype=torch.float32)
            grid = (triton_cdiv(N, rows), triton_cdiv(M, 16), splits)

            def launch() -> torch.Tensor:
                _even_kernel[grid](
                    x, w, y, M, N, K=K, K_SPLIT=K // splits, ROWS=rows, BLOCK_M=16,
                    BLOCK_N=max(16, triton_next_pow2(rows)), BLOCK_K=block_k, LINE=64,
                    num_warps=warps, num_stages=stages, **kernels._launch(x),
                )  # fmt: skip
                return y

            return launch

        launched = triton_cdiv(N, rows) * splits
        yield f"rows {rows} x{splits} ({launched} programs) {block_k}/{warps}/{stages}", make


VARIANTS = {"stream": _stream, "rows_fma": _rows_fma, "persistent": _persistent, "even": _even}

if __name__ == "__main__":
    main()
