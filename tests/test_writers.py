"""Output writers: openai-whisper's layouts, checked by real srt/vtt parsers and the reference."""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import asdict

import pytest
import srt
import webvtt
from conftest import JFK

from whisperforge import Segment, Word
from whisperforge.errors import InvalidOptionError, WhisperforgeError
from whisperforge.writers import (
    FORMATS,
    WriterOptions,
    expand_formats,
    format_timestamp,
    openai_result,
    output_paths,
    safe_stem,
    write,
    write_result,
)

INFO = {"language": "en", "duration": 11.0}


def segment(
    i: int, start: float, end: float, text: str, words: list[Word] | None = None
) -> Segment:
    return Segment(i, 0, start, end, text, [1, 2], -0.2, 1.3, 0.01, words, 0.0)


def timed(text: str, start: float, step: float = 0.5) -> list[Word]:
    """Words of `text` one after another, `step` seconds each, with Whisper's leading spaces."""
    return [
        Word(start + i * step, start + (i + 1) * step, " " + w, 0.9)
        for i, w in enumerate(text.split())
    ]


PLAIN = [
    segment(0, 0.0, 7.74, " And so, my fellow Americans ask not what your country can do for you"),
    segment(1, 7.74, 3725.5, " ask what you can do for your country."),
]
WORDS = [
    segment(0, 0.0, 6.0, " one two three four five six seven eight", timed("one two three four five six seven eight", 0.0)),
    segment(1, 6.0, 8.0, " nine ten", timed("nine ten", 6.0)),
    segment(2, 14.0, 16.0, " after a pause", timed("after a pause", 14.0)),
]  # fmt: skip


def openai_dict(segments: list[Segment]) -> dict:
    """The result dict openai-whisper's `transcribe` returns for these segments, built key by
    key in its order (its writers are fed this to give the expected bytes)."""
    rows = []
    for s in segments:
        row = {"id": s.id, "seek": s.seek, "start": s.start, "end": s.end, "text": s.text,
               "tokens": s.tokens, "temperature": s.temperature, "avg_logprob": s.avg_logprob,
               "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob}  # fmt: skip
        if s.words is not None:  # openai-whisper has the key only with word timestamps
            row["words"] = [
                {"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                for w in s.words
            ]
        rows.append(row)
    return {"text": "".join(s.text for s in segments), "segments": rows, "language": "en"}


def render(fmt: str, segments: list[Segment], **options) -> str:
    buffer = io.StringIO()
    write(fmt, segments, INFO, buffer, WriterOptions(**options))
    return buffer.getvalue()


def srt_cues(text: str) -> list[srt.Subtitle]:
    return list(srt.parse(text))  # raises SRTParseError on anything malformed


def vtt_cues(text: str) -> list[webvtt.Caption]:
    return list(webvtt.from_buffer(io.StringIO(text)))  # raises MalformedFileError


@pytest.fixture(scope="module")
def jfk_result(tiny_en):
    """JFK with word timings, transcribed once: (segments, TranscriptionInfo)."""
    segments, info = tiny_en.transcribe(str(JFK), beam_size=1, word_timestamps=True)
    return list(segments), info


@pytest.fixture(scope="module")
def jfk_words(jfk_result) -> list[Segment]:
    return jfk_result[0]


# --- layouts -----------------------------------------------------------------------------------


def test_format_timestamp():
    assert format_timestamp(0) == "00:00.000"
    assert format_timestamp(7.7404) == "00:07.740"
    assert format_timestamp(3725.5) == "01:02:05.500"
    assert format_timestamp(1.5, always_include_hours=True, decimal_marker=",") == "00:00:01,500"
    assert format_timestamp(59.9996) == "01:00.000"  # rounding carries into the minutes
    assert format_timestamp(-0.01) == "00:00.000"


def test_txt_and_tsv():
    assert render("txt", PLAIN) == (
        "And so, my fellow Americans ask not what your country can do for you\n"
        "ask what you can do for your country.\n"
    )
    tab = [segment(0, 0.0, 1.0, " a\tb")]
    assert render("tsv", PLAIN + tab).splitlines() == [
        "start\tend\ttext",
        "0\t7740\tAnd so, my fellow Americans ask not what your country can do for you",
        "7740\t3725500\task what you can do for your country.",
        "0\t1000\ta b",
    ]


def test_json_without_and_with_words():
    plain = json.loads(render("json", PLAIN))
    assert plain["language"] == "en" and "duration" not in plain  # openai-whisper's keys only
    assert plain["text"] == "".join(s.text for s in PLAIN)
    assert [s["text"] for s in plain["segments"]] == [s.text for s in PLAIN]
    assert "words" not in plain["segments"][0]  # like openai-whisper without word timestamps
    assert plain["segments"][1]["end"] == 3725.5 and plain["segments"][0]["tokens"] == [1, 2]

    worded = json.loads(render("json", WORDS))
    assert worded["segments"][1]["words"] == [asdict(w) for w in WORDS[1].words]
    assert set(worded["segments"][0]["words"][0]) == {"word", "start", "end", "probability"}


def test_srt_and_vtt_segments_parse():
    srt_text = render("srt", PLAIN)
    assert srt_text.startswith("1\n00:00:00,000 --> 00:00:07,740\nAnd so, my fellow")
    cues = srt_cues(srt_text)
    assert [c.content for c in cues] == [s.text.strip() for s in PLAIN]
    assert cues[1].end.total_seconds() == 3725.5

    vtt_text = render("vtt", PLAIN)
    assert vtt_text.startswith("WEBVTT\n\n00:00.000 --> 00:07.740\nAnd so")
    assert "01:02:05.500" in vtt_text  # hours only past the first hour
    assert [c.text for c in vtt_cues(vtt_text)] == [s.text.strip() for s in PLAIN]


def test_arrow_in_text_cannot_break_a_cue():
    tricky = [segment(0, 0.0, 1.0, " a --> b")]
    assert srt_cues(render("srt", tricky))[0].content == "a -> b"
    assert vtt_cues(render("vtt", tricky))[0].text == "a -> b"


def test_blank_line_in_text_cannot_end_a_cue():
    """A blank or whitespace-only line inside a cue's text ended the cue there in every player:
    the lines after it were lost (or read as a broken cue of their own)."""
    plain = [
        segment(0, 0.0, 1.0, " a\n\nb"),
        segment(1, 1.0, 2.0, " c\n \r\n\t\nd\ne"),
        segment(2, 2.0, 3.0, " f"),
    ]
    words = [Word(0.0, 0.5, " g", 0.9), Word(0.5, 1.0, "\n\nh", 0.9)]
    worded = [segment(0, 0.0, 1.0, " g\n\nh", words)]
    for segments, expected in [(plain, ["a\nb", "c\nd\ne", "f"]), (worded, ["g\nh"])]:
        assert [c.content for c in srt_cues(render("srt", segments))] == expected
        assert [c.text for c in vtt_cues(render("vtt", segments))] == expected
    highlighted = ["<u>g</u>\nh", "g\n<u>h</u>"]
    srt_text, vtt_text = (render(fmt, worded, highlight_words=True) for fmt in ("srt", "vtt"))
    assert [c.content for c in srt_cues(srt_text)] == highlighted
    assert [c.raw_text for c in vtt_cues(vtt_text)] == highlighted


def test_word_segments_keep_segment_cues():
    cues = srt_cues(render("srt", WORDS))
    assert [c.content for c in cues] == [s.text.strip() for s in WORDS]
    assert cues[2].start.total_seconds() == 14.0  # from the first word, not the segment


def test_max_line_width_wraps_lines():
    cues = srt_cues(render("srt", WORDS, max_line_width=12))
    assert len(cues) == 3  # segments are kept: no line count was given
    for cue in cues:
        for line in cue.content.split("\n"):
            assert len(line) <= 12 or " " not in line
    assert cues[0].content == "one two\nthree four\nfive six\nseven eight"


def test_max_line_count_merges_and_splits_at_pauses():
    cues = srt_cues(render("srt", WORDS, max_line_width=12, max_line_count=2))
    assert [c.content for c in cues] == [
        "one two\nthree four",
        "five six\nseven eight",
        "nine ten",  # the 6 s pause before "after" starts a new subtitle
        "after a\npause",
    ]
    assert cues[2].start.total_seconds() == 6.0 and cues[2].end.total_seconds() == 7.0


def test_max_words_per_line():
    cues = vtt_cues(render("vtt", WORDS, max_words_per_line=3))
    assert [c.text for c in cues] == [
        "one two three", "four five six", "seven eight", "nine ten", "after a pause"
    ]  # fmt: skip


def test_highlight_words():
    text = render("vtt", WORDS[1:2], highlight_words=True)
    cues = vtt_cues(text)
    assert [c.raw_text for c in cues] == ["<u>nine</u> ten", "nine <u>ten</u>"]
    assert [(c.start, c.end) for c in cues] == [
        ("00:00:06.000", "00:00:06.500"),
        ("00:00:06.500", "00:00:07.000"),
    ]
    gap = [segment(0, 0.0, 3.0, " a b", [Word(0.0, 1.0, " a", 0.9), Word(2.0, 3.0, " b", 0.9)])]
    cues = srt_cues(render("srt", gap, highlight_words=True))
    assert [c.content for c in cues] == ["<u>a</u> b", "a b", "a <u>b</u>"]  # the gap is plain


def test_highlight_without_words_falls_back_to_segments():
    assert srt_cues(render("srt", PLAIN, highlight_words=True))[0].content == PLAIN[0].text.strip()


OPTION_SETS = [
    {},
    {"max_line_width": 20},
    {"max_line_width": 20, "max_line_count": 2},
    {"max_line_width": 42, "max_line_count": 1},
    {"max_words_per_line": 4},
    {"highlight_words": True},
    {"highlight_words": True, "max_line_width": 16, "max_line_count": 2},
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(o) or "plain")
def test_subtitles_match_openai_whisper(jfk_words, options):
    """The reference's writers, fed the same result, give the same bytes."""
    from whisper.utils import WriteSRT, WriteVTT

    for segments in (jfk_words, WORDS, PLAIN):
        for fmt, reference in (("srt", WriteSRT), ("vtt", WriteVTT)):
            expected = io.StringIO()
            reference(".").write_result(openai_dict(segments), expected, **options)
            assert render(fmt, segments, **options) == expected.getvalue(), (fmt, options)
            cues = srt_cues(expected.getvalue()) if fmt == "srt" else vtt_cues(expected.getvalue())
            assert cues


def test_txt_tsv_json_match_openai_whisper():
    """openai-whisper's writers, fed its result dict of the same segments, give the same bytes:
    JSON with non-ASCII escaped, no key of ours added and no newline at the end; a tab in a tsv
    row is a space."""
    from whisper.utils import get_writer

    french = [segment(0, 0.0, 5.8, " Sous le consulat, il devient\tconservateur des forêts.")]
    for segments in (PLAIN, WORDS, french):
        for fmt in ("txt", "tsv", "json"):
            expected = io.StringIO()
            get_writer(fmt, ".").write_result(openai_dict(segments), expected)
            assert render(fmt, segments) == expected.getvalue(), fmt
    assert "for\\u00eats" in render("json", french)


def test_real_words_highlight_every_word(jfk_words):
    cues = srt_cues(render("srt", jfk_words, highlight_words=True, max_line_width=30))
    underlined = [m for c in cues for m in re.findall(r"<u>(.*?)</u>", c.content)]
    assert underlined == [w.word.strip() for s in jfk_words for w in s.words]


# --- files -------------------------------------------------------------------------------------


def test_expand_formats():
    assert expand_formats("all") == list(FORMATS)
    assert expand_formats("srt,vtt") == ["srt", "vtt"]
    assert expand_formats(["json", "all"]) == ["json", "txt", "srt", "vtt", "tsv"]
    with pytest.raises(InvalidOptionError, match="unknown output format 'docx'"):
        expand_formats("docx")


def test_write_result_names_files_after_the_input(tmp_path):
    paths = write_result(PLAIN, INFO, "/some/where/jfk.flac", tmp_path / "out", "all")
    assert sorted(p.name for p in paths) == sorted(f"jfk.{f}" for f in FORMATS)
    assert all(p.parent == tmp_path / "out" for p in paths)
    assert (tmp_path / "out" / "jfk.txt").read_text().startswith("And so, my fellow")
    assert json.loads((tmp_path / "out" / "jfk.json").read_text())["language"] == "en"
    srt_cues((tmp_path / "out" / "jfk.srt").read_text())
    vtt_cues((tmp_path / "out" / "jfk.vtt").read_text())


def test_write_result_accepts_a_generator_and_dict_options(tmp_path):
    paths = write_result(
        iter(WORDS), INFO, "a.wav", tmp_path, ["srt", "txt"], {"max_words_per_line": 3}
    )
    assert [p.name for p in paths] == ["a.srt", "a.txt"]
    assert len(srt_cues(paths[0].read_text())) == 5
    assert paths[1].read_text().count("\n") == 3  # the generator fed both formats
    with pytest.raises(InvalidOptionError, match="unknown writer option"):
        write_result(PLAIN, INFO, "a.wav", tmp_path, "txt", {"max_lines": 2})


@pytest.mark.parametrize(
    "name, stem",
    [("talk.mp3", "talk"), ("..", "transcript"), ("", "transcript"), ("a\nb.wav", "a_b"),
     ("x/..", "transcript"), ("日本語.wav", "日本語"), (".hidden", ".hidden")],
)  # fmt: skip
def test_safe_stem(name, stem):
    assert safe_stem(name) == stem


def test_never_writes_outside_output_dir(tmp_path):
    for name in ("../../escape.wav", "..", "a\\..\\b.wav", "/etc/passwd"):
        for path in output_paths(name, tmp_path, "all"):
            assert path.resolve().parent == tmp_path.resolve()
    # A symlink planted at the target must not redirect the write elsewhere.
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "talk.txt").symlink_to(outside)
    with pytest.raises(WhisperforgeError, match="outside"):
        write_result(PLAIN, INFO, "talk.wav", out, "txt")
    assert outside.read_text() == "keep"


def test_never_overwrites_the_input(tmp_path):
    source = tmp_path / "talk.txt"  # e.g. a text file given as input by mistake
    source.write_text("precious")
    with pytest.raises(WhisperforgeError, match="overwrite the input"):
        write_result(PLAIN, INFO, source, tmp_path, "all")
    assert source.read_text() == "precious"
    assert sorted(os.listdir(tmp_path)) == ["talk.txt"]  # refused before writing anything
    # The same file through another spelling of the path, and through a hard link.
    with pytest.raises(WhisperforgeError, match="overwrite the input"):
        write_result(PLAIN, INFO, tmp_path / "sub" / ".." / "talk.txt", tmp_path, "txt")
    other = tmp_path / "other"
    other.mkdir()
    os.link(source, other / "talk.txt")
    with pytest.raises(WhisperforgeError, match="overwrite the input"):
        write_result(PLAIN, INFO, source, other, "txt")
    assert source.read_text() == "precious"
    # Another folder is fine.
    (path,) = write_result(PLAIN, INFO, source, tmp_path / "elsewhere", "txt")
    assert path.read_text().startswith("And so")


def test_output_dir_that_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(WhisperforgeError, match="not a folder"):
        write_result(PLAIN, INFO, "a.wav", blocker, "txt")


def test_write_accepts_transcription_info(jfk_result):
    segments, info = jfk_result
    buffer = io.StringIO()
    write("json", iter(segments), info, buffer)
    result = json.loads(buffer.getvalue())
    assert result["language"] == "en"
    assert "ask not what your country can do for you" in result["text"].lower()
    assert len(result["segments"][0]["words"]) == len(segments[0].words)


def test_get_writer_writes_what_openai_whispers_does(jfk_result, tmp_path):
    """`whisper.utils.get_writer` under `import whisperforge as whisper`: the same files as
    openai-whisper's writers make from the same result dict, options as a dict or keywords."""
    import json

    import whisper.utils

    import whisperforge

    result = openai_result(*jfk_result)
    options = {"max_line_width": 20, "max_line_count": 2, "highlight_words": True}
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    ours.mkdir(), theirs.mkdir()
    whisperforge.utils.get_writer("all", ours)(result, "talk.flac", options)
    whisper.utils.get_writer("all", str(theirs))(result, "talk.flac", options)
    for fmt in ("txt", "srt", "vtt", "tsv", "json"):
        assert (ours / f"talk.{fmt}").read_text() == (theirs / f"talk.{fmt}").read_text(), fmt
    # A diarizer's extra keys are let be; a word needs no probability.
    result["speakers"] = ["SPK1"]
    for word in result["segments"][0]["words"]:
        word["speaker"] = "SPK1"
        del word["probability"]
    whisperforge.utils.get_writer("all", ours)(result, "spoken.flac", options)
    whisper.utils.get_writer("all", str(theirs))(result, "spoken.flac", options)
    for fmt in ("txt", "srt", "vtt", "tsv", "json"):
        assert (ours / f"spoken.{fmt}").read_text() == (theirs / f"spoken.{fmt}").read_text(), fmt
    assert json.loads((ours / "spoken.json").read_text())["speakers"] == ["SPK1"]
    whisperforge.utils.get_writer("srt", ours)(result, "plain.flac", max_words_per_line=3)
    whisper.utils.get_writer("srt", str(theirs))(result, "plain.flac", max_words_per_line=3)
    assert (ours / "plain.srt").read_text() == (theirs / "plain.srt").read_text()
    with pytest.raises(InvalidOptionError, match="segment 0"):
        whisperforge.utils.get_writer("srt", ours)({"segments": [{"text": "hi"}]}, "bad.flac")


def test_openai_writer_objects_write_to_open_files_as_openai_whispers_do(jfk_result, tmp_path):
    """openai-whisper's writer objects, as its scripts use them: `WriteSRT(dir).write_result(
    result, file)` on an open file (get_writer's writer of one format is such an object), and
    a keyword left None (its CLI passes all four) does not hide the options dict's value."""
    import whisper.utils

    import whisperforge

    result = openai_result(*jfk_result)
    options = {"max_line_width": 20, "max_line_count": 2, "highlight_words": True}
    for fmt in ("txt", "srt", "vtt", "tsv", "json"):
        name = "Write" + fmt.upper()
        for ours, theirs in (
            (getattr(whisperforge.utils, name)(tmp_path), getattr(whisper.utils, name)(".")),
            (whisperforge.utils.get_writer(fmt, tmp_path), whisper.utils.get_writer(fmt, ".")),
        ):
            written, expected = io.StringIO(), io.StringIO()
            ours.write_result(result, written, options, max_line_width=None)
            theirs.write_result(result, expected, options, max_line_width=None)
            assert written.getvalue() == expected.getvalue(), fmt
            ours.write_result(result, written := io.StringIO(), max_words_per_line=3)
            theirs.write_result(result, expected := io.StringIO(), max_words_per_line=3)
            assert written.getvalue() == expected.getvalue(), fmt
    whisperforge.utils.WriteSRT(tmp_path)(result, "talk.flac", options)
    whisper.utils.WriteSRT(str(tmp_path))(result, "spoken.flac", options)
    assert (tmp_path / "talk.srt").read_text() == (tmp_path / "spoken.srt").read_text()


def test_whisper_utils_helpers_are_openai_whispers() -> None:
    """The small `whisper.utils` helpers that scripts import (they were AttributeErrors under
    `import whisperforge as whisper`) give openai-whisper's values."""
    import whisper.utils as reference

    import whisperforge.utils as ours

    segments = [
        {"start": 1.0, "end": 2.0, "words": []},
        {"start": 2.0, "end": 3.5, "words": [{"start": 2.1, "end": 3.4}]},
        {"start": 3.5, "end": 4.0, "words": []},
    ]
    calls = [("exact_div", (480000, 160)), ("str2bool", ("True",)), ("str2bool", ("False",)),
             ("optional_int", ("None",)), ("optional_int", ("7",)),
             ("optional_float", ("None",)), ("optional_float", ("0.5",)),
             ("compression_ratio", ("so so so so so so so so",)), ("compression_ratio", ("",)),
             ("compression_ratio", ("日本語 ünïcode",)), ("get_start", (segments,)),
             ("get_end", (segments,)), ("get_start", ([],)), ("get_end", (segments[:1],)),
             ("make_safe", ("héllo 🎉",))]  # fmt: skip
    for name, args in calls:
        assert getattr(ours, name)(*args) == getattr(reference, name)(*args), (name, args)
    assert ours.system_encoding == reference.system_encoding
    for name in ["str2bool", "optional_int"]:
        with pytest.raises(ValueError):
            getattr(ours, name)("maybe")
