"""The real Whisper architectures, and random weights for them.

The large checkpoints can't be downloaded here, but speed depends only on the shapes, so speed
work runs the real architectures on random weights (`random_model`), with a forced decode length.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .model import LayerNorm, ModelConfig, Whisper


def _config(n_mels: int, n_vocab: int, state: int, head: int, enc: int, dec: int) -> ModelConfig:
    return ModelConfig(
        n_mels=n_mels, n_audio_ctx=1500, n_audio_state=state, n_audio_head=head,
        n_audio_layer=enc, n_vocab=n_vocab, n_text_ctx=448, n_text_state=state,
        n_text_head=head, n_text_layer=dec,
    )  # fmt: skip


PRESETS: dict[str, ModelConfig] = {
    "tiny.en": _config(80, 51864, 384, 6, 4, 4),
    "tiny": _config(80, 51865, 384, 6, 4, 4),
    "base.en": _config(80, 51864, 512, 8, 6, 6),
    "base": _config(80, 51865, 512, 8, 6, 6),
    "small.en": _config(80, 51864, 768, 12, 12, 12),
    "small": _config(80, 51865, 768, 12, 12, 12),
    "medium.en": _config(80, 51864, 1024, 16, 24, 24),
    "medium": _config(80, 51865, 1024, 16, 24, 24),
    "large-v2": _config(80, 51865, 1280, 20, 32, 32),
    "large-v3": _config(128, 51866, 1280, 20, 32, 32),
    "large-v3-turbo": _config(128, 51866, 1280, 20, 32, 4),
    "distil-large-v3": _config(128, 51866, 1280, 20, 32, 2),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; use one of {', '.join(PRESETS)}") from None


@torch.no_grad()
def random_model(
    config: ModelConfig | str,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Whisper:
    """A Whisper of this architecture with random weights of a trained model's scale.

    Built on `device` directly (large-v3 has 1.5 B parameters). Linear and conv weights have
    std 1/sqrt(fan_in), so activations keep their scale through 32 layers in fp16; the key
    projections get no bias, as in the real models.
    """
    config = preset(config) if isinstance(config, str) else config
    device = torch.device(device)
    with torch.device(device):
        model = Whisper(config)
    generator = torch.Generator(device=device).manual_seed(seed)

    def normal_(tensor: Tensor, std: float, mean: float = 0.0) -> None:
        tensor.normal_(mean, std, generator=generator)

    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d)):
            fan_in = module.weight[0].numel()
            normal_(module.weight, fan_in**-0.5)
            if module.bias is not None:
                normal_(module.bias, 0.02)
        elif isinstance(module, LayerNorm):
            normal_(module.weight, 0.1, mean=1.0)
            normal_(module.bias, 0.02)
        elif isinstance(module, nn.Embedding):
            normal_(module.weight, 0.02)
    normal_(model.decoder.positional_embedding, 0.02)
    n = config.n_text_state
    for block in (*model.encoder.blocks, *model.decoder.blocks):
        block.attn.qkv.bias[n : 2 * n] = 0  # the key has no bias
    for block in model.decoder.blocks:
        block.cross_attn.kv.bias[:n] = 0
    return model.to(dtype).eval()


def unfuse_state_dict(fused: dict[str, Tensor]) -> dict[str, Tensor]:
    """This package's fused layout -> canonical (openai-whisper) names; `fused_weights`' inverse."""
    state: dict[str, Tensor] = {}
    for name, tensor in fused.items():
        base, _, kind = name.rpartition(".")
        if base.endswith(".qkv"):
            parts = dict(zip(("query", "key", "value"), tensor.chunk(3)))
        elif base.endswith(".kv"):
            parts = dict(zip(("key", "value"), tensor.chunk(2)))
        else:
            state[name] = tensor
            continue
        for part, piece in parts.items():
            if part == "key" and kind == "bias":
                continue  # the key has no bias
            state[f"{base.rpartition('.')[0]}.{part}.{kind}"] = piece.contiguous()
    return state
