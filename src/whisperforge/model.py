"""The Whisper network in plain torch.nn, as in the paper: a conv + transformer audio encoder and
a transformer text decoder that cross-attends to it.

Two things differ from a textbook transformer, both for decoding speed:
- Self-attention uses one fused QKV projection, cross-attention one fused KV projection
  (`fused_weights` builds them from the canonical, unfused weights).
- The decoder reads and writes a `KVCache`: cross-attention K,V are projected once per audio
  window (`TextDecoder.cross_kv`), self-attention K,V of earlier tokens live in a preallocated
  buffer, so a decode step processes only the new token.
Everything about GPU speed (static shapes, CUDA graphs, quantization) wraps this from outside.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class ModelConfig:
    """The architecture, with openai-whisper's field names (its `ModelDimensions`)."""

    n_mels: int
    n_audio_ctx: int
    n_audio_state: int
    n_audio_head: int
    n_audio_layer: int
    n_vocab: int
    n_text_ctx: int
    n_text_state: int
    n_text_head: int
    n_text_layer: int

    @property
    def is_multilingual(self) -> bool:
        return self.n_vocab >= 51865

    @property
    def num_languages(self) -> int:
        return self.n_vocab - 51765 - int(self.is_multilingual) if self.is_multilingual else 1


class LayerNorm(nn.LayerNorm):
    """LayerNorm computed in fp32 whatever the weights' dtype."""

    def forward(self, x: Tensor) -> Tensor:
        weight = None if self.weight is None else self.weight.float()
        bias = None if self.bias is None else self.bias.float()
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).type(x.dtype)


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> Tensor:
    """The encoder's fixed sinusoidal positions."""
    log_timescale_increment = np.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = torch.exp(-log_timescale_increment * torch.arange(channels // 2))
    scaled_time = torch.arange(length)[:, None] * inv_timescales[None, :]
    return torch.cat([torch.sin(scaled_time), torch.cos(scaled_time)], dim=1)


def split_heads(x: Tensor, n_head: int) -> Tensor:
    """[B, T, D] -> [B, H, T, D/H]"""
    return x.unflatten(-1, (n_head, -1)).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """[B, H, T, D/H] -> [B, T, D]"""
    return x.transpose(1, 2).flatten(2)


def padding_mask(padding: Tensor, offset: int, T: int) -> Tensor:
    """[B, 1, T, offset + T]: query t (at offset + t) sees the keys up to itself past its row's
    padding. A padding position sees only itself, so it stays finite (a NaN there would leak
    into the real rows through 0 * NaN in the attention's weighted sum)."""
    query = torch.arange(offset, offset + T, device=padding.device)[:, None]
    key = torch.arange(offset + T, device=padding.device)[None, :]
    real = key >= padding[:, None, None]
    return ((key <= query) & real | (key == query))[:, None]


class SelfAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_state, 3 * n_state)  # the key part of the bias is zero
        self.out = nn.Linear(n_state, n_state)

    def forward(
        self,
        x: Tensor,
        causal: bool,
        cache: tuple[Tensor, Tensor] | None = None,
        offset: int = 0,
        padding: Tensor | None = None,
    ) -> Tensor:
        """x [B, T, D]. With a cache, K,V of x are written at [offset, offset + T) and the
        queries attend to everything before them in the cache, except a row's first
        `padding[b]` positions (left padding of prompts shorter than the batch's longest)."""
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        T = x.shape[1]
        mask = None
        if cache is not None:
            k_cache, v_cache = cache
            k_cache[:, offset : offset + T] = k
            v_cache[:, offset : offset + T] = v
            k, v = k_cache[:, : offset + T], v_cache[:, : offset + T]
            if padding is not None:
                mask = padding_mask(padding, offset, T)
                causal = False
            elif offset > 0 and T > 1:  # new tokens: all the past, and causally themselves
                mask = torch.ones(T, offset + T, dtype=torch.bool, device=x.device).tril(offset)
                causal = False
        causal = causal and T > 1  # a single query attends to every key: no mask needed
        out = F.scaled_dot_product_attention(
            split_heads(q, self.n_head),
            split_heads(k, self.n_head),
            split_heads(v, self.n_head),
            attn_mask=mask,
            is_causal=causal,
        )
        return self.out(merge_heads(out))


class CrossAttention(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.kv = nn.Linear(
            n_state, 2 * n_state
        )  # applied once per window, see TextDecoder.cross_kv
        self.out = nn.Linear(n_state, n_state)

    def forward(
        self, x: Tensor, k: Tensor, v: Tensor, weights: list[Tensor] | None = None
    ) -> Tensor:
        """x [rows, T, D] attends to k, v [windows, n_audio_ctx, D]: rows // windows
        consecutive rows (a window's beams or samples) share a window's K,V."""
        q = split_heads(self.query(x), self.n_head)
        k, v = split_heads(k, self.n_head), split_heads(v, self.n_head)
        group = q.shape[0] // k.shape[0]
        if weights is not None:  # word timestamps need the attention scores themselves
            qk = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
            weights.append(qk)
            out = qk.softmax(dim=-1).to(v.dtype) @ v
        elif group == 1:
            out = F.scaled_dot_product_attention(q, k, v)
        else:
            # Per window, its rows over a stride-0 view of its K,V: read once, not once per
            # row (beam 5 on the CPU: 5x faster), and for one window the copies' result bit for
            # bit (openai-whisper repeats the audio features per beam). On CUDA the runtime's
            # own cache serves `WhisperModel`.
            out = torch.cat([
                F.scaled_dot_product_attention(
                    q[w * group : (w + 1) * group],
                    k[w : w + 1].expand(group, -1, -1, -1),
                    v[w : w + 1].expand(group, -1, -1, -1),
                )
                for w in range(k.shape[0])
            ])  # fmt: skip
        return self.out(merge_heads(out))


class MLP(nn.Sequential):
    def __init__(self, n_state: int):
        super().__init__(
            nn.Linear(n_state, 4 * n_state), nn.GELU(), nn.Linear(4 * n_state, n_state)
        )


class EncoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.attn_ln = LayerNorm(n_state)
        self.attn = SelfAttention(n_state, n_head)
        self.mlp_ln = LayerNorm(n_state)
        self.mlp = MLP(n_state)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.attn_ln(x), causal=False)
        return x + self.mlp(self.mlp_ln(x))


class DecoderBlock(nn.Module):
    def __init__(self, n_state: int, n_head: int):
        super().__init__()
        self.attn_ln = LayerNorm(n_state)
        self.attn = SelfAttention(n_state, n_head)
        self.cross_attn_ln = LayerNorm(n_state)
        self.cross_attn = CrossAttention(n_state, n_head)
        self.mlp_ln = LayerNorm(n_state)
        self.mlp = MLP(n_state)

    def forward(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        cache: tuple[Tensor, Tensor] | None,
        offset: int,
        weights: list[Tensor] | None = None,
        padding: Tensor | None = None,
    ) -> Tensor:
        x = x + self.attn(self.attn_ln(x), causal=True, cache=cache, offset=offset, padding=padding)
        x = x + self.cross_attn(self.cross_attn_ln(x), cross_k, cross_v, weights)
        return x + self.mlp(self.mlp_ln(x))


class AudioEncoder(nn.Module):
    def __init__(self, n_mels: int, n_ctx: int, n_state: int, n_head: int, n_layer: int):
        super().__init__()
        self.conv1 = nn.Conv1d(n_mels, n_state, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(n_state, n_state, kernel_size=3, stride=2, padding=1)
        self.register_buffer("positional_embedding", sinusoids(n_ctx, n_state))
        self.blocks = nn.ModuleList(EncoderBlock(n_state, n_head) for _ in range(n_layer))
        self.ln_post = LayerNorm(n_state)

    def forward(self, mel: Tensor) -> Tensor:
        """mel [B, n_mels, 2 * n_ctx] -> audio features [B, n_ctx, n_state]"""
        x = F.gelu(self.conv1(mel))
        x = F.gelu(self.conv2(x)).transpose(1, 2)
        x = (x + self.positional_embedding).to(x.dtype)
        for block in self.blocks:
            x = block(x)
        return self.ln_post(x)


@dataclass
class KVCache:
    """Decoder state for a batch of sequences.

    cross_k/cross_v: per layer [windows, n_audio_ctx, D], projected once from the audio
                     features; B / windows consecutive rows (beams, samples) share a window's.
    self_k/self_v:   per layer [B, n_text_ctx, D], preallocated; positions < `length` are filled.
    padding:         [B] leading positions of each row that hold no token (prompts of different
                     lengths, left-padded to the longest), or None when every row is full.
    """

    cross_k: list[Tensor]
    cross_v: list[Tensor]
    self_k: list[Tensor]
    self_v: list[Tensor]
    length: int = 0
    padding: Tensor | None = None

    def reorder(self, source: Tensor) -> None:
        """Keep row `source[i]` as row i (beam search); cross K,V stay, beams share the audio.
        Only the rows that change are copied: beam search leaves most in place (tiny.en, beam
        5, the dev clips: 28 % change a step)."""
        n = self.length  # only the filled positions need to move
        rows = (source != torch.arange(len(source), device=source.device)).nonzero().flatten()
        if len(rows):
            for cache in (*self.self_k, *self.self_v):
                cache[rows, :n] = cache[source[rows], :n]
        if self.padding is not None:
            self.padding = self.padding[source]


LOGIT_BAND = 1024  # vocabulary rows per product in `TokenEmbedding.logits` on the CPU


class TokenEmbedding(nn.Embedding):
    """The token embedding, tied to the output projection. The projection lives here so that a
    quantized embedding (quantize.QuantizedEmbedding) brings its own."""

    def logits(self, hidden: Tensor) -> Tensor:
        weight = self.weight.to(hidden.dtype)
        if hidden.device.type == "cpu" and hidden.numel() > hidden.shape[-1]:
            # Several rows (beams, samples, windows) on the CPU: a band of 1024 tokens at a time
            # is faster than the one product over the whole weight (tiny.en, 5 rows: ~23 ms ->
            # ~15), and sums each score as it did, bit for bit (tested).
            bands = [
                hidden @ weight[i : i + LOGIT_BAND].T for i in range(0, len(weight), LOGIT_BAND)
            ]
            return torch.cat(bands, dim=-1).float()
        return (hidden @ weight.T).float()


class TextDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_ctx: int, n_state: int, n_head: int, n_layer: int):
        super().__init__()
        self.token_embedding = TokenEmbedding(n_vocab, n_state)
        self.positional_embedding = nn.Parameter(torch.empty(n_ctx, n_state))
        self.blocks = nn.ModuleList(DecoderBlock(n_state, n_head) for _ in range(n_layer))
        self.ln = LayerNorm(n_state)

    def cross_kv(self, audio_features: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        """Per layer cross-attention K and V of the audio features: once per window."""
        keys, values = [], []
        for block in self.blocks:
            k, v = block.cross_attn.kv(audio_features).chunk(2, dim=-1)
            keys.append(k.contiguous())
            values.append(v.contiguous())
        return keys, values

    def new_cache(
        self,
        audio_features: Tensor,
        repeats: int = 1,
        max_length: int | None = None,
        padding: Tensor | None = None,
    ) -> KVCache:
        """A cache for `repeats` sequences per window (beams, samples), rows grouped by window;
        `padding` [rows]: left padding of each row's prompt (see KVCache)."""
        cross_k, cross_v = self.cross_kv(audio_features)  # shared by a window's rows
        batch, n_state = cross_k[0].shape[0] * repeats, self.token_embedding.embedding_dim
        shape = (batch, max_length or self.positional_embedding.shape[0], n_state)
        like = cross_k[0]
        return KVCache(
            cross_k,
            cross_v,
            [like.new_zeros(shape) for _ in self.blocks],
            [like.new_zeros(shape) for _ in self.blocks],
            padding=None if padding is None else padding.to(like.device),
        )

    def forward(
        self,
        tokens: Tensor,
        cache: KVCache | None = None,
        audio_features: Tensor | None = None,
        cross_weights: list[Tensor] | None = None,
    ) -> Tensor:
        """Final hidden states [B, T, D] for tokens [B, T]; `logits` turns them into scores.

        With a cache: the tokens continue the cached sequence (T = whole prompt to prefill,
        T = 1 per decode step) and the cache advances by T. Without one: the plain full-sequence
        forward over `audio_features`, the reference the cached path is tested against.
        """
        offset = cache.length if cache is not None else 0
        T = tokens.shape[-1]
        padding = cache.padding if cache is not None else None
        if padding is None:
            positions = self.positional_embedding[offset : offset + T]
        else:  # a left-padded row's tokens start at position 0 after its padding
            index = torch.arange(offset, offset + T, device=tokens.device) - padding[:, None]
            positions = self.positional_embedding[index.clamp(min=0)]
        x = self.token_embedding(tokens) + positions
        if cache is None:
            assert audio_features is not None, "pass a cache or the audio features"
            cross_k, cross_v = self.cross_kv(audio_features)
        else:
            cross_k, cross_v = cache.cross_k, cache.cross_v
        for i, block in enumerate(self.blocks):
            layer_cache = (cache.self_k[i], cache.self_v[i]) if cache is not None else None
            x = block(x, cross_k[i], cross_v[i], layer_cache, offset, cross_weights, padding)
        if cache is not None:
            cache.length += T
        return self.ln(x)

    def logits(self, hidden: Tensor) -> Tensor:
        """Scores over the vocabulary (fp32) through the tied token embedding."""
        return self.token_embedding.logits(hidden)


class Whisper(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.encoder = AudioEncoder(
            config.n_mels, config.n_audio_ctx, config.n_audio_state,
            config.n_audio_head, config.n_audio_layer,
        )  # fmt: skip
        self.decoder = TextDecoder(
            config.n_vocab, config.n_text_ctx, config.n_text_state,
            config.n_text_head, config.n_text_layer,
        )  # fmt: skip

    @property
    def device(self) -> torch.device:
        return self.decoder.positional_embedding.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.positional_embedding.dtype

    @property
    def is_multilingual(self) -> bool:  # openai-whisper's (and `WhisperModel.model`'s, asked so)
        return self.config.is_multilingual

    @property
    def num_languages(self) -> int:
        return self.config.num_languages


def fused_weights(state_dict: Mapping[str, Tensor]) -> Iterator[tuple[str, Tensor]]:
    """Canonical (openai-whisper) weights -> this module's fused layout, one (name, weight) at a
    time, each read from `state_dict` as it is needed (a quantized folder's are dequantized as
    they are read: the whole float model never exists at once).

    Self-attention query/key/value become one `qkv` projection (key has no bias, so its part
    of the fused bias is zero); cross-attention key/value become one `kv` projection.
    """
    for name in state_dict:
        if name.split(".")[-2] not in ("query", "key", "value"):
            yield name, state_dict[name]
        elif name.endswith(".query.weight"):
            base = name.removesuffix(".query.weight")
            q_w, k_w, v_w = (state_dict[f"{base}.{p}.weight"] for p in ("query", "key", "value"))
            q_b, v_b = state_dict[f"{base}.query.bias"], state_dict[f"{base}.value.bias"]
            k_b = state_dict.get(f"{base}.key.bias", torch.zeros_like(q_b))
            if base.endswith("cross_attn"):
                yield from ((f"{base}.query.weight", q_w), (f"{base}.query.bias", q_b))
                yield f"{base}.kv.weight", torch.cat([k_w, v_w])
                yield f"{base}.kv.bias", torch.cat([k_b, v_b])
            else:
                yield f"{base}.qkv.weight", torch.cat([q_w, k_w, v_w])
                yield f"{base}.qkv.bias", torch.cat([q_b, k_b, v_b])
