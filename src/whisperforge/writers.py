"""Transcripts to files: openai-whisper's txt, srt, vtt, tsv and json layouts.

Each writer takes the segments, a dict of facts about the audio (its language) and a text
stream, and writes what openai-whisper's writer of that format writes from its result dict
(`openai_result`), byte for byte; they differ only where openai-whisper's file would break (a
line break in a tsv row, "-->" or a blank line in a cue's words). `write_result` names the
files after the input (`jfk.flac` -> `jfk.srt`) and refuses to overwrite the input or to write
outside the output folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, TextIO

from .errors import InvalidOptionError, WhisperforgeError
from .results import Segment, Word
from .tokenizer import LANGUAGES

FORMATS = ("txt", "srt", "vtt", "tsv", "json")


@dataclass
class WriterOptions:
    """Subtitle layout (srt, vtt). All but `max_words_per_line` need segments with words.

    max_line_width: characters per line before a line break.
    max_line_count: lines per subtitle; with `max_line_width`, segments are merged and split
        into subtitles of at most this many lines (and at pauses over 3 s).
    highlight_words: one cue per spoken word, with that word underlined.
    max_words_per_line: words per subtitle when segments are kept whole.
    """

    max_line_width: int | None = None
    max_line_count: int | None = None
    highlight_words: bool = False
    max_words_per_line: int | None = None


def format_timestamp(
    seconds: float, always_include_hours: bool = False, decimal_marker: str = "."
) -> str:
    """`01:02.345`, or `00:01:02,345` for srt; hours appear when needed or asked for."""
    milliseconds = round(max(seconds, 0.0) * 1000)  # clamp: a timestamp is never before 0
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    secs, milliseconds = divmod(milliseconds, 1_000)
    hours_part = f"{hours:02d}:" if always_include_hours or hours > 0 else ""
    return f"{hours_part}{minutes:02d}:{secs:02d}{decimal_marker}{milliseconds:03d}"


def timed_line(segment: Segment) -> str:
    """A segment as openai-whisper's `verbose` prints it: `[00:00.000 --> 00:07.740]  text`
    (the text as it is, its leading space too)."""
    start, end = format_timestamp(segment.start), format_timestamp(segment.end)
    return f"[{start} --> {end}] {segment.text}"


# openai-whisper's lines around language detection, as its `verbose` prints them.
DETECTING_LANGUAGE = (
    "Detecting language using up to the first 30 seconds. Use `--language` to specify the language"
)


def detected_language(language: str) -> str:
    """`Detected language: German`, as openai-whisper prints it."""
    return f"Detected language: {LANGUAGES[language].title()}"


def _info_dict(info: Mapping[str, Any] | object) -> dict[str, Any]:
    """Accept the dict the writers document, or a `TranscriptionInfo` as a convenience."""
    if isinstance(info, Mapping):
        return dict(info)
    if is_dataclass(info):
        return {f.name: getattr(info, f.name) for f in fields(info)}
    return {}


def _options(options: WriterOptions | Mapping[str, Any] | None) -> WriterOptions:
    if options is None:
        return WriterOptions()
    if isinstance(options, WriterOptions):
        return options
    known = {f.name for f in fields(WriterOptions)}
    unknown = set(options) - known
    if unknown:
        raise InvalidOptionError(
            f"unknown writer option(s) {', '.join(sorted(unknown))}; use {', '.join(sorted(known))}"
        )
    return WriterOptions(**options)


# --- plain layouts ---------------------------------------------------------------------------


def write_txt(
    segments: Sequence[Segment],
    info: Mapping[str, Any],
    file: TextIO,
    options: WriterOptions | None = None,
) -> None:
    """One line per segment."""
    for segment in segments:
        print(segment.text.strip(), file=file)


def write_tsv(
    segments: Sequence[Segment],
    info: Mapping[str, Any],
    file: TextIO,
    options: WriterOptions | None = None,
) -> None:
    """`start<TAB>end<TAB>text` with integer milliseconds: no locale can turn '.' into ','."""
    print("start", "end", "text", sep="\t", file=file)
    for segment in segments:
        # A tab is a space, as openai-whisper writes it; a line break too (there its row would
        # be cut in two), so that each segment stays one row.
        text = re.sub(r"[\r\n]+", " ", segment.text.strip().replace("\t", " "))
        print(round(1000 * segment.start), round(1000 * segment.end), text, sep="\t", file=file)


def write_json(
    segments: Sequence[Segment],
    info: Mapping[str, Any],
    file: TextIO,
    options: WriterOptions | None = None,
) -> None:
    """`openai_result` as JSON, as openai-whisper's `WriteJSON` dumps it: non-ASCII escaped
    (`\\u00e9`), no newline at the end."""
    json.dump(openai_result(segments, info), file)


OPENAI_SEGMENT_KEYS = ("id", "seek", "start", "end", "text", "tokens", "temperature",
                       "avg_logprob", "compression_ratio", "no_speech_prob")  # fmt: skip
OPENAI_WORD_KEYS = ("word", "start", "end", "probability")


def openai_result(segments: Sequence[Segment], info: Mapping[str, Any] | object) -> dict[str, Any]:
    """openai-whisper's result dict: text, segments (words when present), language."""
    info = _info_dict(info)
    rows = []
    for number, segment in enumerate(segments):
        fields = asdict(segment) | {"id": number}  # openai-whisper counts from 0, faster-whisper 1
        row = {key: fields[key] for key in OPENAI_SEGMENT_KEYS}  # in its order, as JSON shows it
        if segment.words is not None:  # openai-whisper has the key only with word timestamps
            row["words"] = [
                {key: word[key] for key in OPENAI_WORD_KEYS} for word in fields["words"]
            ]
        rows.append(row)
    return {
        "text": "".join(segment.text for segment in segments),
        "segments": rows,
        "language": info.get("language"),
    }


def result_segments(result: Mapping[str, Any]) -> list[Segment]:
    """The segments of openai-whisper's result dict (`openai_result`'s inverse), for writing a
    result that openai-whisper code made or changed. Only start, end and text are required (and
    a word's word, start and end); other keys, such as a diarizer's speakers, are let be."""
    segments = []
    for number, row in enumerate(result.get("segments") or []):
        try:
            words = row.get("words")
            segments.append(Segment(
                id=row.get("id", number), seek=row.get("seek", 0),
                start=float(row["start"]), end=float(row["end"]), text=str(row["text"]),
                tokens=list(row.get("tokens", [])), avg_logprob=row.get("avg_logprob", 0.0),
                compression_ratio=row.get("compression_ratio", 0.0),
                no_speech_prob=row.get("no_speech_prob", 0.0),
                words=None if words is None else [
                    Word(float(w["start"]), float(w["end"]), str(w["word"]),
                         float(w.get("probability", 0.0)))
                    for w in words
                ],
                temperature=row.get("temperature"),
            ))  # fmt: skip
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise InvalidOptionError(
                f"result segment {number} is not openai-whisper's segment dict (start, end, "
                f"text; words with word, start, end): {error}"
            ) from None
    return segments


# --- subtitles -------------------------------------------------------------------------------


@dataclass
class _Piece:
    """One word of a subtitle: its text carries the leading space, or a line break."""

    start: float
    end: float
    text: str


def _subtitle_groups(segments: Sequence[Segment], opts: WriterOptions) -> Iterator[list[_Piece]]:
    """Words grouped into subtitles and lines, as openai-whisper's `iterate_result` does."""
    # Without both a width and a line count, every segment (or word chunk) is its own subtitle.
    keep_segments = opts.max_line_count is None or opts.max_line_width is None
    width = opts.max_line_width or 1000
    chunk_size = opts.max_words_per_line or 1000
    first_word = next((w for s in segments for w in (s.words or [])), None)
    last_start = first_word.start if first_word else (segments[0].start if segments else 0.0)
    group: list[_Piece] = []
    line_len, line_count = 0, 1
    for segment in segments:
        words = segment.words or []
        for chunk_start in range(0, len(words), chunk_size):
            for i, word in enumerate(words[chunk_start : chunk_start + chunk_size]):
                text = word.word
                long_pause = not keep_segments and word.start - last_start > 3.0
                chunk_break = keep_segments and i == 0 and bool(group)
                fits = line_len + len(text) <= width
                if line_len > 0 and fits and not long_pause and not chunk_break:
                    line_len += len(text)  # the word continues the current line
                else:
                    text = text.strip()
                    full = opts.max_line_count is not None and (
                        long_pause or line_count >= opts.max_line_count
                    )
                    if (group and full) or chunk_break:
                        yield group
                        group, line_count = [], 1
                    elif line_len > 0:
                        line_count += 1
                        text = "\n" + text
                    line_len = len(text.strip())
                group.append(_Piece(word.start, word.end, text))
                last_start = word.start
    if group:
        yield group


def _cues(
    segments: Sequence[Segment], opts: WriterOptions, stamp: Callable[[float], str]
) -> Iterator[tuple[str, str, str]]:
    """(start, end, text) per subtitle cue, timestamps already formatted."""

    # "-->" in the text would end the cue's timing line early for every subtitle parser, and a
    # blank (or whitespace-only) line would end the cue itself: the lines after it were lost.
    def clean(text: str) -> str:
        lines = text.replace("-->", "->").split("\n")
        return "\n".join(line for line in lines if line.strip()) if len(lines) > 1 else lines[0]

    if not segments or any(segment.words is None for segment in segments):
        for segment in segments:
            yield stamp(segment.start), stamp(segment.end), clean(segment.text.strip())
        return
    for group in _subtitle_groups(segments, opts):
        start, end = stamp(group[0].start), stamp(group[-1].end)
        text = "".join(piece.text for piece in group)
        if not opts.highlight_words:
            yield start, end, clean(text)
            continue
        previous_end = start
        for i, piece in enumerate(group):
            word_start, word_end = stamp(piece.start), stamp(piece.end)
            if word_start != previous_end:  # the gap before this word shows the plain text
                yield previous_end, word_start, clean(text)
            marked = "".join(
                re.sub(r"^(\s*)(.*)$", r"\1<u>\2</u>", p.text, flags=re.DOTALL)
                if j == i
                else p.text
                for j, p in enumerate(group)
            )
            yield word_start, word_end, clean(marked)
            previous_end = word_end


def write_srt(
    segments: Sequence[Segment],
    info: Mapping[str, Any],
    file: TextIO,
    options: WriterOptions | None = None,
) -> None:
    """SubRip: numbered cues, `HH:MM:SS,mmm` timestamps."""

    def stamp(seconds: float) -> str:
        return format_timestamp(seconds, always_include_hours=True, decimal_marker=",")

    cues = _cues(segments, options or WriterOptions(), stamp)
    for number, (start, end, text) in enumerate(cues, start=1):
        print(f"{number}\n{start} --> {end}\n{text}\n", file=file)


def write_vtt(
    segments: Sequence[Segment],
    info: Mapping[str, Any],
    file: TextIO,
    options: WriterOptions | None = None,
) -> None:
    """WebVTT: a header, then `MM:SS.mmm` cues (hours only past the first hour)."""
    print("WEBVTT\n", file=file)
    for start, end, text in _cues(segments, options or WriterOptions(), format_timestamp):
        print(f"{start} --> {end}\n{text}\n", file=file)


Writer = Callable[[Sequence[Segment], Mapping[str, Any], TextIO, WriterOptions | None], None]
WRITERS: dict[str, Writer] = {
    "txt": write_txt,
    "srt": write_srt,
    "vtt": write_vtt,
    "tsv": write_tsv,
    "json": write_json,
}


def write(
    output_format: str,
    segments: Iterable[Segment],
    info: Mapping[str, Any] | object,
    file: TextIO,
    options: WriterOptions | Mapping[str, Any] | None = None,
) -> None:
    """Write one format to a stream (e.g. `write("srt", segments, info, sys.stdout)`)."""
    writer = WRITERS.get(output_format)
    if writer is None:
        raise InvalidOptionError(
            f"unknown output format {output_format!r}; use one of {', '.join(FORMATS)}"
        )
    writer(list(segments), _info_dict(info), file, _options(options))


# --- files -----------------------------------------------------------------------------------


def expand_formats(formats: str | Iterable[str]) -> list[str]:
    """ "all", "srt", "srt,vtt" or a list of names -> known format names, in order, once each."""
    names = formats.split(",") if isinstance(formats, str) else list(formats)
    result: list[str] = []
    for name in (n.strip().lower() for n in names):
        for expanded in FORMATS if name == "all" else (name,):
            if expanded not in FORMATS:
                raise InvalidOptionError(
                    f"unknown output format {expanded!r}; use one of {', '.join(FORMATS)} or all"
                )
            if expanded not in result:
                result.append(expanded)
    if not result:
        raise InvalidOptionError(f"no output format given; use one of {', '.join(FORMATS)} or all")
    return result


def safe_stem(input_path: str | os.PathLike) -> str:
    """The input's name without its extension, made safe as a file name in one folder."""
    stem = Path(os.fspath(input_path)).stem
    # No separators, control characters or a bare "."/"..": the name must stay in output_dir.
    stem = re.sub(r"[\x00-\x1f\x7f/\\]", "_", stem).strip()
    if stem.strip(".") == "":
        stem = "transcript"
    return stem


def output_paths(
    input_path: str | os.PathLike, output_dir: str | os.PathLike, formats: str | Iterable[str]
) -> list[Path]:
    """Where `write_result` would write, checked: inside output_dir and never the input."""
    folder = Path(output_dir).expanduser()
    resolved_folder = folder.resolve()
    source = Path(os.fspath(input_path)).expanduser()
    stem = safe_stem(input_path)
    paths = []
    for name in expand_formats(formats):
        path = folder / f"{stem}.{name}"
        resolved = path.resolve()  # follows a symlink already sitting at the target
        if resolved.parent != resolved_folder:
            raise WhisperforgeError(
                f"{path} points outside {folder}; remove it or choose another --output-dir"
            )
        same = resolved == source.resolve()
        if not same and path.exists() and source.exists():
            same = os.path.samefile(path, source)  # hard links, case-insensitive file systems
        if same:
            raise WhisperforgeError(
                f"writing {path} would overwrite the input file; choose another --output-dir"
            )
        paths.append(path)
    return paths


def output_folder(output_dir: str | os.PathLike) -> Path:
    """`output_dir`, created if needed; a clear error where it is a file."""
    folder = Path(output_dir).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise WhisperforgeError(f"{folder} is not a folder; choose another --output-dir") from None
    return folder


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[TextIO]:
    """A text file to write `path` through: written aside and renamed into place as the block
    ends, so `path` is complete, or as it was (a full disk, Ctrl-C), never cut short."""
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "w", encoding="utf-8") as file:
            yield file
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def write_result(
    segments: Iterable[Segment],
    info: Mapping[str, Any] | object,
    input_path: str | os.PathLike,
    output_dir: str | os.PathLike,
    formats: str | Iterable[str] = "all",
    options: WriterOptions | Mapping[str, Any] | None = None,
) -> list[Path]:
    """Write `<stem>.<format>` files into output_dir (created if needed); returns their paths.

    All targets are checked before the first is written, so a refusal leaves no partial output;
    each is `written_whole`.
    """
    segments = list(segments)  # a generator would be spent by the first format
    info = _info_dict(info)
    opts = _options(options)
    folder = output_folder(output_dir)
    paths = output_paths(input_path, folder, formats)
    failed = []  # one format that cannot be written does not cost the others
    for path in paths:
        try:
            with written_whole(path) as file:
                WRITERS[path.suffix[1:]](segments, info, file, opts)
        except OSError as error:
            failed.append(f"{path} ({error.strerror or error})")
    if failed:
        raise WhisperforgeError(f"could not write {', '.join(failed)}")
    return paths
