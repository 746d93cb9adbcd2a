"""What `decoding.decode` costs a step on the GPU, the host's time included (issue 4).

With real tiny.en a decode step is ~0.1 ms of GPU work, so the rest of a step's time is the
decode loop's own: the logit filters, the search's choice and its copy to the host, beam
search's reorder. Beam 5 and greedy, with timestamps (as `transcribe` decodes), on one 30 s
window (the clips put end to end) and on 16 windows (one clip each) at once; median ms per
step over `--runs` after three warm-ups, tokens per run printed so that code versions compare.
Then sampling (temperature 0.4, best of 5: the fallback's decode) with EOT suppressed, so that
every row runs `SAMPLED` steps, in turns on the runtime's device loop and on decoding's host
loop (`host_loop`).
`--preset` adds the larger architectures' decode loops, random weights (English vocabulary, the
model's tokenizer) on random audio features, 64 tokens at most.

    python3 benchmarks/decode_loop.py --model /tmp/tiny.en --audio clips.npz \
        --preset large-v3-turbo large-v3

clips.npz: 16 kHz int16 clips by name (as `gpu.py --check` takes them).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from whisperforge import WhisperModel
from whisperforge.audio import N_FRAMES, N_SAMPLES, SAMPLE_RATE, log_mel_spectrogram, pad_or_trim
from whisperforge.decoding import DecodingOptions, DecodingResult, decode
from whisperforge.model import Whisper
from whisperforge.presets import preset, random_model
from whisperforge.runtime import Runtime, RuntimeDecoder, RuntimeWhisper

SAMPLED = 96  # steps of every sampled row (EOT suppressed)


def arguments() -> argparse.ArgumentParser:
    """The options of this benchmark and of beam_peers.py."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a model directory (tiny.en unpacked)")
    parser.add_argument("--audio", required=True, help="npz of 16 kHz int16 clips")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--preset", nargs="*", default=[], help="e.g. large-v3-turbo large-v3")
    return parser


def dev_windows(model: WhisperModel, clips_path: str) -> dict[str, torch.Tensor]:
    """float16 mel of one 30 s window (the clips end to end) and of 16 windows (a clip each)."""
    clips = np.load(clips_path)
    audio = [clips[name].astype(np.float32) / 32768 for name in clips.files]
    n_mels = model.model.config.n_mels

    def mel(windows: list[np.ndarray]) -> torch.Tensor:
        spectrograms = [
            pad_or_trim(log_mel_spectrogram(a, n_mels, N_SAMPLES, "cuda"), N_FRAMES)
            for a in windows
        ]
        return torch.stack(spectrograms).half()

    return {
        "1 window": mel([np.concatenate(audio)[: 30 * SAMPLE_RATE]]),
        "16 windows": mel([audio[i % len(audio)] for i in range(16)]),
    }


def preset_runtime(name: str, n_vocab: int) -> tuple[Whisper, Runtime]:
    """A preset architecture with random float16 weights and `n_vocab` tokens (a real model's
    tokenizer then serves it), and its runtime for up to 16 windows of 5 beams."""
    config = dataclasses.replace(preset(name), n_vocab=n_vocab)
    model = random_model(config, device="cuda", dtype=torch.float16)
    return model, Runtime(model, max_rows=80)


def main() -> None:
    args = arguments().parse_args()
    model = WhisperModel(args.model, device="cuda", compute_type="float16")
    inputs = {name: model.encode(mel) for name, mel in dev_windows(model, args.audio).items()}
    tokenizer = model.tokenizer.with_options("en", "transcribe")
    print(torch.cuda.get_device_name(), flush=True)
    for beam in (5, None):
        options = DecodingOptions(beam_size=beam, language="en")
        for name, audio_features in inputs.items():
            time_decode(f"tiny.en, beam {beam or 1}, {name}", model.decode_model, tokenizer,
                        audio_features, options, args.runs)  # fmt: skip
    sampling = DecodingOptions(
        language="en", temperature=0.4, best_of=5, sample_len=SAMPLED,
        suppress_tokens=[-1, tokenizer.eot],
    )  # fmt: skip
    for round in range(2):
        for name, audio_features in inputs.items():
            for loop, where in ((contextlib.nullcontext, "device"), (host_loop, "host")):
                with loop():
                    time_decode(f"tiny.en, sampling t 0.4 best of 5, {name}, {where} loop "
                                f"(round {round + 1})", model.decode_model, tokenizer,
                                audio_features, sampling, args.runs)  # fmt: skip
    for name in args.preset:
        plain, runtime = preset_runtime(name, model.model.config.n_vocab)
        config = plain.config
        generator = torch.Generator(device="cuda").manual_seed(0)
        for windows in (1, 16):
            shape = (windows, config.n_audio_ctx, config.n_audio_state)
            audio_features = torch.randn(shape, device="cuda", generator=generator).half()
            options = DecodingOptions(beam_size=5, language="en", sample_len=64)
            time_decode(f"{name}, beam 5, {windows} windows", RuntimeWhisper(runtime), tokenizer,
                        audio_features, options, args.runs)  # fmt: skip
        del runtime, plain
        torch.cuda.empty_cache()


@contextlib.contextmanager
def host_loop():
    """`decoding.decode` on the runtime with its host loop (a step, then the filters and the
    choice in torch), as it sampled before the device loop did: the decoder offers no
    `search`."""
    search = RuntimeDecoder.search
    RuntimeDecoder.search = None
    try:
        yield
    finally:
        RuntimeDecoder.search = search


def decode_ms(
    model, tokenizer, audio_features: torch.Tensor, options: DecodingOptions, runs: int
) -> tuple[float, list[DecodingResult]]:
    """`decode`'s median ms per step over `runs` after three warm-ups (a run's steps: its
    longest result's tokens and EOT; sampling's differ between runs), and its results."""
    times = []
    with torch.inference_mode():
        for run in range(runs + 3):
            start = time.perf_counter()
            results = decode(model, tokenizer, audio_features, options)
            torch.cuda.synchronize()
            steps = max(len(r.tokens) for r in results) + 1
            if run >= 3:
                times.append((time.perf_counter() - start) * 1e3 / steps)
    return statistics.median(times), results


def time_decode(
    label: str, model, tokenizer, audio_features: torch.Tensor, options: DecodingOptions, runs: int
) -> None:
    ms, results = decode_ms(model, tokenizer, audio_features, options, runs)
    tokens = sum(len(r.tokens) for r in results)
    print(f"{label}: {tokens} tokens, {ms:.3f} ms per step", flush=True)


if __name__ == "__main__":
    main()
