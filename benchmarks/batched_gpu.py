"""Batched (VAD) vs sequential transcription on the GPU, and against HF transformers' chunked
pipeline, in one process.

1. Real weights (`--model`, e.g. tiny.en) on a long recording (`--audio`, 16 kHz int16 .npy):
   sequential, batched, and batched without timestamps (whose greedy loop runs on the device);
   median wall time over `--runs` after a warm-up, RTFx, and WER against `--reference` if given.
2. The large-v3-turbo architecture with random fp16 weights on `--minutes` of audio (the
   recording repeated, cut into 3-minute files for `transcribe_many`), 100 forced tokens per
   window (EOT suppressed, no fallback): batched vs sequential whisperforge, and HF transformers
   doing what `pipeline("automatic-speech-recognition", chunk_length_s=30, batch_size=16)` does
   (30 s chunks every 20 s, its feature extractor, `generate` in batches of 16; the token-to-text
   step is left out, since no turbo tokenizer can be loaded offline).

    python benchmarks/batched_gpu.py --model .device/tiny.en --audio .device/longform.npy \
        --reference .device/longform.txt
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from devset import wer

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu.py's HF helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SR = 16000


def timed(fn, runs: int) -> tuple[float, object]:
    """Median wall seconds of fn() over `runs` after one warm-up, and its last result."""
    result = fn()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def real_weights(
    model_dir: str,
    audio: np.ndarray,
    reference: str | None,
    runs: int,
    out: Path | None,
    chains: list[int],
) -> None:
    from whisperforge import BatchedInferencePipeline, WhisperModel

    model = WhisperModel(model_dir, device="cuda")
    pipeline = BatchedInferencePipeline(model)
    seconds = len(audio) / SR
    modes = {
        "sequential": lambda: model.transcribe(audio, beam_size=1)[0],
        "batched": lambda: pipeline.transcribe(audio, beam_size=1)[0],
        "batched, no timestamps": lambda: pipeline.transcribe(
            audio, beam_size=1, without_timestamps=True
        )[0],
        # Each of `chains` stretches conditioned on its own text (transcribe's loop per chain).
        **{
            f"batched, conditioned, {n} chains": lambda n=n: pipeline.transcribe(
                audio, batch_size=n, beam_size=1, condition_on_previous_text=True
            )[0]
            for n in chains
        },
    }
    score = wer_against(reference)
    print(f"\n{model_dir} float16, {seconds:.0f} s, batch {pipeline.auto_batch_size()} (auto)")
    print("| mode | median s | RTFx | WER % |\n|---|---|---|---|")
    texts = {}
    for name, run in modes.items():
        median, text = timed(lambda run=run: "".join(s.text for s in run()), runs)
        texts[name] = {"seconds": median, "text": text}
        print(f"| {name} | {median:.2f} | {seconds / median:.0f} | {score(text)} |", flush=True)
    if out is not None:  # WER can then be scored where jiwer is installed
        (out / "batched_gpu_texts.json").write_text(json.dumps(texts, indent=1))


def wer_against(reference: str | None):
    """The text's WER against `reference`, as a table cell: "-" where there is no reference or
    no jiwer and openai-whisper (the GPU machine: score the saved texts elsewhere)."""
    scorable = all(importlib.util.find_spec(package) for package in ("jiwer", "whisper"))
    if reference is None or not scorable:
        return lambda text: "-"
    return lambda text: f"{100 * wer([reference], [text]):.2f}"


def turbo_model(device: str = "cuda", name: str = "large-v3-turbo", **model_options):
    """A WhisperModel of the large-v3-turbo architecture (or preset `name`) with random fp16
    weights (no turbo checkpoint loads offline; speed depends only on the shapes), and
    `WhisperModel`'s other options (device_index, num_workers, ...)."""
    from whisperforge import WhisperModel
    from whisperforge.checkpoints import Checkpoint
    from whisperforge.presets import preset, random_model, unfuse_state_dict

    config = preset(name)
    canonical = unfuse_state_dict(
        random_model(config, device=device, dtype=torch.float16).state_dict()
    )
    checkpoint = Checkpoint(config, canonical, None, None, "random weights")
    return WhisperModel(checkpoint, device, **model_options)


def forced_options(eot: int) -> dict:
    """Transcription options that make every window decode 100 tokens, whatever the random
    weights say (EOT, the tokenizer's `eot`, suppressed; no fallback, no no-speech skip)."""
    return {
        "language": "en", "beam_size": 1, "temperature": 0.0, "without_timestamps": True,
        "max_new_tokens": 100, "suppress_tokens": (-1, eot), "compression_ratio_threshold": None,
        "log_prob_threshold": None, "no_speech_threshold": None,
    }  # fmt: skip


def turbo(audio: np.ndarray, minutes: float, batches: list[int], runs: int) -> None:
    from gpu import hf_model

    from whisperforge import BatchedInferencePipeline
    from whisperforge.presets import unfuse_state_dict

    model = turbo_model()
    # The model's own weights for HF: a loaded WhisperModel keeps no second copy of them.
    config, canonical = model.checkpoint.config, unfuse_state_dict(model.model.state_dict())
    pipeline = BatchedInferencePipeline(model)
    total = int(minutes * 60 * SR)
    long = np.resize(audio, total)  # the recording repeated
    files = [long[i : i + 180 * SR] for i in range(0, total, 180 * SR)]
    eot = model.tokenizer.eot
    forced = forced_options(eot)
    seconds = total / SR
    print(f"\nlarge-v3-turbo, random fp16 weights, {seconds / 60:.0f} min in {len(files)} files, "
          "100 forced tokens per window")  # fmt: skip
    print("| engine | median s | RTFx | windows |\n|---|---|---|---|")

    def batched(batch: int) -> int:
        results = pipeline.transcribe_many(files, batch_size=batch or None, **forced)
        return sum(len(r.segments) for r in results)

    for batch in batches:
        median, windows = timed(lambda batch=batch: batched(batch), runs)
        label = batch or f"auto: {pipeline.auto_batch_size()}"
        print(f"| whisperforge batched ({label}) | {median:.2f} | {seconds / median:.0f} | "
              f"{windows} |", flush=True)  # fmt: skip
    from whisperforge.vad import detect_speech

    for device in ("cuda", "cpu"):
        start = time.perf_counter()
        for f in files:
            detect_speech(f, device=device)
        vad = time.perf_counter() - start
        print(f"| (VAD alone, {device}, one thread) | {vad:.2f} | | |", flush=True)

    def sequential() -> int:
        return len(list(model.transcribe(long, **forced)[0]))

    median, windows = timed(sequential, 1)
    print(f"| whisperforge sequential | {median:.2f} | {seconds / median:.0f} | {windows} |")

    hf = hf_model(config, canonical)
    median, chunks = timed(lambda: hf_chunked(hf, config, long, eot, batch=16), 1)
    print(f"| HF transformers chunked, batch 16 | {median:.2f} | {seconds / median:.0f} | "
          f"{chunks} |", flush=True)  # fmt: skip


def hf_chunked(model, config, audio: np.ndarray, eot: int, batch: int) -> int:
    """The HF ASR pipeline's chunk_length_s=30 path: 30 s chunks with 5 s strides on each side,
    log-mel by its feature extractor on the CPU, generate in batches."""
    from gpu import prompt_for
    from transformers import GenerationConfig, GenerationMixin, WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=config.n_mels)
    chunk, step = 30 * SR, 20 * SR
    starts = range(0, max(1, len(audio) - 10 * SR), step)
    generation = GenerationConfig(
        max_new_tokens=100, do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=eot,
        decoder_start_token_id=eot + 1, suppress_tokens=[eot],
    )  # fmt: skip
    with torch.inference_mode():
        for i in range(0, len(starts), batch):
            pieces = [audio[s : s + chunk] for s in starts[i : i + batch]]
            features = extractor(pieces, sampling_rate=SR, return_tensors="pt").input_features
            features = features.to("cuda", torch.float16)
            prompt = torch.tensor([prompt_for(config)] * len(pieces), device="cuda")
            GenerationMixin.generate(
                model, input_features=features, decoder_input_ids=prompt,
                generation_config=generation,
            )  # fmt: skip
    return len(starts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--model", help="real weights (folder or .pt) for part 1")
    parser.add_argument("--audio", required=True, help="16 kHz int16 .npy recording")
    parser.add_argument("--reference", help="its reference text, for WER")
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument(
        "--batch",
        type=int,
        nargs="+",
        default=[16, 64],
        help="batch sizes of the turbo run (0: the automatic one)",
    )
    parser.add_argument("--out", type=Path, help="folder for the real-weights texts (JSON)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-turbo", action="store_true")
    parser.add_argument("--chains", type=int, nargs="*", default=[8, 16, 64],
                        help="conditioned batched mode with these numbers of chains")  # fmt: skip
    args = parser.parse_args()

    audio = np.load(args.audio).astype(np.float32) / 32768
    reference = Path(args.reference).read_text() if args.reference else None
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    if args.model:
        real_weights(args.model, audio, reference, args.runs, args.out, args.chains)
    if not args.skip_turbo:
        turbo(audio, args.minutes, args.batch, args.runs)


if __name__ == "__main__":
    main()
