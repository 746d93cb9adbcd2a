"""int8 on the CPU: whisperforge int8 vs fp32 vs faster-whisper int8 (and fp32) and whisper.cpp
q8_0 (and f16), in one job.

Same tiny.en weights for all (faster-whisper runs the packaged CTranslate2 folder itself,
whisper.cpp the ggml file `engine_process.write_ggml` writes from them), the exact-reference
English dev clips decoded once, the same thread count. Speed: each engine transcribes every clip
once to warm up, then `--runs` times (the engines take turns within each run); the median wall
time per pass. Memory: the bytes whisperforge's weights take as stored (whisper.cpp's: its
file), and the RSS growth while each engine's model loads. Each engine runs in a process of its
own (`engine_process`: PyTorch's and CTranslate2's thread pools slow each other in one process).
WER (EnglishTextNormalizer + jiwer) of every engine's transcripts; then, greedy, for each of
`--wer-models`: fp32, int8 (the CPU's: every linear fbgemm int8, `quantize.Int8Linear`), the
2026-11-22 CPU recipe for comparison (`int8-torch-ao`: torch.ao's dynamic Linear, one 7-bit
activation scale per call) and the GPU's recipes run on the CPU (weight-only int8 step linears;
float8 through torch._scaled_mm), on the same clips and, with `--long`, the 19-minute file; with
how many transcripts equal float32's. Whether int8 activations get 8 bits or 7 depends on the
CPU (`quantize.int8_overflows`, printed first); FBGEMM_ENABLE_INSTRUCTIONS=AVX2 in the
environment makes fbgemm run as on a CPU without VNNI.

    python benchmarks/quantize_cpu.py                       # speed + WER, tiny.en and base
    python benchmarks/quantize_cpu.py --runs 1 --modes greedy --wer-models tiny.en --long
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import warnings
from functools import partial
from pathlib import Path

import torch
from devset import DEV_DIR, LONG_FILE, manifest, wer
from engine_process import EngineProcess, Transcribe, peer, peer_weights, transcript

ENGINES = [
    "whisperforge-float32",
    "whisperforge-int8",
    "faster-whisper-float32",
    "faster-whisper-int8",
    "whisper.cpp-f16",
    "whisper.cpp-q8_0",
]
# The GPU's recipes, emulated on the CPU for their accuracy (quantize_model(..., dynamic=False)).
WER_VARIANTS = ["float32", "int8", "int8-torch-ao", "int8-weight-only", "float8"]


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights as stored: parameters, buffers, and the int8 weights and scales that
    PyTorch's dynamic int8 linears keep packed outside them."""
    from whisperforge.quantize import Int8Linear

    total = sum(t.nbytes for t in (*model.parameters(), *model.buffers()))
    for module in model.modules():
        if isinstance(module, Int8Linear):  # its bias is a parameter, counted above
            weight, _ = module.weight_bias()
            total += weight.numel() + weight.q_per_channel_scales().numel() * 4
        elif isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            weight, bias = module._weight_bias()
            total += weight.numel() + weight.q_per_channel_scales().numel() * 4
            total += 0 if bias is None else bias.nbytes
    return total


def torch_ao_recipe(model: torch.nn.Module) -> None:
    """The CPU's int8 as of 2026-11-22, for comparison: each `Int8Linear` (and the logits
    projection) becomes torch.ao's dynamic Linear on the same int8 weights, whose activations
    get one 7-bit scale per call."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    from whisperforge.quantize import Int8Linear

    for name, module in list(model.named_modules()):
        if isinstance(module, Int8Linear):
            weight, bias = module.weight_bias()
            old = DynamicLinear(module.in_features, module.out_features, bias_=bias is not None)
            old.set_weight_bias(weight, None if bias is None else bias.detach())
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, old)


def whisperforge(name: str, variant: str, threads: int):
    """WhisperModel for a WER variant: a compute type, or a GPU recipe on the CPU."""
    from whisperforge import WhisperModel
    from whisperforge.quantize import quantize_model

    if variant in ("float32", "int8"):
        return WhisperModel(name, device="cpu", compute_type=variant, cpu_threads=threads)
    if variant == "int8-torch-ao":
        model = WhisperModel(name, device="cpu", compute_type="int8", cpu_threads=threads)
        torch_ao_recipe(model.model)
        return model
    model = WhisperModel(name, device="cpu", compute_type="float32", cpu_threads=threads)
    quantize_model(model.model, variant.removesuffix("-weight-only"), dynamic=False)
    return model


def engine(name: str, threads: int, weights: str | None) -> tuple[Transcribe, dict]:
    """The engine `name` as (audio, beam_size) -> text, built in the process that runs it on
    `weights` (`peer_weights`), and its weights' bytes as stored (whisperforge's and
    whisper.cpp's; None for faster-whisper)."""
    if name.startswith("whisperforge-"):
        model = whisperforge("tiny.en", name.removeprefix("whisperforge-"), threads)
        return partial(transcript, model), {"weights_MB": weight_bytes(model.model) / 1e6}
    transcribe, figures = peer(name, threads, weights)
    return transcribe, {"weights_MB": None, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", nargs="*", default=ENGINES, choices=ENGINES)
    parser.add_argument(
        "--modes", nargs="*", default=["greedy", "beam5"], choices=["greedy", "beam5"]
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--wer-models", nargs="*", default=["tiny.en", "base"])
    parser.add_argument("--wer-variants", nargs="*", default=WER_VARIANTS, choices=WER_VARIANTS)
    parser.add_argument("--long", action="store_true", help="WER on the 19-minute file too")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    warnings.simplefilter("ignore", UserWarning)  # torch.ao's quantized tensors: deprecation

    from whisperforge import load_audio
    from whisperforge.quantize import int8_overflows

    torch.set_num_threads(args.threads)
    clips = [r for r in manifest() if r["language"] == "en" and r["ref_kind"] == "exact"]
    audios = [load_audio(DEV_DIR / r["audio"]) for r in clips]
    references = [r["text"] for r in clips]
    seconds = sum(len(a) for a in audios) / 16000
    print(f"{len(clips)} clips, {seconds:.1f} s of audio, {args.threads} threads, "
          f"median of {args.runs}; torch {torch.__version__}, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, int8 activations "
          f"{7 if int8_overflows() else 8} bits", flush=True)  # fmt: skip

    report: dict = {"speed": {}, "memory": {}, "wer": {}}
    built = {}
    for name in args.engines:  # each in a process of its own (`engine_process`)
        factory = partial(engine, name, args.threads, peer_weights(name))
        built[name] = EngineProcess(factory, audios, args.threads)
        report["memory"][name] = built[name].info
        print(f"  loaded {name}: RSS +{built[name].info['rss_growth_MB']:.0f} MB", flush=True)
    for mode in args.modes:
        beam = 5 if mode == "beam5" else 1
        texts = {name: process.transcribe(beam)[1] for name, process in built.items()}  # warm-up
        times: dict[str, list[float]] = {name: [] for name in built}
        for _ in range(args.runs):  # engines interleaved, so a load change hits all alike
            for name, process in built.items():
                times[name].append(process.transcribe(beam)[0])
        for name in built:
            median = statistics.median(times[name])
            report["speed"][f"{mode}/{name}"] = median
            report["wer"][f"{mode}/{name}"] = wer(references, texts[name])
            print(f"  {mode:6} {name:24} {median:7.2f} s  RTFx {seconds / median:6.1f}  "
                  f"WER {100 * report['wer'][f'{mode}/{name}']:.2f} %", flush=True)  # fmt: skip

    print("\n| mode | engine | median s | RTFx | time / whisperforge fp32 | WER % |")
    print("|---|---|---|---|---|---|")
    for key, median in report["speed"].items():
        mode = key.split("/")[0]
        ours = report["speed"].get(f"{mode}/whisperforge-float32")
        ratio = f"{median / ours:.2f}" if ours else "-"
        wer_pct = 100 * report["wer"][key]
        print(f"| {mode} | {key.split('/')[1]} | {median:.2f} | {seconds / median:.1f} | {ratio} | {wer_pct:.2f} |")  # fmt: skip
    for mode in args.modes:
        ours = report["speed"].get(f"{mode}/whisperforge-int8")
        fw = report["speed"].get(f"{mode}/faster-whisper-int8")
        if ours and fw:
            print(
                f"{mode}: whisperforge int8 takes {ours / fw:.2f}x the time of faster-whisper int8"
            )
    print("\n| engine | weights MB (as stored) | RSS growth on load MB |\n|---|---|---|")
    for name, memory in report["memory"].items():
        weights = f"{memory['weights_MB']:.1f}" if memory["weights_MB"] else "-"
        print(f"| {name} | {weights} | {memory['rss_growth_MB']:.0f} |")
    for process in built.values():
        process.close()

    sets = [("dev clips", audios, references)]
    if args.long:
        row = next(r for r in manifest() if r["audio"] == LONG_FILE)
        sets.append(("19-minute file", [load_audio(DEV_DIR / LONG_FILE)], [row["text"]]))
    rows = []
    transcripts: dict[str, list[str]] = {}
    for model_name in args.wer_models:
        for variant in args.wer_variants:
            model = whisperforge(model_name, variant, args.threads)
            for set_name, set_audios, set_references in sets:
                start = time.perf_counter()
                texts = [transcript(model, audio, 1) for audio in set_audios]
                figure = wer(set_references, texts)
                transcripts[f"{model_name}/{variant}/{set_name}"] = texts
                fp32 = transcripts.get(f"{model_name}/float32/{set_name}")
                same = f"{sum(a == b for a, b in zip(texts, fp32))}/{len(texts)}" if fp32 else "-"
                took = time.perf_counter() - start
                rows.append((model_name, variant, set_name, figure, same, took))
                report["wer"][f"greedy/{model_name}/{variant}/{set_name}"] = figure
                print(f"  {model_name} {variant} {set_name}: WER {100 * figure:.2f} % "
                      f"(= float32: {same}; {took:.0f} s)", flush=True)  # fmt: skip
            del model
            gc.collect()
    report["transcripts"] = transcripts
    print(
        "\n| model | variant | set | greedy WER % | vs float32 (points) | text = float32's | s |"
        "\n|---|---|---|---|---|---|---|"
    )
    for model_name, variant, set_name, figure, same, took in rows:
        fp32 = report["wer"].get(f"greedy/{model_name}/float32/{set_name}")
        delta = f"{100 * (figure - fp32):+.2f}" if fp32 is not None else "-"
        print(f"| {model_name} | {variant} | {set_name} | {100 * figure:.2f} | {delta} | "
              f"{same} | {took:.0f} |")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
