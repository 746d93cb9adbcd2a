"""Beam search a step, whisperforge against its peers, on the same real weights and audio (issue 4).

`transcribe`'s default decode is beam search with 5 beams. Real tiny.en (float16) on one 30 s
window (the clips put end to end) and on 16 windows (a clip each): whisperforge's
`decoding.decode` (timestamps, the reference's rules), openai-whisper's `DecodingTask` (the same
algorithm) and HF transformers' `generate(num_beams=5)` (sdpa, and static cache + compile; its
generic beam search, without Whisper's timestamp rules). A peer's step is the median gap between
two calls of a logits filter recording a CUDA event; whisperforge's is the whole decode's time
(prefill included) over its steps, median of `--runs`.

    python3 benchmarks/beam_peers.py --model /tmp/tiny.en --audio clips.npz \
        --preset large-v3-turbo large-v3

`--preset` adds the larger architectures with random weights (tiny.en's vocabulary and
tokenizer) on random audio, 64 tokens at most (a random model's beams end anywhere).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from decode_loop import arguments, decode_ms, dev_windows, preset_runtime
from gpu import StepClock, hf_model, openai_model

from whisperforge import WhisperModel
from whisperforge.audio import N_FRAMES
from whisperforge.decoding import DecodingOptions
from whisperforge.presets import unfuse_state_dict
from whisperforge.runtime import RuntimeWhisper


def openai_whisper(model, mel: torch.Tensor) -> float:
    from whisper.decoding import DecodingOptions as OpenAIOptions
    from whisper.decoding import DecodingTask

    clock = StepClock()
    with torch.inference_mode():
        for clk in (StepClock(), clock):
            task = DecodingTask(model, OpenAIOptions(language="en", beam_size=5, fp16=True))
            task.logit_filters.append(clk)
            task.run(mel)
    return clock.step_ms()


def transformers(
    model, mel: torch.Tensor, sot: int, eot: int, static: bool, max_new_tokens: int
) -> float:
    from transformers import GenerationConfig, GenerationMixin, LogitsProcessorList

    config = GenerationConfig(
        max_new_tokens=max_new_tokens, num_beams=5, do_sample=False, eos_token_id=eot, pad_token_id=eot,
        decoder_start_token_id=sot, cache_implementation="static" if static else None,
    )  # fmt: skip
    prompt = torch.full((mel.shape[0], 1), sot, device="cuda")
    clock = StepClock()
    with torch.inference_mode():
        for clk in (StepClock(), StepClock(), clock):  # the first compiles (static)
            GenerationMixin.generate(
                model, input_features=mel, decoder_input_ids=prompt, generation_config=config,
                logits_processor=LogitsProcessorList([clk]),
            )  # fmt: skip
    return clock.step_ms()


def compare(
    label: str, model, tokenizer, inputs: dict, canonical: dict, sample_len: int | None, runs: int
) -> None:
    """One row per input (name -> (mel, features)): whisperforge's step and each peer's."""
    config, sot, eot = model.config, tokenizer.sot, tokenizer.eot
    options = DecodingOptions(beam_size=5, language="en", sample_len=sample_len)
    for name, (mel, features) in inputs.items():
        row = {"whisperforge": decode_ms(model, tokenizer, features, options, runs)[0]}
        for peer in ("openai-whisper", "HF sdpa", "HF static + compile"):
            try:
                if peer == "openai-whisper":
                    fp32 = {k: v.float() for k, v in canonical.items()}
                    row[peer] = openai_whisper(openai_model(config, fp32), mel)
                else:
                    hf = hf_model(config, canonical)
                    row[peer] = transformers(
                        hf, mel, sot, eot, static=peer != "HF sdpa",
                        max_new_tokens=sample_len or config.n_text_ctx // 2,
                    )  # fmt: skip
                    del hf
            except Exception as error:  # noqa: BLE001 (a peer's failure is reported, not fatal)
                print(
                    f"{label}, {name}: {peer} failed: {type(error).__name__}: {error}", flush=True
                )
            torch.cuda.empty_cache()
        base = row["whisperforge"]
        print(
            f"{label}, beam 5, {name}: "
            + ", ".join(f"{k} {v:.3f} ms/step ({v / base:.1f}x)" for k, v in row.items()),
            flush=True,
        )


def main() -> None:
    args = arguments().parse_args()
    model = WhisperModel(args.model, device="cuda", compute_type="float16")
    tokenizer = model.tokenizer.with_options("en", "transcribe")
    windows = dev_windows(model, args.audio)
    inputs = {name: (mel, model.encode(mel)) for name, mel in windows.items()}
    print(torch.cuda.get_device_name(), flush=True)
    canonical = unfuse_state_dict(model.model.state_dict())
    compare("tiny.en", model.decode_model, tokenizer, inputs, canonical, None, args.runs)
    # The larger architectures: random weights (tiny.en's vocabulary and tokenizer), random
    # audio, 64 tokens at most.
    for name in args.preset:
        plain, runtime = preset_runtime(name, model.model.config.n_vocab)
        generator = torch.Generator(device="cuda").manual_seed(0)
        inputs = {}
        for n in (1, 16):
            shape = (n, plain.config.n_mels, N_FRAMES)
            mel = torch.randn(shape, device="cuda", generator=generator).half()
            inputs[f"{n} window{'s' if n > 1 else ''}"] = (mel, runtime.encoder(mel).clone())
        canonical = unfuse_state_dict(plain.state_dict())
        compare(name, RuntimeWhisper(runtime), tokenizer, inputs, canonical, 64, args.runs)
        del runtime, plain, canonical
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
