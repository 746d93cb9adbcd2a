"""Server under load on loopback: N concurrent clients send dev clips for T seconds.

    python benchmarks/server_load.py --clients 8 --seconds 30
    python benchmarks/server_load.py --url http://127.0.0.1:8000 --clients 32 --seconds 120

Starts `whisperforge serve` on 127.0.0.1 (unless --url names a running server), sends every
clip once alone (the expected answer, and the one-client latency), then runs the clients:
each posts clips back to back until the time is up. Every answer is checked against the
clip's solo answer (text identical) and its reference transcript (WER). Reports throughput
(requests and audio seconds per second) and latency percentiles.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

DEV_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev"
CLIPS = ["openai-whisper__jfk.flac"] + [f"coqui-tts-ljspeech__LJ001-00{i:02d}.wav" for i in
                                        (1, 3, 4, 5, 7, 9, 10)]  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "whisperforge", "serve", "--host", "127.0.0.1", "--port",
               str(port), "--model", args.model, "--beam-size", str(args.beam_size),
               "--threads", str(args.threads), "--log-level", "warning"]  # fmt: skip
    env = {**os.environ, "WHISPERFORGE_API_KEY": ""}
    server = subprocess.Popen(command, env=env)
    url = f"http://127.0.0.1:{port}"
    import httpx

    for _ in range(240):  # bounded: 2 minutes for the model to load
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    server.terminate()
    raise SystemExit("the server did not come up within 2 minutes")


def main() -> None:
    import httpx
    import jiwer
    from whisper.normalizers import EnglishTextNormalizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--url", help="a running server (default: start one on 127.0.0.1)")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="server's torch threads")
    parser.add_argument("--api-key", default=os.environ.get("WHISPERFORGE_API_KEY", ""))
    args = parser.parse_args()

    normalize = EnglishTextNormalizer()
    lines = (DEV_DIR / "manifest.jsonl").read_text().splitlines()
    manifest = {r["audio"]: r for r in map(json.loads, filter(None, lines))}
    clips = [(name, (DEV_DIR / name).read_bytes(), manifest[name]) for name in CLIPS]
    server, url = (None, args.url) if args.url else start_server(args)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    def send(client: httpx.Client, name: str, data: bytes) -> tuple[int, str, float]:
        started = time.perf_counter()
        response = client.post(
            f"{url}/v1/audio/transcriptions", headers=headers,
            files={"file": (name, data)}, data={"model": args.model},
        )  # fmt: skip
        elapsed = time.perf_counter() - started
        text = response.json().get("text", "") if response.status_code == 200 else response.text
        return response.status_code, text, elapsed

    try:
        expected, solo = {}, []
        with httpx.Client(timeout=600) as client:
            for name, data, ref in clips:
                status, text, elapsed = send(client, name, data)
                assert status == 200, f"{name}: {status} {text}"
                expected[name] = text
                solo.append(elapsed)
                wer = jiwer.wer(normalize(ref["text"]), normalize(text))
                print(f"solo {name}: {elapsed:.2f} s, WER {100 * wer:.1f}%", flush=True)
        audio_s = {name: ref["duration_s"] for name, _, ref in clips}

        results: list[tuple[str, int, str, float]] = []
        lock = threading.Lock()
        deadline = time.perf_counter() + args.seconds

        def client_loop(k: int) -> None:
            with httpx.Client(timeout=600) as client:
                i = k
                while time.perf_counter() < deadline:
                    name, data, _ = clips[i % len(clips)]
                    try:
                        status, text, elapsed = send(client, name, data)
                    except httpx.HTTPError as error:
                        status, text, elapsed = -1, repr(error), 0.0
                    with lock:
                        results.append((name, status, text, elapsed))
                    i += 1

        started = time.perf_counter()
        threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)

    ok = [r for r in results if r[1] == 200 and r[2] == expected[r[0]]]
    failed = [r for r in results if r[1] != 200]
    differ = [r for r in results if r[1] == 200 and r[2] != expected[r[0]]]
    latency = np.array([r[3] for r in results if r[1] == 200])
    print(f"\n{args.clients} clients, {args.seconds:g} s, beam {args.beam_size}, "
          f"model {args.model}")  # fmt: skip
    print(f"requests {len(results)}: identical to solo {len(ok)}, other text {len(differ)}, "
          f"errors {len(failed)}")  # fmt: skip
    for name, status, text, _ in differ + failed:
        print(f"  {name}: {status} {text[:120]!r}")
    served_audio = sum(audio_s[r[0]] for r in results if r[1] == 200)
    print(f"throughput {len(results) / wall:.2f} req/s, {served_audio / wall:.1f} audio s/s "
          f"(wall {wall:.1f} s); one client alone: {len(solo) / sum(solo):.2f} req/s")  # fmt: skip
    if latency.size:
        p50, p90, p99 = np.percentile(latency, [50, 90, 99])
        print(f"latency p50 {p50:.2f} s, p90 {p90:.2f} s, p99 {p99:.2f} s, "
              f"max {latency.max():.2f} s; solo mean {np.mean(solo):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
