"""Server under load: throughput and latency with 1 client, then with N at once.

    python benchmarks/server_load.py --clients 32 --seconds 120          # HTTP on loopback
    python benchmarks/server_load.py --url http://127.0.0.1:8000 --clients 1,16
    python benchmarks/server_load.py --in-process --device cuda --model .device/tiny.en \
        --npy .device/longform.npy --clients 1,16 --seconds 15 --json $OUT/server_load.json

HTTP mode starts `whisperforge serve` on 127.0.0.1 (unless --url names a running server) and
has each client post clips back to back to /v1/audio/transcriptions. --in-process drives the
server's own worker (`Engine` over `make_backend`: the batched backend on CUDA) from one
submitter thread per client, without HTTP: for machines without FastAPI and uvicorn; the
model, the backend and the batching are the same.

Every clip is first transcribed offline (`WhisperModel.transcribe`, sequential, the server's
options), then each client count sends one request per client (a warm-up for the batch
shapes) and runs for --seconds. Every answer is checked against the clip's offline text
(identical, else its WER) and, where there is one, its reference transcript. Reports requests
sent, answered, identical, lost; throughput (requests and audio seconds per second); latency
percentiles; the windows per batch (what continuous batching shared); and the throughput of
the most clients over that of the fewest.

Clips: the dev clips below, or (--npy) consecutive --clip-seconds slices of a 16 kHz int16
recording, sent as 16 kHz PCM WAV (which a server without PyAV reads).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from devset import DEV_DIR, manifest_by_name, plain_wer

# About 60 s in all; all shorter than one 30 s window.
CLIPS = ["openai-whisper__jfk.flac"] + [f"coqui-tts-ljspeech__LJ001-00{i:02d}.wav" for i in
                                        (1, 3, 4, 5, 7, 9)]  # fmt: skip


@dataclass
class Clip:
    name: str
    data: bytes  # the file a client uploads
    reference: str | None  # its exact transcript, where there is one
    seconds: float


# (clip name, HTTP status or -1 for no answer, text, latency s)
Result = tuple[str, int, str, float]
Sender = Callable[[Clip], tuple[int, str]]


def dev_clips() -> list[Clip]:
    manifest = manifest_by_name()
    return [Clip(name, (DEV_DIR / name).read_bytes(), manifest[name]["text"],
                 manifest[name]["duration_s"]) for name in CLIPS]  # fmt: skip


def npy_clips(path: Path, seconds: float, count: int) -> list[Clip]:
    """Consecutive `seconds` slices of a 16 kHz int16 recording, as PCM WAV files."""
    pcm = np.load(path, mmap_mode="r")
    size = int(seconds * 16000)
    if pcm.dtype != np.int16 or pcm.ndim != 1 or len(pcm) < size * count:
        raise SystemExit(f"{path}: need 1-D int16 16 kHz audio of at least {seconds * count} s")
    clips = []
    for i in range(count):
        out = io.BytesIO()
        with wave.open(out, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16000)
            wav.writeframes(np.asarray(pcm[i * size : (i + 1) * size], "<i2").tobytes())
        clips.append(Clip(f"{path.stem}_{i * seconds:g}s.wav", out.getvalue(), None, seconds))
    return clips


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    command = [sys.executable, "-m", "whisperforge", "serve", "--host", "127.0.0.1", "--port",
               str(port), "--model", args.model, "--device", args.device,
               "--beam-size", str(args.beam_size), "--threads", str(args.threads),
               "--log-level", "warning"]  # fmt: skip
    if args.batch_size:
        command += ["--batch-size", str(args.batch_size)]
    server = subprocess.Popen(command, env={**os.environ, "WHISPERFORGE_API_KEY": ""})
    url = f"http://127.0.0.1:{port}"
    for _ in range(180):  # bounded: 90 s for the model to load
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.terminate()
    raise SystemExit("the server did not come up within 90 s")


def http_client(url: str, model_id: str, api_key: str) -> Callable[[], Any]:
    """A context manager per client thread: an httpx client that posts a clip."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    @contextlib.contextmanager
    def session() -> Iterator[Sender]:
        with httpx.Client(timeout=300) as client:

            def send(clip: Clip) -> tuple[int, str]:
                try:
                    response = client.post(f"{url}/v1/audio/transcriptions", headers=headers,
                                           files={"file": (clip.name, clip.data)},
                                           data={"model": model_id})  # fmt: skip
                except httpx.HTTPError as error:
                    return -1, repr(error)
                if response.status_code != 200:
                    return response.status_code, response.text
                return 200, response.json()["text"]

            yield send

    return session


def engine_client(engine: Any, options: dict, samples: dict[str, np.ndarray]) -> Callable[[], Any]:
    """A context manager per submitter thread: submits a clip's job to the engine and waits."""
    from whisperforge.engine import Job
    from whisperforge.transcribe import TranscriptionOptions

    transcription = TranscriptionOptions.from_arguments(**options)

    @contextlib.contextmanager
    def session() -> Iterator[Sender]:
        def send(clip: Clip) -> tuple[int, str]:
            try:
                segments, _ = engine.submit(Job(samples[clip.name], transcription)).result(300)
            except Exception as error:  # noqa: BLE001 -- counted as an error, reported
                return -1, repr(error)
            return 200, "".join(s.text for s in segments).strip()

        yield send

    return session


def run(session: Callable[[], Any], clips: list[Clip], n: int, seconds: float
        ) -> tuple[list[Result], int, float]:  # fmt: skip
    """n clients sending clips back to back for `seconds` (at least one each): the answers,
    the requests sent, and the wall time."""
    results: list[Result] = []
    sent = 0
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client_loop(k: int) -> None:
        nonlocal sent
        with session() as send:
            i = k
            while True:
                clip = clips[i % len(clips)]
                with lock:
                    sent += 1
                started = time.perf_counter()
                status, text = send(clip)
                with lock:
                    results.append((clip.name, status, text, time.perf_counter() - started))
                i += 1
                if time.perf_counter() >= deadline:
                    return

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, sent, time.perf_counter() - started


def report(results: list[Result], sent: int, wall: float, clips: list[Clip],
           expected: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """Print and return the figures of one run."""
    by_name = {clip.name: clip for clip in clips}
    ok = [r for r in results if r[1] == 200]
    same = [r for r in ok if r[2] == expected[r[0]]]
    errors = [r for r in results if r[1] != 200]
    print(f"  {sent} requests sent, {len(results)} answered ({sent - len(results)} lost), "
          f"{len(same)} identical to offline, {len(ok) - len(same)} other text, "
          f"{len(errors)} errors")  # fmt: skip
    for name, status, text, _ in errors[:10]:
        print(f"  error {name}: {status} {text[:200]!r}")
    other_wer = []
    for name, _, text, _ in ok:
        if text != expected[name]:
            other_wer.append(plain_wer(expected[name], text))
            reference = by_name[name].reference
            vs_ref = f", vs reference {100 * plain_wer(reference, text):.1f}%" if reference else ""
            print(f"  other text {name}: WER vs offline {100 * other_wer[-1]:.1f}%{vs_ref}")
    audio = sum(by_name[r[0]].seconds for r in ok)
    latency = np.array([r[3] for r in ok]) if ok else np.zeros(1)
    p50, p90, p99 = np.percentile(latency, [50, 90, 99])
    figures = {
        "sent": sent, "answered": len(results), "lost": sent - len(results), "ok": len(ok),
        "identical": len(same), "errors": len(errors), "wall_s": round(wall, 2),
        "max_wer_vs_offline": round(max(other_wer, default=0.0), 4),
        "requests_per_s": round(len(ok) / wall, 3), "audio_s_per_s": round(audio / wall, 2),
        "latency_s": {"p50": round(p50, 3), "p90": round(p90, 3), "p99": round(p99, 3),
                      "max": round(float(latency.max()), 3)},
    }  # fmt: skip
    print(f"  throughput {figures['requests_per_s']:.2f} req/s, {audio / wall:.1f} audio s/s "
          f"(wall {wall:.1f} s)")  # fmt: skip
    print(f"  latency p50 {p50:.3f} s, p90 {p90:.3f} s, p99 {p99:.3f} s, max {latency.max():.3f} s")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16", help="client counts, run in turn")
    parser.add_argument("--seconds", type=float, default=20.0, help="per client count")
    parser.add_argument("--url", help="a running server (default: start one on 127.0.0.1)")
    parser.add_argument("--in-process", action="store_true",
                        help="drive the server's engine directly, without HTTP")  # fmt: skip
    parser.add_argument("--model", default="tiny.en", help="a model name or folder")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, help="the server's (default: its own)")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch threads of the model")
    parser.add_argument("--npy", type=Path, help="16 kHz int16 audio to cut clips from")
    parser.add_argument("--clip-seconds", type=float, default=12.0, help="with --npy")
    parser.add_argument("--n-clips", type=int, default=16, help="with --npy")
    parser.add_argument("--api-key", default=os.environ.get("WHISPERFORGE_API_KEY", ""))
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    import torch

    from whisperforge import WhisperModel, load_audio
    from whisperforge.engine import Engine, make_backend
    from whisperforge.transcribe import temperature_ladder

    counts = [int(n) for n in args.clients.split(",")]
    clips = npy_clips(args.npy, args.clip_seconds, args.n_clips) if args.npy else dev_clips()
    started_at = time.perf_counter()
    model = WhisperModel(args.model, device=args.device, cpu_threads=args.threads)
    # What the server runs for a plain request (App.parse): language detected, temperature 0
    # with OpenAI's fallback ladder, no prompt, no word timestamps.
    options = {"beam_size": args.beam_size, "temperature": temperature_ladder(0.0)}
    samples = {clip.name: load_audio(clip.data) for clip in clips}
    expected = {}
    for clip in clips:
        segments, _ = model.transcribe(samples[clip.name], **options)
        expected[clip.name] = "".join(s.text for s in segments).strip()
        text = expected[clip.name]
        vs_ref = (
            f", WER vs reference {100 * plain_wer(clip.reference, text):.1f}%"
            if clip.reference
            else ""
        )
        print(f"offline {clip.name}: {text[:60]!r}{vs_ref}")

    server = engine = None
    if args.in_process:
        engine = Engine(make_backend(model, args.batch_size), max_queue=1 << 16)
        engine.start()
        session = engine_client(engine, options, samples)
        stats: Callable[[], dict] = engine.backend.stats
        where = f"in process, {model.device}"
    else:
        import httpx

        del model  # the server holds its own
        server, url = (None, args.url) if args.url else start_server(args)
        session = http_client(url, Path(args.model).name or args.model, args.api_key)
        stats = lambda: httpx.get(f"{url}/health", timeout=10).json()
        where = f"HTTP {url}"
    print(f"ready in {time.perf_counter() - started_at:.1f} s ({where})", flush=True)

    figures: dict[str, Any] = {"model": args.model, "beam_size": args.beam_size, "where": where,
                               "device": torch.cuda.get_device_name() if torch.cuda.is_available()
                               else "cpu", "clips": len(clips), "runs": {}}  # fmt: skip
    try:
        for n in counts:
            print(f"\n{n} client(s), warm-up: one request each", flush=True)
            figures["runs"][f"warmup_{n}"] = report(*run(session, clips, n, 0), clips, expected)
            before = stats()
            print(f"{n} client(s), {args.seconds:g} s, beam {args.beam_size}, {where}")
            run_figures = report(*run(session, clips, n, args.seconds), clips, expected)
            after = stats()
            if after.get("batched"):
                windows = after["windows"] - before["windows"]
                batches = max(after["batches"] - before["batches"], 1)
                run_figures["windows_per_batch"] = round(windows / batches, 2)
                run_figures["max_batch_windows"] = after["max_batch_windows"]
                print(f"  windows per batch: mean {windows / batches:.2f}, "
                      f"max so far {after['max_batch_windows']}")  # fmt: skip
            figures["runs"][str(n)] = run_figures
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        if engine is not None:
            engine.stop()
    if len(counts) > 1:
        first, last = figures["runs"][str(counts[0])], figures["runs"][str(counts[-1])]
        ratio = last["requests_per_s"] / max(first["requests_per_s"], 1e-9)
        figures["throughput_ratio"] = round(ratio, 2)
        print(f"\nthroughput with {counts[-1]} clients / with {counts[0]}: {ratio:.2f}x")
    figures["total_s"] = round(time.perf_counter() - started_at, 1)
    print(f"total {figures['total_s']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
