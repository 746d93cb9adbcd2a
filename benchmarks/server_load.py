"""Server under load on loopback: throughput and latency with 1 client, then with N at once.

    python benchmarks/server_load.py --clients 1,16 --seconds 20
    python benchmarks/server_load.py --url http://127.0.0.1:8000 --clients 32 --seconds 120
    python benchmarks/server_load.py --prepare .device/clips   # 16 kHz WAV copies of the clips

Starts `whisperforge serve` on 127.0.0.1 (unless --url names a running server), sends every
clip once alone (its expected answer) and then all of them at once (a warm-up for the batch
shapes), then runs each client count in turn for --seconds: each client posts clips back to
back. Every answer is checked against the clip's solo answer (identical text) and its
reference transcript (WER). Reports throughput (requests and audio seconds per second),
latency percentiles, the windows per batch from /health (what continuous batching shared),
and the throughput of the most clients over that of one.

The clips are the dev clips below, or (--clips DIR) the 16 kHz PCM WAV copies that --prepare
writes with their transcripts, which a server without PyAV reads and which travel light.
Needs only httpx and numpy on the client side.
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
import wave
from pathlib import Path

import numpy as np

DEV_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "dev"
# About 60 s in all, so the WAV copies stay under 2 MB; all shorter than one 30 s window.
CLIPS = ["openai-whisper__jfk.flac"] + [f"coqui-tts-ljspeech__LJ001-00{i:02d}.wav" for i in
                                        (1, 3, 4, 5, 7, 9)]  # fmt: skip
MANIFEST = "clips.json"


def words(text: str) -> list[str]:
    return "".join(c for c in text.lower() if c.isalnum() or c in " '").split()


def wer(reference: str, text: str) -> float:
    """Word error rate: word-level edit distance over the reference's length."""
    ref, hyp = words(reference), words(text)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[-1] / max(len(ref), 1)


def prepare(folder: Path) -> None:
    """Write the clips as 16 kHz mono 16-bit WAV with their transcripts (needs PyAV here)."""
    from whisperforge import load_audio

    lines = (DEV_DIR / "manifest.jsonl").read_text().splitlines()
    manifest = {r["audio"]: r for r in map(json.loads, filter(None, lines))}
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for name in CLIPS:
        samples = load_audio(DEV_DIR / name)  # PyAV's s16 samples / 32768: exact in int16
        out = folder / (Path(name).stem + ".wav")
        with wave.open(str(out), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(16000)
            wav.writeframes(np.round(samples * 32768).clip(-32768, 32767).astype("<i2").tobytes())
        entries.append({"audio": out.name, "text": manifest[name]["text"],
                        "duration_s": len(samples) / 16000})  # fmt: skip
    (folder / MANIFEST).write_text(json.dumps(entries, indent=1))
    size = sum(f.stat().st_size for f in folder.iterdir())
    print(f"wrote {len(entries)} clips, {size / 1e6:.2f} MB, to {folder}")


def load_clips(folder: Path | None) -> list[tuple[str, bytes, str, float]]:
    """(name, file bytes, reference text, seconds) of each clip."""
    if folder is not None:
        entries = json.loads((folder / MANIFEST).read_text())
        return [(e["audio"], (folder / e["audio"]).read_bytes(), e["text"], e["duration_s"])
                for e in entries]  # fmt: skip
    lines = (DEV_DIR / "manifest.jsonl").read_text().splitlines()
    manifest = {r["audio"]: r for r in map(json.loads, filter(None, lines))}
    return [(name, (DEV_DIR / name).read_bytes(), manifest[name]["text"],
             manifest[name]["duration_s"]) for name in CLIPS]  # fmt: skip


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


def main() -> None:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,16", help="client counts, run in turn")
    parser.add_argument("--seconds", type=float, default=20.0, help="per client count")
    parser.add_argument("--url", help="a running server (default: start one on 127.0.0.1)")
    parser.add_argument("--model", default="tiny.en", help="a model name or folder")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batch-size", type=int, help="the server's (default: its own)")
    parser.add_argument("--beam-size", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="server's torch threads")
    parser.add_argument("--clips", type=Path, help="a folder that --prepare wrote")
    parser.add_argument("--prepare", type=Path, metavar="DIR", help="write WAV clips and exit")
    parser.add_argument("--api-key", default=os.environ.get("WHISPERFORGE_API_KEY", ""))
    args = parser.parse_args()
    if args.prepare:
        prepare(args.prepare)
        return
    counts = [int(n) for n in args.clients.split(",")]
    clips = load_clips(args.clips)
    model_id = Path(args.model).name or args.model
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    started_at = time.perf_counter()
    server, url = (None, args.url) if args.url else start_server(args)
    print(f"server up in {time.perf_counter() - started_at:.1f} s", flush=True)

    def send(client: httpx.Client, name: str, data: bytes) -> tuple[int, str, float]:
        started = time.perf_counter()
        response = client.post(
            f"{url}/v1/audio/transcriptions", headers=headers,
            files={"file": (name, data)}, data={"model": model_id},
        )  # fmt: skip
        elapsed = time.perf_counter() - started
        text = response.json().get("text", "") if response.status_code == 200 else response.text
        return response.status_code, text, elapsed

    def run(n: int, seconds: float) -> tuple[list[tuple[str, int, str, float]], float]:
        """n clients posting clips back to back for `seconds`: the answers and the wall time."""
        results: list[tuple[str, int, str, float]] = []
        lock = threading.Lock()
        deadline = time.perf_counter() + seconds

        def client_loop(k: int) -> None:
            with httpx.Client(timeout=300) as client:
                i = k
                while True:  # at least one request each, so seconds=0 sends one per client
                    name, data, _, _ = clips[i % len(clips)]
                    try:
                        status, text, elapsed = send(client, name, data)
                    except httpx.HTTPError as error:
                        status, text, elapsed = -1, repr(error), 0.0
                    with lock:
                        results.append((name, status, text, elapsed))
                    i += 1
                    if time.perf_counter() >= deadline:
                        return

        started = time.perf_counter()
        threads = [threading.Thread(target=client_loop, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results, time.perf_counter() - started

    def health() -> dict:
        return httpx.get(f"{url}/health", timeout=10).json()

    throughput: dict[int, float] = {}
    try:
        expected = {}
        with httpx.Client(timeout=300) as client:
            for name, data, reference, _ in clips:
                status, text, elapsed = send(client, name, data)
                assert status == 200, f"{name}: {status} {text}"
                expected[name] = text
                print(f"solo {name}: {elapsed:.2f} s, WER {100 * wer(reference, text):.1f}%")
        run(max(counts), 0)  # every client sends once: the batch shapes get warm
        audio_s = {name: seconds for name, _, _, seconds in clips}
        references = {name: reference for name, _, reference, _ in clips}
        for n in counts:
            before = health()
            results, wall = run(n, args.seconds)
            after = health()
            ok = [r for r in results if r[1] == 200]
            same = [r for r in ok if r[2] == expected[r[0]]]
            print(f"\n{n} client(s), {args.seconds:g} s, beam {args.beam_size}, {model_id} on "
                  f"{after.get('device')}: {len(results)} requests, {len(same)} identical to "
                  f"solo, {len(ok) - len(same)} other text, {len(results) - len(ok)} errors")  # fmt: skip
            for name, status, text, _ in results:
                if status != 200:
                    print(f"  error {name}: {status} {text[:200]!r}")
                elif text != expected[name]:
                    print(f"  other text {name}: WER vs solo {100 * wer(expected[name], text):.1f}%,"
                          f" vs reference {100 * wer(references[name], text):.1f}%")  # fmt: skip
            throughput[n] = len(ok) / wall
            served = sum(audio_s[r[0]] for r in ok)
            print(f"  throughput {throughput[n]:.2f} req/s, {served / wall:.1f} audio s/s "
                  f"(wall {wall:.1f} s)")  # fmt: skip
            latency = np.array([r[3] for r in ok])
            if latency.size:
                p50, p90, p99 = np.percentile(latency, [50, 90, 99])
                print(f"  latency p50 {p50:.3f} s, p90 {p90:.3f} s, p99 {p99:.3f} s, "
                      f"max {latency.max():.3f} s")  # fmt: skip
            if after.get("batched"):
                windows = after["windows"] - before["windows"]
                batches = max(after["batches"] - before["batches"], 1)
                print(f"  windows per batch: mean {windows / batches:.1f}, "
                      f"max so far {after['max_batch_windows']}")  # fmt: skip
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    if len(throughput) > 1 and throughput[counts[0]] > 0:
        first, last = counts[0], counts[-1]
        ratio = throughput[last] / throughput[first]
        print(f"\nthroughput with {last} clients / with {first}: {ratio:.2f}x")
    print(f"total {time.perf_counter() - started_at:.0f} s")


if __name__ == "__main__":
    main()
