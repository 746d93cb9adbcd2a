"""A short request sent while the server takes in a long upload: how long it waits.

    python benchmarks/server_long_upload.py --hours 2 --runs 5
    PYTHONPATH=OLD_CHECKOUT/src python benchmarks/server_long_upload.py --hours 2 --runs 5

The server (tiny.en on the CPU, in this process, on uvicorn on 127.0.0.1) gets a --hours FLAC of
digital silence (its mel costs what speech's does; its windows are then skipped undecoded);
--delay seconds after that upload starts, a client posts JFK (11 s) and times the answer.
Before session 49 the long upload's whole mel was made by the one worker thread that decodes
every request's windows, so the short request waited for it; now the upload's own request
thread makes it. Reports the short request's latency (median over --runs) and the same
request alone. The second line runs an older checkout's server the same way.
"""

from __future__ import annotations

import argparse
import io
import statistics
import threading
import time
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--delay", type=float, default=3.0, help="s after the upload starts")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()

    long = flac(args.hours * 3600)
    short = JFK.read_bytes()
    model = WhisperModel("tiny.en", device="cpu", compute_type="float32")
    config = ServerConfig(beam_size=1, request_timeout_s=3600)
    url, server = serve(create_app(config, model=model))
    endpoint = f"{url}/v1/audio/transcriptions"
    form = {"model": "tiny.en", "response_format": "text"}

    def post(data: bytes, name: str) -> float:
        started = time.perf_counter()
        response = httpx.post(endpoint, files={"file": (name, data)}, data=form, timeout=3600)
        assert response.status_code == 200, response.text
        return time.perf_counter() - started

    alone = [post(short, "jfk.flac") for _ in range(args.runs)]
    behind = []
    for _ in range(args.runs):
        upload = threading.Thread(target=post, args=(long, "long.flac"), daemon=True)
        upload.start()
        time.sleep(args.delay)
        behind.append(post(short, "jfk.flac"))
        upload.join()
    print(
        f"{len(long) / 2**10:.0f} kB FLAC of {args.hours:g} h; JFK alone: median "
        f"{statistics.median(alone):.2f} s {[round(t, 2) for t in alone]}; sent {args.delay:g} s "
        f"after the upload began: median {statistics.median(behind):.2f} s "
        f"{[round(t, 2) for t in behind]}"
    )
    server.should_exit = True


if __name__ == "__main__":
    main()
