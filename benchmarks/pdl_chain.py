"""Does programmatic dependent launch pay inside a CUDA graph? A chain of dependent step matmuls
(square: each one's output is the next one's input, each on its own weights, more weights than L2
holds), captured in a graph, with the runtime's PDL off and on: time per kernel and the
bandwidth it reaches.

    python3 benchmarks/pdl_chain.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from triton.testing import do_bench

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from whisperforge import runtime


def main() -> None:
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
            runtime.USE_PDL = pdl

            def chain(x: torch.Tensor = x0, weights=weights, config=config) -> None:
                for w in weights:
                    x = runtime.skinny_linear(x, w, None, False, config)

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
