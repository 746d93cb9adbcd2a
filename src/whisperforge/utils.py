"""openai-whisper's `whisper.utils` names that its scripts use, so that with
`import whisperforge as whisper`, `whisper.utils.get_writer("srt", ".")(result, "talk.flac")`
writes `talk.srt` as openai-whisper's would, and `whisper.utils.WriteSRT(".").write_result(result,
file)` writes to an open file; its small helpers too (`str2bool`, `optional_int`, ... as
argparse types, `compression_ratio`, `get_start`). faster-whisper's `faster_whisper.utils`
names are here too (`available_models`, `download_model`, `format_timestamp`, the same in both
packages)."""

import sys

from .checkpoints import available_models, download_model
from .decoding import compression_ratio
from .openai_api import (
    ResultWriter,
    WriteJSON,
    WriteSRT,
    WriteTSV,
    WriteTXT,
    WriteVTT,
    get_writer,
)
from .writers import format_timestamp

__all__ = ["ResultWriter", "WriteJSON", "WriteSRT", "WriteTSV", "WriteTXT", "WriteVTT",
           "available_models", "compression_ratio", "download_model", "exact_div",
           "format_timestamp", "get_end", "get_start", "get_writer", "make_safe",
           "optional_float", "optional_int", "str2bool", "system_encoding"]  # fmt: skip

system_encoding = sys.getdefaultencoding()


def make_safe(text: str) -> str:
    """`text` with what the system encoding cannot write replaced (unchanged under UTF-8)."""
    if system_encoding.replace("-", "").lower() == "utf8":
        return text
    return text.encode(system_encoding, errors="replace").decode(system_encoding)


def exact_div(x: int, y: int) -> int:
    """x // y where y divides x; anything else is a mistake (openai-whisper asserts it)."""
    if x % y:
        raise AssertionError(f"{x} is not a multiple of {y}")
    return x // y


def str2bool(text: str) -> bool:
    """An argparse type: "True" or "False" (any case)."""
    value = {"true": True, "false": False}.get(text.lower()) if isinstance(text, str) else None
    if value is None:
        raise ValueError(f"Expected one of True, False, got {text!r}")
    return value


def optional_int(text: str) -> int | None:
    """An argparse type: a whole number, or "None"."""
    return None if text == "None" else int(text)


def optional_float(text: str) -> float | None:
    """An argparse type: a number, or "None"."""
    return None if text == "None" else float(text)


def get_start(segments: list[dict]) -> float | None:
    """Where the first word starts, else the first segment; None without segments."""
    words = (word for segment in segments for word in segment.get("words") or [])
    return next((word["start"] for word in words), segments[0]["start"] if segments else None)


def get_end(segments: list[dict]) -> float | None:
    """Where the last word ends, else the last segment; None without segments."""
    words = (w for segment in reversed(segments) for w in reversed(segment.get("words") or []))
    return next((word["end"] for word in words), segments[-1]["end"] if segments else None)
