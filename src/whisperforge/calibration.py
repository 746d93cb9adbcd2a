"""Calibrated int8 / fp8 weights: GPTQ on the linears' inputs from real audio.

Rounding each weight to its nearest int8 step (`quantize.quantize_weight`) adds an error of up
to half a step to every weight, and the model sees all of them at once. GPTQ (Frantar et al.,
arXiv:2210.17323) rounds the columns of a linear one at a time and moves each column's rounding
error onto the columns not yet rounded, weighted by how the inputs seen on calibration audio
correlate (the Hessian H = sum x x^T of the layer's inputs), so the layer's *outputs* on such
inputs change as little as the grid allows. The weights keep their format and their scale per
output channel: a calibrated checkpoint loads and runs exactly as a plain quantized one.

`calibrate` runs the float32 model over the audio as long-form transcription does (30 s
windows, greedy, each window prompted with the previous one's text), hooks the linears that the
compute type stores quantized for their inputs, and returns the checkpoint with those weights on
the quantized grid and their scales (`Checkpoint.weight_scales`), for `save_quantized`
(`whisperforge quantize --calibration-audio`). The token embedding keeps round-to-nearest: it is
looked up as well as multiplied, and a lookup has no inputs to weigh its error by.

On the GPU (benchmarks/RESULTS.md, session 22) it brought tiny.en's int8 on the 19-minute file
from 9.13 % to 8.87 % (float32 8.58 %, float16 8.66 %; means of 5 equally good weight draws),
the clips level; fp8 it did not help.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from tqdm import tqdm

from .audio import N_SAMPLES, AudioInput, load_audio, log_mel_spectrogram
from .checkpoints import Checkpoint
from .decoding import DecodingOptions, decode
from .errors import InvalidOptionError
from .model import Whisper
from .quantize import (
    COMPUTE_TYPES,
    QMAX,
    canonical_weights,
    dequantize,
    quantize_weight,
    stored_quantized,
    weight_format,
)
from .tokenizer import Tokenizer
from .transcribe import build_model, build_tokenizer

# Added to H's diagonal, times its mean: a few minutes of audio give the decoder a few hundred
# tokens, fewer than its widest inputs (up to 5120), so H alone fits those tokens' directions
# and lets the others' error grow. On tiny.en's held-out clips the decoder's output error was
# 0.7-1.2x round-to-nearest's at GPTQ's usual 0.01, 0.55-0.82x at 0.3 (0.38-0.65x encoder's).
DAMPING = 0.3
BLOCK = 128  # columns rounded per block; later columns are updated once per block (lazy batch)


def calibrate(
    checkpoint: Checkpoint,
    compute_type: str,
    audio: Sequence[AudioInput],
    device: str | torch.device = "cpu",
    language: str | None = None,
) -> Checkpoint:
    """`checkpoint` with the linears a `compute_type` checkpoint stores quantized
    (`quantize.stored_quantized`) rounded by GPTQ onto its grid (int8 or fp8, one scale per
    output channel) as seen on `audio`, and the token embedding rounded to nearest. The result's
    `weight_scales` make `save_quantized` / `quantize_model` reproduce exactly these weights.
    `language`: the audio's, for a multilingual model (None: detected per window)."""
    weights = COMPUTE_TYPES.get(compute_type, (None, None))[1]
    if weights is None:
        raise InvalidOptionError(
            f"compute_type {compute_type!r} has float weights: nothing to calibrate"
        )
    if not audio:
        raise InvalidOptionError("calibration needs audio: pass one or more speech files")
    model = build_model(checkpoint, torch.device(device), torch.float32)
    linears = [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
        and stored_quantized(canonical_weights(name)[0], compute_type)
    ]
    tokenizer = build_tokenizer(checkpoint)
    hessians = collect_hessians(model, tokenizer, audio, linears, language)
    # a fused projection's parts (query, key, value) share its inputs
    inputs = {part: h for name, h in hessians.items() for part in canonical_weights(name)}
    state, scales = dict(checkpoint.state_dict), {}
    for name, weight in checkpoint.state_dict.items():
        if weight.dim() != 2 or not stored_quantized(name, compute_type):
            continue  # biases, norms, convolutions; float weights of this type
        kind, group = weight_format(name, weights, weight.shape[1])
        if name in inputs:
            q, scale = gptq(weight.to(inputs[name].device), inputs[name], kind)
        else:  # the token embedding
            q, scale = quantize_weight(weight, kind, None, group)
        state[name], scales[name] = dequantize(q, scale).cpu(), scale.cpu()
    return dataclasses.replace(
        checkpoint, state_dict=state, compute_type=compute_type, weight_scales=scales
    )


@torch.inference_mode()
def collect_hessians(
    model: Whisper,
    tokenizer: Tokenizer,
    audio: Sequence[AudioInput],
    linears: Sequence[str],
    language: str | None = None,
) -> dict[str, Tensor]:
    """sum x x^T ([K, K], float32) of the inputs of each of the model's `linears` (module
    names) while it transcribes `audio`: 30 s windows, greedy with timestamps, each window
    prompted with the text before it, as long-form transcription runs."""
    hessians: dict[str, Tensor] = {}

    def hook(name: str, module: nn.Module, inputs: tuple[Tensor, ...]) -> None:
        x = inputs[0].reshape(-1, inputs[0].shape[-1]).float()
        if name not in hessians:
            hessians[name] = torch.zeros(x.shape[1], x.shape[1], device=x.device)
        hessians[name].addmm_(x.t(), x)

    handles = [
        model.get_submodule(name).register_forward_pre_hook(
            lambda module, inputs, name=name: hook(name, module, inputs)
        )
        for name in linears
    ]
    options = DecodingOptions(language=language or (None if model.config.is_multilingual else "en"))
    samples = [load_audio(a) for a in audio]
    windows = sum((len(s) + N_SAMPLES - 1) // N_SAMPLES for s in samples)
    try:
        bar = tqdm(total=windows, unit="window", desc="calibrating", file=sys.stderr,
                   disable=not sys.stderr.isatty())  # fmt: skip
        with bar:
            for clip in samples:
                prompt: list[int] = []
                for start in range(0, len(clip), N_SAMPLES):
                    window = torch.from_numpy(clip[start : start + N_SAMPLES])
                    mel = log_mel_spectrogram(
                        window, model.config.n_mels, N_SAMPLES - len(window), model.device
                    )
                    features = model.encoder(mel[None])
                    result = decode(model, tokenizer, features, options, [prompt])[0]
                    prompt += result.tokens
                    bar.update(1)
    finally:
        for handle in handles:
            handle.remove()
    return hessians


def gptq(weight: Tensor, hessian: Tensor, weights: str) -> tuple[Tensor, Tensor]:
    """[N, K] float weight and its inputs' H [K, K] -> (q, scale per output channel) as
    `quantize.quantize_weight` returns them, rounded column by column with each column's
    error moved onto the columns after it (GPTQ, in order of decreasing H diagonal: the inputs
    that carry the most go first, while the most columns remain to absorb their error)."""
    w = weight.detach().to(torch.float64).clone()
    h = hessian.to(torch.float64).clone()
    dead = h.diagonal() == 0  # inputs that were always zero: any weight does
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h.diagonal().add_(DAMPING * h.diagonal().mean())
    order = torch.argsort(h.diagonal(), descending=True)
    w, h = w[:, order], h[order][:, order]
    # Upper Cholesky factor of H^-1: row i holds how column i's error spreads to later columns.
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)

    scale = weight.detach().abs().amax(dim=1).to(torch.float64).clamp(min=1e-12) / QMAX[weights]
    q = torch.empty_like(w)
    K = w.shape[1]
    for begin in range(0, K, BLOCK):
        end = min(begin + BLOCK, K)
        errors = torch.empty(w.shape[0], end - begin, dtype=w.dtype, device=w.device)
        for i in range(begin, end):
            q[:, i] = round_to_grid(w[:, i] / scale, weights)
            error = (w[:, i] - q[:, i] * scale) / u[i, i]
            w[:, i:end] -= error[:, None] * u[i, i:end][None, :]
            errors[:, i - begin] = error
        w[:, end:] -= errors @ u[begin:end, end:]
    q = q[:, torch.argsort(order)]
    if weights == "int8":
        return q.to(torch.int8), scale.float()
    return q.float().to(torch.float8_e4m3fn), scale.float()


def round_to_grid(x: Tensor, weights: str) -> Tensor:
    """x (in units of the scale) to the nearest value the format holds, clamped to its range."""
    x = x.clamp(-QMAX[weights], QMAX[weights])
    return x.round() if weights == "int8" else x.float().to(torch.float8_e4m3fn).to(x.dtype)
