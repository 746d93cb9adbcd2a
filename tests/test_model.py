"""The network on random weights: the KV-cached path equals the plain full-sequence forward,
fused projections equal separate ones, and both equal openai-whisper's network."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from whisperforge.model import ModelConfig, Whisper, fused_weights

CONFIG = ModelConfig(
    n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=4, n_audio_layer=2,
    n_vocab=51865, n_text_ctx=448, n_text_state=64, n_text_head=4, n_text_layer=3,
)  # fmt: skip


def random_canonical_state(config: ModelConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with openai-whisper's names, as a checkpoint would hold them."""
    import whisper.model as reference

    torch.manual_seed(seed)
    model = reference.Whisper(reference.ModelDimensions(**asdict(config)))
    state = model.state_dict()
    for name, tensor in state.items():
        if name != "encoder.positional_embedding":  # fixed sinusoids
            state[name] = torch.randn_like(tensor) * 0.2
    return state


@pytest.fixture(scope="module")
def pair():
    import whisper.model as reference

    state = random_canonical_state(CONFIG)
    ours = Whisper(CONFIG)
    ours.load_state_dict(dict(fused_weights(state)))
    theirs = reference.Whisper(reference.ModelDimensions(**asdict(CONFIG)))
    theirs.load_state_dict(state)
    return ours.eval(), theirs.eval(), state


@torch.inference_mode()
def test_cached_decode_equals_full_forward(pair):
    model, _, _ = pair
    torch.manual_seed(1)
    features = model.encoder(torch.randn(2, CONFIG.n_mels, 3000))
    tokens = torch.randint(0, CONFIG.n_vocab, (2, 24))
    full = model.decoder.logits(model.decoder(tokens, audio_features=features))

    cache = model.decoder.new_cache(features)
    prompt = 7  # prefill a prompt, then one token per step
    stepped = [model.decoder.logits(model.decoder(tokens[:, :prompt], cache))]
    for t in range(prompt, tokens.shape[1]):
        stepped.append(model.decoder.logits(model.decoder(tokens[:, t : t + 1], cache)))
    stepped = torch.cat(stepped, dim=1)
    assert cache.length == tokens.shape[1]
    torch.testing.assert_close(stepped, full, atol=1e-4, rtol=1e-4)

    # A chunk of several tokens after a prefix (the masked prefill path) agrees too.
    cache = model.decoder.new_cache(features)
    first = model.decoder.logits(model.decoder(tokens[:, :5], cache))
    rest = model.decoder.logits(model.decoder(tokens[:, 5:], cache))
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_cache_reorder_follows_beams(pair):
    model, _, _ = pair
    torch.manual_seed(2)
    features = model.encoder(torch.randn(1, CONFIG.n_mels, 3000))
    tokens = torch.randint(0, CONFIG.n_vocab, (3, 10))
    cache = model.decoder.new_cache(features, repeats=3)
    model.decoder(tokens[:, :9], cache)
    source = torch.tensor([2, 2, 0])
    cache.reorder(source)
    last = model.decoder.logits(model.decoder(tokens[source, 9:], cache))[:, -1]
    full = model.decoder.logits(
        model.decoder(tokens[source], audio_features=features.expand(3, -1, -1))
    )
    torch.testing.assert_close(last, full[:, -1], atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_fused_qkv_equals_separate_projections(pair):
    model, _, state = pair
    x = torch.randn(2, 5, CONFIG.n_text_state)
    for block in ("decoder.blocks.1.attn", "encoder.blocks.0.attn"):
        fused = dict(model.named_modules())[block].qkv(x)
        separate = [
            x @ state[f"{block}.{p}.weight"].T + state.get(f"{block}.{p}.bias", 0)
            for p in ("query", "key", "value")
        ]
        torch.testing.assert_close(fused, torch.cat(separate, dim=-1), atol=1e-5, rtol=1e-5)
    cross = model.decoder.blocks[0].cross_attn.kv(x)
    separate = [
        x @ state["decoder.blocks.0.cross_attn.key.weight"].T,
        x @ state["decoder.blocks.0.cross_attn.value.weight"].T
        + state["decoder.blocks.0.cross_attn.value.bias"],
    ]
    torch.testing.assert_close(cross, torch.cat(separate, dim=-1), atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_network_equals_openai_whisper(pair):
    model, reference, _ = pair
    torch.manual_seed(3)
    mel = torch.randn(2, CONFIG.n_mels, 3000)
    tokens = torch.randint(0, CONFIG.n_vocab, (2, 12))
    features = model.encoder(mel)
    torch.testing.assert_close(features, reference.encoder(mel), atol=1e-4, rtol=1e-4)
    ours = model.decoder.logits(model.decoder(tokens, audio_features=features))
    torch.testing.assert_close(ours, reference.decoder(tokens, features), atol=1e-4, rtol=1e-4)


@torch.inference_mode()
def test_rows_of_a_window_share_its_cross_kv(pair):
    """Beams share their window's cross K,V (a stride-0 view per window) and the CPU logits are
    summed a band of the vocabulary at a time. For one window both must give what per-row
    copies and one product give, bit for bit, or beam search would stop matching
    openai-whisper's token for token; for several windows, the same within rounding."""
    model, _, _ = pair
    torch.manual_seed(4)
    for windows in (1, 3):
        features = model.encoder(torch.randn(windows, CONFIG.n_mels, 3000))
        tokens = torch.randint(0, CONFIG.n_vocab, (windows * 5, 6))
        shared, copied = (model.decoder.new_cache(features, repeats=5) for _ in range(2))
        copied.cross_k = [k.repeat_interleave(5, dim=0) for k in copied.cross_k]
        copied.cross_v = [v.repeat_interleave(5, dim=0) for v in copied.cross_v]
        for t in (slice(0, 5), slice(5, 6)):  # the prompt, then a step
            ours, theirs = model.decoder(tokens[:, t], shared), model.decoder(tokens[:, t], copied)
            if windows == 1:
                assert torch.equal(ours, theirs)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)

    weight = model.decoder.token_embedding.weight
    for rows in (2, 5, 10, 16, 40):
        hidden = torch.randn(rows, CONFIG.n_text_state)
        assert torch.equal(model.decoder.logits(hidden), hidden @ weight.T)
    hidden = torch.randn(2, 7, CONFIG.n_text_state)
    assert torch.equal(model.decoder.logits(hidden), hidden @ weight.T)
