"""openai-whisper's `whisper.utils` names that its scripts use, so that with
`import whisperforge as whisper`, `whisper.utils.get_writer("srt", ".")(result, "talk.flac")`
writes `talk.srt` as openai-whisper's would, and `whisper.utils.WriteSRT(".").write_result(result,
file)` writes to an open file. faster-whisper's `faster_whisper.utils` names are here too
(`available_models`, `download_model`, `format_timestamp`, the same in both packages)."""

from .checkpoints import available_models, download_model
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
           "available_models", "download_model", "format_timestamp", "get_writer"]  # fmt: skip
