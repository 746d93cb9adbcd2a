"""The step matmuls' stream kernel configs, chosen in the step itself (runtime.HOPPER_STEP_CONFIGS).

`linear` picks a config per shape by timing each alone, but under PDL a kernel's own time misses
what it overlaps with its neighbours, and the pick moves between jobs (the same step came out 1.69
and 1.85 ms on one H200). This times the whole graphed greedy step instead: for a preset and
batch, coordinate descent over the step's matmul shapes, each shape's candidate configs tried
with the others held, two passes, from the runtime's own choice (the table where it has the
shape, else each picked alone); prints the table to paste into the runtime.

    python benchmarks/tune_step.py --preset large-v3 --batch 1 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpu import eot_for, prompt_for

from whisperforge import runtime
from whisperforge.presets import preset, random_model
from whisperforge.runtime import Runtime


def step_ms(rt: Runtime, features: torch.Tensor, prompt: list[int], eot: int, steps: int) -> float:
    """Median ms per greedy step over 3 runs, with graphs captured afresh (a config is baked into
    the kernels a graph holds)."""
    rt._allocate(rt.max_windows, rt.max_rows)
    cross = rt.cross(features)
    times = []
    for _ in range(4):
        batch = rt.prefill(cross, [prompt] * features.shape[0])
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        rt.greedy(batch, steps, eot, suppress=[eot], check_every=0)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (steps - 1))
    return statistics.median(times[1:])


def tune(name: str, batch: int, steps: int, passes: int) -> dict[tuple, runtime.StreamConfig]:
    c = preset(name)
    model = random_model(c, seed=0, device="cuda", dtype=torch.float16)
    rt = Runtime(model, "float16", max_windows=batch, max_rows=batch)
    torch.manual_seed(0)
    mel = torch.randn(batch, c.n_mels, 3000, device="cuda", dtype=torch.float16)
    features = rt.encoder(mel).clone()
    prompt, eot = prompt_for(c), eot_for(c)
    runtime._linear_choice.clear()
    first = step_ms(rt, features, prompt, eot, steps)  # the runtime's own choice of configs
    keys = [k for k, v in runtime._linear_choice.items() if v is not None and k[0] == batch]
    print(f"{name} b{batch}: {first:.4f} ms/step with the runtime's configs", flush=True)
    best = first
    for _ in range(passes):
        for key in keys:
            chosen = runtime._linear_choice[key]
            for config in runtime._SKINNY_CONFIGS:
                if key[2] % config[1] or config == chosen:
                    continue
                runtime._linear_choice[key] = config
                ms = step_ms(rt, features, prompt, eot, steps)
                if ms < best * 0.997:  # a real gain, not the noise between two runs
                    best, chosen = ms, config
            runtime._linear_choice[key] = chosen
            print(f"  {key[:3]} partial={key[7]}: {chosen} -> {best:.4f} ms/step", flush=True)
    final = step_ms(rt, features, prompt, eot, steps)
    print(f"{name} b{batch}: {final:.4f} ms/step tuned (first {first:.4f})", flush=True)
    return {k: runtime._linear_choice[k] for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="large-v3")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    table = {}
    for batch in args.batch:
        for (M, N, K, _, bias, gelu, _, partial), config in tune(
            args.preset, batch, args.steps, args.passes
        ).items():
            table[(M, N, K, bias, gelu, partial)] = config
    print("HOPPER_STEP_CONFIGS = {  # (rows, N, K, bias, gelu, partial): config")
    for key, config in sorted(table.items()):
        print(f"    {key}: {config},")
    print("}")


if __name__ == "__main__":
    main()
