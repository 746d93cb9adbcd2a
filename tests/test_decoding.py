"""The decode loop's own machinery, on the real tiny.en and dev clips."""

from __future__ import annotations

import pytest
import torch
from conftest import DEV_DIR, short_english_clips

from whisperforge import runtime
from whisperforge.audio import N_FRAMES, load_audio, log_mel_spectrogram, pad_or_trim
from whisperforge.decoding import DecodingOptions, decode


@pytest.fixture(scope="module")
def features(tiny_en) -> torch.Tensor:
    """Three English clips of 5-11 s, one window each."""
    clips = [c["audio"] for c in short_english_clips() if c["duration_s"] < 12][::8]
    mel = [
        pad_or_trim(log_mel_spectrogram(load_audio(DEV_DIR / c), 80, 0), N_FRAMES) for c in clips
    ]
    return tiny_en.encode(torch.stack(mel))


@pytest.mark.parametrize(
    "options",
    [
        DecodingOptions(language="en", beam_size=5),
        DecodingOptions(language="en", beam_size=5, patience=0.5),  # best unfinished beams fill
        DecodingOptions(language="en"),  # greedy on the host
        DecodingOptions(language="en", temperature=0.6, best_of=3),
    ],
    ids=["beam", "beam-patience0.5", "greedy", "sampling"],
)
def test_completion_read_a_step_late_changes_nothing(tiny_en, features, monkeypatch, options):
    """On CUDA a search reads its completion flags a step late (`runtime.CompletionFlag`) and
    so runs one step past completion, which beam search undoes. The same path run on the CPU,
    over windows that complete at different steps, gives the tokens of reading at once."""
    results = {}
    for late in (False, True):
        monkeypatch.setattr(runtime, "READ_LATE", late)
        torch.manual_seed(0)  # sampling: the step past completion draws after the last sample
        results[late] = decode(tiny_en.model, tiny_en.tokenizer, features, options)
    assert len({len(r.tokens) for r in results[False]}) > 1  # complete at different steps
    for now, late in zip(results[False], results[True]):
        assert (now.tokens, now.avg_logprob) == (late.tokens, late.avg_logprob)


@pytest.mark.parametrize(
    "given, code",
    [("de", "de"), (" DE ", "de"), ("German", "de"), ("pt-BR", "pt"), ("zh_CN", "zh"),
     ("en-US", "en"), ("yue", "yue"), ("xx", None), ("xx-DE", None), ("de-", "de"),
     ("jv-ID", "jw"), ("iw", "he"), ("nb-NO", "no"), ("Filipino", "tl")],
)  # fmt: skip
def test_a_language_is_a_code_a_name_or_a_locale(given, code):
    """A manifest's or a user's locale (pt-BR, zh_CN: Common Voice's codes) is its language;
    ISO codes Whisper spells otherwise (jv, iw, nb, fil) are its; anything else unknown is
    refused by name (openai-whisper refuses the locales and the ISO codes)."""
    from whisperforge.errors import InvalidOptionError
    from whisperforge.tokenizer import LANGUAGES, normalize_language

    if code is None:
        with pytest.raises(InvalidOptionError, match=f"unknown language {given!r}"):
            normalize_language(given, list(LANGUAGES))
    else:
        assert normalize_language(given, list(LANGUAGES)) == code
