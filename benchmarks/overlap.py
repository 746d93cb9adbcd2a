"""Is a batch's decode faster as smaller batches stepping side by side on their own streams?

At 16 windows a step is ~8 latency-bound stages a layer (each a few µs over its weight bytes,
HBM mostly idle) plus one cross-attention that streams 16 windows' K,V at near copy speed. Two
half batches on two streams could run one half's cross-attention while the other's latency-bound
stages run, at the price of reading the weights once per half. This times, for a preset's random
fp16 weights and a forced greedy decode, one `Runtime` of all the windows against 2 or 4
runtimes of a share each, their greedy loops queued on their own streams at once (runs
alternating, median ms per step), and checks the tokens are the same.

    python benchmarks/overlap.py --preset large-v3-turbo large-v3 --windows 16 --splits 1 2 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpu import eot_for, prompt_for

from whisperforge.presets import preset, random_model
from whisperforge.runtime import Runtime


def decode(
    runtimes: list[Runtime], features: torch.Tensor, prompt: list[int], eot: int, tokens: int,
    streams: list[torch.cuda.Stream],
) -> tuple[float, torch.Tensor]:  # fmt: skip
    """ms per step of every runtime's greedy decode of its share of the windows, each queued on
    its own stream at once; and the tokens of all rows."""
    main = torch.cuda.current_stream()
    share = features.shape[0] // len(runtimes)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    results = []
    start.record()
    for i, (rt, stream) in enumerate(zip(runtimes, streams)):
        stream.wait_stream(main)
        with torch.cuda.stream(stream):
            cross = rt.cross(features[i * share : (i + 1) * share])
            batch = rt.prefill(cross, [prompt] * share)
            results.append(rt.greedy(batch, tokens, eot, suppress=[eot], stop=False))
    for stream in streams:
        main.wait_stream(stream)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (tokens - 1), torch.cat([r.tokens for r in results])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", nargs="+", default=["large-v3-turbo", "large-v3"])
    parser.add_argument("--windows", type=int, nargs="+", default=[16])
    parser.add_argument("--splits", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for name in args.preset:
        c = preset(name)
        model = random_model(c, seed=0, device="cuda", dtype=torch.float16)
        prompt, eot = prompt_for(c), eot_for(c)
        for windows in args.windows:
            torch.manual_seed(0)
            mel = torch.randn(windows, c.n_mels, 3000, device="cuda", dtype=torch.float16)
            variants = {}
            for splits in args.splits:
                share = windows // splits
                rts = [Runtime(model, max_windows=share) for _ in range(splits)]
                streams = [torch.cuda.Stream() for _ in range(splits)]
                variants[splits] = (rts, streams)
            features = Runtime(model, max_windows=windows).encoder(mel).clone()
            torch.cuda.empty_cache()
            times: dict[int, list[float]] = {s: [] for s in variants}
            tokens: dict[int, torch.Tensor] = {}
            for run in range(args.runs + 1):  # the first: graphs and kernels
                order = list(variants) if run % 2 else list(reversed(variants))
                for splits in order:
                    ms, tok = decode(*variants[splits][:1], features, prompt, eot, args.tokens,
                                     variants[splits][1])  # fmt: skip
                    if run:
                        times[splits].append(ms)
                    tokens[splits] = tok
            base = statistics.median(times[args.splits[0]])
            for splits, ts in times.items():
                ms = statistics.median(ts)
                same = (tokens[splits] == tokens[args.splits[0]]).all(dim=1).sum().item()
                print(
                    f"{name} {windows} windows as {splits} x {windows // splits}: "
                    f"{ms:.4f} ms/step (runs {' '.join(f'{t:.4f}' for t in ts)}), "
                    f"x{base / ms:.2f} vs {args.splits[0]} x {windows // args.splits[0]}, "
                    f"rows with the same tokens {same}/{windows}",
                    flush=True,
                )
            del variants
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
