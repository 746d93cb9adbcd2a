"""Quantized weights on the GPU: decode step ms at batch 1 and 16, int8 and fp8 against fp16.

One job, the runtime only (benchmarks/gpu.py's measurement: `bench_runtime`, 64 forced tokens,
EOT suppressed), random fp16 weights of the real architectures (seed 0), quantized in place by
`quantize.quantize_model` as `WhisperModel(..., compute_type=...)` does. Before timing, a check
on the `tiny` preset: the graphed runtime on quantized weights against the plain quantized model
(eager), and the Triton fp8 row quantizer against its torch reference. Weight memory is
`torch.cuda.memory_allocated` after building (and quantizing) a model; "step weights" is what
one decode step reads (the decoder's step linears and the tied embedding). Prints markdown, and
writes the figures as JSON to --out (default: $OUT/quantize_gpu.json when $OUT is set).

Time: each (preset, type) is measured only while the job is under --budget-s (default 75 s;
the rest is reported as skipped), so the whole run stays under ~90 s on an H100. The order puts
batch 1 of every type first, then batch 16.

    python benchmarks/quantize_gpu.py                  # turbo and large-v3, batch 1 and 16
    python benchmarks/quantize_gpu.py --preset large-v3-turbo --types float16 int8 --batch 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/gpu.py's helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import gpu as bench

from whisperforge import quantize
from whisperforge.model import ModelConfig, Whisper
from whisperforge.presets import preset, random_model
from whisperforge.runtime import Runtime


def build(c: ModelConfig, compute_type: str) -> tuple[Whisper, int]:
    """The preset with random fp16 weights, quantized for `compute_type`; its bytes on the GPU."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    model = random_model(c, seed=0, device="cuda", dtype=torch.float16)
    quantize.quantize_model(model, quantize.COMPUTE_TYPES[compute_type][1])
    torch.cuda.synchronize()
    return model, torch.cuda.memory_allocated() - before


def step_weight_bytes(model: Whisper) -> int:
    """Bytes one decode step reads of weights: the step linears and the tied embedding."""
    dec = model.decoder
    modules = [dec.token_embedding] + [
        block.get_submodule(part) for block in dec.blocks for part in quantize.STEP_LINEARS
    ]
    return sum(t.nbytes for m in modules for t in (*m.parameters(), *m.buffers()))


@torch.inference_mode()
def check(steps: int = 16) -> list[str]:
    """tiny preset: graphed runtime on quantized weights vs the plain quantized model (eager,
    teacher-forced, 2 windows x 2 rows), and fp8 rows (Triton) vs the torch reference."""
    c = preset("tiny")
    lines = []
    x = torch.randn(16, 1280, device="cuda", dtype=torch.float16) * 3
    q, _ = quantize.fp8_rows(x)
    reference = (x.float() / (x.float().abs().amax(1, keepdim=True) / 448)).to(q.dtype)
    same = torch.equal(q.view(torch.uint8), reference.view(torch.uint8))
    lines.append(f"fp8 rows, Triton == torch: {same}")
    for compute_type in ("int8", "float8"):
        plain = random_model(c, seed=1, device="cuda", dtype=torch.float16)
        features = plain.encoder(torch.randn(2, c.n_mels, 3000, device="cuda", dtype=torch.float16))
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(0, 50000, (4, 5 + steps), generator=g).cuda()
        float_logits = plain.decoder.logits(
            plain.decoder(tokens, audio_features=features.repeat_interleave(2, 0))
        )
        quantize.quantize_model(plain, quantize.COMPUTE_TYPES[compute_type][1])
        rt = Runtime(plain, max_windows=2, max_rows=4)
        batch = rt.prefill(rt.cross(features), tokens[:, :5], group=2)
        worst = 0.0
        for t in range(5, 5 + steps):
            logits = rt.step(batch, tokens[:, t]).clone()
            hidden = plain.decoder(
                tokens[:, : t + 1], audio_features=features.repeat_interleave(2, 0)
            )
            expected = plain.decoder.logits(hidden[:, -1])
            worst = max(worst, float((logits - expected).norm() / expected.norm()))
        quantized_logits = plain.decoder.logits(
            plain.decoder(tokens, audio_features=features.repeat_interleave(2, 0))
        )
        error = float((quantized_logits - float_logits).norm() / float_logits.norm())
        lines.append(
            f"{compute_type}: graphed runtime vs plain quantized model, worst relative logits "
            f"error over {steps} steps {worst:.1e}; quantized vs float16 model {error:.1e}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", nargs="+", default=["large-v3-turbo", "large-v3"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--types", nargs="+", default=["float16", "int8", "float8"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--budget-s", type=float, default=75.0, help="start no measurement after")
    out_dir = os.environ.get("OUT")
    default_out = Path(out_dir) / "quantize_gpu.json" if out_dir else None
    parser.add_argument("--out", type=Path, default=default_out, help="the figures as JSON")
    args = parser.parse_args()
    start = time.perf_counter()
    name = torch.cuda.get_device_name()
    fp8 = torch.cuda.get_device_capability() >= (8, 9)
    types = [t for t in args.types if fp8 or quantize.COMPUTE_TYPES[t][1] != "float8"]
    bw, tflops = bench.ceilings()
    print(f"device: {name}; copy {bw:.0f} GB/s, fp16 matmul {tflops:.0f} TFLOP/s; "
          f"torch {torch.__version__}; fp8: {fp8}")  # fmt: skip
    try:
        for line in check():
            print("check:", line, flush=True)
    except Exception as error:  # noqa: BLE001 - reported; the timings still run
        print(f"check failed: {type(error).__name__}: {error}"[:600], flush=True)

    results: dict = {"device": name, "copy_GBps": bw, "presets": {}, "skipped": []}
    for batches in ([b] for b in args.batch):  # every type at batch 1 before any at batch 16
        for preset_name in args.preset:
            c = preset(preset_name)
            entry: dict = results["presets"].setdefault(preset_name, {})
            for compute_type in types:
                if time.perf_counter() - start > args.budget_s:
                    results["skipped"].append(f"{preset_name} {compute_type} b{batches[0]}")
                    print(f"skipped (over --budget-s): {results['skipped'][-1]}", flush=True)
                    continue
                model = rt = None
                try:
                    model, nbytes = build(c, compute_type)
                    rt = Runtime(model, max_windows=max(batches))
                    row: dict = entry.setdefault(compute_type, {"batches": {}})
                    row["weights_GB"] = nbytes / 1e9
                    row["step_weights_GB"] = step_weight_bytes(model) / 1e9
                    for batch in batches:
                        figures = bench.bench_runtime(rt, c, batch, args.tokens, bw, tflops)
                        # The floor with this model's step weights instead of fp16 ones.
                        fp16_weights = bench.step_bytes(c, windows=0, rows=0, length=0)
                        extra = (row["step_weights_GB"] * 1e9 - fp16_weights) / bw / 1e6
                        figures["step_floor_ms"] += extra
                        row["batches"][batch] = figures
                        print(f"{preset_name} {compute_type} b{batch}: {figures['step_ms']:.3f} "
                              f"ms/step (floor {figures['step_floor_ms']:.3f}), prefill "
                              f"{figures['prefill_ms']:.2f} ms, weights {row['weights_GB']:.2f} GB "
                              f"({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
                except Exception as error:  # noqa: BLE001 - one failing type is reported, not fatal
                    message = f"{type(error).__name__}: {error}"[:400]
                    entry.setdefault(compute_type, {})["error"] = message
                    print(f"{preset_name} {compute_type} failed: {message}", flush=True)
                finally:
                    del model, rt
                    torch.cuda.empty_cache()
    choices = {str(k[:3]) + f" {str(k[3])[6:]}": getattr(v, "__name__", v)
               for k, v in quantize._quantized_choice.items()}  # fmt: skip
    print(
        f"quantized matmul choices (M, N, K, weights) -> Triton (block_n, block_k, warps, stages) or a function: {choices}"
    )
    print(f"fp8 _scaled_mm output dtype per activation dtype: {quantize._fp8_out}")

    print(f"\n### decode step, ms ({args.tokens} forced tokens; x = fp16 ms / this ms)\n")
    print("| preset | batch | " + " | ".join(types) + " |")
    print("|---|---|" + "---|" * len(types))
    for preset_name, entry in results["presets"].items():
        for batch in args.batch:
            base = entry.get("float16", {}).get("batches", {}).get(batch, {}).get("step_ms")
            cells = []
            for t in types:
                figures = entry.get(t, {}).get("batches", {}).get(batch)
                if figures is None:
                    cells.append("-")  # failed or skipped: said above
                    continue
                ratio = f" ({base / figures['step_ms']:.2f}x)" if base and t != "float16" else ""
                cells.append(
                    f"{figures['step_ms']:.3f}{ratio}, floor {figures['step_floor_ms']:.3f}"
                )
            print(f"| {preset_name} | {batch} | " + " | ".join(cells) + " |")
    print("\n### weights on the GPU, GB (all / read per decode step)\n")
    print("| preset | " + " | ".join(types) + " |")
    print("|---|" + "---|" * len(types))
    for preset_name, entry in results["presets"].items():
        cells = [
            f"{entry[t]['weights_GB']:.2f} / {entry[t]['step_weights_GB']:.2f}"
            if "weights_GB" in entry.get(t, {}) else "-"
            for t in types
        ]  # fmt: skip
        print(f"| {preset_name} | " + " | ".join(cells) + " |")
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
