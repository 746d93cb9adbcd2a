"""The step matmuls' stream kernel configs, chosen in the step itself (kernels.STEP_CONFIGS).

Timing each matmul's config alone misses what a kernel overlaps with its neighbours under PDL,
and such picks moved between jobs (the same step came out 1.69 and 1.85 ms on one H200). This
times the whole graphed greedy step instead: for a preset and batch, coordinate descent over the
step's matmul shapes, each shape's candidate configs (`kernels.STREAM_CANDIDATES`,
`quantize.QUANTIZED_CANDIDATES`) tried with the others held, two passes, from the tables'
configs.

    python benchmarks/tune_step.py --preset large-v3 --batch 1 16 [--roles logits]
    python benchmarks/tune_step.py --preset large-v3 --batch 1 16 --compute-type int8  # quantize's

Prints each tuned choice under its key in `kernels.STEP_CONFIGS` /
`quantize.STREAM_CONFIGS`, (rows, `kernels.step_role`[, weight dtype]), to copy there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpu import eot_for, prompt_for

from whisperforge import kernels, quantize
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
        rt.greedy(batch, steps, eot, suppress=[eot], stop=False)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / (steps - 1))
    return statistics.median(times[1:])


def tune(
    name: str, batch: int, steps: int, passes: int, compute_type: str, roles: list[str] | None
) -> dict[tuple, tuple]:
    """The step's stream kernel configs for `compute_type` (float16, or int8 / float8 weights,
    whose choices quantize.py keeps), by coordinate descent on the whole step's time."""
    c = preset(name)
    model = random_model(c, seed=0, device="cuda", dtype=torch.float16)
    if compute_type == "float16":
        choice, candidates = kernels._linear_choice, kernels.STREAM_CANDIDATES
    else:
        quantize.quantize_model(model, quantize.COMPUTE_TYPES[compute_type][1])
        choice, candidates = quantize._quantized_choice, quantize.QUANTIZED_CANDIDATES
    rt = Runtime(model, "float16", max_windows=batch, max_rows=batch)
    torch.manual_seed(0)
    mel = torch.randn(batch, c.n_mels, 3000, device="cuda", dtype=torch.float16)
    features = rt.encoder(mel).clone()
    prompt, eot = prompt_for(c), eot_for(c)
    choice.clear()
    first = step_ms(rt, features, prompt, eot, steps)  # the runtime's own choice of configs
    # Keys are (rows, N, K, ...); a tuple is a stream kernel config (else cuBLAS or another op).
    keys = [k for k, v in choice.items() if isinstance(v, tuple) and k[0] == batch]
    if roles:
        keys = [k for k in keys if kernels.step_role(k[1], k[2]) in roles]
    print(f"{name} {compute_type} b{batch}: {first:.4f} ms/step, runtime's configs", flush=True)
    best = first
    for _ in range(passes):
        for key in keys:
            chosen = choice[key]
            for config in candidates:
                if key[2] % config[1] or config == chosen:
                    continue
                choice[key] = config
                ms = step_ms(rt, features, prompt, eot, steps)
                if ms < best * 0.997:  # a real gain, not the noise between two runs
                    best, chosen = ms, config
            choice[key] = chosen
            print(f"  {key}: {chosen} -> {best:.4f} ms/step", flush=True)
    final = step_ms(rt, features, prompt, eot, steps)
    print(f"{name} {compute_type} b{batch}: {final:.4f} ms/step tuned (first {first:.4f})")
    return {k: choice[k] for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="large-v3")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--compute-type", default="float16", choices=["float16", "int8", "float8"])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--roles", nargs="+", help="only these `kernels.step_role`s (default all)")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for batch in args.batch:
        table = tune(args.preset, batch, args.steps, args.passes, args.compute_type, args.roles)
        for key, config in sorted(table.items(), key=str):
            # As the tables key it: (1 row or up to 16, role[, int8 / fp8 weight dtype]).
            rows, role = 1 if key[0] == 1 else 16, kernels.step_role(key[1], key[2])
            quantized = (key[3],) if args.compute_type != "float16" else ()
            print(f"    {(rows, role, *quantized)}: {config},  # {key}")


if __name__ == "__main__":
    main()
