"""Does programmatic dependent launch pay inside a CUDA graph? A chain of dependent step matmuls
(square: each one's output is the next one's input, each on its own weights, more weights than L2
holds), captured in a graph, with the runtime's PDL off and on: time per kernel and the
bandwidth it reaches. `--persistent`: the same one-row chain as the phases of one persistent
kernel with grid barriers (`layer._grid_sync`) between them, each program's weight tile
loaded into registers after the barrier, or before it (`preload`: the load overlaps the wait).

    python3 benchmarks/pdl_chain.py [--persistent]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from layer import _grid_exit, _grid_sync  # benchmarks/layer.py

from whisperforge import kernels


@triton.jit
def _persistent_chain_kernel(
    w_ptr, x_ptr, sync_ptr, PHASES: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr, PRELOAD: tl.constexpr,
):  # fmt: skip
    """x[j + 1] = w[j] @ x[j] for j < PHASES, one row; program p computes outputs
    [p ROWS, (p + 1) ROWS) of every phase, its [ROWS, K] weight tile held in registers."""
    program = tl.program_id(0)
    programs = tl.num_programs(0)
    n = program * ROWS + tl.arange(0, ROWS)
    k = tl.arange(0, BLOCK_K)
    tile = n[:, None] * K + k[None, :]
    mask = (n[:, None] < K) & (k[None, :] < K)
    w = tl.load(w_ptr + tile, mask=mask, other=0.0)
    for j in range(PHASES):
        if not PRELOAD:
            w = tl.load(w_ptr + j * K * K + tile, mask=mask, other=0.0)
        x = tl.load(x_ptr + j * K + k, mask=k < K, other=0.0, cache_modifier=".cg")
        y = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
        if PRELOAD:  # the next phase's weights: they do not wait for this phase's output
            w = tl.load(w_ptr + tl.minimum(j + 1, PHASES - 1) * K * K + tile, mask=mask, other=0.0)
        tl.store(x_ptr + (j + 1) * K + n, y.to(x_ptr.dtype.element_ty), mask=n < K)
        _grid_sync(sync_ptr, (j + 1) * programs, True)
    _grid_exit(sync_ptr, programs, True)


def persistent_chain(chains: int = 48, k: int = 1280) -> None:
    weights = torch.randn(chains, k, k, device="cuda", dtype=torch.float16) / 40
    x = torch.zeros(chains + 1, k, device="cuda", dtype=torch.float16)
    x[0].normal_()
    sync = torch.zeros(3, dtype=torch.int32, device="cuda")
    expected = x[0].float()
    for w in weights:
        expected = (w.float() @ expected).half().float()
    for rows, warps in ((8, 4), (16, 8), (16, 4)):
        for preload in (False, True):

            def run(rows: int = rows, warps: int = warps, preload: bool = preload) -> None:
                _persistent_chain_kernel[(triton.cdiv(k, rows),)](
                    weights, x, sync, PHASES=chains, K=k, BLOCK_K=triton.next_power_of_2(k),
                    ROWS=rows, PRELOAD=preload, num_warps=warps,
                )  # fmt: skip

            run()
            torch.cuda.synchronize()
            error = float((x[-1].float() - expected).norm() / expected.norm())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                run()
            us = do_bench(graph.replay, warmup=25, rep=200, return_mode="median") * 1e3 / chains
            print(
                f"persistent rows 1 {k}x{k}, {triton.cdiv(k, rows)} programs of {rows} outputs,"
                f" {warps} warps, preload={preload}: {us:.2f} us/phase"
                f" ({k * k * 2 / us / 1e3:.0f} GB/s), rel. error {error:.1e},"
                f" give-up flag {int(sync[2])}",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--persistent", action="store_true")
    if parser.parse_args().persistent:
        persistent_chain()
    chains = 48
    for rows, k, config in (
        (1, 1280, (32, 128, 4, 3)),
        (1, 2560, (32, 128, 4, 3)),
        (16, 1280, (16, 256, 4, 3)),
    ):
        weights = [
            torch.randn(k, k, device="cuda", dtype=torch.float16) / 40 for _ in range(chains)
        ]
        x0 = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        for pdl in (False, True, False, True):
            kernels.USE_PDL = pdl

            def chain(x: torch.Tensor = x0, weights=weights, config=config) -> None:
                for w in weights:
                    x = kernels.skinny_linear(x, w, None, False, config)

            chain()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain()
            graphed = do_bench(graph.replay, warmup=25, rep=200, return_mode="median") / chains
            eager = do_bench(chain, warmup=25, rep=200, return_mode="median") / chains
            gbps = k * k * 2 / (graphed * 1e-3) / 1e9
            print(
                f"rows {rows} {k}x{k} pdl={pdl}: graphed {graphed * 1e3:.2f} us/kernel"
                f" ({gbps:.0f} GB/s), eager {eager * 1e3:.2f} us/kernel",
                flush=True,
            )


if __name__ == "__main__":
    main()
