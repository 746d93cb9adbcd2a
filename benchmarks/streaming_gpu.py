"""What one streaming update costs on the GPU with the large-v3-turbo architecture (issue 7).

A LocalAgreement update (`streaming.model_transcriber`) is `WhisperModel.transcribe` of the
audio buffer with word timestamps, prompted with the committed text before it. Random weights
say nothing useful, so each update is made to decode what speech would give: `--tokens-per-s`
tokens per second of buffer (EOT suppressed), after a prompt of `--prompt-tokens` tokens; the
encoder always sees a padded 30 s window, so buffer length changes only the decode and the
word alignment. Median over `--runs` after a warm-up, per buffer length.

    python3 benchmarks/streaming_gpu.py --audio .gpuaudio/longform.npy
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # batched_gpu's turbo model
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

SR = 16000


def main() -> None:
    from batched_gpu import forced_options, turbo_model

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--audio", required=True, help="16 kHz int16 .npy recording")
    parser.add_argument("--buffers", type=float, nargs="+", default=[2, 5, 10, 15, 20, 30])
    parser.add_argument("--tokens-per-s", type=float, default=3.0)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--preset", default="large-v3-turbo")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()

    audio = np.load(args.audio).astype(np.float32) / 32768
    model = turbo_model(args.device, args.preset)
    sync = torch.cuda.synchronize if args.device == "cuda" else lambda: None
    prompt = list(range(1000, 1000 + args.prompt_tokens))  # token ids: only the length matters
    print(args.device, "torch", torch.__version__)
    print(f"{args.preset}, random fp16 weights, greedy, word timestamps, prompt "
          f"{args.prompt_tokens} tokens, {args.tokens_per_s} tokens per buffer second")  # fmt: skip
    print("| buffer s | tokens | ms per update (median) | p90 ms |\n|---|---|---|---|")
    for seconds in args.buffers:
        buffer = audio[: int(seconds * SR)]
        options = forced_options(model.tokenizer.eot)
        options["max_new_tokens"] = max(1, round(seconds * args.tokens_per_s))

        def update(buffer: np.ndarray = buffer, options: dict = options) -> None:
            segments, _ = model.transcribe(
                buffer, initial_prompt=prompt, word_timestamps=True, **options
            )
            assert list(segments), "a forced decode always gives a segment"

        update()  # warm-up: graphs for this shape
        times = []
        for _ in range(args.runs):
            sync()
            start = time.perf_counter()
            update()
            sync()
            times.append(1000 * (time.perf_counter() - start))
        p90 = float(np.percentile(times, 90))
        print(f"| {seconds:g} | {options['max_new_tokens']} | {statistics.median(times):.1f} | "
              f"{p90:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
