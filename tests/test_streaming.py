"""Streaming transcription (LocalAgreement-2): the policy on scripted hypotheses (fast, exact),
a real replay of a 27 s dev clip with tiny.en on a simulated clock, and `whisperforge stream`."""

from __future__ import annotations

import bisect
import io
import itertools
import os
import signal
import struct
import sys
import threading
import time
from dataclasses import dataclass, replace

import numpy as np
import pytest
from conftest import DEV_DIR, JFK, manifest, plain_wer, plain_words

from whisperforge import Segment, Word, cli, load_audio
from whisperforge.errors import AudioError, InvalidOptionError
from whisperforge.streaming import (
    StreamingOptions,
    StreamingTranscriber,
    model_transcriber,
    pcm16_to_float,
    replay,
)

SR = 16000
HOTWORDS = DEV_DIR / "faster-whisper__hotwords.mp3"  # 4 s, names ComfyUI
RAMP = 1e-4  # scripted audio: sample value = stream time * RAMP, so a fake knows where it is


def segment(words: list[Word]) -> Segment:
    return Segment(0, 0, words[0].start, words[-1].end, "".join(w.word for w in words), [],
                   -0.1, 1.0, 0.0, words, 0.0)  # fmt: skip


def ramp(start: int, stop: int) -> np.ndarray:
    return (np.arange(start, stop) / SR * RAMP).astype(np.float32)


@dataclass
class Scripted:
    """A fake model: knows the words of the whole stream, returns those inside the buffer."""

    words: list[Word]
    calls: int = 0

    def __post_init__(self) -> None:
        self.prompts: list[str | None] = []
        self.starts = [w.start for w in self.words]

    def __call__(self, audio: np.ndarray, prompt: str | None, language: str | None):
        self.calls += 1
        self.prompts.append(prompt)
        offset = float(audio[0]) / RAMP
        end = offset + audio.size / SR
        first = bisect.bisect_left(self.starts, offset - 1e-3)
        inside = []
        for w in self.words[first:]:
            if w.end > end:
                break
            inside.append(Word(w.start - offset, w.end - offset, w.word, 1.0))
        sentences, current = [], []
        for w in inside:
            current.append(w)
            if w.word.endswith("."):
                sentences.append(segment(current))
                current = []
        return sentences + ([segment(current)] if current else []), "en"


def script(seconds: float) -> list[Word]:
    """A word every 0.4 s, a sentence every 10 words."""
    return [Word(i * 0.4 + 0.05, i * 0.4 + 0.35, f" w{i}" + ("." if i % 10 == 9 else ""), 1.0)
            for i in range(int(seconds / 0.4))]  # fmt: skip


def test_an_hour_stays_bounded_and_commits_everything_once():
    seconds = 3600
    fake = Scripted(script(seconds))
    stream = StreamingTranscriber(fake, StreamingOptions(min_chunk_s=1.0))
    events, largest = [], 0.0
    step = SR // 2
    for start in range(0, seconds * SR, step):  # 0.5 s chunks
        events += stream.feed(ramp(start, start + step))
        largest = max(largest, stream.buffer_s)
    events.append(stream.finish())
    assert [w.word for w in stream.committed] == [w.word for w in fake.words]
    assert [w.word for e in events for w in e.committed] == [w.word for w in fake.words]
    assert largest <= 16.0  # trimmed at committed sentence ends past trim_s=15
    assert fake.calls == seconds  # one update per min_chunk_s of audio, none on finish
    # A word is in the hypothesis after the first update past its end, committed at the next.
    delays = [e.time - w.end for e in events[:-1] for w in e.committed]
    assert 0 < min(delays) and max(delays) <= 2.0 + 1e-6
    # The prompt is the committed text before the buffer, at most prompt_chars long.
    assert all(p is None or len(p) <= 200 for p in fake.prompts)
    assert fake.prompts[-1] and fake.prompts[-1].endswith(".")


def test_the_initial_prompt_comes_before_the_committed_text_until_it_fills_the_prompt():
    fake = Scripted(script(60))
    options = StreamingOptions(min_chunk_s=1.0, initial_prompt=" Zorbix, Acme. ")
    stream = StreamingTranscriber(fake, options)
    for start in range(0, 60 * SR, SR):
        stream.feed(ramp(start, start + SR))
    assert fake.prompts[0] == "Zorbix, Acme."  # nothing committed yet
    with_text = [p for p in fake.prompts if p != "Zorbix, Acme."]
    assert with_text[0].startswith("Zorbix, Acme. w0")  # then the committed text after it
    # Once there are prompt_chars of committed text, that alone.
    assert "Zorbix" not in fake.prompts[-1] and 190 <= len(fake.prompts[-1]) <= 200
    with pytest.raises(InvalidOptionError, match="initial_prompt must be text"):
        StreamingOptions(initial_prompt=["Zorbix"])  # type: ignore[arg-type]


def test_an_initial_prompt_spells_a_name_as_it_does_offline(tiny_en, monkeypatch, capsys):
    """The prompt reaches the model: the clip's name is spelled as prompted (without it,
    tiny.en misspells it), in the library and the command (the server's: test_server)."""
    audio = load_audio(HOTWORDS)
    spelled = [replay(tiny_en, audio, chunk_s=0.5, options=StreamingOptions(language="en",
                      min_chunk_s=2.0, initial_prompt=prompt)).text
               for prompt in (None, "ComfyUI")]  # fmt: skip
    assert "ComfyUI" not in spelled[0] and "ComfyUI" in spelled[1]
    monkeypatch.setattr(cli, "load_model", lambda args: tiny_en)
    command = ["stream", str(HOTWORDS), "--min-chunk", "2", "--initial-prompt", "ComfyUI"]
    assert cli.main(command) == 0
    assert "ComfyUI" in capsys.readouterr().out


def test_local_agreement_commits_the_common_prefix_and_never_changes_it():
    hypotheses = [  # tiny.en's real hypotheses on growing JFK buffers (times moved a little)
        [(0.0, 0.72, " And"), (0.72, 0.98, " so...")],
        [(0.0, 0.76, " And"), (0.76, 1.04, " so"), (1.04, 1.4, " my"), (1.4, 1.74, " fellow"),
         (1.74, 1.98, " American")],
        [(0.0, 0.76, " And"), (0.76, 1.04, " so"), (1.04, 1.32, " am"), (1.32, 1.46, " I"),
         (1.46, 1.76, " fellow"), (1.76, 2.12, " Americans.")],
        [(0.0, 0.76, " And"), (0.76, 1.04, " so"), (1.04, 1.4, " my"), (1.4, 1.74, " fellow"),
         (1.74, 2.28, " Americans"), (2.28, 3.74, " ask")],
        [(0.02, 0.8, " And"), (0.8, 1.0, " so,"), (1.0, 1.4, " my"), (1.4, 1.76, " fellow"),
         (1.76, 2.32, " Americans,"), (2.32, 3.86, " ask"), (3.86, 4.5, " not")],
    ]  # fmt: skip
    calls = iter(hypotheses)

    def fake(audio, prompt, language):
        return [segment([Word(a, b, t, 1.0) for a, b, t in next(calls)])], "en"

    stream = StreamingTranscriber(fake, StreamingOptions(min_chunk_s=1.0))
    events = [e for _ in hypotheses for e in stream.feed(np.zeros(SR, np.float32))]
    committed = [e.committed_text for e in events]
    assert committed == ["", " And so", "", "", " my fellow Americans, ask"]
    assert events[2].tentative_text == " am I fellow Americans."
    assert events[-1].tentative_text == " not"
    assert [e.time for e in events] == [1.0, 2.0, 3.0, 4.0, 5.0]  # the clock is the audio received
    assert stream.text == " And so my fellow Americans, ask"


@pytest.mark.parametrize("silence_db", [None, -100.0])  # (the ramp is about -80 dBFS)
def test_clear_drops_the_tentative_words_and_keeps_what_was_committed(silence_db):
    """`clear` (the server's input_audio_buffer.clear) drops the tentative words and the audio
    not committed, undecoded, keeps the words a `commit` committed (and the prompt they make),
    and the clock goes on over the dropped audio; a multilingual stream whose words a commit
    made before its language was heard still ends with their language (it ended with words
    and language None: an empty buffer, or one gated as silent, skipped the commit that fixes
    it)."""
    fake = Scripted(script(6))
    fake.is_multilingual = True  # type: ignore[attr-defined]  # (DETECTION_S: 3 s)
    options = StreamingOptions(min_chunk_s=1.0, silence_db=silence_db)
    stream = StreamingTranscriber(fake, options)
    stream.feed(ramp(0, round(1.2 * SR)))
    said = stream.commit().committed_text
    assert said == " w0 w1 w2" and stream.language is None
    assert stream.feed(ramp(round(1.2 * SR), round(2.4 * SR)))[0].tentative_text == " w3 w4 w5"
    calls = fake.calls
    stream.clear(ramp(round(2.4 * SR), round(2.6 * SR)))  # and the audio that came with it
    assert fake.calls == calls and stream.received_s == 2.6 and stream.buffer_s == 0
    # The next words, where they are in all the audio (w6 began before the clear).
    (event,) = stream.feed(ramp(round(2.6 * SR), 4 * SR))
    timed = [[(round(w.start, 3), round(w.end, 3), w.word) for w in ws]
             for ws in (event.tentative, fake.words[7:10])]  # fmt: skip
    assert event.committed == [] and timed[0] == timed[1]
    assert fake.prompts[-1] == said.strip() and stream.language is None  # 1.4 s heard since
    stream.clear()
    final = stream.finish()
    assert final.committed == [] and stream.text == said
    assert final.language == stream.language == "en"


def test_any_chunk_size_and_odd_byte_splits_give_the_same_samples():
    rng = np.random.default_rng(0)
    pcm = rng.integers(-32768, 32767, size=SR * 3, dtype=np.int16).astype("<i2").tobytes()
    seen: list[np.ndarray] = []

    def fake(audio, prompt, language):
        seen.append(audio.copy())
        return [], "en"

    stream = StreamingTranscriber(fake, StreamingOptions(min_chunk_s=3.0))
    i, sizes = 0, [1, 7, 2, 1001, 3, 16000]
    for k in range(10_000):  # bounded
        if i >= len(pcm):
            break
        size = sizes[k % len(sizes)]
        stream.feed(pcm[i : i + size])
        i += size
    np.testing.assert_array_equal(seen[0], pcm16_to_float(pcm))


def test_16_bit_samples_in_an_int64_chunk_are_refused_not_heard_as_silence():
    """np.array of a list of ints is int64: scaled as 64-bit PCM it was -96 dB down, and a stream
    of speech fed so committed nothing. int32 chunks stay 32-bit PCM (a quiet one is common)."""
    heard: list[float] = []

    def fake(audio, prompt, language):
        heard.append(float(np.abs(audio).max()))
        return [], "en"

    stream = StreamingTranscriber(fake, StreamingOptions(min_chunk_s=0.1))
    speech_like = np.array([1000, -2000, 3000] * 1000)
    with pytest.raises(AudioError, match="astype"):
        stream.feed(speech_like)
    assert stream.received_s == 0  # nothing of the refused chunk was kept
    stream.feed(speech_like.astype(np.int32) << 16)  # 32-bit PCM at the same level: taken
    assert heard and abs(heard[-1] - 3000 / 32768) < 1e-6


def test_silence_costs_no_updates():
    fake = Scripted([])
    stream = StreamingTranscriber(fake, StreamingOptions(silence_db=-50.0))
    for _ in range(120):  # a minute of digital silence, 0.5 s at a time
        assert stream.feed(np.zeros(SR // 2, np.float32)) == []
    assert fake.calls == 0 and stream.buffer_s <= 1.5
    rng = np.random.default_rng(1)
    noise = (0.1 * rng.standard_normal(SR * 2)).astype(np.float32)
    stream.feed(noise)
    assert fake.calls == 1


def test_an_improbable_tail_window_is_not_committed_but_an_improbable_buffer_is():
    first = segment([Word(0.1, 0.5, " one", 0.9), Word(0.5, 0.9, " two", 0.9)])
    # The long-form loop's second window: the unfinished end of the buffer decoded on its own.
    tail = replace(segment([Word(1.0, 1.0, " three", 0.01), Word(1.0, 1.1, " four", 0.05)]),
                   seek=100, avg_logprob=-2.0)  # fmt: skip

    def fake(audio, prompt, language):
        return [first, tail], "en"

    stream = StreamingTranscriber(fake, StreamingOptions(min_chunk_s=1.0))
    events = [e for _ in range(3) for e in stream.feed(np.zeros(SR, np.float32))]
    events.append(stream.finish())
    assert stream.text == " one two"
    assert all("three" not in e.tentative_text for e in events)
    kept = StreamingTranscriber(fake, StreamingOptions(tail_log_prob_threshold=None))
    kept.feed(np.zeros(SR, np.float32))
    assert kept.finish().committed_text == " one two three four"

    # One window only: improbable or not, it is all the buffer holds, and it is committed.
    def improbable(audio, prompt, language):
        return [replace(first, avg_logprob=-2.0)], "en"

    stream = StreamingTranscriber(improbable, StreamingOptions(min_chunk_s=1.0))
    for _ in range(2):
        stream.feed(np.zeros(SR, np.float32))
    assert stream.text == " one two"


def test_a_loop_the_prompt_led_into_is_decoded_again_without_it(tiny_en):
    """Commits at the short pauses of a list ("copy, modify, merge, publish, distribute") left
    each word with a full stop in the committed text that prompts the decoder, and base's next
    decode of the licence's following 17 s was a loop ("submit." 112 times): a loop is not
    used, so nothing was committed, and at the end of the stream those words were lost. (That
    loop takes base 20 s on the CPU, and a cut 40 ms later has none: here tiny.en decodes, and
    a prompted decode is such a loop.) Decoded again without the prompt, the words are there."""
    decode = model_transcriber(tiny_en)

    def looping_when_prompted(audio: np.ndarray, prompt: str | None, language: str | None):
        if prompt:
            return [segment([Word(i * 0.15, i * 0.15 + 0.15, " submit.", 0.9)
                             for i in range(100)])], "en"  # fmt: skip
        return decode(audio, prompt, language)

    licence = load_audio(DEV_DIR / "faster-whisper__multilingual.mp3")[round(14.46 * SR) : 32 * SR]
    prompt = "the rights to use, copy, modify. merge. publish. distribute."
    options = StreamingOptions(language="en", min_chunk_s=15.0, initial_prompt=prompt)
    stream = StreamingTranscriber(looping_when_prompted, options)
    stream.feed(licence)
    stream.finish()
    assert "sell copies of the software" in plain_words(stream.text)
    assert "submit" not in stream.text


def test_silence_after_words_that_keep_changing_does_not_grow_the_buffer():
    """With the silence gate, words still tentative after two silent updates (a last word that
    changes at every decode) were kept waiting, and the buffer grew for as long as the silence
    lasted (605 s after 10 minutes): they are committed as they stand, the silence dropped."""
    calls = 0
    noise = (0.1 * np.random.default_rng(0).standard_normal(SR * 2)).astype(np.float32)

    def flickering(audio, prompt, language):
        nonlocal calls
        calls += 1
        if not np.array_equal(audio[:8], noise[:8]):  # the words are at the noise's start only
            return [], "en"
        last = " cat" if calls % 2 else " dog"
        return [segment([Word(0.1, 0.5, " one", 0.9), Word(0.6, 0.9, last, 0.5)])], "en"

    stream = StreamingTranscriber(flickering, StreamingOptions(silence_db=-40.0))
    stream.feed(noise)
    for _ in range(600):
        stream.feed(np.zeros(SR, np.float32))
    assert stream.buffer_s < 2 and calls < 10
    assert plain_words(stream.text) in ("one cat", "one dog")


def test_a_decoding_loop_that_goes_on_does_not_grow_the_buffer():
    """A hypothesis that loops ("submit. submit. ...") is not used, and its update returned
    before the buffer was trimmed: while the loop went on, the buffer grew without end (120 s
    after 2 minutes, each update decoding all of it). The hard cap holds it to max_buffer_s."""
    decoded: list[float] = []

    def looping(audio, prompt, language):
        decoded.append(audio.size / SR)
        step = audio.size / SR / 100
        return [segment([Word(i * step, (i + 1) * step, " submit.", 0.9)
                         for i in range(100)])], "en"  # fmt: skip

    stream = StreamingTranscriber(looping, StreamingOptions(language="en"))
    noise = (0.1 * np.random.default_rng(0).standard_normal(SR)).astype(np.float32)
    for _ in range(120):
        stream.feed(noise)
    assert max(decoded) <= stream.options.max_buffer_s and stream.buffer_s <= 30
    assert stream.finish().committed == []  # and nothing of the loop is committed


def test_speech_that_really_repeats_is_not_taken_for_a_decoding_loop(tiny_en):
    """JFK's 11 s said twice and begun again, 25 s fed at once (a client sending a recording):
    its decode gzips past the loop threshold, so nothing of it was used, and the stream ended
    with no words at all; offline has them all. Decoded in pieces, each piece is JFK's words
    as themselves, and they are committed (a loop, whose pieces loop too, is not: the test
    above)."""
    jfk = load_audio(JFK)
    audio = np.tile(np.concatenate([jfk, np.zeros(SR, np.float32)]), 3)[: 25 * SR]
    stream = StreamingTranscriber(tiny_en, StreamingOptions(language="en"))
    stream.feed(audio)
    stream.finish()
    text = plain_words(stream.text)
    assert text.count("ask not what your country") == 2 and text.endswith("country and so")


def test_a_multilingual_streams_language_is_heard_from_seconds_of_audio(base):
    """The language was fixed at the first update with words: 1 s of German was "en" (and 1 s
    of Spanish "ml"), and the stream came out in English."""
    german = load_audio(DEV_DIR / "picovoice-leopard__test_de.wav")
    stream = StreamingTranscriber(base, StreamingOptions())
    events = [e for i in range(0, german.size, SR) for e in stream.feed(german[i : i + SR])]
    events.append(stream.finish())
    assert stream.language == "de" and "Portal" in stream.text
    # Each event tells the language once it is heard: None before, with nothing committed.
    assert all(e.language in (None, "de") for e in events) and events[-1].language == "de"
    assert all(not e.committed for e in events if e.language is None)
    assert events[-1].to_dict()["language"] == "de"


def test_words_committed_before_the_language_is_fixed_carry_their_language(base):
    """A multilingual stream that ends (or is stopped) before DETECTION_S of audio commits its
    last hypothesis as it stands: its final event had words and language None."""
    german = load_audio(DEV_DIR / "picovoice-leopard__test_de.wav")[: 2 * SR]
    stream = StreamingTranscriber(base, StreamingOptions())
    assert [(e.language, e.committed_text) for e in stream.feed(german)] == [(None, "")]
    final = stream.finish()  # no new audio: the last hypothesis is committed as it stands
    assert "Portal" in final.committed_text
    assert final.language == stream.language == "de"
    assert final.to_dict()["language"] == "de"


def test_a_commit_before_the_language_is_heard_does_not_fix_it(base):
    """A client's commit after its first 1.5 s of Spanish (a short first utterance) fixed the
    stream's language from them: Arabic, and the other 7 s of Spanish came out as nothing. Its
    words are committed as heard, and the language is still detected from what follows."""
    spanish = load_audio(DEV_DIR / "picovoice-leopard__test_es.wav")
    stream = StreamingTranscriber(base, StreamingOptions())
    stream.feed(spanish[: round(1.5 * SR)])
    assert stream.commit().language is None  # still being detected
    stream.feed(spanish[round(1.5 * SR) :])
    stream.finish()
    assert stream.language == "es"
    assert "grano medio" in stream.text
    # Ended with no more words, the stream's language is the one its committed words were heard in
    # (the final event said null beside them).
    short = StreamingTranscriber(base, StreamingOptions())
    short.feed(spanish[: round(1.5 * SR)])
    assert short.commit().committed and short.finish().language == short.language is not None


def test_a_clear_before_anything_is_committed_hears_the_language_again(base):
    """`clear` (the server's input_audio_buffer.clear) drops audio the client took back; a
    language detected from it, with nothing committed, stayed the stream's: German heard and
    dropped, then English came out as "Und so my fellow Americans!". It is detected again from
    what follows; the clock goes on over the dropped audio."""
    german = load_audio(DEV_DIR / "picovoice-leopard__test_de.wav")[: 4 * SR]
    stream = StreamingTranscriber(base, StreamingOptions())
    assert [(e.language, e.committed) for e in stream.feed(german)] == [("de", [])]
    stream.clear()
    assert stream.language is None and stream.buffer_s == 0 and stream.received_s == 4.0
    final = stream.finish()  # nothing heard since: nothing committed, no language
    assert (final.language, final.committed, final.time) == (None, [], 4.0)


def test_the_update_after_a_commit_does_not_fix_a_language_still_being_heard():
    """A commit before DETECTION_S of audio leaves the language being detected (its words are
    committed as heard), but the update after it fixed the language from its buffer, 2.4 s:
    only at the stream's end do committed words fix it, under DETECTION_S."""
    fake = Scripted(script(6))
    fake.is_multilingual = True  # type: ignore[attr-defined]
    stream = StreamingTranscriber(fake, StreamingOptions(min_chunk_s=1.0))
    stream.feed(ramp(0, round(1.2 * SR)))
    assert stream.commit().committed_text == " w0 w1 w2" and stream.language is None
    (event,) = stream.feed(ramp(round(1.2 * SR), round(2.4 * SR)))
    assert event.language is None and event.committed == []
    (event,) = stream.feed(ramp(round(2.4 * SR), round(3.6 * SR)))
    assert event.language == stream.language == "en"  # DETECTION_S heard


def test_options_are_checked():
    with pytest.raises(ValueError, match="min_chunk_s"):
        StreamingOptions(min_chunk_s=0)
    # Refused when made, not at the first update (agreement=2.5: a bare TypeError there).
    for bad in ({"min_chunk_s": 1e9}, {"task": "summarize"}, {"agreement": 2.5},
                {"beam_size": 0}, {"max_buffer_s": 60, "trim_s": 50}):  # fmt: skip
        with pytest.raises(InvalidOptionError, match=next(iter(bad))):
            StreamingOptions(**bad)
    with pytest.raises(ValueError, match="trim_s"):
        StreamingOptions(trim_s=40)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="min_chunk_s"):
            StreamingOptions(min_chunk_s=bad)
    for bad in (float("nan"), 0.0, -10.0):  # 0: all speech was taken for silence, no words
        with pytest.raises(ValueError, match="silence_db"):
            StreamingOptions(silence_db=bad)
    stream = StreamingTranscriber(Scripted([]), StreamingOptions())
    # A chunk with NaN is refused before it is kept: the stream goes on.
    with pytest.raises(AudioError, match="NaN"):
        stream.feed(np.array([0.0, np.nan], np.float32))
    stream.feed(np.zeros(10, np.float32))
    stream.finish()
    with pytest.raises(ValueError, match="finished"):
        stream.feed(np.zeros(10, np.float32))
    for bad in (float("nan"), 0.0, -1.0):  # NaN was a bare "cannot convert float NaN"
        with pytest.raises(ValueError, match="chunk_s must be positive seconds"):
            replay(Scripted([]), np.zeros(SR, np.float32), chunk_s=bad)


# --- real model -----------------------------------------------------------------------------


def test_replay_of_a_dev_clip_matches_offline(tiny_en):
    clip = "mfa__acoustic_corpus.wav"  # 26.7 s, spontaneous speech: its first 20 s
    audio = load_audio(DEV_DIR / clip)[: 20 * SR]
    offline = "".join(s.text for s in tiny_en.transcribe(audio, beam_size=1, temperature=0.0)[0])
    # An update every 2 s of audio (not the default 1 s): half the decodes, the same checks.
    options = StreamingOptions(language="en", min_chunk_s=2.0)
    run = replay(tiny_en, audio, chunk_s=0.5, options=options)
    assert plain_wer(offline, run.text) < 0.06
    # Committed text only grows: each event adds words after the last, in time order.
    ends = [w.end for w in run.words]
    assert ends == sorted(ends) and ends[-1] <= audio.size / SR + 0.05
    assert all(a.end <= b.start <= b.end for a, b in itertools.pairwise(run.words))  # no overlap
    text = ""
    for event in run.events:
        text += event.committed_text
        assert run.text.startswith(text.strip())
    # The simulated clock is exact: updates at every 2.0 s of audio, the last at the end.
    assert [e.time for e in run.events[:-1]] == [2.0 * k for k in range(1, len(run.events))]
    assert run.events[-1].final and run.events[-1].time == pytest.approx(audio.size / SR)
    delays = np.array(run.delays)
    assert delays.min() >= 0 and delays.mean() < 3.0


def test_no_text_invented_after_the_last_word(tiny_en, tiny_en_greedy):
    """Isolated words with silence between and after them: the end of the buffer is often
    decoded again in a short window of its own, where tiny.en makes up a sentence; streaming
    must end where offline transcription of the same file ends."""
    clip = "whisper-timestamped__words.wav"  # 23.1 s
    audio = load_audio(DEV_DIR / clip)
    offline = "".join(s.text for s in tiny_en_greedy[clip])
    run = replay(tiny_en, audio, chunk_s=0.5, options=StreamingOptions(language="en"))
    assert len(plain_words(run.text).split()) <= len(plain_words(offline).split())
    assert plain_wer(offline, run.text) < 0.15


def test_no_words_are_committed_in_silence_after_speech(tiny_en):
    """JFK, then 20 s of digital silence: tiny.en filled the silence with a "Thank" that two
    updates agreed on (13.9-15.3 s), and it was committed. Offline transcription of the same
    audio has nothing after JFK's last word."""
    jfk = load_audio(JFK)
    audio = np.concatenate([jfk, np.zeros(20 * SR, np.float32)])
    run = replay(tiny_en, audio, chunk_s=1.0, options=StreamingOptions(language="en"))
    assert plain_words(run.text).startswith("and so my fellow americans ask not")
    assert [w for w in run.words if w.start >= jfk.size / SR] == []


def test_a_model_from_whisperforge_load_model_streams(tiny_en):
    """`whisperforge.load_model` gives openai-whisper's model, whose `transcribe` returns a
    dict: a stream of it failed its first update with "too many values to unpack"."""
    from whisperforge.openai_api import OpenAIWhisper

    run = replay(OpenAIWhisper(tiny_en), load_audio(SHORT), options=StreamingOptions("en"))
    assert plain_words(run.text) == "in being comparatively modern"


def test_replay_takes_audio_as_feed_does_and_stereo_is_told_how_to_mix(tiny_en):
    """replay() of s16le bytes (as `feed` takes them) failed with a raw AttributeError; a
    stereo array was refused without saying which axis to average."""
    audio = load_audio(SHORT)
    pcm = (audio * 32767).astype("<i2").tobytes() + b"\x00"  # and half a sample
    run = replay(tiny_en, pcm, options=StreamingOptions("en"))
    assert plain_words(run.text) == "in being comparatively modern"
    with pytest.raises(AudioError, match=r"audio.mean\(axis=1\)"):
        StreamingTranscriber(tiny_en).feed(np.stack([audio, audio], axis=1))


# --- the command line ---------------------------------------------------------------------------

SHORT = DEV_DIR / "coqui-tts-ljspeech__LJ001-0002.wav"  # 1.9 s: "in being comparatively modern."


@pytest.fixture
def model(tiny_en, monkeypatch):
    monkeypatch.setattr(cli, "load_model", lambda args: tiny_en)
    return tiny_en


def test_stream_command_on_a_file(model, capsys):
    assert cli.main(["stream", str(SHORT), "--language", "en"]) == 0
    out = capsys.readouterr().out
    assert plain_words(out) == "in being comparatively modern"


def test_stream_command_translates_as_transcribe_does(base, monkeypatch, capsys):
    """`stream` had no --task: a stream was never translated, though StreamingOptions can."""
    monkeypatch.setattr(cli, "load_model", lambda args: base)
    french = DEV_DIR / "speech_recognition__french.aiff"  # 2.5 s: "et c'est la dictée numéro 1"
    command = ["stream", str(french), "--task", "translate", "--timestamps", "--min-chunk", "3"]
    assert cli.main(command) == 0
    out, err = capsys.readouterr()
    assert "dictation" in out.lower() and "dictée" not in out
    assert "warning: Word-level timestamps on translations may not be reliable." in err


def test_stream_command_refuses_to_translate_on_an_english_only_model(model, capsys):
    assert cli.main(["stream", str(SHORT), "--task", "translate"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip() == (
        "error: this model is English-only and cannot translate; use a multilingual model such "
        "as base"
    )


def test_stream_command_on_raw_pcm_from_stdin_in_real_time(model, capsys, monkeypatch):
    pcm = (load_audio(SHORT) * 32767).astype("<i2").tobytes()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(pcm)))
    assert cli.main(["stream", "-", "--realtime", "--timestamps", "--min-chunk", "0.5"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines and all(line.startswith("[00:0") for line in lines)
    assert plain_words(" ".join(line.split("] ", 1)[1] for line in lines)) == (
        "in being comparatively modern"
    )


class StoppedWithCtrlC(io.RawIOBase):
    """The stdin of a live source that the user stops with Ctrl-C once `data` is read."""

    def __init__(self, data: bytes):
        self.data = memoryview(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if not self.data:
            raise KeyboardInterrupt
        n = min(len(buffer), len(self.data))
        buffer[:n], self.data = self.data[:n], self.data[n:]
        return n


def test_ctrl_c_on_a_live_stream_still_prints_its_last_words(model, capsys, monkeypatch):
    """`arecord ... | whisperforge stream -` is stopped with Ctrl-C; the words still tentative
    then were lost (all of them on a short utterance), and the line was left open."""
    pcm = (load_audio(SHORT) * 32767).astype("<i2").tobytes()
    stdin = io.TextIOWrapper(io.BufferedReader(StoppedWithCtrlC(pcm)))
    monkeypatch.setattr(sys, "stdin", stdin)
    assert cli.main(["stream", "-", "--input-format", "s16le"]) == 130
    out = capsys.readouterr().out
    assert plain_words(out) == "in being comparatively modern" and out.endswith("\n")


def test_finish_after_an_interrupted_update_decodes_its_audio(tiny_en):
    """Ctrl-C (or any error) inside an update's decode leaves its audio in the buffer, unheard;
    finish() committed the hypothesis before it as it stood, without that audio's words."""
    options = StreamingOptions(language="en", min_chunk_s=2.0)
    chunks = np.split(load_audio(JFK)[: 6 * SR], 3)  # three updates, the last interrupted
    decode, calls = model_transcriber(tiny_en), 0

    def interrupted_at_the_last(audio, prompt, language):
        nonlocal calls
        calls += 1
        if calls == len(chunks):
            raise KeyboardInterrupt
        return decode(audio, prompt, language)

    stream = StreamingTranscriber(interrupted_at_the_last, options)
    with pytest.raises(KeyboardInterrupt):
        for chunk in chunks:
            stream.feed(chunk)
    stream.finish()
    whole = StreamingTranscriber(tiny_en, options)
    for chunk in chunks:
        whole.feed(chunk)
    whole.finish()
    assert stream.text == whole.text


def test_commit_commits_the_whole_hypothesis_trims_and_goes_on(tiny_en):
    """`commit` (the server's input_audio_buffer.commit) commits all it heard, as `finish`
    does, and trims the buffer as an update does: a client that commits more often than
    min_chunk_s makes no other update, and its buffer grew past Whisper's 30 s."""
    options = StreamingOptions(language="en", min_chunk_s=20.0, trim_s=2.0)
    stream = StreamingTranscriber(tiny_en, options)
    assert stream.feed(load_audio(JFK)) == []  # under min_chunk_s: no update
    event = stream.commit()
    assert not event.final and event.tentative == [] and not stream.finished
    said = next(clip["text"] for clip in manifest() if clip["audio"] == JFK.name)
    assert plain_words(event.committed_text) == plain_words(said)
    assert stream.buffer_s < 1.0  # cut after the sentence's last word (11 s before)
    assert stream.finish().committed == [] and stream.text == event.committed_text


def test_speech_after_where_a_decode_stopped_is_decoded_too(tiny_en):
    """A commit after "Americans", a clear, another clip committed, then the rest of JFK: with
    the first item's text as its prompt, tiny.en decoded the buffer (the clip, then JFK) as
    the clip alone, ending at 5.4 s of 13.1, and the stream ended without "ask not ... your
    country", which offline transcription of the same audio has. The rest is decoded too."""
    jfk, other = load_audio(JFK), load_audio(DEV_DIR / "coqui-tts-ljspeech__LJ001-0004.wav")
    stream = StreamingTranscriber(tiny_en, StreamingOptions(language="en", min_chunk_s=14.0))
    stream.feed(jfk[: 3 * SR])
    stream.commit()
    stream.clear()
    stream.feed(other)
    stream.commit()
    stream.feed(jfk[3 * SR :])  # under min_chunk_s: decoded at the finish
    stream.finish()
    said = next(clip["text"] for clip in manifest() if clip["audio"] == JFK.name)
    assert plain_words(stream.text).endswith(" ".join(plain_words(said).split()[5:]))


def test_the_buffer_is_not_cut_inside_a_committed_word(tiny_en):
    """JFK's first 3 s committed, another clip committed (no clear), then the rest of JFK: the
    buffer was trimmed at a segment end (13.38 s) inside the committed "you." (12.38-13.42 s,
    an older decode's times), whose text then was in neither the prompt nor the audio.
    Prompted "...can do for", tiny.en heard "Ask what you can do for your country" as "your
    country", and "you can do for your" was lost. The 0.6 s after "country." was then decoded in
    a window of its own as "Thank you." (no_speech_prob 0.74): not said, not committed."""
    jfk, other = load_audio(JFK), load_audio(DEV_DIR / "coqui-tts-ljspeech__LJ001-0004.wav")
    stream = StreamingTranscriber(tiny_en, StreamingOptions(language="en"))
    stream.feed(jfk[: 3 * SR])
    stream.commit()
    stream.feed(other)
    stream.commit()
    for chunk in np.array_split(jfk[3 * SR :], 8):  # an update a second, trimmed at 15 s
        stream.feed(chunk)
    stream.finish()
    assert plain_words(stream.text).endswith("ask what you can do for your country")


def test_a_live_pipe_is_read_while_updates_decode(tiny_en, capsys, monkeypatch):
    """`arecord ... | whisperforge stream -` on a machine slower than real time: the audio that
    arrived during an update goes into the next one, as ufal's server reads all it has. It was
    read 0.1 s at a time between updates, an update per second of audio, so the text fell
    further behind the speaker every second (and the microphone's 64 KiB pipe overflowed)."""
    calls = 0

    class Counted:  # the real model, its decodes counted
        def __getattr__(self, name):
            return getattr(tiny_en, name)

        def transcribe(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            return tiny_en.transcribe(*args, **kwargs)

    monkeypatch.setattr(cli, "load_model", lambda args: Counted())
    pcm = (load_audio(JFK) * 32767).astype("<i2").tobytes()
    read_end, write_end = os.pipe()

    def speak() -> None:  # 11 s of audio, all there long before tiny.en has decoded 1 s
        with open(write_end, "wb") as pipe:
            pipe.write(pcm)

    speaker = threading.Thread(target=speak)
    speaker.start()
    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
        assert cli.main(["stream", "-", "--input-format", "s16le", "--language", "en"]) == 0
    speaker.join()
    assert calls <= 4  # one decode per second of audio before: 11
    spoken = next(clip["text"] for clip in manifest() if clip["audio"] == JFK.name)
    assert plain_wer(spoken, capsys.readouterr().out) < 0.15


def live_wav_header(rate: int, channels: int) -> bytes:
    """A 16-bit WAV header as a recorder writes it to a pipe: its sizes unknown (0xFFFFFFFF)."""
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * 2, channels * 2, 16)
    size = struct.pack("<I", 0xFFFFFFFF)
    return b"RIFF" + size + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + size


def test_a_live_wav_streams_as_it_arrives_and_ctrl_c_keeps_what_arrived(model, capsys,
                                                                         monkeypatch):  # fmt: skip
    """`arecord | whisperforge stream -` (a WAV, 48 kHz stereo here): stdin was read to its end
    before anything was decoded, so nothing showed, and Ctrl-C lost it all. Now the header is
    read and the samples stream; Ctrl-C after 6 s of speech transcribes those 6 s, the audio
    still in the pipe and the reader's queue too."""
    audio = load_audio(JFK)[: 6 * SR]
    frames = np.repeat((audio * 32767).astype("<i2"), 3)  # 48 kHz (resampled to 16 on the way)
    wav = live_wav_header(48000, 2) + np.repeat(frames[:, None], 2, axis=1).tobytes()
    read_end, write_end = os.pipe()

    def record_then_ctrl_c() -> None:
        with open(write_end, "wb") as pipe:
            pipe.write(wav)
            pipe.flush()
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)  # as the terminal sends it: to both programs
            time.sleep(0.2)  # the recorder's last write, then it exits

    recorder = threading.Thread(target=record_then_ctrl_c)
    with open(read_end, "rb") as stdin:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stdin))
        recorder.start()
        assert cli.main(["stream", "-", "--language", "en"]) == 130
    recorder.join()
    whole = StreamingTranscriber(model, StreamingOptions(language="en"))  # all 6 s, no Ctrl-C
    whole.feed(audio)
    whole.finish()
    assert plain_words(whole.text).startswith("and so my fellow americans ask not what")
    assert plain_wer(whole.text, capsys.readouterr().out) < 0.1


@pytest.mark.parametrize(
    ("name", "args"),
    [("short.aac", []), ("short.raw", ["--sample-rate", "8000"])],
    ids=["adts-aac-on-stdin", "raw-8-khz"],
)
def test_stream_command_reads_aac_on_stdin_and_raw_pcm_of_other_rates(model, capsys, tmp_path,
                                                                      monkeypatch, name, args):  # fmt: skip
    """ADTS AAC on stdin was taken for raw PCM (a blank transcript), and raw PCM of another
    rate than 16 kHz gave confident garbage with no way to say its rate."""
    av = pytest.importorskip("av")
    audio = load_audio(SHORT)
    if name.endswith(".aac"):
        out = io.BytesIO()
        with av.open(out, "w", format="adts") as container:
            stream = container.add_stream("aac", rate=SR)
            frame = av.AudioFrame.from_ndarray(audio[None, :], format="flt", layout="mono")
            frame.rate = SR
            resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=SR)
            for packet in [p for f in resampler.resample(frame) for p in stream.encode(f)]:
                container.mux(packet)
            container.mux(stream.encode(None))
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(out.getvalue())))
        command = ["stream", "-"]
    else:
        path = tmp_path / name
        path.write_bytes((audio[::2] * 32767).astype("<i2").tobytes())  # 8 kHz
        command = ["stream", str(path)]
    assert cli.main([*command, "--language", "en", *args]) == 0
    assert plain_words(capsys.readouterr().out) == "in being comparatively modern"


def wav_header_at(rate: int) -> bytes:
    """A live mono WAV's header that says `rate` Hz, whatever it is (a damaged one's)."""
    header = bytearray(live_wav_header(SR, 1))
    header[24:28] = struct.pack("<I", rate)
    return bytes(header)


@pytest.mark.parametrize(
    ("stdin", "args", "error"),
    [
        (b"\1\0" * 2, ["--sample-rate", "1"], "stdin: raw PCM at 1 Hz is not streamed"),
        (b"\1\0" * 800, ["--sample-rate", str(1 << 31)], "stdin: raw PCM at 2147483648 Hz"),
        (wav_header_at(0) + b"\1\0" * 800, [], "stdin: not audio FFmpeg can decode"),
        (wav_header_at(1 << 31) + b"\1\0" * 800, [], "stdin: not audio FFmpeg can decode"),
    ],
    ids=["raw-1-hz", "raw-2-31-hz", "wav-0-hz", "wav-2-31-hz"],
)
def test_stream_command_refuses_sample_rates_it_cannot_stream(model, capsys, monkeypatch,
                                                               stdin, args, error):  # fmt: skip
    """Rates outside 8000-192000 Hz, the WebSocket's: past an int32 (--sample-rate, or a
    damaged WAV header) or 0 Hz were tracebacks; at 1 Hz, 4 bytes were 2 s of audio. A WAV
    header's goes to FFmpeg, which reads any rate it can."""
    read_end, write_end = os.pipe()  # a pipe, as from a recorder: a WAV on it streams
    with open(write_end, "wb") as pipe:
        pipe.write(stdin)  # (less than a pipe holds)
    with open(read_end, "rb") as pipe:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(pipe))
        assert cli.main(["stream", "-", *args]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {error}")


@pytest.mark.parametrize(
    ("stdin", "error"),
    [(b"", "stdin: no audio, the input is empty"), (b"meeting notes\n", "stdin holds text")],
)
def test_stream_command_refuses_stdin_without_audio(model, capsys, monkeypatch, stdin, error):
    """`whisperforge stream - < /dev/null` printed a blank line and exited 0, and text piped in
    was read as PCM noise and transcribed (" ."); both are errors, before any decode."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    assert cli.main(["stream", "-"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"error: {error}")


def test_stream_command_missing_file(model, capsys, tmp_path):
    assert cli.main(["stream", "nope.wav"]) == 1
    assert "no such file" in capsys.readouterr().err
    assert cli.main(["stream", str(tmp_path)]) == 1
    assert "is a folder" in capsys.readouterr().err
    not_audio = tmp_path / "notes.wav"  # a named file is raw PCM by its name only, not this
    not_audio.write_text("meeting notes, not a recording")
    assert cli.main(["stream", str(not_audio)]) == 1
    assert f"{not_audio}: not a readable audio file" in capsys.readouterr().err
    empty = tmp_path / "empty.raw"
    empty.write_bytes(b"")
    assert cli.main(["stream", str(empty)]) == 1
    assert f"{empty}: no audio, the file is empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value"), [("--min-chunk", "0"), ("--silence-db", "0"), ("--agreement", "1")]
)
def test_stream_command_names_a_bad_option_as_typed(capsys, option, value):
    """A bad --min-chunk was told as "min_chunk_s must be...": no option of the command."""
    assert cli.main(["stream", str(SHORT), option, value]) == 1
    assert capsys.readouterr().err.startswith(f"error: {option} ")
