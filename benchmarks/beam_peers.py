"""Beam search a step, whisperforge against its peers, on the same real weights and audio (issue 4).

`transcribe`'s default decode is beam search with 5 beams. Real tiny.en (float16) on one 30 s
window (the clips put end to end) and on 16 windows (a clip each): whisperforge's
`decoding.decode` (timestamps, the reference's rules), openai-whisper's `DecodingTask` (the same
algorithm) and HF transformers' `generate(num_beams=5)` (sdpa, and static cache + compile; its
generic beam search, without Whisper's timestamp rules). A peer's step is the median gap between
two calls of a logits filter recording a CUDA event; whisperforge's is the whole decode's time
(prefill included) over its steps, median of `--runs`.

    python3 benchmarks/beam_peers.py --model /tmp/tiny.en --audio clips.npz \
        --preset large-v3-turbo large-v3

`--preset` adds the larger architectures with random weights (tiny.en's vocabulary and
tokenizer) on random audio, 64 tokens at most (a random model's beams end anywhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpu import StepClock, hf_model, openai_model

from whisperforge import WhisperModel
from whisperforge.audio import N_FRAMES, N_SAMPLES, SAMPLE_RATE, log_mel_spectrogram, pad_or_trim
from whisperforge.decoding import DecodingOptions, decode
from whisperforge.presets import preset, random_model, unfuse_state_dict
from whisperforge.runtime import Runtime, RuntimeWhisper


def ours(model, tokenizer, features: torch.Tensor, options: DecodingOptions, runs: int) -> float:
    times = []
    with torch.inference_mode():
        for _ in range(runs + 2):
            start = time.perf_counter()
            results = decode(model, tokenizer, features, options)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    steps = max(len(r.tokens) for r in results) + 1
    return statistics.median(times[2:]) * 1e3 / steps


def openai_whisper(model, mel: torch.Tensor) -> float:
    from whisper.decoding import DecodingOptions as OpenAIOptions
    from whisper.decoding import DecodingTask

    clock = StepClock()
    with torch.inference_mode():
        for clk in (StepClock(), clock):
            task = DecodingTask(model, OpenAIOptions(language="en", beam_size=5, fp16=True))
            task.logit_filters.append(clk)
            task.run(mel)
    return clock.step_ms()


def transformers(
    model, mel: torch.Tensor, sot: int, eot: int, static: bool, max_new_tokens: int
) -> float:
    from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList

    config = GenerationConfig(
        max_new_tokens=max_new_tokens, num_beams=5, do_sample=False, eos_token_id=eot, pad_token_id=eot,
        decoder_start_token_id=sot, cache_implementation="static" if static else None,
    )  # fmt: skip
    prompt = torch.full((mel.shape[0], 1), sot, device="cuda")
    clock = StepClock()
    with torch.inference_mode():
        for clk in (StepClock(), StepClock(), clock):  # the first compiles (static)
            GenerationMixin.generate(
                model, input_features=mel, decoder_input_ids=prompt, generation_config=config,
                logits_processor=LogitsProcessorList([clk]),
            )  # fmt: skip
    return clock.step_ms()


def compare(
    label: str, model, tokenizer, inputs: dict, canonical: dict, sample_len: int | None, runs: int
) -> None:
    """One row per input (name -> (mel, features)): whisperforge's step and each peer's."""
    config, sot, eot = model.config, tokenizer.sot, tokenizer.eot
    options = DecodingOptions(beam_size=5, language="en", sample_len=sample_len)
    for name, (mel, features) in inputs.items():
        row = {"whisperforge": ours(model, tokenizer, features, options, runs)}
        for peer in ("openai-whisper", "HF sdpa", "HF static + compile"):
            try:
                if peer == "openai-whisper":
                    fp32 = {k: v.float() for k, v in canonical.items()}
                    row[peer] = openai_whisper(openai_model(config, fp32), mel)
                else:
                    hf = hf_model(config, canonical)
                    row[peer] = transformers(
                        hf, mel, sot, eot, static=peer != "HF sdpa",
                        max_new_tokens=sample_len or config.n_text_ctx // 2,
                    )  # fmt: skip
                    del hf
            except Exception as error:  # noqa: BLE001 (a peer's failure is reported, not fatal)
                print(
                    f"{label}, {name}: {peer} failed: {type(error).__name__}: {error}", flush=True
                )
            torch.cuda.empty_cache()
        base = row["whisperforge"]
        print(
            f"{label}, beam 5, {name}: "
            + ", ".join(f"{k} {v:.3f} ms/step ({v / base:.1f}x)" for k, v in row.items()),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a model directory (tiny.en unpacked)")
    parser.add_argument("--audio", required=True, help="npz of 16 kHz int16 clips")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--preset", nargs="*", default=[], help="e.g. large-v3-turbo large-v3")
    args = parser.parse_args()
    model = WhisperModel(args.model, device="cuda", compute_type="float16")
    config = model.model.config
    tokenizer = model.tokenizer.with_options("en", "transcribe")
    clips = np.load(args.audio)
    audio = [clips[name].astype(np.float32) / 32768 for name in clips.files]

    def mel(windows: list[np.ndarray]) -> torch.Tensor:
        spectrograms = [
            pad_or_trim(log_mel_spectrogram(a, config.n_mels, N_SAMPLES, "cuda"), N_FRAMES)
            for a in windows
        ]
        return torch.stack(spectrograms).half()

    windows = {
        "1 window": mel([np.concatenate(audio)[: 30 * SAMPLE_RATE]]),
        "16 windows": mel([audio[i % len(audio)] for i in range(16)]),
    }
    inputs = {name: (m, model.encode(m)) for name, m in windows.items()}
    print(torch.cuda.get_device_name(), flush=True)
    canonical = unfuse_state_dict(model.model.state_dict())
    compare("tiny.en", model.decode_model, tokenizer, inputs, canonical, None, args.runs)
    # The larger architectures: random weights (tiny.en's vocabulary and tokenizer), random
    # audio, 64 tokens at most.
    for name in args.preset:
        c = dataclasses.replace(preset(name), n_vocab=config.n_vocab)
        plain = random_model(c, device="cuda", dtype=torch.float16)
        runtime = Runtime(plain, max_rows=80)
        generator = torch.Generator(device="cuda").manual_seed(0)
        inputs = {}
        for n in (1, 16):
            m = torch.randn(n, c.n_mels, N_FRAMES, device="cuda", generator=generator).half()
            inputs[f"{n} window{'s' if n > 1 else ''}"] = (m, runtime.encoder(m).clone())
        canonical = unfuse_state_dict(plain.state_dict())
        compare(name, RuntimeWhisper(runtime), tokenizer, inputs, canonical, 64, args.runs)
        del runtime, plain, canonical
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
