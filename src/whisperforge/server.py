"""An OpenAI-compatible speech-to-text server (FastAPI + uvicorn).

    whisperforge serve --host 127.0.0.1 --port 8000 --model tiny.en

    POST /v1/audio/transcriptions   OpenAI's multipart fields; json, text, srt, vtt, verbose_json;
    POST /v1/audio/translations     stream=true: server-sent transcript.text.delta/.done events
    GET  /v1/models, /v1/models/{id}, /health
    WS   /v1/audio/stream           s16le mono PCM in (binary frames, or OpenAI's realtime
                                    input_audio_buffer.append events), JSON events out
    WS   /v1/realtime               the same stream as OpenAI's Realtime API in transcription
                                    mode (24 kHz, server VAD, deltas), where its SDK connects

The stream's client events: binary PCM frames, and OpenAI realtime's input_audio_buffer.append,
.commit (commit the words heard so far) and .clear (drop the audio not committed), and "stop"
(or {"type": "stop"}). Its server events, each with an `event_id` of its own: session.created;
transcript.update (committed and tentative words) after updates and commits; after a commit,
OpenAI's input_audio_buffer.committed (item_id, previous_item_id; on /v1/realtime at once, with
conversation.item.added and .done, and a transcription delta once the item's words are decoded),
and conversation.item.input_audio_transcription.completed (item_id, transcript: the words
committed since the commit before); input_audio_buffer.cleared; session.update (or the beta
transcription_session.update) answered with session.updated (`realtime.Session`); with server VAD
on, input_audio_buffer.speech_started/stopped and a commit at each stop;
error; and transcript.final at the end.

Errors use OpenAI's schema, {"error": {"message", "type", "param", "code"}}, with a 4xx status
for anything the client can fix; the server keeps serving. On the stream, as an event of
{"type": "error"}, whose `error` also says the `event_id` of the client event it answers.

One worker thread owns the model (`engine.Engine`): requests from all clients, file uploads and
streaming updates alike, become `Job`s on its queue, run by its `Backend` (see `engine.py`):
batched by windows on CUDA and the CPU alike. Nothing above the Backend (HTTP, validation,
streaming, timeouts) depends on which one runs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import functools
import hmac
import importlib
import json
import logging
import math
import os
import re
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .audio import (
    MAX_STREAM_RATE,
    MIN_STREAM_RATE,
    SAMPLE_RATE,
    PcmResampler,
    available_memory,
    load_audio,
)
from .engine import Backend, Engine, Job, QueueFull, make_backend
from .errors import (
    GPU_OUT_OF_MEMORY,
    AudioError,
    AudioTooLongError,
    InvalidOptionError,
    is_out_of_memory,
)
from .realtime import OPENAI_RATE, ServerVad, Session, SessionError, Turn, TurnDetector, updated
from .results import Segment, TranscriptionInfo
from .streaming import StreamingEvent, StreamingOptions, StreamingTranscriber
from .tokenizer import LANGUAGES, asks_detection, normalize_language
from .transcribe import PreparedAudio, TranscriptionOptions, temperature_ladder
from .writers import write

try:  # module level: FastAPI resolves the endpoints' annotations in this namespace
    from fastapi import Request as HTTPRequest
    from fastapi import WebSocket
except ImportError:  # the server extra is not installed; create_app says what to do
    HTTPRequest = WebSocket = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from fastapi import FastAPI

    from .transcribe import WhisperModel

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("word", "segment")
# The form fields a request may send: OpenAI's (a list's as `name[]`, as the openai client sends
# it), and `hotwords`, as faster-whisper-based servers take it. Others are refused by name, not
# ignored as if they were heeded (a list's elements come as `name[]`; plain `name` is taken too).
FORM_FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature",
               "timestamp_granularities[]", "stream", "hotwords", "keywords[]", "languages[]",
               "chunking_strategy")  # fmt: skip
# OpenAI's fields for what Whisper does not do: what the request asked, said back to it.
UNSUPPORTED_FIELDS = {
    "include[]": "per-token log probabilities (include[]=logprobs) are not returned; "
    "verbose_json gives each segment's avg_logprob",
    "known_speaker_names[]": "speaker diarization is not supported",
    "known_speaker_references[]": "speaker diarization is not supported",
}
# The WebSocket's query parameters (`StreamingOptions`; the key where headers cannot be set)
STREAM_PARAMETERS = ("model", "language", "task", "prompt", "sample_rate", "min_chunk_s",
                     "silence_db", "agreement", "api_key", "intent")  # fmt: skip
ALIASES = ("whisper-1",)  # what OpenAI examples send; served by the loaded model
DISCONNECT_POLL_S = 0.5  # how often a waiting request checks that its client is still there
# Audio a streaming client may send ahead of the decoding before the server stops reading
# (5 minutes of 16 kHz s16le): bounds the memory of a client that sends faster than real time.
STREAM_BACKLOG_BYTES = 300 * SAMPLE_RATE * 2
# What a text message read ahead holds until the stream takes it (a command, or the error event
# it is answered with: about 600 bytes), counted in the backlog as that many bytes of audio: a
# client that sent bad messages and read no answers grew the queue without bound (a million
# one-byte messages: +600 MB).
STREAM_TEXT_BYTES = 1024
# The longest client `event_id` said back in the error event that answers its event (OpenAI's
# are "event_" and a few letters): a longer one is not kept beside it.
MAX_EVENT_ID = 256
# OpenAI realtime's event for an item's transcript, which its transcription clients wait for.
TRANSCRIPTION_COMPLETED = "conversation.item.input_audio_transcription.completed"
TRANSCRIPTION_DELTA = "conversation.item.input_audio_transcription.delta"
SESSION_UPDATES = ("session.update", "transcription_session.update")  # GA, beta
# The longest session update taken (OpenAI's are a few hundred bytes): a text message waiting in
# the backlog counts as `STREAM_TEXT_BYTES`, and a session's is kept until it is carried out.
MAX_SESSION_CHARS = 16384
MIN_COMMIT_S = 0.1  # the audio a commit needs since the one before (or a clear), as OpenAI's
# What a stream holds of the server's audio memory while it is open: its backlog, and its
# buffer (at most `max_buffer_s`, which the WebSocket leaves at its default) as float32 samples.
STREAM_AUDIO_BYTES = STREAM_BACKLOG_BYTES + int(StreamingOptions.max_buffer_s * SAMPLE_RATE * 4)
# Memory a request's audio holds, per 16 kHz sample: its float32 samples (4 bytes) and the mel
# made of them while it runs (80 bins a 160-sample hop: 2 bytes; large-v3's 128 bins: 3.2), or
# while it decodes, the 16-bit frames beside the float32 result (2 + 4).
BYTES_PER_SAMPLE = 8
MB = 1 << 20
# How long an upload past the size limit is read on (and dropped) so that its client gets the
# 413 (nginx's lingering close is 30 s; 10 s of upload passes 25 MB at 20 Mbit/s).
LINGER_S = 10.0


@dataclass
class ServerConfig:
    """How `whisperforge serve` runs. api_key None: no authentication."""

    model: str = "tiny.en"
    model_dir: str | None = None  # where a hub name is looked for (--model-dir)
    device: str = "auto"
    compute_type: str = "default"
    threads: int = 0
    beam_size: int = 5
    max_upload_mb: float = 25.0  # OpenAI's limit
    # 25 MB of compressed silence decodes to days of samples: the audio's own limit (4 hours:
    # ~0.4 GB of samples and mel while it is transcribed).
    max_audio_s: float = 4 * 3600.0
    request_timeout_s: float = 300.0
    max_queue: int = 256
    # What the audio of the requests in progress may hold (uploads, samples, mels) before new
    # ones get 503; None: half the memory available once the model has loaded.
    max_audio_memory_mb: float | None = None
    api_key: str | None = None
    # Web pages (origins, "*": any) whose scripts may call the API (CORS); none by default.
    cors_origins: tuple[str, ...] = ()
    batch_size: int | None = None  # windows decoded together; None: 16 on CUDA, 4 on the CPU

    @property
    def model_id(self) -> str:
        """The id clients send as `model`: the name, or a path's last part."""
        return Path(self.model).name or self.model

    def serves(self, model: str) -> bool:
        """Whether `model` names the loaded model: its id, what --model said (a hub name's
        `org/name`), or an alias."""
        return model in (self.model_id, self.model, *ALIASES)


# --- errors -----------------------------------------------------------------------------------


class APIError(Exception):
    """An error in OpenAI's schema: status, message, type, param, code."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error"):  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}  # fmt: skip


def overloaded(reason: str) -> APIError:
    """503, as OpenAI's API answers when it has no room: the client should retry later (the
    `openai` client does, after Retry-After)."""
    return APIError(503, f"the server is overloaded: {reason}; retry in a few seconds", None,
                    "server_is_overloaded", "server_error")  # fmt: skip


class AudioMemory:
    """The memory that the audio of the requests in progress may hold: each request's upload
    as it arrives, then its decoded samples (`BYTES_PER_SAMPLE`) while it decodes, waits and runs.
    A request that would take more than is left is refused with a 503, as it asks: many large
    uploads at once were each decoded and queued until the OOM killer took the server."""

    def __init__(self, limit: int):
        self.limit, self.held = limit, 0
        self._lock = threading.Lock()

    def reserve(self) -> Reservation:
        return Reservation(self)


class Reservation:
    """One request's share of `AudioMemory`: `cover` grows it (from the event loop as the upload
    arrives, from the decoding thread as samples come), `release` gives it back, once."""

    def __init__(self, memory: AudioMemory):
        self.memory, self.bytes = memory, 0

    def cover(self, total: int) -> None:
        """Hold `total` bytes, or raise: a 400 where the request alone needs more than the
        limit (no retry would help), a 503 where the others' requests hold the rest."""
        memory = self.memory
        if total <= self.bytes:
            return
        if total > memory.limit:
            raise APIError(400, f"the audio needs more memory than this server gives all "
                           f"requests together ({memory.limit / MB:.0f} MB, its "
                           "--max-audio-memory-mb); send it in parts", "file",
                           "audio_too_long")  # fmt: skip
        with memory._lock:
            if memory.held - self.bytes + total > memory.limit:
                raise overloaded(
                    f"the audio of the requests in progress fills its memory "
                    f"({memory.limit / MB:.0f} MB, --max-audio-memory-mb)"
                )
            memory.held += total - self.bytes
            self.bytes = total

    def release(self) -> None:
        with self.memory._lock:
            self.memory.held -= self.bytes
            self.bytes = 0


# --- request parsing ------------------------------------------------------------------------


@dataclass
class ParsedRequest:
    """A validated transcription request."""

    audio: PreparedAudio
    response_format: str
    stream: bool
    words: bool
    segments: bool  # verbose_json's segments: not given for timestamp_granularities[]=word alone
    options: TranscriptionOptions
    language: str | None
    task: str
    memory: Reservation  # the audio's share of the server's memory, until the job is done

    def job(self, on_segment: Callable[[Segment], None] | None = None) -> Job:
        job = Job(self.audio, self.options, self.language, self.task, on_segment=on_segment)
        job.future.add_done_callback(lambda _: self.memory.release())  # done with the audio
        return job


def _text_field(form: Any, name: str, default: str | None = None) -> str | None:
    values = form.getlist(name)
    if not values:
        return default
    value = values[-1]
    if not isinstance(value, str):
        raise APIError(400, f"'{name}' must be a text field, not a file upload", name)
    return value


def _list_field(form: Any, name: str) -> list[str]:
    """A list field's text values, sent as `name[]` (the openai client) or `name`."""
    values = [*form.getlist(f"{name}[]"), *form.getlist(name)]
    if not all(isinstance(v, str) for v in values):
        raise APIError(400, f"'{name}[]' must be text fields, not file uploads", f"{name}[]")
    return [v for v in values if v]


def _bool_field(form: Any, name: str) -> bool:
    value = (_text_field(form, name) or "false").strip().lower()
    if value not in ("true", "false", "1", "0"):
        raise APIError(400, f"'{name}' must be true or false, got {value!r}", name)
    return value in ("true", "1")


class App:
    """The HTTP layer over one Engine; builds the FastAPI app."""

    def __init__(self, config: ServerConfig, model: WhisperModel, engine: Engine):
        self.config = config
        self.model = model
        self.engine = engine
        self.max_bytes = int(config.max_upload_mb * MB)
        limit = config.max_audio_memory_mb
        if limit is None:  # half: the rest for the work's own buffers and the allocator's slack
            free = available_memory()  # (four 4 h uploads peaked at 1.4x what they held)
            limit = free / 2 / MB if free is not None else math.inf  # unknown: no limit
        self.memory = AudioMemory(int(min(limit * MB, 2**62)))
        # Each open WebSocket stream's "end now" signal, set at a shutdown (`end_streams`).
        self.streams: set[asyncio.Event] = set()

    # --- parsing ---------------------------------------------------------------------------

    async def read_form(self, request: Any, memory: Reservation) -> Any:
        """The multipart form, its bytes held in `memory` as they arrive."""
        from starlette.requests import ClientDisconnect
        from starlette.requests import Request as StarletteRequest

        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if encoding != "identity":  # read as it came, the form was "Invalid multipart data."
            raise APIError(415, f"Content-Encoding {encoding!r} is not supported; send the form "
                           "uncompressed (audio files are compressed already)", None,
                           "unsupported_content_encoding")  # fmt: skip
        receive = request.receive
        loop = asyncio.get_running_loop()
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes + 64 * 1024:
            await _discard_rest(receive, loop.time() + LINGER_S)
            raise self._too_large()
        received = 0
        # A client that trickles its upload (slowloris) is cut off: each held a connection and
        # its share of the audio memory for as long as it kept sending, a byte a minute or less.
        deadline = loop.time() + self.config.request_timeout_s

        async def limited_receive() -> dict:
            nonlocal received
            try:
                message = await asyncio.wait_for(receive(), deadline - loop.time())
            except TimeoutError:
                raise APIError(408, f"the upload did not arrive within the server's "
                               f"{self.config.request_timeout_s:g} s request timeout; send it "
                               "faster, or start the server with a larger --request-timeout",
                               "file", "timeout") from None  # fmt: skip
            received += len(message.get("body", b""))
            if received > self.max_bytes + 64 * 1024:  # room for the form's own fields
                if message.get("more_body", False):
                    await _discard_rest(receive, min(deadline, loop.time() + LINGER_S))
                raise self._too_large()
            memory.cover(received)
            return message

        limited = StarletteRequest(request.scope, limited_receive)
        try:
            return await limited.form(max_files=4, max_fields=64)
        except ClientDisconnect:  # gone during its upload: nobody to answer, nothing to log
            raise APIError(499, "the client closed the request", None, "client_closed") from None

    def check_fields(self, form: Any) -> None:
        """Refuse the fields this server would not heed, by name."""
        known = {*FORM_FIELDS, *(f.removesuffix("[]") for f in FORM_FIELDS)}
        for name in form:
            listed = name if name.endswith("[]") else f"{name}[]"
            if listed in UNSUPPORTED_FIELDS:
                raise APIError(400, UNSUPPORTED_FIELDS[listed], listed)
            if name not in known:
                raise APIError(400, f"unknown field {name!r}; this server takes "
                               f"{', '.join(FORM_FIELDS)}", name)  # fmt: skip
        strategy = _text_field(form, "chunking_strategy")
        if strategy not in (None, "", "auto"):  # long audio is windowed as Whisper does anyway
            raise APIError(400, "chunking_strategy takes only 'auto' here: the audio is cut "
                           "into Whisper's 30 s windows", "chunking_strategy")  # fmt: skip

    def _too_large(self) -> APIError:
        return APIError(413, f"the upload is larger than this server's limit of "
                        f"{self.config.max_upload_mb:g} MB; send a shorter or more compressed "
                        "file (or start the server with a larger --max-upload-mb)",
                        "file", "file_too_large")  # fmt: skip

    async def parse(self, request: Any, task: str) -> ParsedRequest:
        memory = self.memory.reserve()
        try:
            return await self._parse(request, task, memory)
        except BaseException:
            memory.release()
            raise

    async def _parse(self, request: Any, task: str, memory: Reservation) -> ParsedRequest:
        from starlette.concurrency import run_in_threadpool
        from starlette.datastructures import UploadFile

        form = await self.read_form(request, memory)
        self.check_fields(form)
        uploads = form.getlist("file")
        if not uploads:
            raise APIError(400, "no audio file: send it as the multipart/form-data field 'file'",
                           "file")  # fmt: skip
        if len(uploads) > 1:
            raise APIError(400, f"send one audio file a request, not {len(uploads)}", "file")
        upload = uploads[0]
        if not isinstance(upload, UploadFile):
            raise APIError(400, "'file' must be a file upload (multipart/form-data with a "
                           "filename), not a text field", "file")  # fmt: skip

        model = _text_field(form, "model")
        if not model:
            raise APIError(400, f"'model' is required; this server serves "
                           f"{self.config.model_id!r} (alias: whisper-1)", "model")  # fmt: skip
        if not self.config.serves(model):
            raise APIError(404, f"the model {model!r} does not exist on this server; use "
                           f"{self.config.model_id!r} or whisper-1 (GET /v1/models lists them)",
                           "model", "model_not_found")  # fmt: skip

        response_format = _text_field(form, "response_format", "json")
        if response_format not in RESPONSE_FORMATS:
            raise APIError(400, f"response_format {response_format!r} is not supported; use "
                           f"one of {', '.join(RESPONSE_FORMATS)}", "response_format")  # fmt: skip

        text = _text_field(form, "temperature", "0")
        try:
            temperature = float(text)
        except (TypeError, ValueError):
            raise APIError(400, f"'temperature' must be a number, got {text!r}",
                           "temperature") from None  # fmt: skip
        if not 0.0 <= temperature <= 1.0:
            raise APIError(400, f"'temperature' must be between 0 and 1, got {text.strip()}",
                           "temperature")  # fmt: skip

        granularities = _list_field(form, "timestamp_granularities")
        for g in granularities:
            if not isinstance(g, str) or g not in GRANULARITIES:
                raise APIError(400, f"timestamp_granularities[] takes word and/or segment, got "
                               f"{g if isinstance(g, str) else 'a file'!r}",
                               "timestamp_granularities[]")  # fmt: skip
        # As OpenAI's API: word times are verbose_json's, refused with any other format (they
        # were dropped without a word); words alone are given without the segments.
        if "word" in granularities and task == "translate":  # not OpenAI's either
            raise APIError(400, "timestamp_granularities[]=word is not given for a translation: "
                           "its English words were not spoken, so they have no times; ask for "
                           "segments", "timestamp_granularities[]")  # fmt: skip
        if "word" in granularities and response_format != "verbose_json":
            raise APIError(400, "timestamp_granularities[]=word needs response_format="
                           f"verbose_json, not {response_format}",
                           "timestamp_granularities[]")  # fmt: skip
        words = "word" in granularities
        with_segments = "segment" in granularities or not words
        stream = _bool_field(form, "stream")
        if stream and response_format not in ("json", "text"):
            raise APIError(400, "stream=true works with response_format json or text", "stream")

        if task == "translate":
            self.check_translates("model")
        # The spoken language; a translation's too (beyond OpenAI's fields there, as the CLI's
        # --task translate --language takes it), where it is otherwise detected.
        language = _text_field(form, "language") or None
        if language is not None and asks_detection(language):
            language = None  # as the stream's language=auto, and the CLI's --language none
        languages = _list_field(form, "languages")
        if language is not None:
            language = self._language(language, "language")
        # Compared as the codes they name: language=en with languages[]=English (or en-US) is
        # one language, as the openai client sends both.
        codes = {self._language(entry, "languages[]") for entry in languages}
        if len(codes) > 1 or (codes and language not in (None, *codes)):
            raise APIError(400, "this server transcribes a request in one language: send it as "
                           "language (or none, to have it detected)", "languages[]")  # fmt: skip
        language = language or (codes.pop() if codes else None)
        prompt = _text_field(form, "prompt") or None
        # Beyond OpenAI's fields, as faster-whisper-based servers take it: words to favour.
        # OpenAI's keywords[] are the same: names and terms to spell right.
        hotwords = ", ".join(filter(None, [_text_field(form, "hotwords"),
                                           *_list_field(form, "keywords")])) or None  # fmt: skip

        data = await upload.read()
        if not data:
            raise APIError(400, "the uploaded file is empty (0 bytes); send a complete audio file",
                           "file")  # fmt: skip
        if len(data) > self.max_bytes:
            raise self._too_large()

        def hold(n_samples: int) -> None:  # the upload's bytes are held until it is decoded
            memory.cover(len(data) + BYTES_PER_SAMPLE * n_samples)

        try:
            audio = await run_in_threadpool(functools.partial(
                load_audio, data, max_seconds=self.config.max_audio_s, on_samples=hold
            ))  # fmt: skip
        except AudioTooLongError as error:
            raise APIError(400, f"{str(error).removeprefix('<audio bytes>: ')} (this server's "
                           "--max-audio-s)", "file", "audio_too_long") from None  # fmt: skip
        except AudioError as error:
            name = upload.filename or "the upload"
            reason = str(error).removeprefix("<audio bytes>: ")
            raise APIError(400, f"{name}: {reason} (any format FFmpeg reads works: flac, mp3, "
                           "mp4, m4a, ogg, wav, webm, ...)", "file", "invalid_file_format",
                           ) from None  # fmt: skip

        try:
            options = TranscriptionOptions.from_arguments(
                beam_size=self.config.beam_size, temperature=temperature_ladder(temperature),
                initial_prompt=prompt, hotwords=hotwords, word_timestamps=words,
            )  # fmt: skip
        except InvalidOptionError as error:
            raise APIError(400, str(error)) from None
        memory.cover(len(data) + BYTES_PER_SAMPLE * audio.size)  # what a WAV without PyAV took
        # Its mel made here, in this request's thread, not by the worker that decodes the other
        # requests' windows (JFK behind a 2 h upload: 3.7 s, now 1.2; RESULTS, session 49).
        prepared = await run_in_threadpool(self.model.prepare, audio, options)
        return ParsedRequest(prepared, response_format, stream, words, with_segments, options,
                             language, task, memory)  # fmt: skip

    # --- running --------------------------------------------------------------------------

    def submit(self, job: Job) -> Future:
        job.deadline = time.monotonic() + self.config.request_timeout_s
        try:
            return self.engine.submit(job)
        except QueueFull:
            job.future.cancel()  # never queued: what it holds is released
            raise overloaded(f"its queue of {self.config.max_queue} requests is full "
                             "(--max-queue)") from None  # fmt: skip

    async def wait(self, job: Job, request: Any) -> tuple[list[Segment], TranscriptionInfo]:
        """The job's result. A client that leaves, or a request past its timeout, abandons the
        job: the worker spends no more windows on it (`Job.abandon`)."""
        future = asyncio.wrap_future(job.future)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_s
        try:
            while not future.done():
                left = deadline - loop.time()
                if left <= 0:
                    raise self._timeout()
                await asyncio.wait({future}, timeout=min(left, DISCONNECT_POLL_S))
                if not future.done() and await request.is_disconnected():
                    raise APIError(499, "the client closed the request", None, "client_closed")
            return future.result()
        except Exception as error:
            failure = self._job_error(error)
            if failure is None:
                raise  # a bug: the app's 500 handler
            raise failure from None
        finally:
            _abandon(job, future)

    def _job_error(self, error: BaseException) -> APIError | None:
        """The answer to a job that failed for a reason the client can act on; None for a bug."""
        if isinstance(error, TimeoutError):  # the worker stopped it at its deadline
            return self._timeout()
        if isinstance(error, InvalidOptionError):
            return APIError(400, str(error))
        if isinstance(error, AudioError):
            return APIError(400, str(error), "file")
        if is_out_of_memory(error):  # other requests may have held the memory: 503, retry
            return overloaded(GPU_OUT_OF_MEMORY)
        return None

    def _timeout(self) -> APIError:
        return APIError(504, f"the transcription did not finish within the server's "
                        f"{self.config.request_timeout_s:g} s request timeout; send shorter audio "
                        "or start the server with a larger --request-timeout",
                        None, "timeout", "server_error")  # fmt: skip

    async def transcribe(self, request: Any, task: str) -> Any:
        from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

        parsed = await self.parse(request, task)
        if parsed.stream:
            loop = asyncio.get_running_loop()
            deltas: asyncio.Queue[Segment] = asyncio.Queue()
            job = parsed.job(on_segment=lambda s: loop.call_soon_threadsafe(deltas.put_nowait, s))
            self.submit(job)  # a full queue is a 503 before the stream begins
            return StreamingResponse(self.sse(job, deltas), media_type="text/event-stream")
        job = parsed.job()
        self.submit(job)
        segments, info = await self.wait(job, request)
        text = "".join(s.text for s in segments).strip()
        fmt = parsed.response_format
        if fmt == "json":
            return JSONResponse({"text": text, "usage": _usage(info)})
        if fmt == "text":
            return PlainTextResponse(text + "\n")
        if fmt in ("srt", "vtt"):
            out = StringIO()
            write(fmt, segments, info, out)
            media_type = "text/vtt" if fmt == "vtt" else None
            return PlainTextResponse(out.getvalue(), media_type=media_type)
        return JSONResponse(verbose_json(segments, info, task, parsed.words, parsed.segments))

    async def sse(self, job: Job, deltas: asyncio.Queue[Segment]) -> AsyncIterator[str]:
        """transcript.text.delta per segment as it is final, then transcript.text.done. A client
        that leaves closes this generator: the job is abandoned."""
        future = asyncio.wrap_future(job.future)
        try:
            async for event in self._sse_events(job, future, deltas):
                yield event
        finally:
            _abandon(job, future)

    async def _sse_events(self, job: Job, future: asyncio.Future,
                          deltas: asyncio.Queue[Segment]) -> AsyncIterator[str]:  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_s
        parts: list[str] = []
        while True:
            getter = asyncio.ensure_future(deltas.get())
            try:
                done, _ = await asyncio.wait({getter, future}, timeout=deadline - loop.time(),
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            finally:  # also when the client leaves (this wait is cancelled): no task left behind
                getter.cancel()
            if getter in done:
                delta = getter.result().text
                delta = delta.lstrip() if not parts else delta
                parts.append(delta)
                yield f"data: {json.dumps({'type': 'transcript.text.delta', 'delta': delta})}\n\n"
                continue
            if not done:
                job.abandon()
                yield f"data: {json.dumps(self._timeout().body())}\n\n"
                return
            break
        while not deltas.empty():  # segments that arrived with the result
            delta = deltas.get_nowait().text
            parts.append(delta.lstrip() if not parts else delta)
            yield f"data: {json.dumps({'type': 'transcript.text.delta', 'delta': parts[-1]})}\n\n"
        try:
            segments, _ = future.result()
        except Exception as error:  # noqa: BLE001 -- reported in the stream, which has begun
            failure = self._job_error(error) or APIError(500, str(error), type="server_error")
            yield f"data: {json.dumps(failure.body())}\n\n"
            return
        text = "".join(s.text for s in segments).strip()
        # No usage: the openai client types a done event's usage as tokens, not duration.
        done_event = {"type": "transcript.text.done", "text": text}
        yield f"data: {json.dumps(done_event)}\n\n"

    # --- streaming over a WebSocket ---------------------------------------------------------

    def buffer_transcriber(self, options: StreamingOptions) -> Callable:
        """Streaming updates run as jobs on the shared worker, batched with everything else."""

        def run(audio: np.ndarray, prompt: str | None, language: str | None):
            transcription = TranscriptionOptions.from_arguments(
                beam_size=options.beam_size, temperature=options.temperature,
                initial_prompt=prompt, word_timestamps=True,
            )  # fmt: skip
            job = Job(audio, transcription, language, options.task)
            future = self.submit(job)
            try:
                segments, info = future.result(self.config.request_timeout_s)
            except TimeoutError:
                job.abandon()
                raise self._timeout() from None
            return segments, info.language

        # A multilingual model's stream detects its language from seconds of audio, not the
        # first one (see BufferTranscriber).
        run.is_multilingual = self.model.is_multilingual  # type: ignore[attr-defined]
        return run

    async def websocket(self, ws: Any, realtime: bool = False) -> None:
        """/v1/audio/stream: live audio in, `session.created`, `transcript.update` events and a
        `transcript.final` out. The audio is s16le mono PCM at ?sample_rate= (16000 unless given;
        8000-192000, resampled to 16 kHz), of any length a message (an odd byte waits for the
        next message's), as binary frames, or as OpenAI's realtime API sends it: text frames of
        {"type": "input_audio_buffer.append", "audio": BASE64}, whose bytes are taken as a binary
        frame's. {"type": "input_audio_buffer.commit"} ends an utterance: what has arrived is
        decoded and all its words committed (`StreamingTranscriber.commit`), answered with a
        `transcript.update` with nothing tentative, then OpenAI's `input_audio_buffer.committed`
        (`item_id` "item_1", "item_2", ... one a commit, and the `previous_item_id`, null for
        the first) and `conversation.item.input_audio_transcription.completed` (the item's
        `transcript`: the words committed since the commit before); the stream goes on (under
        `MIN_COMMIT_S` of audio since the commit before: OpenAI's error
        input_audio_buffer_commit_empty, no item). {"type": "input_audio_buffer.clear"} drops the audio and
        tentative words not committed (`StreamingTranscriber.clear`), answered with
        `input_audio_buffer.cleared`; the stream goes on. "stop" (or {"type": "stop"}) ends the
        stream with its `transcript.final`. Anything else gets an error event, and the stream
        goes on with the audio it has. Each event sent has an `event_id` of its own ("event_1",
        ...); an error's `error.event_id` is that of the client event it answers (null: none).

        realtime: /v1/realtime, OpenAI's Realtime API in transcription mode as its clients (the
        `openai` SDK's `client.realtime.connect`) expect it: 24 kHz audio only (its clients
        refuse a session of another rate), server VAD unless the session says otherwise,
        session.created with OpenAI's session object, an item's committed, added and done as
        soon as its commit is decided (a client's, or server VAD's at the end of speech), its
        transcript in one `conversation.item.input_audio_transcription.delta` and the completed
        once its words are decoded (as whisper-1's on OpenAI's), and none of the server's own
        transcript.update events. On both routes `session.update` (and the beta
        `transcription_session.update`) configures the session (`App.session_update`), and
        server VAD, where it is on, sends speech_started/stopped and commits each utterance as
        a client's commit does."""
        from starlette.concurrency import run_in_threadpool
        from starlette.websockets import WebSocketDisconnect

        params = ws.query_params
        events = _ServerEvents(ws)
        authorized = self.authorized(ws.headers.get("authorization"), params.get("api_key"))
        await ws.accept()  # (closed before it, the client saw a bare HTTP 403, no reason)
        if not authorized:
            error = APIError(401, "missing or incorrect API key; send it as 'Authorization: "
                             "Bearer KEY' or ?api_key=KEY", None, "invalid_api_key")  # fmt: skip
            await events.error(error)
            await ws.close(code=1008, reason="invalid API key")
            return
        try:
            options = self.stream_options(params)
            resample = PcmResampler(stream_sample_rate(params, OPENAI_RATE if realtime else
                                                       SAMPLE_RATE))  # fmt: skip
            if realtime and resample.rate != OPENAI_RATE:  # (its session would say the rate,
                # which OpenAI's clients refuse)
                raise APIError(400, f"/v1/realtime takes OpenAI's {OPENAI_RATE} Hz audio only; "
                               "leave sample_rate out, or stream other rates to "
                               "/v1/audio/stream", "sample_rate")  # fmt: skip
        except APIError as error:
            await events.error(error)
            await ws.close(code=1008)
            return
        # Counted with the requests' audio: many streams once held memory without a limit.
        memory = self.memory.reserve()
        try:
            if STREAM_AUDIO_BYTES > self.memory.limit:  # no retry would help
                raise APIError(400, f"a stream holds {STREAM_AUDIO_BYTES / MB:.0f} MB of audio "
                               f"memory, more than this server's {self.memory.limit / MB:.0f} MB; "
                               "start it with a larger --max-audio-memory-mb")  # fmt: skip
            memory.cover(STREAM_AUDIO_BYTES)
        except APIError as error:
            await events.error(error)
            await ws.close(code=1013 if error.status == 503 else 1008)  # 1013: try again later
            return
        # OpenAI's default turn detection is server VAD; /v1/audio/stream's clients predate it.
        session = Session(resample.rate, params.get("model") or self.config.model_id,
                          options.language, options.initial_prompt,
                          ServerVad() if realtime else None)  # fmt: skip
        stream = StreamingTranscriber(self.buffer_transcriber(options), options)
        detector = TurnDetector(session.turn_detection) if session.turn_detection else None
        inbox = _Inbox(ws, resample.rate)
        reader = asyncio.create_task(inbox.read())
        ending = asyncio.Event()
        self.streams.add(ending)
        heard = False  # whether audio has arrived (a session update may change less after it)
        items = 0  # the items numbered so far (input_audio_buffer.committed's "item_1", ...)
        item_start = 0  # where the words of the next item begin, in `stream.committed`
        answering: str | None = None  # the event_id of the client event being carried out
        # The decoder's work, in order: audio to feed or drop, and items to commit (numbers).
        # It runs beside the loop, which goes on reading the audio and sending server VAD's
        # events as the VAD hears them: run in the loop, a decode held speech_stopped up.
        todo: list[Turn | int] = []
        decoding: asyncio.Task[None] | None = None  # carrying `todo` out; None or done: idle
        uncommitted = 0  # samples queued for the decoder since its last commit or clear

        def committed(item: int) -> dict[str, Any]:
            """OpenAI's input_audio_buffer.committed of item `item` (numbered from 1)."""
            return {"type": "input_audio_buffer.committed", "item_id": f"item_{item}",
                    "previous_item_id": f"item_{item - 1}" if item > 1 else None}  # fmt: skip

        async def decide() -> None:
            """The next item is made of the audio queued so far (a client's commit, or server
            VAD's at the end of speech): queued for the decoder to commit, and on /v1/realtime
            told now, as OpenAI's server does, while its words are still to be decoded:
            committed, and the user's message item, its audio not said back, added and done at
            once (OpenAI's transcription sessions send conversation.item.done so, its transcript
            null: the words come in the transcription's own events, from the decoder). Told
            once decoded, the next speech_started (of audio sent faster than it decodes) came
            before the item it followed. /v1/audio/stream's committed stays after the commit's
            transcript.update, whose words it says are committed."""
            nonlocal items
            items += 1
            if realtime:  # (sent before it is queued: its transcription cannot come first)
                told = committed(items)
                item = {"id": told["item_id"], "object": "realtime.item", "type": "message",
                        "status": "completed", "role": "user",
                        "content": [{"type": "input_audio", "transcript": None}]}  # fmt: skip
                previous = told["previous_item_id"]
                await events.send(
                    told,
                    {"type": "conversation.item.added", "previous_item_id": previous, "item": item},
                    {"type": "conversation.item.done", "previous_item_id": previous, "item": item},
                )
            queue(items)

        async def commit(item: int) -> None:
            """The decoder's part of item `item`: the words heard since the last commit."""
            nonlocal item_start
            item_id, seconds = f"item_{item}", stream.uncommitted_s
            update: StreamingEvent = await run_in_threadpool(stream.commit)
            if not realtime:  # as before there were items; then the item, its words committed
                await events.send(update.to_dict(), committed(item))
            # The item's words: all committed since the last commit, by agreement too.
            transcript = "".join(w.word for w in stream.committed[item_start:]).strip()
            item_start = len(stream.committed)
            if realtime and transcript:
                # As OpenAI's whisper-1: the turn's text in one delta, after the item exists
                # (its clients file deltas under an item they were told of: sent as words were
                # agreed on, before the commit, they named an item not yet added).
                await events.send({"type": TRANSCRIPTION_DELTA, "item_id": item_id,
                                   "content_index": 0, "delta": transcript, "logprobs": None})  # fmt: skip
            await events.send({"type": TRANSCRIPTION_COMPLETED, "item_id": item_id,
                               "content_index": 0, "transcript": transcript,
                               "usage": {"type": "duration", "seconds": round(seconds, 3)}})  # fmt: skip

        async def feed(pcm: bytes) -> None:
            for event in await run_in_threadpool(stream.feed, pcm):
                if not realtime:  # (OpenAI's clients know no transcript.update)
                    await events.send(event.to_dict())

        async def decode() -> None:
            """Carry `todo` out, in order, until it is empty."""
            while todo:
                step = todo.pop(0)
                if isinstance(step, Turn):
                    inbox.release(len(step.pcm))
                if isinstance(step, int):
                    await commit(step)
                elif step.kind == "drop":  # silence before speech: not decoded, its time counted
                    stream.clear(step.pcm)
                else:
                    await feed(step.pcm)

        def queue(step: Turn | int) -> None:
            """`step` for the decoder, after those queued before it."""
            nonlocal decoding, uncommitted
            last = todo[-1] if todo else None
            if isinstance(step, Turn):  # still the backlog's until decoded: bounded as it was
                inbox.hold(len(step.pcm))
            if isinstance(step, Turn) and isinstance(last, Turn) and last.kind == step.kind:
                last.pcm += step.pcm  # what came during a decode goes into the next one whole
            else:
                todo.append(step)
            if isinstance(step, int) or step.kind == "drop":  # (as `stream.uncommitted_s`)
                uncommitted = 0
            else:
                uncommitted += len(step.pcm) // 2
            if decoding is None or decoding.done():
                if decoding is not None:
                    decoding.result()  # (its error, if it failed, is the stream's)
                decoding = asyncio.create_task(decode())

        async def decoded() -> None:
            """Wait for the decoder to carry out all queued (a command's answer follows the
            updates of the audio before it, and the stream is the decoder's alone meanwhile)."""
            if decoding is not None:
                await decoding  # (its error, if it failed, is the stream's)

        async def hear(pcm: bytes) -> None:
            """16 kHz audio into the stream, through server VAD where it is on: its events are
            sent now, while the audio waits for the decoder."""
            nonlocal items
            turns = await run_in_threadpool(detector, pcm) if detector else [Turn("feed", pcm)]
            for turn in turns:
                next_item = f"item_{items + 1}"  # (as OpenAI's: the item speech will make)
                if turn.kind in ("drop", "feed"):
                    queue(turn)
                elif turn.kind == "started":
                    await events.send({"type": "input_audio_buffer.speech_started",
                                       "audio_start_ms": turn.ms, "item_id": next_item})  # fmt: skip
                else:  # said as the VAD hears it; then the speech's last audio, and its item
                    await events.send({"type": "input_audio_buffer.speech_stopped",
                                       "audio_end_ms": turn.ms, "item_id": next_item})  # fmt: skip
                    if turn.pcm:
                        queue(Turn("feed", turn.pcm))
                    # (less goes with the next one; decided here, so that the next speech_started
                    # names the item after this one before the decoder has made it)
                    if uncommitted >= MIN_COMMIT_S * SAMPLE_RATE:
                        await decide()

        async def next_message() -> tuple[bytes, dict[str, Any] | None]:
            """`inbox.next_or_stop`, or the decoder's error as soon as it fails."""
            receive = asyncio.ensure_future(
                inbox.next_or_stop(self.config.request_timeout_s, ending)
            )
            if decoding is not None:
                await asyncio.wait({receive, decoding}, return_when=asyncio.FIRST_COMPLETED)
                if decoding.done() and decoding.exception():
                    receive.cancel()
                    decoding.result()
            return await receive

        try:
            if realtime:
                await events.send({"type": "session.created", "session": session.ga()})
            else:
                await events.send(
                    {
                        "type": "session.created",
                        "sample_rate": resample.rate,
                        "format": "s16le",
                        "model": self.config.model_id,
                        "language": options.language,
                    }
                )  # null: it will be detected
            while True:
                answering = None  # (the audio's updates answer no one event)
                audio, message = await next_message()
                command = message.get("text") if message else None  # `_client_text`'s
                stop = command == "stop"
                heard = heard or bool(audio)
                # at the stop, with the last samples the resampler holds
                pcm = resample(audio) + (resample.flush() if stop else b"")
                if command == "clear":  # the audio that came before it goes with it, undecoded
                    await decoded()
                    stream.clear(detector.clear(pcm) if detector else pcm)
                    uncommitted = 0
                    await events.send({"type": "input_audio_buffer.cleared"})
                    continue
                if pcm:
                    await hear(pcm)
                if message is None:
                    continue
                if message["type"] == "websocket.disconnect":
                    return
                answering = message.get("event_id")
                # `uncommitted` is what `stream.uncommitted_s` will be once the decoder is done
                enough = uncommitted >= MIN_COMMIT_S * SAMPLE_RATE
                if realtime and command == "commit" and enough:  # told at once, as OpenAI's
                    await decide()
                    continue
                if realtime and stop and enough:  # OpenAI's clients wait for items, not
                    await decide()  # transcript.final
                await decoded()
                if stop:
                    final: StreamingEvent = await run_in_threadpool(stream.finish)
                    await events.send({**final.to_dict(), "text": stream.text.strip()})
                    await ws.close(code=1012 if ending.is_set() else 1000)  # 1012: restarting
                    return
                if command == "session":
                    try:
                        new = self.session_update(session, message, heard, realtime)
                    except APIError as error:
                        await events.error(error, answering)
                        continue
                    if not heard:  # nothing decoded yet: the stream starts as the session says
                        options = replace(options, language=new.language,
                                          initial_prompt=new.prompt)  # fmt: skip
                        stream = StreamingTranscriber(self.buffer_transcriber(options), options)
                        resample = PcmResampler(new.rate)
                        inbox.rate = new.rate
                        detector = TurnDetector(new.turn_detection) if new.turn_detection else None
                    elif detector and new.turn_detection:  # the VAD's figures, from here on
                        detector.options = new.turn_detection
                    session = new
                    beta = message["kind"] == "transcription_session.update"
                    await events.send({"type": "transcription_session.updated" if beta else
                                       "session.updated",
                                       "session": new.beta() if beta else new.ga()})  # fmt: skip
                    continue
                if command == "commit" and stream.uncommitted_s < MIN_COMMIT_S:
                    # As OpenAI's realtime API: no item for (next to) no audio. Where there
                    # was some, it stays, and goes with the next commit.
                    heard_ms = 1000 * stream.uncommitted_s
                    await events.error(APIError(400, "Error committing input audio buffer: "
                                                "buffer too small. Expected at least 100ms of "
                                                f"audio, but buffer only has {heard_ms:.2f}ms "
                                                "of audio.", None,
                                                "input_audio_buffer_commit_empty"), answering)  # fmt: skip
                    continue
                if command == "commit":  # (/v1/audio/stream's: answered once decoded, as all)
                    await decide()
                    await decoded()
                    continue
                await events.error(message["error"], answering)
        except WebSocketDisconnect:
            return
        except APIError as error:
            await events.error(error, answering)
            await ws.close(code=1011)
        finally:
            self.streams.discard(ending)
            reader.cancel()
            if decoding is not None:  # (an error it ended with is read: nobody waits for it)
                decoding.cancel()
                decoding.add_done_callback(lambda done: done.cancelled() or done.exception())
            memory.release()

    def session_update(self, session: Session, message: dict[str, Any], heard: bool,
                       realtime: bool) -> Session:  # fmt: skip
        """The session a session.update (`message`: `_client_text`'s) makes of `session`, or
        an APIError naming the field it cannot take. Before any audio everything may change (the
        stream starts as the session says); after it, only server VAD's figures: a rate, language
        or prompt changed there would apply to audio already decoded under the old one (a rate
        to the resampler's filter, a language to the words being agreed on), and server VAD
        turned on would drop the audio not yet committed as silence before speech. realtime:
        /v1/realtime's, whose audio is OpenAI's 24 kHz only."""
        kind = message["kind"]
        try:
            new = updated(session, kind, message["session"], openai_rate=realtime)
        except SessionError as error:
            raise APIError(400, str(error), error.param, error.code) from None
        where = ("session.audio.input.transcription" if kind == "session.update"
                 else "session.input_audio_transcription")  # fmt: skip
        if new.model != session.model and not self.config.serves(new.model):
            raise APIError(404, f"the model {new.model!r} does not exist on this server; use "
                           f"{self.config.model_id!r}", f"{where}.model", "model_not_found")  # fmt: skip
        language = new.language and not asks_detection(new.language)
        new = replace(new, language=self._language(new.language, f"{where}.language")
                      if language else None if self.model.is_multilingual else "en")  # fmt: skip
        changed = [name for name, before, after in (
            ("rate", session.rate, new.rate), ("language", session.language, new.language),
            ("prompt", session.prompt, new.prompt),
            ("turn_detection", session.turn_detection is None, new.turn_detection is None))
            if before != after]  # fmt: skip
        if heard and changed:
            raise APIError(400, f"the session's {changed[0]} cannot change once audio has "
                           "arrived (server VAD's threshold, prefix_padding_ms and "
                           "silence_duration_ms can); set it before the first append, or open "
                           "a new session", "session", "session_update_after_audio")  # fmt: skip
        return new

    async def end_streams(self, forced: Callable[[], bool]) -> None:
        """At a shutdown, before uvicorn closes the connections: each open stream transcribes
        the audio it has, sends its final transcript and closes with 1012 (uvicorn alone closed
        them with 1012 and nothing more, and the words not yet committed were lost). Waits for
        that within --request-timeout, or until a second Ctrl-C (`forced`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_s
        for ending in self.streams:
            ending.set()
        while self.streams and not forced() and loop.time() < deadline:
            await asyncio.sleep(0.05)

    def stream_options(self, params: Any) -> StreamingOptions:
        unknown = sorted(set(params) - set(STREAM_PARAMETERS))
        if unknown:  # e.g. hotwords=: refused, not ignored as if it were heeded
            raise APIError(400, f"unknown parameter {unknown[0]!r}; the stream takes "
                           f"{', '.join(STREAM_PARAMETERS)}", unknown[0])  # fmt: skip
        intent = params.get("intent")  # OpenAI's realtime clients say it
        if intent not in (None, "transcription"):
            raise APIError(400, f"intent {intent!r}: this server serves transcription sessions "
                           "only; use intent=transcription", "intent")  # fmt: skip
        task = params.get("task") or "transcribe"
        if task not in ("transcribe", "translate"):
            raise APIError(400, f"unknown task {task!r}; use transcribe or translate", "task")
        if task == "translate":
            self.check_translates("task")
        model = params.get("model")
        if model is not None and not self.config.serves(model):
            raise APIError(404, f"the model {model!r} does not exist on this server; use "
                           f"{self.config.model_id!r}", "model", "model_not_found")  # fmt: skip
        language = params.get("language")
        if language and not asks_detection(language):
            language = self._language(language, "language")
        else:
            language = None
        values: dict[str, Any] = {}
        for name, kind, hint in (("min_chunk_s", float, "seconds, e.g. 1.0"),
                                 ("silence_db", float, "dBFS, e.g. -45"),
                                 ("agreement", int, "a whole number of hypotheses, e.g. 2")):  # fmt: skip
            if params.get(name):
                try:
                    values[name] = kind(params[name])
                except ValueError:
                    raise APIError(400, f"{name} {params[name]!r} must be {hint}", name) from None
        try:
            # An English-only model has no language to detect: its words come at once.
            language = language or (None if self.model.is_multilingual else "en")
            return StreamingOptions(language=language, task=task,
                                    initial_prompt=params.get("prompt") or None, **values)  # fmt: skip
        except InvalidOptionError as error:  # its message starts with the option's name
            name = str(error).split()[0]
            raise APIError(400, str(error), name if name in values else None) from None

    def _language(self, language: str, param: str) -> str:
        """The code of a request's language (a code, a name or a locale), or a 400 on `param`."""
        try:
            return normalize_language(language, self.model.supported_languages)
        except InvalidOptionError as error:
            raise APIError(400, str(error), param) from None

    def check_translates(self, param: str) -> None:
        """Refuse a translation on an English-only model (`param`: the field that asked)."""
        if not self.model.is_multilingual:
            raise APIError(400, f"the model {self.config.model_id!r} is English-only and cannot "
                           "translate; serve a multilingual model (e.g. --model base)",
                           param)  # fmt: skip

    # --- auth -----------------------------------------------------------------------------

    def authorized(self, header: str | None, query_key: str | None = None) -> bool:
        key = self.config.api_key
        if not key:
            return True
        given = query_key or ""
        if header and header.lower().startswith("bearer "):
            given = header[7:].strip()
        return hmac.compare_digest(given.encode(), key.encode())


class _ServerEvents:
    """What a stream sends its client: each event with an `event_id` of its own ("event_1",
    "event_2", ...), as OpenAI's realtime server events have one; an error's `error` object
    says the `event_id` of the client event it answers, as OpenAI's does (null: none, or one
    the client did not give)."""

    def __init__(self, ws: Any):
        self.ws, self.sent = ws, 0
        # Server VAD's events and the decoder's are sent from two tasks: one at a time, so that
        # they go out in the order of their ids.
        self.lock = asyncio.Lock()

    async def send(self, *events: dict[str, Any]) -> None:
        """`events`, one after another, none of the other task's between them."""
        async with self.lock:
            for event in events:
                self.sent += 1
                await self.ws.send_json({"event_id": f"event_{self.sent}", **event})

    async def error(self, error: APIError, event_id: str | None = None) -> None:
        body = error.body()
        body["error"]["event_id"] = event_id
        await self.send({"type": "error", **body})


class _Inbox:
    """A WebSocket client's messages, read as they arrive, also while an update runs: a socket
    nobody reads stops answering the client's pings, and the client drops it; and the audio
    that arrived during an update goes into the next one at once (as ufal's server reads all
    it has), so a server slower than real time stays one update behind instead of falling
    further behind with every second of audio."""

    def __init__(self, ws: Any, rate: int, max_backlog: int = STREAM_BACKLOG_BYTES):
        self.ws, self.rate, self.max_backlog = ws, rate, max_backlog
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.backlog = 0  # bytes of audio read and not yet taken
        self.room = asyncio.Event()  # set while the backlog is under max_backlog
        self.room.set()

    async def read(self) -> None:
        try:
            while True:
                await self.room.wait()  # a client far ahead waits (TCP backpressure)
                message = await self.ws.receive()
                if message.get("text") is not None:  # base64 audio counts as its bytes
                    message = _client_text(message["text"], self.rate)
                self.queue.put_nowait(message)
                if message["type"] == "websocket.disconnect":
                    return
                self.backlog += _held(message)
                if self.backlog > self.max_backlog:
                    self.room.clear()
        finally:  # a socket that failed ends the session as a disconnect does
            self.queue.put_nowait({"type": "websocket.disconnect"})

    def hold(self, size: int) -> None:
        """`size` bytes taken from the queue stay in the backlog until `release`d: the stream
        holds them for its decoder, and a client far ahead must wait for that too."""
        self.backlog += size
        if self.backlog > self.max_backlog:
            self.room.clear()

    def release(self, size: int) -> None:
        self.backlog -= size
        if self.backlog <= self.max_backlog:
            self.room.set()

    async def next(self) -> tuple[bytes, dict[str, Any] | None]:
        """All audio that arrived since the last call, and the text or disconnect message
        that came after it (None: none yet)."""
        audio: list[bytes] = []
        message: dict[str, Any] | None = await self.queue.get()
        while message is not None and message.get("bytes") is not None:
            audio.append(message["bytes"])
            message = None if self.queue.empty() else self.queue.get_nowait()
        data = b"".join(audio)
        self.release(len(data) + (_held(message) if message is not None else 0))
        return data, message

    async def next_or_stop(self, idle_s: float, ending: asyncio.Event
                           ) -> tuple[bytes, dict[str, Any] | None]:  # fmt: skip
        """As `next`, or a "stop" in two cases: the client was silent for `idle_s` (an idle one
        held its share of the audio memory for as long as it stayed connected), or `ending` is
        set (the server is shutting down): then with the audio already read, and nothing more
        is waited for, though the client may still be sending."""
        stop = {"type": "websocket.receive", "text": "stop"}
        if ending.is_set():
            audio, message = await self.next() if not self.queue.empty() else (b"", None)
            disconnected = message is not None and message["type"] == "websocket.disconnect"
            return audio, message if disconnected else stop
        receive = asyncio.ensure_future(self.next())
        end = asyncio.ensure_future(ending.wait())
        try:
            done, _ = await asyncio.wait({receive, end}, timeout=idle_s,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:  # (also when the stream stops waiting: its decoder failed)
            end.cancel()
            receive.cancel()  # unless done (a message it was about to take stays in the queue)
        if receive in done:
            return receive.result()
        return await self.next_or_stop(idle_s, ending) if ending.is_set() else (b"", stop)


def _held(message: dict[str, Any]) -> int:
    """What a message `_Inbox` queues counts in its backlog: an audio message its bytes, a
    text one `STREAM_TEXT_BYTES`, a disconnect (not counted when it was read) nothing."""
    if message.get("bytes") is not None:
        return len(message["bytes"])
    return 0 if message["type"] == "websocket.disconnect" else STREAM_TEXT_BYTES


async def _discard_rest(receive: Callable, deadline: float) -> None:
    """Read what is left of a request's body, keeping none of it, until `deadline` (the loop's
    time): a client still sending when the server answers and closes sees its connection reset,
    not the answer (the async openai client reported a 413 as "Connection error" and sent the
    upload twice more). Past the deadline the connection closes all the same."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(TimeoutError):
        while True:
            message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            if message["type"] != "http.request" or not message.get("more_body", False):
                return


def _abandon(job: Job, waiter: asyncio.Future) -> None:
    """Abandon `job` unless it is done. Its TimeoutError reaches `waiter` (the request's
    asyncio view of it) after the request is gone; reading it here keeps asyncio from logging
    "Future exception was never retrieved" for every client that leaves."""
    if not job.future.done():
        job.abandon()
    waiter.add_done_callback(lambda done: done.cancelled() or done.exception())


def stream_sample_rate(params: Any, default: int = SAMPLE_RATE) -> int:
    """The WebSocket's `sample_rate` (`default` unless given); other rates are resampled to 16 kHz.
    An empty one is refused as other bad values are: taken as 16 kHz, a client that meant to
    give its rate and sent none heard its audio at the wrong speed, without a word."""
    value = params.get("sample_rate", str(default))
    # ASCII digits, few enough for int(): str.isdigit also takes '²' and other digits int()
    # refuses (a ValueError, and no error event), and int() refuses more than 4300 of them
    rate = int(value) if value.isascii() and value.isdigit() and len(value) <= 9 else 0
    if not MIN_STREAM_RATE <= rate <= MAX_STREAM_RATE:
        raise APIError(400, f"sample_rate {value!r} must be a whole number of Hz from "
                       f"{MIN_STREAM_RATE} to {MAX_STREAM_RATE}, e.g. 16000, 24000 or 48000",
                       "sample_rate")  # fmt: skip
    return rate


def _client_text(text: str, rate: int) -> dict[str, Any]:
    """A stream's text frame as `_Inbox` queues it: an input_audio_buffer.append's audio as a
    binary frame's bytes (so it joins the frames around it and counts in the backlog), "stop",
    "commit" or "clear" as the text of that word, anything else as the error it is answered
    with (its text, up to a frame's 16 MB, is not kept); those three and an error with the
    client event's `event_id`, where it gave one (a string of at most `MAX_EVENT_ID`
    characters that UTF-8 can carry; another is not said back, and the event is carried out all
    the same: JSON's "\\ud800", a lone surrogate, failed the error event's send and cut the
    connection)."""
    try:
        event = json.loads(text)
    except (ValueError, RecursionError):  # (RecursionError: "[[[...", a traceback once)
        event = None
    kind = event.get("type") if isinstance(event, dict) else None
    event_id = event.get("event_id") if isinstance(event, dict) else None
    if not isinstance(event_id, str) or len(event_id) > MAX_EVENT_ID or not _utf8(event_id):
        event_id = None
    message: dict[str, Any] = {"type": "websocket.receive", "event_id": event_id}
    commands = {"stop": "stop", "input_audio_buffer.commit": "commit",
                "input_audio_buffer.clear": "clear"}  # fmt: skip
    if text.strip().lower() in ("stop", "eof"):
        kind = "stop"
    if isinstance(kind, str) and kind in commands:  # (a "type" may be a list: unhashable)
        return {**message, "text": commands[kind]}
    if kind in SESSION_UPDATES and len(text) <= MAX_SESSION_CHARS:
        return {**message, "text": "session", "kind": kind, "session": event.get("session")}
    if kind in SESSION_UPDATES:
        error = APIError(400, f"{kind} is {len(text)} characters, over this server's "
                         f"{MAX_SESSION_CHARS}: shorten its prompt", "session")  # fmt: skip
    elif kind == "input_audio_buffer.append":
        audio = event.get("audio")
        if not isinstance(audio, str):
            problem = "is missing" if audio is None else f"is a {type(audio).__name__}"
        else:
            try:
                audio_bytes = base64.b64decode(audio, validate=True)
                return {"type": "websocket.receive", "bytes": audio_bytes}
            except ValueError as bad:  # binascii.Error, or a character past ASCII
                problem = f"is not base64 ({bad})"
        error = APIError(400, f"input_audio_buffer.append's audio {problem}: send the base64 "
                         f"of s16le mono PCM at {rate} Hz", "audio")  # fmt: skip
    else:
        error = APIError(400, f"send audio as binary s16le mono frames at {rate} Hz (or as "
                         'OpenAI\'s {"type": "input_audio_buffer.append", "audio": BASE64} '
                         'events), {"type": "input_audio_buffer.commit"} to commit the words '
                         'heard so far, {"type": "input_audio_buffer.clear"} to drop the audio '
                         'not committed, {"type": "session.update", "session": {...}} to '
                         f"configure the session (at most {MAX_SESSION_CHARS} characters), "
                         'and "stop" (or {"type": "stop"}) to end the stream',
                         "type" if kind is not None else None)  # fmt: skip
    return {**message, "error": error}


def _utf8(text: str) -> bool:
    """Whether a text frame can carry `text` (not a lone surrogate, which JSON can spell)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _usage(info: TranscriptionInfo) -> dict[str, Any]:
    return {"type": "duration", "seconds": math.ceil(info.duration)}


def verbose_json(segments: list[Segment], info: TranscriptionInfo, task: str, words: bool,
                 with_segments: bool = True) -> dict:  # fmt: skip
    """OpenAI's verbose_json: language by name, segments with their decoding figures (not given
    when only words were asked for, as OpenAI's API leaves them out), words if asked for."""
    body: dict[str, Any] = {
        "task": task,
        # A translation's language is its output's (OpenAI's API: always english).
        "language": "english"
        if task == "translate"
        else LANGUAGES.get(info.language, info.language),
        "duration": round(info.duration, 3),
        "text": "".join(s.text for s in segments).strip(),
        "segments": [
            {
                "id": number,  # OpenAI's count from 0
                "seek": s.seek,
                "start": round(s.start, 3),
                "end": round(s.end, 3),
                "text": s.text,
                "tokens": s.tokens,
                "temperature": s.temperature,
                "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio,
                "no_speech_prob": s.no_speech_prob,
            }
            for number, s in enumerate(segments)
        ],
        "usage": _usage(info),
    }
    if not with_segments:
        del body["segments"]
    if words:
        body["words"] = [
            {"word": w.word.strip(), "start": round(w.start, 3), "end": round(w.end, 3)}
            for s in segments for w in (s.words or [])
        ]  # fmt: skip
    return body


# --- the app --------------------------------------------------------------------------------


def _importable(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def create_app(config: ServerConfig | None = None, model: WhisperModel | None = None,
               backend: Backend | None = None) -> FastAPI:  # fmt: skip
    """The FastAPI app. `model` (already loaded) and `backend` are seams for tests; by default
    the model is loaded from `config` and served by `make_backend(model, config.batch_size)`."""
    try:
        from fastapi import Depends, FastAPI
        from fastapi.exceptions import RequestValidationError
        from fastapi.middleware.cors import CORSMiddleware
        from fastapi.responses import JSONResponse
        from starlette.exceptions import HTTPException

        try:  # the form parser: starlette only asks for it at a request's first upload (a 500)
            import python_multipart  # noqa: F401  (python-multipart 0.0.13 and later)
        except ModuleNotFoundError:
            import multipart  # noqa: F401  (its earlier name)
    except ImportError as error:
        raise ImportError(
            f"the server needs FastAPI, uvicorn and python-multipart ({error}); install them "
            "with: pip install 'whisperforge[server]'"
        ) from None
    if not any(_importable(name) for name in ("websockets", "wsproto")):  # uvicorn's WebSockets
        warnings.warn(
            "websockets is not installed: the streaming WebSocket /v1/audio/stream answers 404, "
            "as /v1/realtime does "
            "(the HTTP API works); install it with: pip install 'whisperforge[server]'",
            stacklevel=2,
        )

    config = config or ServerConfig()
    if config.api_key is None:
        config.api_key = os.environ.get("WHISPERFORGE_API_KEY") or None
    if model is None:
        from .transcribe import WhisperModel

        model = WhisperModel(config.model, device=config.device, compute_type=config.compute_type,
                             cpu_threads=config.threads,
                             download_root=config.model_dir)  # fmt: skip
    engine = Engine(backend or make_backend(model, config.batch_size), config.max_queue)
    state = App(config, model, engine)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        engine.stop()

    app = FastAPI(title="whisperforge", summary="OpenAI-compatible speech to text",
                  lifespan=lifespan)  # fmt: skip
    app.state.whisperforge = state
    if config.cors_origins:  # a browser's preflight (OPTIONS) answered, its reads allowed
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST"], allow_headers=["*"],
                           expose_headers=["Retry-After"])  # fmt: skip
    engine.start()

    @app.exception_handler(APIError)
    async def api_error(_: Any, error: APIError) -> JSONResponse:
        headers = {"Retry-After": "1"} if error.status == 503 else {}  # the openai client waits
        if error.status in (408, 504):  # the openai client retries these unless told: the same
            headers["x-should-retry"] = "false"  # audio would time out again, twice more
        if error.status in (408, 413):  # the body's rest is not read: the connection is done
            headers["Connection"] = "close"
        return JSONResponse(error.body(), status_code=error.status, headers=headers)

    @app.exception_handler(HTTPException)
    async def http_error(request: Any, error: HTTPException) -> JSONResponse:
        message = str(error.detail)
        if error.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path}); see GET /v1/models"
        elif error.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
            if request.method == "OPTIONS" and "origin" in request.headers:  # a preflight
                message += ("; this server takes no cross-origin requests from web pages: "
                            "start it with --cors-origin ORIGIN (or '*') to allow them")  # fmt: skip
        kind = "invalid_request_error" if error.status_code < 500 else "server_error"
        return JSONResponse(APIError(error.status_code, message, type=kind).body(),
                            status_code=error.status_code, headers=error.headers)  # fmt: skip

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Any, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return JSONResponse(APIError(400, first.get("msg", "invalid request"), param).body(),
                            status_code=400)  # fmt: skip

    @app.exception_handler(Exception)
    async def internal_error(_: Any, error: Exception) -> JSONResponse:
        message = f"internal error {type(error).__name__}: {error}; please report it"
        return JSONResponse(APIError(500, message, type="server_error").body(), status_code=500)

    def auth(request: HTTPRequest) -> None:
        if not state.authorized(request.headers.get("authorization")):
            raise APIError(401, "missing or incorrect API key; send it as 'Authorization: "
                           "Bearer KEY' (the server's --api-key or WHISPERFORGE_API_KEY)",
                           None, "invalid_api_key")  # fmt: skip

    @app.post("/v1/audio/transcriptions", dependencies=[Depends(auth)])
    async def transcriptions(request: HTTPRequest) -> Any:
        return await state.transcribe(request, "transcribe")

    @app.post("/v1/audio/translations", dependencies=[Depends(auth)])
    async def translations(request: HTTPRequest) -> Any:
        return await state.transcribe(request, "translate")

    started = int(time.time())

    def model_card(model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": started, "owned_by": "whisperforge"}

    @app.get("/v1/models", dependencies=[Depends(auth)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card(m) for m in (config.model_id, *ALIASES)]}

    @app.get("/v1/models/{model_id}", dependencies=[Depends(auth)])
    async def model_info(model_id: str) -> dict[str, Any]:
        if not config.serves(model_id):
            raise APIError(404, f"the model {model_id!r} does not exist on this server",
                           "model", "model_not_found")  # fmt: skip
        return model_card(model_id)

    @app.api_route("/health", methods=["GET", "HEAD"])  # monitors that ask with HEAD too
    async def health() -> Any:  # (an annotation FastAPI resolves for /openapi.json)
        ok = engine.alive
        body = {"status": "ok" if ok else "error", "model": config.model_id,
                "device": str(model.device), "queued": engine.queued,
                "completed": engine.completed, "active": engine.backend.active,
                "audio_memory_mb": round(state.memory.held / MB, 1),
                "max_audio_memory_mb": round(state.memory.limit / MB),
                **engine.backend.stats()}  # fmt: skip
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.websocket("/v1/audio/stream")
    async def stream(ws: WebSocket) -> None:
        await state.websocket(ws)

    @app.websocket("/v1/realtime")  # where the openai SDK's client.realtime.connect goes
    async def realtime(ws: WebSocket) -> None:
        await state.websocket(ws, realtime=True)

    return app


def serve(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000,
          log_level: str = "info") -> None:  # fmt: skip
    """Run the server until interrupted (what `whisperforge serve` calls)."""
    try:  # (before the model loads)
        import uvicorn  # noqa: F401
    except ImportError:
        raise ImportError("the server needs uvicorn; install it with: pip install "
                          "'whisperforge[server]'") from None  # fmt: skip
    app = create_app(config)
    uvicorn_server(app, host=host, port=port, log_level=log_level, log_config=log_config()).run()


def uvicorn_server(app: FastAPI, **settings: Any) -> Any:
    """A uvicorn server of `app` (`settings`: uvicorn.Config's) whose shutdown (SIGTERM, Ctrl-C)
    first stops taking connections and lets the open WebSocket streams send their final
    transcripts (`App.end_streams`), then does uvicorn's."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: list | None = None) -> None:
            for listener in self.servers:  # no new connections while the streams end
                listener.close()
            if app.state.whisperforge.streams:
                logging.getLogger("uvicorn.error").info(
                    "Sending %d open streams their final transcripts",
                    len(app.state.whisperforge.streams))  # fmt: skip
            await app.state.whisperforge.end_streams(lambda: self.force_exit)
            await super().shutdown(sockets)

    return Server(uvicorn.Config(app, **settings))


class RedactedKeys(logging.Filter):
    """uvicorn logs each request's path with its query, and a WebSocket client may give its key
    as `?api_key=...` (browsers cannot set headers there): keys are not for logs."""

    KEY = re.compile(r"(api_key=)[^&\s\"]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                self.KEY.sub(r"\1***", arg) if isinstance(arg, str) else arg for arg in record.args
            )
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's logging, with `RedactedKeys` on its handlers."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redacted_keys": {"()": RedactedKeys}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redacted_keys"]
    return config
