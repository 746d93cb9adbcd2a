"""GPU speed of the runtime against its peers, on the same random weights in one process.

For a preset architecture with random fp16 weights and a forced decode length (EOT suppressed),
prints the runtime's encode_ms, cross_ms, prefill_ms, decode_ms, decode_steps, per-step ms and
RTFx, each with its floor (bytes over the copy bandwidth or FLOPs over the matmul rate, both
measured in this job), then the decode step of the peers on the same weights:
HF transformers (sdpa, eager generate), HF with a static cache (generate compiles it) and
openai-whisper. A peer's step is the median gap between two calls of a logits processor.

    python benchmarks/gpu.py --preset large-v3-turbo --batch 1 16 --tokens 128
    python benchmarks/gpu.py --check MODEL_DIR --audio clips.npz long.npy --out check.json  # real weights

--check transcribes int16 16 kHz clips on the GPU through WhisperModel (which runs on the runtime
there) in each of --compute-types (float16, float32, int8_float16, float8, ...) and writes texts
and tokens, to compare with a CPU reference (--compare). --seeds with --perturb adds a pass per
seed on weights moved by tiny noise (`perturbed`), and --compare then prints each type's mean
WER over them: the 19-minute file's WER moves by up to a point with any change of numbers, the
mean over such passes much less.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from whisperforge import kernels, runtime
from whisperforge.checkpoints import Checkpoint, hf_name
from whisperforge.model import ModelConfig, Whisper
from whisperforge.presets import preset, random_model, unfuse_state_dict
from whisperforge.runtime import Runtime


def eot_for(config: ModelConfig) -> int:
    return 50257 if config.is_multilingual else 50256


def prompt_for(config: ModelConfig) -> list[int]:
    """<|startoftranscript|><|en|><|transcribe|><|notimestamps|> (English-only: no language, task)."""
    sot = eot_for(config) + 1
    if config.is_multilingual:
        return [sot, sot + 1, config.n_vocab - 1506, config.n_vocab - 1502]
    return [sot, config.n_vocab - 1502]


def events_ms(fn, reps: int = 10, warmup: int = 2) -> float:
    """Median device time of fn() in ms, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def ceilings() -> tuple[float, float]:
    """(copy GB/s counting read + write, fp16 matmul TFLOP/s), measured here."""
    x = torch.randn(1 << 28, device="cuda", dtype=torch.float16)  # 512 MiB
    y = torch.empty_like(x)
    bw = 2 * x.numel() * 2 / events_ms(lambda: y.copy_(x)) / 1e6
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    tflops = 2 * 8192**3 / events_ms(lambda: a @ a) / 1e9
    return bw, tflops


# --- floors ----------------------------------------------------------------------------------


def encoder_flops(c: ModelConfig, windows: int) -> float:
    T, D, L = c.n_audio_ctx, c.n_audio_state, c.n_audio_layer
    conv = 2 * (2 * T) * c.n_mels * D * 3 + 2 * T * D * D * 3
    layers = L * (2 * T * 12 * D * D + 4 * T * T * D)
    return windows * (conv + layers)


def step_bytes(c: ModelConfig, windows: int, rows: int, length: int, itemsize: int = 2) -> float:
    """A decode step must read the decoder's weights once, every window's cross K,V and each
    row's self K,V so far."""
    D, L = c.n_text_state, c.n_text_layer
    weights = L * 14 * D * D + c.n_vocab * D
    cross = windows * L * c.n_audio_ctx * 2 * D
    cache = rows * L * length * 2 * D
    return (weights + cross + cache) * itemsize


# --- the runtime -----------------------------------------------------------------------------


def bench_runtime(
    rt: Runtime, c: ModelConfig, batch: int, tokens: int, bw: float, tflops: float
) -> dict:
    torch.manual_seed(0)
    mel = torch.randn(batch, c.n_mels, 3000, device="cuda", dtype=rt.dtype)
    prompt = prompt_for(c)
    encode_ms = events_ms(lambda: rt.encoder(mel))
    features = rt.encoder(mel)
    cross_ms = events_ms(lambda: rt.cross(features))
    cross = rt.cross(features)
    prefill_ms = events_ms(lambda: rt.prefill(cross, [prompt] * batch))

    def decode() -> None:
        b = rt.prefill(cross, [prompt] * batch)
        rt.greedy(b, tokens, eot_for(c), suppress=[eot_for(c)], stop=False)

    total_ms = events_ms(decode, reps=5)
    decode_ms = total_ms - prefill_ms
    steps = tokens - 1
    D = c.n_text_state
    mean_length = len(prompt) + tokens / 2
    step_floor = step_bytes(c, batch, batch, mean_length) / bw / 1e6
    enc_floor = encoder_flops(c, batch) / tflops / 1e9
    cross_floor = max(
        2 * batch * c.n_audio_ctx * D * 2 * D * c.n_text_layer / tflops / 1e9,
        batch * c.n_text_layer * c.n_audio_ctx * 2 * D * 2 / bw / 1e6,
    )
    work_ms = encode_ms + cross_ms + prefill_ms + decode_ms
    return {
        "batch": batch,
        "encode_ms": encode_ms,
        "encode_floor_ms": enc_floor,
        "cross_ms": cross_ms,
        "cross_floor_ms": cross_floor,
        "prefill_ms": prefill_ms,
        "decode_ms": decode_ms,
        "decode_steps": steps,
        "step_ms": decode_ms / steps,
        "step_floor_ms": step_floor,
        "rtfx": batch * 30 / (work_ms / 1000),
    }


def bench_window(rt: Runtime, c: ModelConfig, steps: int = 100) -> float:
    """A whole 30 s window at batch 1: mel on the GPU, encoder, cross, prefill, `steps` steps."""
    from whisperforge.audio import N_SAMPLES, log_mel_spectrogram

    audio = torch.randn(N_SAMPLES, device="cuda") * 0.1
    prompt = prompt_for(c)

    def window() -> None:
        mel = log_mel_spectrogram(audio, c.n_mels, 0, "cuda")[None, :, :3000]
        cross = rt.encode(mel)
        rt.greedy(
            rt.prefill(cross, [prompt]), steps + 1, eot_for(c), suppress=[eot_for(c)], stop=False
        )

    return events_ms(window, reps=5)


# --- peers -----------------------------------------------------------------------------------


def hf_model(c: ModelConfig, canonical: dict[str, torch.Tensor], device: str = "cuda"):
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    config = WhisperConfig(
        vocab_size=c.n_vocab, num_mel_bins=c.n_mels, d_model=c.n_text_state,
        encoder_layers=c.n_audio_layer, encoder_attention_heads=c.n_audio_head,
        decoder_layers=c.n_text_layer, decoder_attention_heads=c.n_text_head,
        encoder_ffn_dim=4 * c.n_audio_state, decoder_ffn_dim=4 * c.n_text_state,
        max_source_positions=c.n_audio_ctx, max_target_positions=c.n_text_ctx,
        decoder_start_token_id=eot_for(c) + 1, eos_token_id=eot_for(c), pad_token_id=eot_for(c),
        attn_implementation="sdpa",
    )  # fmt: skip
    with torch.device(device):
        model = (
            WhisperForConditionalGeneration(config).to(canonical["decoder.ln.weight"].dtype).eval()
        )
    state = {hf_name(name): tensor for name, tensor in canonical.items()}
    state["proj_out.weight"] = canonical["decoder.token_embedding.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("k_proj.bias" in m for m in missing), (missing, unexpected)
    return model


class StepClock:
    """A logits processor / filter that only records a CUDA event each step."""

    def __init__(self):
        self.events: list[torch.cuda.Event] = []

    def __call__(self, input_ids, scores):  # transformers
        self.tick()
        return scores

    def apply(self, logits, tokens):  # openai-whisper
        self.tick()

    def tick(self) -> None:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self.events.append(event)

    def step_ms(self) -> float:
        torch.cuda.synchronize()
        gaps = [a.elapsed_time(b) for a, b in zip(self.events, self.events[1:])]
        return statistics.median(gaps)


def bench_hf(model, c: ModelConfig, batch: int, tokens: int, static: bool) -> float:
    from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList

    mel = torch.randn(batch, c.n_mels, 3000, device="cuda", dtype=torch.float16)
    prompt = torch.tensor([prompt_for(c)] * batch, device="cuda")
    eot = eot_for(c)
    config = GenerationConfig(
        max_new_tokens=tokens, do_sample=False, num_beams=1, eos_token_id=None, pad_token_id=eot,
        decoder_start_token_id=eot + 1, suppress_tokens=[eot],
        cache_implementation="static" if static else None,
    )  # fmt: skip
    clock = StepClock()

    def run(clock: StepClock) -> None:
        GenerationMixin.generate(
            model, input_features=mel, decoder_input_ids=prompt, generation_config=config,
            logits_processor=LogitsProcessorList([clock]),
        )  # fmt: skip

    with torch.inference_mode():
        run(StepClock())  # warm-up: compiles the static-cache forward
        run(StepClock())
        run(clock)
    return clock.step_ms()


def bench_openai(model, c: ModelConfig, batch: int, tokens: int) -> float:
    from whisper.decoding import DecodingOptions, DecodingTask

    mel = torch.randn(batch, c.n_mels, 3000, device="cuda", dtype=torch.float16)
    options = DecodingOptions(
        language="en", sample_len=tokens, without_timestamps=True, suppress_tokens=[eot_for(c)],
        suppress_blank=False, fp16=True,
    )  # fmt: skip
    clock = StepClock()
    with torch.inference_mode():
        for clk in (StepClock(), clock):
            task = DecodingTask(model, options)
            task.logit_filters.append(clk)
            task.run(mel)
    return clock.step_ms()


def openai_model(c: ModelConfig, canonical: dict[str, torch.Tensor], device: str = "cuda"):
    import whisper.model as ow

    with torch.device(device):
        model = ow.Whisper(ow.ModelDimensions(**asdict(c)))
    model.load_state_dict(canonical)  # fp32 parameters, fp16 compute: openai-whisper's own way
    return model.eval()


# --- profile -------------------------------------------------------------------------------


def profile_step(rt: Runtime, c: ModelConfig, batch: int, length: int = 64) -> str:
    """Kernel times of one eager decode step (what the graph replays)."""
    from torch.profiler import ProfilerActivity, profile

    prompt = prompt_for(c) + [1000] * (length - len(prompt_for(c)))
    graphs, rt.graphs = rt.graphs, False
    cross = rt.cross(rt.encoder(torch.randn(batch, c.n_mels, 3000, device="cuda", dtype=rt.dtype)))
    b = rt.prefill(cross, [prompt] * batch)
    for _ in range(3):
        rt.step(b, rt.token[:batch])
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            rt.step(b, rt.token[:batch])
        torch.cuda.synchronize()
    rt.graphs = graphs
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=25)


# --- correctness --------------------------------------------------------------------------


@torch.inference_mode()
def selftest(preset_name: str = "tiny", steps: int = 70) -> None:
    """The graphed runtime against the plain model on the GPU, random weights: 2 windows x 2 rows,
    prompts of 3 to 9 tokens, `steps` teacher-forced steps across the bucket at 64, then a
    greedy decode graphed vs eager."""
    c = preset(preset_name)
    plain = random_model(c, seed=1, device="cuda")
    features = plain.encoder(torch.randn(2, c.n_mels, 3000, device="cuda"))
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 50000, (n,), generator=g).tolist() for n in (3, 9, 5, 4)]
    fed = torch.randint(0, 50000, (steps, 4), generator=g)

    def reference(rows: list[list[int]]) -> torch.Tensor:
        out = []
        for r, row in enumerate(rows):
            hidden = plain.decoder(
                torch.tensor([row], device="cuda"), audio_features=features[r // 2 : r // 2 + 1]
            )
            out.append(plain.decoder.logits(hidden[:, -1])[0])
        return torch.stack(out)

    variants = [("float32", True, True), ("float32", False, True), ("float16", True, False)]
    for compute_type, fused, fold in [*variants, ("float16", True, True)]:
        runtime.FOLD = fold
        rt = Runtime(plain, compute_type, max_windows=2, max_rows=4, fused=fused)
        batch = rt.prefill(rt.cross(features.to(rt.dtype)), prompts, group=2)
        rows = [list(p) for p in prompts]
        worst = (rt.logits[:4] - reference(rows)).norm() / reference(rows).norm()
        for t in range(steps):
            logits = rt.step(batch, fed[t].cuda())
            for r in range(4):
                rows[r].append(int(fed[t, r]))
            ref = reference(rows)
            worst = max(worst, (logits - ref).norm() / ref.norm())
        mel = torch.randn(2, c.n_mels, 3000, device="cuda")
        enc_ref = plain.encoder(mel)
        enc_err = (rt.encoder(mel).float() - enc_ref).norm() / enc_ref.norm()
        print(
            f"selftest {preset_name} {compute_type} fused={rt.fused} fold={rt._folds(4)}: encoder rel. error {enc_err:.2e};"
            f" graphed step vs plain fp32, worst relative error {worst:.2e}"
            f" over {steps} steps (max length {batch.max_length}, {len(rt._graphs)} graphs)"
        )
    for compute_type in ("float32", "float16"):
        results = []
        for graphs in (True, False):
            rt = Runtime(plain, compute_type, max_windows=2, graphs=graphs)
            batch = rt.prefill(rt.cross(features.to(rt.dtype)), [prompts[0], prompts[1]])
            results.append(rt.greedy(batch, 100, 50256, suppress=[50256]).tokens)
        print(
            f"selftest greedy 100 tokens {compute_type}, graphed == eager: {torch.equal(*results)}"
        )

    print("matmul choices (M, N, K, dtype) -> Triton (block_n, block_k, warps, stages) or cuBLAS:")
    for key, config in kernels._linear_choice.items():
        print(f"  {key[:3]} {str(key[3])[6:]}: {config or 'cuBLAS'}")


# --- correctness on real weights -----------------------------------------------------------


def check(
    model_dir: str,
    audio_paths: list[str],
    out: str,
    compute_types: list[str],
    greedy: bool,
    device: str = "cuda",
    seeds: list[int] | None = None,
    perturb: float = 0.0,
) -> None:
    """Transcribe every clip (int16, 16 kHz; .npz of clips or .npy files) once per compute type;
    write texts and tokens. "plain-float32" is the reference network on the GPU without the
    runtime; `device` "cpu" makes the CPU reference to `compare` with. `greedy`: temperature 0
    and beam 1 (deterministic, for token comparisons); else the defaults (beam 5 and the
    fallback ladder). `seeds`, `perturb`: a pass per seed, each with the weights moved by
    `perturbed` (seed 0: as they are), stored under the compute type's name for seed 0 and as
    "TYPE seed N" for the others (so the JSON of runs over different seeds merge)."""
    import numpy as np

    from whisperforge import WhisperModel
    from whisperforge.checkpoints import resolve_checkpoint

    clips: dict[str, np.ndarray] = {}
    for path in audio_paths:  # an .npz of clips by name, or one .npy clip named by its file
        clips.update({Path(path).stem: np.load(path)} if path.endswith(".npy") else np.load(path))
    results: dict[str, dict] = {name: {} for name in clips}
    torch.backends.cudnn.allow_tf32 = False  # the plain model's convolutions too: fp32 is fp32
    options = {"beam_size": 1, "temperature": 0.0} if greedy else {}
    checkpoint = resolve_checkpoint(model_dir)
    for seed in seeds or [0]:
        weights = perturbed(checkpoint, perturb, seed) if perturb and seed else checkpoint
        for compute_type in compute_types:
            key = compute_type if seed == 0 else f"{compute_type} seed {seed}"
            model = WhisperModel(weights, device=device, compute_type=compute_type.split("-")[-1])
            assert model.runtime is not None or device == "cpu"
            if compute_type.startswith("plain"):  # the reference network on the GPU, no runtime
                model.runtime, model.decode_model = None, model.model
            start = time.perf_counter()
            for name, samples in clips.items():
                # Fallback samples at temperature > 0: the same draws for every compute type and
                # device (on the dev files they never decided a transcript: RESULTS, session 21).
                torch.manual_seed(0)
                segments, _ = model.transcribe(samples.astype(np.float32) / 32768, **options)
                segments = list(segments)
                results[name][key] = {
                    "text": "".join(s.text for s in segments).strip(),
                    "tokens": [t for s in segments for t in s.tokens],
                }
            print(f"{key}: {len(clips)} clips in {time.perf_counter() - start:.1f} s", flush=True)
            del model
            torch.cuda.empty_cache()
            Path(out).write_text(json.dumps(results))  # after each: a run cut short keeps them


def perturbed(checkpoint: Checkpoint, relative: float, seed: int) -> Checkpoint:
    """The checkpoint with each float weight w moved to w (1 + relative * N(0, 1)), in float32:
    a model as good as the given one that rounds differently. Its spread of WER over seeds is
    what a change of numbers alone moves a WER by (the 19-minute file's: up to a point,
    since one early word changes every later window's prompt), the yardstick for a quantized
    model's."""
    import dataclasses

    g = torch.Generator().manual_seed(seed)
    state = {
        name: w.float() * (1 + relative * torch.randn(w.shape, generator=g))
        if w.is_floating_point() else w
        for name, w in checkpoint.state_dict.items()
    }  # fmt: skip
    return dataclasses.replace(checkpoint, state_dict=state)


def compare(results_path: str, reference_path: str, longform_text: str | None) -> None:
    """`check`'s transcripts against a reference run's (its first compute type): per compute
    type, clips with the same text and the same tokens, the clips that differ, and WER on the
    manifest's exact English references (and the long file, with its reference text); with
    several seeds, each type's mean WER over them."""
    sys.path.insert(0, str(Path(__file__).parent))
    from devset import manifest, wer

    results = json.loads(Path(results_path).read_text())
    reference = json.loads(Path(reference_path).read_text())
    exact = {
        r["audio"]: r["text"]
        for r in manifest()
        if r["ref_kind"] == "exact" and r["language"] == "en"
    }
    short = [name for name in results if name != "longform"]
    ref_type = next(iter(reference[short[0]]))
    columns = [(f"reference {ref_type}", reference, ref_type)]
    columns += [(t, results, t) for t in results[short[0]]]
    print(
        f"| compute_type | text = {ref_type} ({len(short)} clips) | tokens = | WER exact clips | WER long file |"
    )
    print("|---|---|---|---|---|")
    scores: dict[str, list[tuple[float, float | None]]] = {}  # per type: (clips, long) per seed
    long_reference = Path(longform_text).read_text() if longform_text else ""
    for label, source, compute_type in columns:
        texts = {name: source[name][compute_type]["text"] for name in source}
        same_text = [n for n in short if texts[n] == reference[n][ref_type]["text"]]
        same_tokens = [
            n
            for n in short
            if source[n][compute_type]["tokens"] == reference[n][ref_type]["tokens"]
        ]
        scored = [n for n in short if n in exact]
        clip_wer = wer([exact[n] for n in scored], [texts[n] for n in scored])
        long_wer = None
        if longform_text and "longform" in texts:
            long_wer = wer([long_reference], [texts["longform"]])
        long_text = "-" if long_wer is None else f"{100 * long_wer:.2f} %"
        print(
            f"| {label} | {len(same_text)} / {len(short)} | {len(same_tokens)} / {len(short)}"
            f" | {100 * clip_wer:.2f} % ({len(scored)}) | {long_text} |"
        )
        for name in sorted(set(short) - set(same_text)):
            print(f"    {name}: {texts[name]!r} vs {reference[name][ref_type]['text']!r}")
        if source is results:
            scores.setdefault(compute_type.split(" seed ")[0], []).append((clip_wer, long_wer))
    if any(len(runs) > 1 for runs in scores.values()):
        print(
            "\n| compute_type | seeds | mean WER exact clips | mean WER long file | long file per seed |"
        )
        print("|---|---|---|---|---|")
        for compute_type, runs in scores.items():
            clips, long = zip(*runs)
            mean_long = f"{100 * statistics.mean(long):.2f} %" if None not in long else "-"
            each = " / ".join(f"{100 * w:.2f}" for w in long if w is not None)
            print(
                f"| {compute_type} | {len(runs)} | {100 * statistics.mean(clips):.2f} % "
                f"| {mean_long} | {each} |"
            )


def check_prompts(model_dir: str, audio_paths: list[str]) -> None:
    """Windows decoded in one batch, each after its own prompt (lengths differ), against each
    decoded alone, in fp32 through the runtime on the GPU: the tokens must be the same."""
    import numpy as np

    from whisperforge import WhisperModel
    from whisperforge.audio import N_FRAMES, log_mel_spectrogram, pad_or_trim
    from whisperforge.decoding import DecodingOptions, decode

    clips = dict(np.load(audio_paths[0]))
    names = sorted(clips)[:8]
    model = WhisperModel(model_dir, device="cuda", compute_type="float32")
    torch.backends.cudnn.allow_tf32 = False
    mels = [log_mel_spectrogram(clips[n].astype(np.float32) / 32768, 80, 0) for n in names]
    features = model.encode(torch.stack([pad_or_trim(m, N_FRAMES) for m in mels]).cuda())
    tokenizer = model.tokenizer.with_options("en", "transcribe")
    text = "the printing press and the art of printing is the art of arts, and more"
    prompts = [tokenizer.encode(" " + text[: 9 * i]) if i else [] for i in range(len(names))]
    for beam in (None, 5):
        options = DecodingOptions(language="en", beam_size=beam)
        together = decode(model.decode_model, tokenizer, features, options, prompts)
        same = 0
        for i, prompt in enumerate(prompts):
            alone_options = DecodingOptions(language="en", beam_size=beam, prompt=prompt)
            alone = decode(model.decode_model, tokenizer, features[i : i + 1], alone_options)[0]
            same += together[i].tokens == alone.tokens
        print(f"own prompts, fp32, beam {beam}: {same}/{len(names)} windows token-identical")


# --- main ----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", nargs="+", default=["large-v3-turbo"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument(
        "--peers", nargs="*", default=["hf-sdpa", "hf-static-compile", "openai-whisper"]
    )
    parser.add_argument(
        "--pdl", choices=["auto", "on", "off", "both"], default="auto",
        help="programmatic dependent launch of the step kernels (both: off, then on)",
    )  # fmt: skip
    parser.add_argument(
        "--fold", choices=["on", "off", "both"], default="on",
        help="layer norms and residual adds folded into the step's matmuls (both: off, then on)",
    )  # fmt: skip
    parser.add_argument(
        "--self-out", choices=["on", "off", "both"], default="on",
        help="one row: self-attention and its output projection in one kernel (both: off, then on)",
    )  # fmt: skip
    parser.add_argument("--window", action="store_true", help="time a whole 30 s window at batch 1")
    parser.add_argument("--profile", action="store_true", help="kernel table of an eager step")
    parser.add_argument("--check", metavar="MODEL_DIR")
    parser.add_argument("--audio", nargs="+", help="--check: .npz of int16 clips, or .npy files")
    parser.add_argument("--out")
    parser.add_argument(
        "--compute-types", nargs="+", default=["float16", "float32", "plain-float32"]
    )
    parser.add_argument("--greedy", action="store_true", help="--check at temperature 0, beam 1")
    parser.add_argument(
        "--seeds", type=int, nargs="+", default=[0], help="--check: a pass per seed of --perturb"
    )
    parser.add_argument(
        "--perturb", type=float, default=0.0,
        help="--check: weights moved by this relative N(0, 1) noise per seed (seed 0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--device", default="cuda", help="--check on this device (cpu: a reference)"
    )
    parser.add_argument(
        "--compare", nargs=2, metavar=("CHECK_JSON", "REFERENCE_JSON"),
        help="--check's transcripts against a reference run's; --audio: the long file's text",
    )  # fmt: skip
    parser.add_argument("--selftest", action="store_true", help="runtime vs plain model on the GPU")
    parser.add_argument("--check-prompts", metavar="MODEL_DIR", help="own prompts per window")
    args = parser.parse_args()
    if args.check_prompts:
        check_prompts(args.check_prompts, args.audio)
        return
    if args.compare:
        compare(*args.compare, args.audio[0] if args.audio else None)
        return
    if args.check:
        check(
            args.check, args.audio, args.out, args.compute_types, args.greedy, args.device,
            args.seeds, args.perturb,
        )  # fmt: skip
        return
    if args.selftest:
        selftest()
        return

    name = torch.cuda.get_device_name()
    bw, tflops = ceilings()
    print(
        f"device: {name}; copy {bw:.0f} GB/s, fp16 matmul {tflops:.0f} TFLOP/s; torch {torch.__version__}"
    )
    report: dict = {"device": name, "copy_GBps": bw, "matmul_TFLOPs": tflops, "presets": {}}
    for preset_name in args.preset:
        c = preset(preset_name)
        model: Whisper = random_model(c, seed=0, device="cuda", dtype=torch.float16)
        rows = []
        pdls = {"auto": [None], "on": [True], "off": [False], "both": [False, True]}[args.pdl]
        folds = {"on": [True], "off": [False], "both": [False, True]}[args.fold]
        self_outs = {"on": [True], "off": [False], "both": [False, True]}[args.self_out]
        for pdl, fold, self_out in itertools.product(pdls, folds, self_outs):
            kernels.USE_PDL, runtime.FOLD, runtime.SELF_OUT = pdl, fold, self_out
            rt = Runtime(model, args.dtype, max_windows=max(args.batch))
            for batch in args.batch:
                t0 = time.perf_counter()
                row = bench_runtime(rt, c, batch, args.tokens, bw, tflops)
                row["bench_s"] = time.perf_counter() - t0
                row["pdl"], row["fold"] = kernels.step_pdl(), rt._folds(batch)
                row["self_out"] = row["fold"] and batch == 1 and self_out
                rows.append(row)
                print(
                    f"{preset_name} b{batch} pdl={row['pdl']} fold={row['fold']} self_out={row['self_out']}: encode {row['encode_ms']:.2f} ms (floor {row['encode_floor_ms']:.2f})"
                    f" | cross {row['cross_ms']:.2f} (floor {row['cross_floor_ms']:.2f})"
                    f" | prefill {row['prefill_ms']:.2f} | decode {row['decode_ms']:.1f} ms / {row['decode_steps']}"
                    f" steps = {row['step_ms']:.3f} ms/step (floor {row['step_floor_ms']:.3f})"
                    f" | RTFx {row['rtfx']:.0f}",
                    flush=True,
                )
        entry: dict = {"runtime": rows}
        if args.window:
            entry["window_ms"] = bench_window(rt, c)
            print(
                f"{preset_name}: whole 30 s window, batch 1, 100 steps: {entry['window_ms']:.1f} ms"
            )
        if args.profile:
            for batch in args.batch:
                print(
                    f"--- eager step kernels, {preset_name} b{batch}\n" + profile_step(rt, c, batch)
                )
        canonical = unfuse_state_dict(model.state_dict())
        peers: dict[str, dict[int, float | str]] = {}
        for peer in args.peers:
            peers[peer] = {}
            try:
                t0 = time.perf_counter()
                if peer.startswith("hf"):
                    other = hf_model(c, canonical)
                else:
                    other = openai_model(c, canonical)
                for batch in args.batch:
                    if peer == "openai-whisper":
                        ms = bench_openai(other, c, batch, args.tokens)
                    else:
                        ms = bench_hf(
                            other, c, batch, args.tokens, static=peer == "hf-static-compile"
                        )
                    peers[peer][batch] = ms
                    print(
                        f"{preset_name} b{batch} {peer}: {ms:.3f} ms/step ({time.perf_counter() - t0:.0f} s)",
                        flush=True,
                    )
                del other
            except Exception as error:  # noqa: BLE001 - a peer that fails is reported, not fatal
                peers[peer]["error"] = f"{type(error).__name__}: {error}"[:500]
                print(f"{preset_name} {peer} failed: {peers[peer]['error']}", flush=True)
            torch.cuda.empty_cache()
        entry["peers"] = peers
        report["presets"][preset_name] = entry
        print(f"\n{preset_name}: ms per decode step ({args.tokens} forced tokens)")
        print("batch | whisperforge | " + " | ".join(peers) + " | floor | best peer / ours")
        for row in rows:
            b = row["batch"]
            times = [peers[p].get(b) for p in peers]
            numbers = [t for t in times if isinstance(t, float)]
            ratio = f"{min(numbers) / row['step_ms']:.1f}x" if numbers else "-"
            cells = " | ".join(f"{t:.3f}" if isinstance(t, float) else "-" for t in times)
            print(
                f"{b} (pdl={row['pdl']}, fold={row['fold']}) | {row['step_ms']:.3f} | {cells} | {row['step_floor_ms']:.3f} | {ratio}"
            )
        chosen = {f"{k[:3]} {str(k[3])[6:]}": v for k, v in kernels._linear_choice.items()}
        print(
            f"{preset_name}: step matmuls (M, N, K) -> Triton (block_n, block_k, warps, stages) or None = cuBLAS: {chosen}"
        )
        entry["matmul_choices"] = {k: v for k, v in chosen.items()}
        kernels._linear_choice.clear()
        del model, rt
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
