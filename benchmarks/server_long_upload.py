"""A short request sent while the server takes in a long upload: how long it waits.

    python benchmarks/server_long_upload.py --hours 2 --runs 5
    python benchmarks/server_long_upload.py --hours 2 --runs 3 --wav
    PYTHONPATH=OLD_CHECKOUT/src python benchmarks/server_long_upload.py --hours 2 --runs 5

The server (tiny.en on the CPU, in this process, on uvicorn on 127.0.0.1) gets a --hours FLAC of
digital silence (its mel costs what speech's does; its windows are then skipped undecoded), or
with --wav the same as 16-bit WAV (230 MB for 2 h; --max-upload-mb raised to take it), posted
by another process (a client in this one held the GIL while it sent 230 MB, which once passed
for the server's stall); --delay seconds after that upload starts, a client posts JFK (11 s)
and times the answer. Before session 49 the long upload's whole mel was made by the one worker
thread that decodes every request's windows, so the short request waited for it; now the
upload's own request thread makes it. Reports the short request's latency (median over --runs),
the same request alone, and the event loop's longest stall meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import wave
from fractions import Fraction

import av
import httpx
import numpy as np
import uvicorn
from devset import DEV_DIR  # benchmarks/, this script's folder

from whisperforge import WhisperModel
from whisperforge.server import ServerConfig, create_app

JFK = DEV_DIR / "openai-whisper__jfk.flac"


def flac(seconds: float) -> bytes:
    """`seconds` of digital silence as 16 kHz FLAC: a few hundred kB, within --max-upload-mb's
    default (a WAV this long would be 220 MB, whose multipart parse would be what is timed)."""
    out = io.BytesIO()
    with av.open(out, mode="w", format="flac") as container:
        stream = container.add_stream("flac", rate=16000)
        stream.layout = "mono"
        minute = np.zeros((1, 60 * 16000), np.int16)
        for i in range(int(seconds // 60)):
            frame = av.AudioFrame.from_ndarray(minute, "s16", "mono")
            frame.sample_rate, frame.pts, frame.time_base = (
                16000,
                i * minute.size,
                Fraction(1, 16000),
            )
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return out.getvalue()


def serve(app) -> tuple[str, uvicorn.Server]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    return f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", server


def pcm_wav(seconds: float) -> bytes:
    """`seconds` of digital silence as 16 kHz 16-bit WAV."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(np.zeros(round(seconds * 16000), np.int16).tobytes())
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--delay", type=float, default=3.0, help="s after the upload starts")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--wav", action="store_true", help="upload WAV, not FLAC")
    args = parser.parse_args()

    long = (pcm_wav if args.wav else flac)(args.hours * 3600)
    name = "long.wav" if args.wav else "long.flac"
    short = JFK.read_bytes()
    model = WhisperModel("tiny.en", device="cpu", compute_type="float32")
    config = ServerConfig(beam_size=1, request_timeout_s=3600, max_upload_mb=len(long) / 2**20 + 1)
    url, server = serve(create_app(config, model=model))
    endpoint = f"{url}/v1/audio/transcriptions"
    form = {"model": "tiny.en", "response_format": "text"}
    stalls: list[float] = []

    async def watch_the_event_loop() -> None:  # how late a 10 ms sleep wakes
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.01)
            stalls.append(time.perf_counter() - start - 0.01)

    asyncio.run_coroutine_threadsafe(watch_the_event_loop(), server.servers[0].get_loop())

    def post(data: bytes, name: str) -> float:
        started = time.perf_counter()
        response = httpx.post(endpoint, files={"file": (name, data)}, data=form, timeout=3600)
        assert response.status_code == 200, response.text
        return time.perf_counter() - started

    alone = [post(short, "jfk.flac") for _ in range(args.runs)]
    behind, stalled = [], []
    with tempfile.NamedTemporaryFile(suffix=name) as file:
        file.write(long)
        file.flush()
        sender = (  # another process: its GIL is not the server's
            "import httpx, sys\n"
            f"r = httpx.post({endpoint!r}, files={{'file': ({name!r}, open({file.name!r}, 'rb'))}}, "
            f"data={form!r}, timeout=3600)\n"
            "sys.exit(r.status_code != 200)\n"
        )
        for _ in range(args.runs):
            upload = subprocess.Popen([sys.executable, "-c", sender])
            stalls.clear()
            time.sleep(args.delay)
            behind.append(post(short, "jfk.flac"))
            assert upload.wait() == 0, "the long upload failed"
            stalled.append(max(stalls))
    print(
        f"{len(long) / 2**20:.1f} MB {'WAV' if args.wav else 'FLAC'} of {args.hours:g} h; JFK "
        f"alone: median {statistics.median(alone):.2f} s {[round(t, 2) for t in alone]}; sent "
        f"{args.delay:g} s after the upload began: median {statistics.median(behind):.2f} s "
        f"{[round(t, 2) for t in behind]}; the event loop's longest stall a run: "
        f"{[round(t, 3) for t in stalled]} s"
    )
    server.should_exit = True


if __name__ == "__main__":
    main()
