"""The `whisperforge` command: `transcribe` audio files, list the `models` available here,
`download` one, `stream` live audio, `serve` the OpenAI-compatible HTTP API, `batch` a corpus
(`corpus.py`), `export` to ONNX and `quantize` a checkpoint.

`transcribe`'s options follow openai-whisper's `whisper` command, spelled with dashes or, as
openai-whisper spells them, with underscores (`--word_timestamps True`).
User errors print one `error: ...` line on stderr and exit 1; usage errors exit 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import re
import shlex
import stat
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from .errors import (
    GPU_OUT_OF_MEMORY,
    AudioError,
    InvalidOptionError,
    WhisperforgeError,
    is_out_of_memory,
)
from .tokenizer import LANGUAGES, asks_detection, normalize_language, parse_token_ids
from .writers import (
    DETECTING_LANGUAGE,
    FORMATS,
    WriterOptions,
    detected_language,
    expand_formats,
    format_timestamp,
    output_paths,
    timed_line,
    write_result,
)

if TYPE_CHECKING:
    from .results import Segment
    from .transcribe import WhisperModel

DESCRIPTION = "Transcribe speech with OpenAI Whisper models."
TRANSCRIBE_EPILOG = """\
where the transcript goes:
  no --output-format and no --output-dir: the transcript is printed to stdout, one segment
    per line (nothing is written to disk).
  --output-dir DIR: files named after each input (jfk.flac -> DIR/jfk.srt) in the formats of
    --output-format, which defaults to all of them, as openai-whisper does.
  --output-format without --output-dir: files in the current folder, as openai-whisper does.
  An input file is never overwritten.

examples:
  whisperforge transcribe talk.flac
  whisperforge transcribe talk.flac --word-timestamps -f srt --max-line-width 42 -o subs/
  whisperforge transcribe *.wav --model base --language de --output-dir out/
  ffmpeg -i talk.mp4 -f wav - | whisperforge transcribe - -f srt
"""

STDIN = "-"  # the file name that reads the audio from stdin, as `stream -` does


def _optional_float(text: str) -> float | None:
    """A float, or None for "none" (openai-whisper's way to switch a threshold off)."""
    if text.lower() == "none":
        return None
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or none, got {text!r}") from None


# openai-whisper's boolean flag values (--fp16 False, --verbose True).
BOOLEANS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


# openai-whisper's flags that take True / False, which are switches here.
SWITCHES = {"--verbose", "--word-timestamps", "--highlight-words", "--carry-initial-prompt",
            "--condition-on-previous-text", "--vad-filter", "--without-timestamps"}  # fmt: skip


def _bool(text: str) -> bool:
    key = text.strip().lower()
    if key not in BOOLEANS:
        raise argparse.ArgumentTypeError(f"expected True or False, got {text!r}")
    return BOOLEANS[key]


def _language(text: str) -> str | None:
    """--language: a code or name, or none to detect it, as openai-whisper's --help says (or
    auto, as whisper.cpp's -l and the server's stream take it). One no model knows is refused
    here, before a model loads (base took 7 s to say "xx" is unknown); whether the model knows
    it is checked where the model reads it."""
    if asks_detection(text):
        return None
    try:
        normalize_language(text, tuple(LANGUAGES))
    except InvalidOptionError as error:
        raise argparse.ArgumentTypeError(f"{error}, or auto to detect it") from None
    return text


def _json_object(text: str) -> dict[str, Any]:
    """--vad-parameters: a JSON object (its fields are checked where the VAD's options are)."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"expected a JSON object such as '{{\"threshold\": 0.6}}', got {text!r}"
        )
    return value


def _token_ids(text: str) -> list[int] | None:
    """--suppress-tokens: comma-separated ids (-1: the symbols), or none."""
    if text.strip().lower() == "none":
        return None
    try:
        return parse_token_ids(text) or None
    except InvalidOptionError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


T = TypeVar("T", int, float)


def _number(
    kind: Callable[[str], T], valid: Callable[[T], bool], expected: str
) -> Callable[[str], T]:
    """An argparse type: `text` as a `kind` for which `valid` holds, else "expected ..."."""

    def parse(text: str) -> T:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not valid(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    return parse


_positive_int = _number(int, lambda n: n >= 1, "a whole number of at least 1")
_threads = _number(int, lambda n: n >= 0, "a whole number of threads, or 0 for torch's choice")
_positive_float = _number(float, lambda x: x > 0 and math.isfinite(x), "a number above 0")
_port = _number(int, lambda n: 0 <= n <= 65535, "a port number from 0 to 65535")
_count = _number(int, lambda n: n >= 0, "a whole number, 0 or none for no limit")


def _optional_positive_int(text: str) -> int | None:
    """A whole number of at least 1, or None for "none" (openai-whisper's flags take it)."""
    return None if text.strip().lower() == "none" else _positive_int(text)


def _line_limit(text: str) -> int | None:
    """A subtitle limit: a whole number, or none; 0 is none too, as openai-whisper's writers
    (and `writers.WriterOptions`) read it."""
    return None if text.strip().lower() == "none" else _count(text) or None


def build_parser() -> argparse.ArgumentParser:
    from . import __version__  # (the package imports this module)

    parser = argparse.ArgumentParser(prog="whisperforge", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"whisperforge {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    t = commands.add_parser(
        "transcribe",
        help="transcribe (or translate) audio files",
        description="Transcribe audio files (any format FFmpeg reads).",
        usage=short_usage("FILE [FILE ...]"),
        epilog=TRANSCRIBE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t.add_argument(
        "files", nargs="+", metavar="FILE",
        help="audio file(s) to transcribe; - reads one from stdin (written as stdin.*)",
    )  # fmt: skip
    _add_model_options(t)

    decode = add_decoding_options(t, batched=False)
    decode.add_argument(
        "--batch-size",
        metavar="N",
        type=_positive_int,
        default=None,
        help="the throughput mode: VAD-cut windows decoded N at a time, with temperature "
        "fallback and, unless --condition-on-previous-text, no conditioning "
        "(default: sequential)",
    )

    out = t.add_argument_group("output")
    out.add_argument(
        "--output-format",
        "-f",
        choices=[*FORMATS, "all"],
        default=None,
        help="file format (default: text on stdout, or all with --output-dir); "
        "see 'where the transcript goes' below",
    )
    out.add_argument(
        "--output-dir",
        "-o",
        default=None,
        metavar="DIR",
        help="folder for the output files (created if needed)",
    )
    out.add_argument(
        "--verbose",
        action="store_true",
        help="print each segment as `[00:00.000 --> 00:07.740] text` as it is "
        "transcribed (instead of the plain text on stdout)",
    )
    out.add_argument(
        "--highlight-words",
        action="store_true",
        help="srt/vtt: underline each word as it is spoken",
    )
    out.add_argument(
        "--max-line-width",
        type=_line_limit,
        default=None,
        metavar="N",
        help="srt/vtt: characters per line before a line break",
    )
    out.add_argument(
        "--max-line-count",
        type=_line_limit,
        default=None,
        metavar="N",
        help="srt/vtt: lines per subtitle (needs --max-line-width)",
    )
    out.add_argument(
        "--max-words-per-line",
        type=_line_limit,
        default=None,
        metavar="N",
        help="srt/vtt: words per subtitle (no effect with --max-line-width and --max-line-count)",
    )
    t.set_defaults(run=run_transcribe)

    m = commands.add_parser(
        "models",
        help="list the models that load on this machine",
        description="List the model names that load here and where from.",
    )
    m.add_argument(
        "--model-dir",
        metavar="DIR",
        default=None,
        help="the hub cache that --model-dir names for the other commands (default: the "
        "Hugging Face cache)",
    )
    m.set_defaults(run=run_models)
    d = commands.add_parser(
        "download",
        help="a model as one CTranslate2 folder (for offline use elsewhere)",
        description="Print the folder holding a model as CTranslate2 lays it out (model.bin, "
        "config.json, tokenizer.json, vocabulary), found as --model finds it; with "
        "--output-dir, its files written there.",
    )
    d.add_argument("model", metavar="NAME", help="a model name (see `whisperforge models`)")
    d.add_argument("--output-dir", "-o", metavar="DIR", default=None, help="write the files here")
    d.add_argument(
        "--revision", metavar="REV", default=None, help="a hub model's branch, tag or commit"
    )
    d.set_defaults(run=run_download)
    _add_stream_parser(commands)
    _add_serve_parser(commands)
    _add_quantize_parser(commands)
    _add_export_parser(commands)
    from .corpus import add_batch_parser  # the corpus job keeps its options with it

    add_batch_parser(commands)
    return parser


def add_task_option(parser: Any, note: str = "") -> None:
    """--task, as `transcribe`, `batch` and `stream` take it (`note`: added to its help)."""
    parser.add_argument(
        "--task",
        default="transcribe",
        choices=["transcribe", "translate"],
        help="transcribe, or translate to English (default: %(default)s)" + note,
    )


def add_decoding_options(parser: argparse.ArgumentParser, batched: bool) -> Any:
    """The decoding options of `transcribe` and `batch` (`batched`: the corpus job, always on
    the batched pipeline), in two groups; returns the first. `batch` takes the options only
    the sequential loop honours too, hidden, to refuse them by name (`refuse_unbatched`)."""
    decode = parser.add_argument_group("decoding")
    # A manifest's own `language` and `task` columns win over these in `batch`.
    own = "; a manifest row's own `{}` wins" if batched else ""
    decode.add_argument(
        "--language",
        metavar="LANG",
        type=_language,
        default=None,
        help="spoken language as a code, name or locale (en, German, pt-BR, ...); detected per "
        "file when omitted or none" + own.format("language"),
    )
    add_task_option(decode, own.format("task"))
    decode.add_argument(
        "--beam-size",
        metavar="N",
        type=_optional_positive_int,
        default=5,
        help="beams at temperature 0; 1 or none is greedy (default: %(default)s)",
    )
    decode.add_argument(
        "--best-of",
        metavar="N",
        type=_optional_positive_int,
        default=5,
        help="samples per window above temperature 0; none is 1 (default: %(default)s)",
    )
    decode.add_argument(
        "--temperature",
        metavar="T",
        type=float,
        default=0.0,
        help="first sampling temperature (default: %(default)s)",
    )
    decode.add_argument(
        "--temperature-increment-on-fallback",
        metavar="STEP",
        type=_optional_float,
        default=0.2,
        help="step up to 1.0 when a window fails the quality thresholds; "
        "none: no fallback (default: %(default)s)",
    )
    decode.add_argument(
        "--initial-prompt",
        metavar="TEXT",
        default=None,
        help="text that prompts every window (names, spelling, style); with "
        "--condition-on-previous-text, each chain's first"
        if batched
        else "text that conditions the first window (names, spelling, style)",
    )
    decode.add_argument(
        "--hotwords",
        metavar="TEXT",
        default=None,
        help="words to favour, e.g. names to spell right (put in every window's prompt)",
    )
    decode.add_argument(
        "--repetition-penalty",
        metavar="P",
        type=float,
        default=1.0,
        help="above 1: each token a window has sampled scores lower (default: %(default)s)",
    )
    decode.add_argument(
        "--no-repeat-ngram-size",
        metavar="N",
        type=int,
        default=0,
        help="no N tokens in a row twice within a window; 0: off (default: %(default)s)",
    )
    decode.add_argument(
        "--multilingual",
        action="store_true",
        help="detect each 30 s window's language, for speech that changes language",
    )
    decode.add_argument(
        "--condition-on-previous-text",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="prompt each window with the text before it; each file is then cut into "
        "--batch-size chains of windows, each conditioned on its own text (default: off, "
        "each window alone)"
        if batched
        else "prompt each window with the previous text (default: on; with --batch-size off, "
        "and on it cuts the file into N chains of windows, each conditioned on its own text)",
    )
    decode.add_argument(
        "--word-timestamps",
        action="store_true",
        default=None,  # None: not given; the subtitle options below then turn it on
        help="time every word"
        + ("" if batched else " (implied by the subtitle options below and "
           "--hallucination-silence-threshold)"),
    )  # fmt: skip
    # openai-whisper's --word_timestamps False, said by name: the subtitle options are refused.
    decode.add_argument("--no-word-timestamps", dest="word_timestamps", action="store_false",
                        help=argparse.SUPPRESS)  # fmt: skip
    decode.add_argument(
        "--without-timestamps",
        action="store_true",
        help="decode the text without timestamp tokens: one segment per window, timed by the "
        "window",
    )
    decode.add_argument(
        "--prepend-punctuations",
        metavar="CHARS",
        help="with word timestamps: these join the next word (default: openai-whisper's)",
    )
    decode.add_argument(
        "--append-punctuations",
        metavar="CHARS",
        help="with word timestamps: these join the word before (default: openai-whisper's)",
    )
    decode.add_argument(
        "--clip-timestamps",
        metavar="LIST",
        default="0",
        help=argparse.SUPPRESS
        if batched
        else "start,end,start,end,... seconds to transcribe; the last end "
        "defaults to the end of the file (default: %(default)s)",
    )
    decode.add_argument(
        "--vad-filter",
        default=None,
        action=argparse.BooleanOptionalAction,
        help="decode only the speech that Silero VAD finds (default: on); --no-vad-filter "
        "cuts each file every --chunk-length (30) seconds instead"
        if batched
        else "skip the parts without speech (Silero VAD) before transcribing (default: off; "
        "on with --batch-size, where --no-vad-filter cuts the audio every --chunk-length "
        "(30) seconds instead)",
    )
    decode.add_argument(
        "--vad-parameters",
        metavar="JSON",
        type=_json_object,
        default=None,
        help="the VAD's options to change, e.g. '{\"threshold\": 0.6, "
        '"min_silence_duration_ms": 500}\' (also neg_threshold, min_speech_duration_ms, '
        "max_speech_duration_s, speech_pad_ms; default: faster-whisper's, with 160 ms "
        "silences and speech of at most --chunk-length in the batched mode)",
    )
    decode.add_argument(
        "--hallucination-silence-threshold",
        type=_optional_float,
        default=None,
        metavar="SECONDS",
        help=argparse.SUPPRESS
        if batched
        else "skip silences longer than this around likely hallucinations",
    )

    search = parser.add_argument_group(
        "search and fallback (openai-whisper's and faster-whisper's)"
    )
    search.add_argument(
        "--patience",
        metavar="P",
        type=_optional_float,
        default=1.0,
        help="beam search: finish after P x beam-size candidates (default: %(default)s)",
    )
    search.add_argument(
        "--length-penalty",
        metavar="P",
        type=_optional_float,
        default=None,
        help="rank beams and samples by log-prob / ((5 + length) / 6)^P, the Google NMT "
        "alpha, as openai-whisper's --length_penalty (faster-whisper's Python argument of "
        "that name is an exponent of the length instead); default: by log-prob / length",
    )
    search.add_argument(
        "--compression-ratio-threshold",
        metavar="R",
        type=_optional_float,
        default=2.4,
        help="fall back when the text's gzip ratio is above R; none: off (default: %(default)s)",
    )
    search.add_argument(
        "--log-prob-threshold",
        "--logprob-threshold",
        metavar="L",
        type=_optional_float,
        default=-1.0,
        help="fall back when the average log-probability is below L; none: off "
        "(default: %(default)s)",
    )
    search.add_argument(
        "--no-speech-threshold",
        metavar="P",
        type=_optional_float,
        default=0.6,
        help="skip a window as silence when its no-speech probability is above P and it "
        "decoded below --log-prob-threshold; none: off (default: %(default)s)",
    )
    search.add_argument(
        "--log-prob-low-threshold",
        metavar="L",
        type=_optional_float,
        default=None,
        help="skip a window whose average log-probability is below L, however likely speech",
    )
    search.add_argument(
        "--suppress-tokens",
        metavar="IDS",
        type=_token_ids,
        default="-1",
        help="token ids never to sample, as -1,50362; -1: the symbols (default: %(default)s)",
    )
    search.add_argument(
        "--carry-initial-prompt",
        action="store_true",
        help="put --initial-prompt before every window's prompt, not only the first",
    )
    search.add_argument(
        "--chunk-length",
        metavar="SECONDS",
        type=float,
        default=None,
        help="seconds of audio a window holds, up to 30 (default: 30)",
    )
    search.add_argument(
        "--max-new-tokens",
        metavar="N",
        type=_positive_int,
        default=None,
        help="tokens a window may sample (default: half the text context)",
    )
    return decode


def _add_model_options(parser: argparse.ArgumentParser, threads: int = 0) -> None:
    group = parser.add_argument_group("model")
    group.add_argument(
        "--model",
        default="tiny.en",
        metavar="NAME",
        help="model name (see `whisperforge models`), model folder or OpenAI .pt "
        "file (default: %(default)s)",
    )
    group.add_argument(
        "--model-dir",
        metavar="DIR",
        default=None,
        help="where models are looked for and downloaded (default: the Hugging Face cache)",
    )
    group.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA when present), cpu or cuda[:N] (default: %(default)s)",
    )
    group.add_argument(
        "--compute-type",
        default="default",
        choices=["default", "auto", "float32", "float16", "bfloat16", *QUANTIZED_COMPUTE_TYPES],
        help="default: float16 on CUDA, float32 on CPU (a quantized model: its own type); "
        "auto: the fastest here (float16 on CUDA, int8 on CPU)",
    )
    group.add_argument(
        "--fp16",
        type=_bool,
        default=None,
        metavar="BOOL",
        help="openai-whisper's: False means --compute-type float32 (default: the compute type's)",
    )
    group.add_argument(
        "--threads",
        metavar="N",
        type=_threads,
        default=threads,
        help="CPU threads for torch (0: torch's choice; default: %(default)s)",
    )


STREAM_EPILOG = """\
input: a file path or - for stdin. Raw PCM (signed 16-bit little-endian, mono, 16 kHz or
  --sample-rate) is read as it arrives, and so is audio piped in live (WAV, MP3, AAC, FLAC,
  Ogg, WebM); a file (and an MP4) is decoded first. --input-format auto takes a file named
  .raw, .pcm or .s16le for raw PCM, and stdin by its first bytes. Ctrl-C stops the input: what
  had arrived is transcribed and printed, as at its end.

examples:
  whisperforge stream talk.flac --realtime
  arecord -f S16_LE -r 16000 | whisperforge stream - --language en
  ffmpeg -i talk.mp4 -f s16le -ar 16000 -ac 1 - | whisperforge stream - --timestamps
"""


def _add_stream_parser(commands: Any) -> None:
    s = commands.add_parser(
        "stream",
        help="live transcription of a stream: prints text as it becomes final",
        usage=short_usage("FILE|-"),
        description="Transcribe audio as it arrives (LocalAgreement-2); committed text is "
        "printed once and never changes.",
        epilog=STREAM_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    s.add_argument("input", metavar="FILE|-", help="audio file, or - for stdin")
    s.add_argument(
        "--input-format",
        choices=["auto", "s16le", "file"],
        default="auto",
        help="s16le: raw mono PCM (16 kHz, or --sample-rate); file: any file (default: auto)",
    )
    s.add_argument(
        "--sample-rate",
        metavar="HZ",
        type=_positive_int,
        default=16000,
        help="raw PCM's sample rate, 8000-192000, resampled to 16 kHz (default: %(default)s)",
    )
    s.add_argument(
        "--realtime",
        action="store_true",
        help="pace the input at real time (as a live source would arrive)",
    )
    s.add_argument(
        "--language",
        metavar="LANG",
        type=_language,
        default=None,
        help="spoken language; detected once speech starts when omitted or none",
    )
    add_task_option(s)
    s.add_argument(
        "--initial-prompt",
        metavar="TEXT",
        default=None,
        help="text said to come before the stream (names and their spellings, the topic); "
        "the committed text takes its place as it grows",
    )
    s.add_argument(
        "--beam-size",
        metavar="N",
        type=_positive_int,
        default=1,
        help="beams per update; 1 is greedy (default: %(default)s)",
    )
    s.add_argument(
        "--min-chunk",
        metavar="SECONDS",
        type=float,
        default=1.0,
        help="new audio per update: lower is faster to commit, costs more (default: %(default)s)",
    )
    s.add_argument(
        "--agreement",
        metavar="N",
        type=int,
        default=2,
        help="hypotheses that must agree before words are final (default: %(default)s)",
    )
    s.add_argument(
        "--silence-db",
        metavar="DBFS",
        type=float,
        default=None,
        help="skip updates on audio quieter than this, e.g. -45 (default: off)",
    )
    s.add_argument(
        "--timestamps",
        action="store_true",
        help="print each update's committed words as `[start --> end] text` lines",
    )
    _add_model_options(s, threads=0)
    s.set_defaults(run=run_stream)


def _add_serve_parser(commands: Any) -> None:
    v = commands.add_parser(
        "serve",
        help="run an OpenAI-compatible HTTP server (/v1/audio/transcriptions, ...)",
        usage=short_usage(),
        description="Serve /v1/audio/transcriptions, /v1/audio/translations, /v1/models, "
        "/health and the WebSocket /v1/audio/stream (needs: pip install 'whisperforge[server]').",
    )
    v.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on; 0.0.0.0 exposes it to the network (default: %(default)s)",
    )
    v.add_argument("--port", type=_port, default=8000, help="(default: %(default)s)")
    v.add_argument(
        "--api-key",
        metavar="KEY",
        default=os.environ.get("WHISPERFORGE_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $WHISPERFORGE_API_KEY, else no key)",
    )
    v.add_argument(
        "--cors-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="let scripts of web pages from ORIGIN (e.g. https://app.example.com; '*': any) call "
        "the API from a browser; repeat it for more (default: none)",
    )
    v.add_argument(
        "--max-upload-mb",
        metavar="MB",
        type=_positive_float,
        default=25.0,
        help="largest accepted upload (default: %(default)s)",
    )
    v.add_argument(
        "--max-audio-s",
        type=_positive_float,
        default=4 * 3600.0,
        metavar="SECONDS",
        help="longest accepted audio, however small its file (default: %(default)s)",
    )
    v.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=300.0,
        metavar="SECONDS",
        help="give up on a request after this long (default: %(default)s)",
    )
    v.add_argument(
        "--beam-size",
        metavar="N",
        type=_positive_int,
        default=5,
        help="beams at temperature 0 (default: %(default)s)",
    )
    v.add_argument(
        "--max-queue",
        metavar="N",
        type=_positive_int,
        default=256,
        help="requests waiting before new ones get 503 (default: %(default)s)",
    )
    v.add_argument(
        "--max-audio-memory-mb",
        metavar="MB",
        type=_positive_float,
        default=None,
        help="memory that the audio of the requests in progress may hold (uploads, samples, "
        "mels: about 440 MB an hour of audio) before new ones get 503 (default: half the "
        "memory available once the model has loaded)",
    )
    v.add_argument(
        "--batch-size",
        metavar="N",
        type=_positive_int,
        default=None,
        help="decode the 30 s windows of up to N requests together (continuous batching; "
        "1: one request at a time, a short one waiting behind a long one). Default: 16 on CUDA, "
        "4 on the CPU",
    )
    v.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: %(default)s)",
    )
    _add_model_options(v)
    v.set_defaults(run=run_serve)


# --- transcribe ------------------------------------------------------------------------------


def load_model(args: argparse.Namespace) -> WhisperModel:
    """The model for this run (a seam: tests swap in an already loaded one)."""
    from .transcribe import WhisperModel  # torch is slow to import: only when needed

    return WhisperModel(args.model, device=args.device, compute_type=_compute_type(args),
                        cpu_threads=args.threads, download_root=args.model_dir)  # fmt: skip


def _compute_type(args: argparse.Namespace) -> str:
    """--compute-type, or float32 where openai-whisper's --fp16 False asks for it: float32
    activations, so a `whisperforge quantize` folder's int8 weights stay int8 (int8_float32),
    as `fp16=False` keeps them in the Python API (it had been dequantized to float32, silently
    slower)."""
    if args.fp16 is not False or args.compute_type != "default":
        return args.compute_type
    from .checkpoints import quantized_compute_type
    from .quantize import COMPUTE_TYPES

    folder = Path(str(args.model)).expanduser()
    saved = quantized_compute_type(folder) if folder.is_dir() else None
    return "int8_float32" if COMPUTE_TYPES.get(saved, (None, None))[1] == "int8" else "float32"


def _writer_options(args: argparse.Namespace, formats: list[str]) -> WriterOptions:
    """The subtitle options; a warning where `formats` (the files written) have no use for them."""
    options = WriterOptions(
        max_line_width=args.max_line_width,
        max_line_count=args.max_line_count,
        highlight_words=args.highlight_words,
        max_words_per_line=args.max_words_per_line,
    )
    given = [f"--{name.replace('_', '-')}" for name, value in vars(options).items() if value]
    if given and not {"srt", "vtt"} & set(formats):
        written = "prints the text" if not formats else f"writes {', '.join(formats)}"
        _warn(f"{', '.join(given)}: for srt and vtt files, and this run {written}; "
              "add -f srt, vtt or all")  # fmt: skip
    if options.max_line_count and not options.max_line_width:
        _warn("--max-line-count has no effect without --max-line-width")
    if options.max_words_per_line and options.max_line_width and options.max_line_count:
        _warn("--max-words-per-line has no effect with --max-line-width and --max-line-count")
    return options


def warn_of_translated_word_times(word_times: bool, task: str) -> None:
    """openai-whisper's warning: word times follow the spoken words, not their translation."""
    if word_times and task == "translate":
        from .timing import TRANSLATED_WORD_TIMES

        _warn(TRANSLATED_WORD_TIMES)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _file_warning_shower(path: str) -> Callable[..., None]:
    """A `warnings.showwarning` that names the file a warning is about."""

    def show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
        text = str(message)
        _warn(text if text.startswith(f"{path}: ") else f"{path}: {text}")

    return show


def _error(message: str) -> None:
    """One `error:` line on stderr: scripts and people read it the same way."""
    print("error: " + " ".join(message.split()), file=sys.stderr)


def _file_error(path: str, error: BaseException) -> None:
    message = str(error) or type(error).__name__
    if message.startswith(f"{path}: "):  # audio errors already name the file
        message = message[len(path) + 2 :]
    _error(f"{path}: {message}")


def _output_name(path: str) -> str:
    """The name the output files are named after: stdin's audio is written as stdin.*."""
    return "stdin" if path == STDIN else path


def transcription_arguments(args: argparse.Namespace, batched: bool) -> dict[str, Any]:
    """`TranscriptionOptions.from_arguments`' keywords from the decoding options, as
    openai-whisper's command reads them, for the sequential loop or (`batched`) the batched
    pipeline: no conditioning unless asked, and clip timestamps are its call's own."""
    from .transcribe import temperature_ladder  # torch is slow to import: only when needed

    options: dict[str, Any] = {
        "beam_size": args.beam_size or 1,  # openai-whisper's "None": no beam search
        "best_of": args.best_of or 1,
        "temperature": temperature_ladder(args.temperature, args.temperature_increment_on_fallback),
        "initial_prompt": args.initial_prompt,
        "word_timestamps": bool(args.word_timestamps),  # None: not given
        "without_timestamps": args.without_timestamps,
        "hotwords": args.hotwords,
        "repetition_penalty": args.repetition_penalty,
        "no_repeat_ngram_size": args.no_repeat_ngram_size,
        "multilingual": args.multilingual,
        "patience": 1.0 if args.patience is None else args.patience,
        "nmt_length_penalty": args.length_penalty,  # openai-whisper's CLI: the NMT alpha
        "compression_ratio_threshold": args.compression_ratio_threshold,
        "log_prob_threshold": args.log_prob_threshold,
        "no_speech_threshold": args.no_speech_threshold,
        "log_prob_low_threshold": args.log_prob_low_threshold,
        "suppress_tokens": args.suppress_tokens,
        "carry_initial_prompt": args.carry_initial_prompt,
        "chunk_length": args.chunk_length,
        "max_new_tokens": args.max_new_tokens,
    }
    if batched:
        options["condition_on_previous_text"] = bool(args.condition_on_previous_text)
    else:
        options["condition_on_previous_text"] = args.condition_on_previous_text is not False
        # openai-whisper's loop: its files hold the instantaneous segments a window cuts, emptied
        options["keep_empty_segments"] = True
        options["clip_timestamps"] = args.clip_timestamps
        options["hallucination_silence_threshold"] = args.hallucination_silence_threshold
    for name in ("prepend_punctuations", "append_punctuations"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    return options


def vad_arguments(args: argparse.Namespace, batched: bool) -> dict[str, Any]:
    """`vad_filter` and `vad_parameters`: the VAD runs by default in the batched pipeline only,
    and VAD parameters where no VAD runs are refused, not ignored."""
    vad_filter = batched if args.vad_filter is None else args.vad_filter
    if args.vad_parameters is not None and not vad_filter:
        off = "with --no-vad-filter" if batched else "without --vad-filter"
        raise InvalidOptionError(f"--vad-parameters: no VAD runs {off}; drop one of them")
    return {"vad_filter": vad_filter, "vad_parameters": args.vad_parameters}


def sequential_only(args: argparse.Namespace) -> list[str]:
    """The options given that only the sequential loop honours."""
    given = {"--hallucination-silence-threshold": args.hallucination_silence_threshold is not None}
    return [name for name, on in given.items() if on]


def _transcribe_one(
    model: WhisperModel, path: str, args: argparse.Namespace, stdout_text: bool, header: bool
) -> tuple[list[Segment], dict[str, Any]]:
    """Transcribe one file, showing progress and (when asked) the text as it arrives."""
    from tqdm import tqdm

    from .transcribe import TranscriptionOptions, with_progress

    audio: str | bytes = sys.stdin.buffer.read() if path == STDIN else path
    batched = args.batch_size is not None
    transcription = TranscriptionOptions.from_arguments(**transcription_arguments(args, batched))
    if batched:
        from .batched import BatchedInferencePipeline

        segments_iter, info = BatchedInferencePipeline(model).transcribe_with(
            audio, transcription, args.language, args.task, args.batch_size,
            clip_timestamps=None if args.clip_timestamps == "0" else args.clip_timestamps,
            **vad_arguments(args, batched),
        )  # fmt: skip
    else:
        segments_iter, info = model.transcribe_with(
            audio, transcription, args.language, args.task, **vad_arguments(args, batched)
        )
    # Printed once the audio is read and its language found: a file that fails gets no header.
    if header and (stdout_text or args.verbose):
        print(f"==> {path} <==", flush=True)
    if args.verbose and args.language is None and model.is_multilingual:
        # openai-whisper's lines (an English-only model has no language to detect)
        print(DETECTING_LANGUAGE, detected_language(info.language), sep="\n", flush=True)
    segments = []
    # A bar in a log file is noise: shown only on a terminal, and not beside --verbose's lines
    # (as openai-whisper: they show the progress).
    shown = sys.stderr.isatty() and not args.verbose
    for segment in with_progress(
        segments_iter, info.duration, Path(_output_name(path)).name, shown
    ):
        segments.append(segment)
        if args.verbose:
            tqdm.write(timed_line(segment), file=sys.stdout)
        elif stdout_text:
            tqdm.write(segment.text.strip(), file=sys.stdout)  # the txt layout, streamed
    sys.stdout.flush()
    return segments, {"language": info.language}


def run_transcribe(args: argparse.Namespace) -> int:
    word_options = {
        "--highlight-words": args.highlight_words,
        "--max-line-width": args.max_line_width,
        "--max-line-count": args.max_line_count,
        "--max-words-per-line": args.max_words_per_line,
        "--hallucination-silence-threshold": args.hallucination_silence_threshold is not None,
    }
    given = [name for name, value in word_options.items() if value]
    if given and args.word_timestamps is False:  # --word_timestamps False, by name
        raise InvalidOptionError(
            f"{given[0]} requires --word_timestamps True (it works on word timings); drop one "
            "of them"
        )
    # These work on word timings; openai-whisper makes you ask for them as well.
    args.word_timestamps = bool(given) or bool(args.word_timestamps)
    warn_of_translated_word_times(args.word_timestamps, args.task)
    unbatched = sequential_only(args)
    if args.batch_size is not None and unbatched:
        raise InvalidOptionError(
            f"{', '.join(unbatched)}: not available with --batch-size; drop one of them"
        )
    vad_arguments(args, batched=args.batch_size is not None)  # refused before the model loads
    write_files = args.output_dir is not None or args.output_format is not None
    formats = args.output_format or "all"
    options = _writer_options(args, expand_formats(formats) if write_files else [])
    output_dir = args.output_dir if args.output_dir is not None else "."

    failed = False
    # A typo in a path should not cost a model load: report missing files first.
    files = []
    for path in args.files:
        if path == STDIN:
            if args.files.count(STDIN) > 1:
                raise InvalidOptionError("- is given twice, but stdin holds one audio file")
            if sys.stdin.isatty():
                raise InvalidOptionError("-: stdin is a terminal; pipe an audio file in")
            files.append(path)
        elif not os.path.exists(path) or os.path.isdir(path):  # pipes and /dev/stdin are fine
            what = "is a folder, not an audio file" if os.path.isdir(path) else "no such file"
            _error(f"{path}: {what}; check the path")
            failed = True
        else:
            files.append(path)
    if not files:
        return 1

    if write_files:  # a bad --output-dir should fail now, not after the first transcription
        folder = Path(output_dir).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise WhisperforgeError(f"--output-dir {output_dir} is not a folder") from None
        except OSError as error:
            raise WhisperforgeError(f"--output-dir {output_dir}: {error.strerror}") from None
        try:
            tempfile.TemporaryFile(dir=folder).close()
        except OSError as error:
            raise WhisperforgeError(
                f"--output-dir {output_dir} cannot be written to ({error.strerror}); choose another"
            ) from None

    model = load_model(args)
    if args.fp16 and model.device.type == "cpu":  # asked for by name: say so, as openai-whisper
        _warn("FP16 is not supported on CPU; using FP32 instead")
    written: set[Path] = set()
    for done, path in enumerate(files):
        try:
            if write_files:  # check the targets before spending time on the audio
                targets = output_paths(_output_name(path), output_dir, formats)
                clash = next((p for p in targets if p.resolve() in written), None)
                if clash is not None:
                    raise WhisperforgeError(
                        f"{clash} was already written for an earlier input with the same name; "
                        "transcribe it with another --output-dir"
                    )
            several = len(args.files) > 1
            with warnings.catch_warnings():  # entering it clears Python's once-per-place memory
                if several:  # so that each file's warnings are shown, naming it
                    warnings.showwarning = _file_warning_shower(path)
                segments, info = _transcribe_one(
                    model, path, args, stdout_text=not write_files, header=several
                )
            if write_files:
                paths = write_result(
                    segments, info, _output_name(path), output_dir, formats, options
                )
                written.update(p.resolve() for p in paths)
        except (InvalidOptionError, BrokenPipeError):
            raise  # an option no file can satisfy, or no reader left: stop here (main())
        except KeyboardInterrupt:
            if len(files) > 1:  # say where it stopped: what is done need not be done again
                kept = f"; their files are in {output_dir}" if write_files and done else ""
                print(f"interrupted at {path}: {done} of {len(files)} files done{kept}",
                      file=sys.stderr)  # fmt: skip
            raise
        except (WhisperforgeError, OSError) as error:
            _file_error(path, error)
            failed = True
        except Exception as error:  # noqa: BLE001 -- a bug, not the user's fault: say so, go on
            if is_out_of_memory(error):  # not a bug: the options ask more than the GPU holds
                _file_error(path, WhisperforgeError(GPU_OUT_OF_MEMORY))
                failed = True
                continue
            if args.verbose:
                traceback.print_exc()
            hint = "" if args.verbose else "; rerun with --verbose for the traceback"
            _error(f"{path}: internal error {type(error).__name__}: {error}{hint}")
            failed = True
    return 1 if failed else 0


# --- models ----------------------------------------------------------------------------------


def run_models(args: argparse.Namespace) -> int:
    from .model_names import (  # not .checkpoints: it imports torch, 1.2 s of a 2.5 s listing
        HUB_REPOS,
        PACKAGE_INSTALL_HINT,
        PACKAGED_MODELS,
        openai_cached_file,
        packaged_model_folders,
    )

    print("Installed model packages (load offline):")
    missing = []
    for name in sorted(PACKAGED_MODELS):
        folders = packaged_model_folders(name)
        if folders:
            where = ", ".join(str(folder) for folder in folders)
            print(f"  {name:<16} {where}")
        else:
            missing.append(name)
    if missing:
        print("Installable as packages (not installed):")
        for name in missing:
            print(f"  {name:<16} {PACKAGE_INSTALL_HINT.get(name, '')}")

    if args.model_dir and not Path(args.model_dir).expanduser().is_dir():
        # A mistyped folder was listed as an empty cache, "(none)", with no word of the typo.
        _warn(f"--model-dir {args.model_dir}: no such folder; check the path")
    cached = _hub_cached(HUB_REPOS, args.model_dir)
    where = args.model_dir or "the Hugging Face hub cache, or openai-whisper's"
    if args.model_dir is None:  # (a --model-dir is looked in alone)
        found = {name for name, _ in cached}
        cached += [(n, f"{f} (openai-whisper's)") for n in sorted(HUB_REPOS)
                   if n not in found and (f := openai_cached_file(n))]  # fmt: skip
    print(f"In {where} (load offline):")
    for name, repo in cached:
        print(f"  {name:<16} {repo}")
    if not cached:
        print("  (none)")
    others = sorted(set(HUB_REPOS) - set(PACKAGED_MODELS) - {name for name, _ in cached})
    note = (
        f"Other names ({', '.join(others)}) load from the Hugging Face hub cache, downloaded "
        "once when online. --model also takes a local model folder (CTranslate2 or "
        "transformers) or an OpenAI .pt file."
    )
    print(textwrap.fill(note, width=88, break_on_hyphens=False))  # names stay whole
    return 0


# download_model's arguments, as the `download` command's options.
DOWNLOAD_FLAGS = {"output_dir": "--output-dir", "revision": "--revision"}


def run_download(args: argparse.Namespace) -> int:
    from .checkpoints import download_model

    try:
        print(download_model(args.model, args.output_dir, revision=args.revision))
    except WhisperforgeError as error:
        raise _as_typed(error, DOWNLOAD_FLAGS) from None
    return 0


def _hub_cached(repos: dict[str, str], cache_dir: str | None) -> list[tuple[str, str]]:
    """Names whose converted weights are already in the local hub cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return []
    found = []
    for name, repo in sorted(repos.items()):
        try:
            hit = try_to_load_from_cache(repo, "model.bin", cache_dir=cache_dir)
        except (OSError, ValueError):  # a damaged cache is not worth failing a listing for
            hit = None
        if isinstance(hit, str):
            found.append((name, repo))
    return found


# --- stream ----------------------------------------------------------------------------------

_CONTAINER_MAGIC = (
    b"RIFF",
    b"RF64",
    b".snd",
    b"wvpk",
    b"MAC ",
    b"\xff\xf1",  # ADTS AAC (MPEG-4, MPEG-2)
    b"\xff\xf9",
    b"fLaC",
    b"ID3",
    b"OggS",
    b"\x1aE\xdf\xa3",
    b"FORM",
    b"\xff\xfb",
    b"\xff\xf3",
    b"\xff\xf2",
    b"#!AMR",
    b"caff",
)


def _looks_like_container(head: bytes) -> bool:
    return head.startswith(_CONTAINER_MAGIC) or head[4:8] == b"ftyp"


def _looks_like_text(head: bytes) -> bool:
    """Printable ASCII only: text piped in by mistake. As s16le PCM, 12 such bytes would be six
    loud positive samples in a row, never how a recording starts (its high bytes are near 0x00
    or 0xff)."""
    return all(32 <= byte < 127 or byte in b"\t\n\r" for byte in head)


class _StreamInput:
    """The `stream` command's input as chunks: float32 arrays of a file decoded whole, or s16le
    bytes as they arrive where it is raw PCM or a live pipe. `rest()`: after Ctrl-C, what had
    arrived and was not handed out yet."""

    def __init__(self, args: argparse.Namespace, chunk_bytes: int):
        self.args, self.chunk_bytes = args, chunk_bytes
        self.arrivals: _Arrivals | None = None

    def rest(self) -> bytes:
        return self.arrivals.rest() if self.arrivals is not None else b""

    def __iter__(self) -> Iterator[Any]:
        from .audio import decode_arriving, load_audio

        args = self.args
        stdin = args.input == "-"
        name = "stdin" if stdin else args.input
        raw_name = args.input.lower().endswith((".raw", ".pcm", ".s16le"))
        source = sys.stdin.buffer if stdin else open(args.input, "rb")  # noqa: SIM115
        with source:
            head = source.read(12)
            # auto: a named file is raw PCM by its name only (a damaged .wav is an error, not
            # noise); stdin by its first bytes.
            is_raw = args.input_format == "s16le" or (
                args.input_format == "auto"
                and (raw_name or (stdin and not _looks_like_container(head)))
            )
            if is_raw and args.input_format == "auto" and stdin and head and _looks_like_text(head):
                raise AudioError(
                    f"stdin holds text ({head.decode()!r}...), not audio; pipe in raw 16 kHz "
                    "mono s16le PCM or an audio file, or pass --input-format s16le to read it "
                    "as PCM"
                )
            live = _is_live(source)
            # A container from a pipe is decoded as it arrives; but an MP4 (its index may come
            # last) and a file are decoded whole, then handed out in chunks.
            if not is_raw and not (live and head[4:8] != b"ftyp"):
                audio = load_audio(head + source.read() if stdin else args.input)
                step = self.chunk_bytes // 2
                for i in range(0, audio.size, step):
                    yield audio[i : i + step]
                return
            raw = ("s16le", args.sample_rate, 1) if is_raw else None
            if live:  # read by a thread from here on, past what the buffer holds
                head += source.read1(len(source.peek()))
                read = _reader(os.dup(source.fileno()))
                self.arrivals = _Arrivals(decode_arriving(name, head, read, raw))
                yield from self.arrivals
                return
            read = source.read1 if hasattr(source, "read1") else source.read
            # A file (or stdin redirected from one) in small chunks, as if it arrived live.
            chunks = decode_arriving(name, head, lambda _: read(self.chunk_bytes), raw)
            yield from chunks


def _reader(fd: int) -> Callable[[int], bytes]:
    """`read(n)` of `fd` unbuffered (its own descriptor: closing a buffered file under a
    blocked read would wait for that read): what has arrived, up to n bytes."""
    source = open(fd, "rb", buffering=0)  # noqa: SIM115 -- closed at the end of the input

    def read(n: int) -> bytes:
        data = b"" if source.closed else source.read(n)
        if not data:  # asked again at the end (FFmpeg does): b"" again
            source.close()
        return data

    return read


def _is_live(source: Any) -> bool:
    """A pipe, FIFO or device: its audio arrives while updates decode. A regular file (or
    stdin redirected from one) is read in small chunks, as if it arrived live."""
    try:
        return not stat.S_ISREG(os.fstat(source.fileno()).st_mode)
    except (OSError, ValueError):  # no file descriptor (stdin replaced in-process)
        return False


class _Arrivals:
    """Chunks a thread reads from a live input, handed out as all that arrived since the last:
    a microphone's pipe neither overflows (64 KiB, 2 s of audio) nor falls behind while an
    update decodes, and an update takes all the audio that arrived during the one before, as
    ufal's server does, instead of one more `min_chunk` at a time, later and later."""

    def __init__(self, chunks: Iterator[bytes]):
        self._arrived: queue.Queue[bytes | BaseException] = queue.Queue()
        threading.Thread(target=self._read, args=(chunks,), name="whisperforge-stdin",
                         daemon=True).start()  # fmt: skip

    def _read(self, chunks: Iterator[bytes]) -> None:
        try:
            for data in chunks:
                self._arrived.put(data)
            self._arrived.put(b"")  # the end of the input
        except BaseException as error:  # noqa: BLE001 -- raised again in the caller's thread
            self._arrived.put(error)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            items = [self._arrived.get()]
            while not self._arrived.empty():
                items.append(self._arrived.get_nowait())
            data = b"".join(item for item in items if isinstance(item, bytes))
            if data:
                yield data
            if isinstance(items[-1], BaseException):
                raise items[-1]
            if items[-1] == b"":
                return

    def rest(self, wait_s: float = 1.0) -> bytes:
        """What arrived and was not handed out, waiting up to `wait_s` for the input's end:
        Ctrl-C stops the programs that pipe into this one too, and what they sent last is
        still in the pipe."""
        parts: list[bytes] = []
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                item = self._arrived.get(timeout=left)
            except queue.Empty:
                break
            if not isinstance(item, bytes) or not item:  # the end, or the reader's error
                break
            parts.append(item)
        return b"".join(parts)


def _joined(pieces: list[Any]) -> Any:
    """Chunks of one input as one: raw bytes, or float32 arrays of a decoded file."""
    if isinstance(pieces[0], bytes):
        return b"".join(pieces)
    import numpy as np

    return np.concatenate(pieces)


def _as_typed(error: WhisperforgeError, flags: dict[str, str]) -> WhisperforgeError:
    """`error` with the Python API's names that `flags` maps (min_chunk_s, output_dir) as the
    command's options (--min-chunk, --output-dir): "min_chunk_s must be...", "pass an
    output_dir" named nothing the user can type."""
    message = str(error)
    for name, flag in flags.items():
        message = re.sub(rf"(?<![\w-]){re.escape(name)}\b", flag, message)
    return error if message == str(error) else type(error)(message)


# StreamingOptions' fields, as the `stream` command's options.
STREAM_FLAGS = {"min_chunk_s": "--min-chunk", "silence_db": "--silence-db",
                "agreement": "--agreement"}  # fmt: skip


def run_stream(args: argparse.Namespace) -> int:
    from .streaming import StreamingOptions, StreamingTranscriber

    if args.input != "-" and (not os.path.exists(args.input) or os.path.isdir(args.input)):
        what = "is a folder" if os.path.isdir(args.input) else "no such file"
        _error(f"{args.input}: {what}; check the path, or use - for stdin")
        return 1
    try:
        options = StreamingOptions(
            language=args.language, task=args.task, beam_size=args.beam_size,
            min_chunk_s=args.min_chunk,
            silence_db=args.silence_db, agreement=args.agreement,
            initial_prompt=args.initial_prompt,
        )  # fmt: skip
    except InvalidOptionError as error:
        raise _as_typed(error, STREAM_FLAGS) from None
    model = load_model(args)
    model.check_task(args.task)  # an English-only model's translation: refused before any audio
    warn_of_translated_word_times(args.timestamps, args.task)
    start = time.monotonic()
    clock = (lambda: time.monotonic() - start) if args.realtime else None
    stream = StreamingTranscriber(model, options, clock=clock)
    chunk_s = 0.1

    def show(event: Any) -> None:
        if not event.committed:
            return
        if args.timestamps:
            first, last = event.committed[0].start, event.committed[-1].end
            span = f"[{format_timestamp(first)} --> {format_timestamp(last)}]"
            print(f"{span} {event.committed_text.strip()}", flush=True)
        else:
            print(event.committed_text, end="", flush=True)

    fed_s = 0.0
    pending: list[Any] = []
    interrupted = False
    chunks = _StreamInput(args, chunk_bytes=int(chunk_s * 16000) * 2)
    try:
        for chunk in chunks:
            pending.append(chunk)
            fed_s += (len(chunk) / 2 if isinstance(chunk, bytes) else chunk.size) / 16000
            if args.realtime:
                ahead = fed_s - (time.monotonic() - start)
                if ahead < -chunk_s:
                    continue  # behind real time: gather what has "arrived", feed it at once
                time.sleep(max(0.0, ahead))
            # Pieces gathered while behind real time go in as one: one update, not one per
            # `min_chunk` of them.
            piece, pending = _joined(pending), []
            for event in stream.feed(piece):
                show(event)
    except KeyboardInterrupt:
        # Ctrl-C is how a live input (a microphone) is stopped: the words still tentative and
        # the audio not yet decoded are transcribed and printed, as at the end of the input.
        # A second Ctrl-C stops at once.
        interrupted = True
        if rest := chunks.rest():  # what had arrived from a live input
            pending.append(rest)
    if pending:
        for event in stream.feed(_joined(pending)):
            show(event)
    if stream.received_s == 0 and not interrupted:  # a blank line and 0 read as a transcript
        if args.input == "-":
            raise AudioError(
                "stdin: no audio, the input is empty; pipe in raw 16 kHz mono s16le PCM or an "
                "audio file"
            )
        raise AudioError(f"{args.input}: no audio, the file is empty")
    show(stream.finish())
    if not args.timestamps:
        print(flush=True)
    return 130 if interrupted else 0


# --- serve -----------------------------------------------------------------------------------


def run_serve(args: argparse.Namespace) -> int:
    try:
        from .server import ServerConfig, serve
    except ImportError as error:
        raise WhisperforgeError(str(error)) from None
    config = ServerConfig(
        model=args.model, model_dir=args.model_dir, device=args.device,
        compute_type=_compute_type(args),
        threads=args.threads, beam_size=args.beam_size, max_upload_mb=args.max_upload_mb,
        max_audio_s=args.max_audio_s,
        request_timeout_s=args.request_timeout, max_queue=args.max_queue,
        max_audio_memory_mb=args.max_audio_memory_mb,
        api_key=args.api_key or None, batch_size=args.batch_size,
        cors_origins=tuple(args.cors_origin),
    )  # fmt: skip
    try:
        serve(config, host=args.host, port=args.port, log_level=args.log_level)
    except ImportError as error:
        raise WhisperforgeError(str(error)) from None
    return 0


# --- export ----------------------------------------------------------------------------------


def _add_export_parser(commands: Any) -> None:
    e = commands.add_parser(
        "export",
        help="export a model as ONNX or torch.export graphs with static caches",
        description="Export the encoder, cross K,V projection, decoder prefill, decoder step "
        "(static caches) and logits. An ONNX folder transcribes on onnxruntime: "
        "`whisperforge transcribe FILE --model DIR`; torch-export .pt2 files are for "
        "ExecuTorch or AOTInductor.",
    )
    e.add_argument("model", metavar="MODEL", help="model name, model folder or OpenAI .pt file")
    e.add_argument("--format", choices=["onnx", "torch-export"], default="onnx",
                   help="(default: %(default)s)")  # fmt: skip
    e.add_argument("--out", required=True, metavar="DIR",
                   help="a new or empty folder, or an earlier export's (replaced)")  # fmt: skip
    e.add_argument("--compute-type", choices=["float32", "float16"], default="float32",
                   help="weights and activations (default: %(default)s)")  # fmt: skip
    e.set_defaults(run=run_export)


def run_export(args: argparse.Namespace) -> int:
    from .export import export_model  # torch is slow to import: only when needed

    out = export_model(args.model, args.out, args.format, args.compute_type)
    print(f"exported {args.model} ({args.format}, {args.compute_type}) to {out}")
    if args.format == "onnx":
        print(f"transcribe with it: whisperforge transcribe FILE --model {_quoted(out)}")
    return 0


def _quoted(path: str | Path) -> str:
    """`path` as a shell reads it back: the hint printed with a folder of spaces (`my models/q8`)
    was a command that named two arguments."""
    return shlex.quote(str(path))


# --- quantize --------------------------------------------------------------------------------

# quantize.COMPUTE_TYPES with quantized weights (named here: the CLI imports torch only when needed)
QUANTIZED_COMPUTE_TYPES = ["int8", "int8_float32", "int8_float16", "int8_bfloat16", "float8"]


def _add_quantize_parser(commands: Any) -> None:
    q = commands.add_parser(
        "quantize",
        help="save a model with int8 (or fp8) weights: smaller on disk, faster to decode",
        description="Quantize every linear weight (a scale per output channel) and the token "
        "embedding (a scale per 64 columns of each row) and save a folder that loads directly: "
        "`whisperforge transcribe FILE --model OUT`. The folder keeps no float weights: on a GPU, "
        "whose int8 covers the decoder's step alone, the encoder runs on its int8 weights "
        "dequantized, so its text may differ slightly from `--compute-type int8` on MODEL.",
    )
    q.add_argument("model", metavar="MODEL", help="model name, model folder or OpenAI .pt file")
    q.add_argument("out", metavar="OUT", help="a new or empty folder")
    q.add_argument("--compute-type", choices=QUANTIZED_COMPUTE_TYPES, default="int8",
                   help="the weights, and the default compute type when loading "
                   "(default: %(default)s)")  # fmt: skip
    q.set_defaults(run=run_quantize)


def run_quantize(args: argparse.Namespace) -> int:
    import torch  # only when needed

    from .checkpoints import check_new_folder, resolve_checkpoint, save_quantized
    from .quantize import has_fp8

    out = Path(args.out).expanduser()  # as export's --out (a quoted ~ reaches us as it is)
    check_new_folder(out)  # before the model loads
    checkpoint = resolve_checkpoint(args.model)
    if args.compute_type == "float8" and not has_fp8(torch.device("cuda")):
        _warn("float8 weights load only on a GPU with fp8 tensor cores (Ada, Hopper): not here")
    try:
        save_quantized(checkpoint, out, args.compute_type)
    except OSError as error:
        raise WhisperforgeError(f"cannot write {out}: {error.strerror or error}; pass a folder "
                                "you can write to") from None  # fmt: skip
    after = sum(f.stat().st_size for f in out.iterdir()) / 1e6
    before = sum(t.nbytes for t in checkpoint.state_dict.values()) / 1e6
    stored = str(next(iter(checkpoint.state_dict.values())).dtype).removeprefix("torch.")
    was = "" if checkpoint.compute_type else f" (its weights as stored, {stored}: {before:.1f} MB)"
    print(f"quantized {args.model} ({args.compute_type}) to {out}: {after:.1f} MB on disk{was}")
    print(f"transcribe with it: whisperforge transcribe FILE --model {_quoted(out)}")
    return 0


# --- entry point -----------------------------------------------------------------------------


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser's commands by name."""
    actions = parser._subparsers._group_actions if parser._subparsers else []
    return {name: command for a in actions for name, command in getattr(a, "choices", {}).items()}


def _option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every --flag of the parser and its commands."""
    flags = set(parser._option_string_actions)
    for command in _commands(parser).values():
        flags |= _option_strings(command)
    return flags


def _openai_spelling(argv: Sequence[str], flags: set[str]) -> list[str]:
    """openai-whisper's way to write the flags, as ours: a --flag_name of ours as --flag-name
    (its =value as it is; other words, such as a prompt's, stay as they are), and a switch's
    True / False (--word_timestamps True, --verbose=False) as the switch, nothing, or its
    --no- form; a flag cut short as argparse takes it (--word_timestamp True, which was left as
    it was, or --word-timestamp True, whose True was left over), whole. Also --suppress-tokens
    -1,50362 as --suppress-tokens=-1,50362: argparse would take a list that starts with a minus
    for a flag."""
    out: list[str] = []
    for arg in argv:
        name, equals, value = arg.partition("=")
        dashed = name.replace("_", "-")
        if name.startswith("--") and dashed not in flags:
            whole = [flag for flag in flags if flag.startswith(dashed)]
            dashed = whole[0] if len(whole) == 1 else dashed
        if name.startswith("--") and dashed in flags:
            name = dashed
            arg = name + equals + value
        if out and out[-1] == "--suppress-tokens" and re.fullmatch(r"-\d+(,\s*-?\d+)+", arg):
            out[-1] += "=" + arg
            continue
        if name in SWITCHES and equals:
            out.append(name)
            arg = value
        if out and out[-1] in SWITCHES and arg.strip().lower() in BOOLEANS:
            if not BOOLEANS[arg.strip().lower()]:
                switch = out.pop()
                if "--no-" + switch[2:] in flags:  # on by default somewhere: say no
                    out.append("--no-" + switch[2:])
            continue
        out.append(arg)
    return out


def short_usage(arguments: str = "") -> str:
    """A command's usage line, shown above a usage error: its every option made a 30-line
    block."""
    return f"%(prog)s {arguments + ' ' if arguments else ''}[options]  (%(prog)s --help lists them)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    first = argv[0] if argv else ""
    # A path that is not there (`whisperforge nosuch.flac`) is transcribe's to say so; a word
    # with no dot or slash is a mistyped command, argparse's to list the commands for.
    is_file = first == STDIN or os.path.isfile(first) or bool(re.search(r"[./\\]", first))
    is_option = first.startswith("-") and first not in ("-h", "--help", "--version")
    if first not in _commands(parser) and (is_file or is_option):
        argv.insert(0, "transcribe")  # `whisper talk.flac`, as openai-whisper users type it
    argv = _openai_spelling(argv, _option_strings(parser))
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown:  # said by the command's parser: the top one showed its own usage
            command = _commands(parser).get(getattr(args, "command", None) or "", parser)
            command.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit as exit_:  # usage errors (2) and --help (0) as a return value
        return exit_.code if isinstance(exit_.code, int) else 0 if exit_.code is None else 2
    if hasattr(sys.stdout, "reconfigure"):
        # A transcript may hold characters the terminal's encoding lacks: show "?", not a crash.
        sys.stdout.reconfigure(errors="replace")
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            return args.run(args)
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:  # `whisperforge transcribe ... | head`: the reader has gone
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
            return 141  # as a process killed by SIGPIPE
        except (WhisperforgeError, OSError) as error:
            _error(str(error) or type(error).__name__)
            return 1
        except Exception as error:
            if not is_out_of_memory(error):
                raise  # a bug: its traceback is what a report needs
            _error(GPU_OUT_OF_MEMORY)  # the options ask more than the GPU holds (stream, export)
            return 1


def _show_warning(
    message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any
) -> None:
    _warn(str(message))


if __name__ == "__main__":
    sys.exit(main())
