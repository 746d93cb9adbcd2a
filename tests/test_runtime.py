"""The runtime's batched, bucketed step (run eagerly on the CPU in fp32) against the plain model:
same logits row by row with different prompt lengths, across bucket boundaries, with rows
finishing at different steps; and the same tokens as `decode` on the real tiny.en."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from conftest import JFK, run_interpreted, run_script

from whisperforge.audio import N_FRAMES, load_audio, log_mel_spectrogram, pad_or_trim
from whisperforge.decoding import DecodingOptions, decode, suppress_token_list
from whisperforge.model import ModelConfig, Whisper
from whisperforge.presets import PRESETS, random_model, unfuse_state_dict
from whisperforge.runtime import Runtime, RuntimeWhisper

CONFIG = ModelConfig(
    n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=4, n_audio_layer=2,
    n_vocab=51865, n_text_ctx=448, n_text_state=64, n_text_head=4, n_text_layer=3,
)  # fmt: skip
BUCKETS = (8, 16)  # small, so a short decode crosses two boundaries
TOL = {"atol": 1e-4, "rtol": 1e-4}


@pytest.fixture(scope="module")
def setup():
    model = random_model(CONFIG, seed=0)
    torch.manual_seed(1)
    with torch.inference_mode():
        features = model.encoder(torch.randn(2, CONFIG.n_mels, 3000))
    return model, features


def plain_last_logits(model: Whisper, tokens: list[int], features: torch.Tensor) -> torch.Tensor:
    """The reference: the plain full-sequence forward of one row, scores after its last token."""
    with torch.inference_mode():
        hidden = model.decoder(torch.tensor([tokens]), audio_features=features[None])
        return model.decoder.logits(hidden[:, -1])[0]


def test_presets_and_unfuse_round_trip():
    from whisperforge.model import fused_weights

    assert PRESETS["large-v3"].n_mels == 128 and PRESETS["large-v3"].n_vocab == 51866
    assert (
        PRESETS["large-v3-turbo"].n_text_layer == 4 and PRESETS["distil-large-v3"].n_text_layer == 2
    )
    state = random_model(CONFIG).state_dict()
    again = dict(fused_weights(unfuse_state_dict(state)))
    assert again.keys() == state.keys()
    assert all(torch.equal(again[k], state[k]) for k in state)


def test_pipeline_stages_fit_the_gpus_shared_memory():
    """The tables' configs (tuned on an H200) keep their pipeline where it fits and lose
    stages where a GPU's shared memory is smaller, never below one."""
    from whisperforge.kernels import pipeline_stages

    tile = 256 * (32 * 2 + 16 * 2)  # (32, 256, 4, 4) on fp16 weights: 24 KiB a stage
    assert pipeline_stages(4, tile, 227 * 1024) == 4  # H100 / H200
    assert pipeline_stages(4, tile, 99 * 1024) == 3  # consumer Ampere / Ada
    assert pipeline_stages(4, tile, 64 * 1024) == 2  # T4
    assert pipeline_stages(3, 10**6, 48 * 1024) == 1


def test_every_model_has_a_tuned_config_for_each_step_matmul():
    """The tuned tables are keyed by a matmul's role, which every preset's step shapes map to
    (so every model's step runs the same kernels in every process, and its transcripts
    repeat)."""
    from whisperforge import kernels, quantize

    for name, c in PRESETS.items():
        d = c.n_text_state
        shapes = {"qkv": (3 * d, d), "out": (d, d), "fc1": (4 * d, d), "fc2": (d, 4 * d)}
        shapes["logits"] = (c.n_vocab, d)
        for role, (N, K) in shapes.items():
            assert kernels.step_role(N, K) == role, (name, role)
            for rows in (1, 16):
                assert (rows, role) in kernels.STEP_CONFIGS
                assert (rows, role, torch.int8) in quantize.STREAM_CONFIGS
                assert role == "logits" or (rows, role, torch.float8_e4m3fn) in (
                    quantize.STREAM_CONFIGS
                )


def test_runtime_keeps_the_model_dtype_unless_told():
    model = random_model(CONFIG).to(torch.bfloat16)
    assert Runtime(model).model is model  # no copy: WhisperModel's compute_type stands
    assert Runtime(model, "float32").dtype == torch.float32 and model.dtype == torch.bfloat16


def test_norms_through_the_matmuls_keep_no_float32_weights(tiny_en):
    """The folded step's vectors (w g, w b) come from float32 copies of the weights; a result
    tied to autograd would keep each copy alive (large-v3: 1.7 GB of GPU memory)."""
    from whisperforge.kernels import norm_through

    block = random_model(CONFIG).decoder.blocks[0]  # parameters that require gradients
    assert block.mlp[0].weight.requires_grad
    w_g, w_b, _ = norm_through(block.mlp[0].weight, block.mlp_ln)
    assert w_g.grad_fn is None and w_b.grad_fn is None
    assert not any(p.requires_grad for p in tiny_en.model.parameters())  # loaded for inference


def test_a_cpu_transcription_does_not_import_triton():
    """Triton serves a GPU (or its interpreter) only. PyTorch's CUDA wheels install it for CPU
    users too, where importing it would hold ~50 MB for nothing."""
    pytest.importorskip("triton")  # else there is nothing to keep out (CI)
    if torch.cuda.device_count():
        pytest.skip("a GPU is here: the runtime imports Triton for it")
    run_script(f"""
import sys
from whisperforge import WhisperModel
model = WhisperModel("tiny.en", device="cpu", compute_type="int8")
text = "".join(s.text for s in model.transcribe({str(JFK)!r}, beam_size=1)[0])
assert "country" in text, text
assert "triton" not in sys.modules, "Triton was imported"
print("ok")
""")


def test_encoder_and_cross_match_plain(setup):
    model, features = setup
    runtime = Runtime(model, "float32", max_windows=2)
    torch.manual_seed(2)
    mel = torch.randn(2, CONFIG.n_mels, 3000)
    with torch.inference_mode():
        torch.testing.assert_close(runtime.encoder(mel), model.encoder(mel), **TOL)
        runtime.cross(features)
        keys, values = model.decoder.cross_kv(features)
    D = CONFIG.n_text_state
    for i, (k, v) in enumerate(zip(keys, values)):
        torch.testing.assert_close(runtime.cross_kv[i][:2, :, :D], k, **TOL)
        torch.testing.assert_close(runtime.cross_kv[i][:2, :, D:], v, **TOL)


def test_batched_bucketed_step_equals_plain_model(setup):
    """Two windows x two rows each, prompts of 3..6 tokens; 14 steps take the longest row from 6
    to 20 tokens, across the buckets at 8 and 16. Rows 'finish' at different steps (from then
    on they are fed EOT, as decode does), and every row's logits match the plain model's. The
    prefill pads the prompts to 8 tokens, as it does for its graphs on a GPU."""
    model, features = setup
    group, eot = 2, 50256
    runtime = Runtime(
        model, "float32", max_windows=2, max_rows=4, buckets=BUCKETS, prompt_ladder=(8,)
    )
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 50000, (n,), generator=g).tolist() for n in (3, 6, 5, 4)]
    finish_at = [4, 9, 100, 2]  # step at which each row is fed EOT from then on
    cross = runtime.cross(features)
    batch = runtime.prefill(cross, prompts, group=group)
    assert batch.max_length == 6
    rows = [list(p) for p in prompts]
    for r in range(4):
        torch.testing.assert_close(
            runtime.logits[r], plain_last_logits(model, rows[r], features[r // group]), **TOL
        )
    for step in range(14):
        fed = [
            eot if step >= finish_at[r] else int(torch.randint(0, 50000, (1,), generator=g))
            for r in range(4)
        ]
        logits = runtime.step(batch, torch.tensor(fed))
        for r in range(4):
            rows[r].append(fed[r])
            expected = plain_last_logits(model, rows[r], features[r // group])
            torch.testing.assert_close(logits[r], expected, **TOL, msg=f"row {r} step {step}")
    assert batch.max_length == 20 and runtime.pos[:4].tolist() == [len(r) for r in rows]


def test_reorder_follows_beams(setup):
    model, features = setup
    runtime = Runtime(model, "float32", max_windows=1, max_rows=3, buckets=BUCKETS)
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 50000, (3, 10), generator=g)
    batch = runtime.prefill(runtime.cross(features[:1]), tokens[:, :9], group=3)
    source = torch.tensor([2, 2, 0])
    runtime.reorder(batch, source)
    logits = runtime.step(batch, tokens[source, 9])
    for r in range(3):
        expected = plain_last_logits(model, tokens[source[r]].tolist(), features[0])
        torch.testing.assert_close(logits[r], expected, **TOL)


def test_a_failed_allocation_leaves_no_buffers_of_another_size(setup, monkeypatch):
    """Out of memory while the buffers grew (a batch of beams too big; the batched pipeline
    then halves it) left the runtime believing it had room: the half batch then ran on the
    smaller buffers it had before ("The size of tensor a (5) must match the size of tensor b
    (1800)", found on an H200 at beam 600). The allocation fails here as torch fails it."""
    model, features = setup
    runtime = Runtime(model, "float32", max_windows=1, max_rows=2, buckets=BUCKETS)
    zeros = torch.zeros

    def out_of_memory_past_4_rows(*size, **keywords):
        shape = size[0] if len(size) == 1 and not isinstance(size[0], int) else size
        if len(shape) == 5 and shape[1] > 4:  # the self K,V of every layer, row and position
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")
        return zeros(*size, **keywords)

    monkeypatch.setattr(torch, "zeros", out_of_memory_past_4_rows)
    tokens = torch.randint(0, 50000, (8, 6), generator=torch.Generator().manual_seed(6))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        runtime.prefill(runtime.cross(features), tokens[:, :5], group=4)  # 8 rows
    batch = runtime.prefill(runtime.cross(features[1:]), tokens[:4, :5], group=4)  # the half
    logits = runtime.step(batch, tokens[:4, 5])
    for r in range(4):
        expected = plain_last_logits(model, tokens[r].tolist(), features[1])
        torch.testing.assert_close(logits[r], expected, **TOL)


def plain_greedy(
    model: Whisper, prompt: list[int], features: torch.Tensor, n: int, suppress: list[int]
):
    """Greedy tokens and their log-probabilities from full forwards (no EOT: the caller cuts)."""
    tokens, logprobs = list(prompt), []
    for _ in range(n):
        logits = plain_last_logits(model, tokens, features).clone()
        logits[suppress] = float("-inf")
        token = int(logits.argmax())
        logprobs.append(float(torch.log_softmax(logits, -1)[token]))
        tokens.append(token)
    return tokens[len(prompt) :], logprobs


def test_greedy_loop_matches_plain_greedy_with_rows_finishing_apart(setup):
    model, features = setup
    n, suppress = 12, [220, 50257]
    runtime = Runtime(model, "float32", max_windows=2, buckets=BUCKETS)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 50000, (k,), generator=g).tolist() for k in (4, 7)]
    plain = [plain_greedy(model, p, features[i], n, suppress) for i, p in enumerate(prompts)]

    # EOT := a token that row 0 first emits at some step while row 1 emits it later or never:
    # the rows then finish at different steps.
    def first(seq: list[int], t: int) -> int:
        return seq.index(t) if t in seq else n

    eot = next(
        t
        for t in plain[0][0][1:]
        if first(plain[0][0], t) < n - 2 and first(plain[1][0], t) != first(plain[0][0], t)
    )
    batch = runtime.prefill(runtime.cross(features), prompts)
    result = runtime.greedy(batch, n, eot, suppress=suppress, stop=False)
    for r, (seq, logprobs) in enumerate(plain):
        end = first(seq, eot)
        expected = seq[: end + 1] + [eot] * (n - end - 1)
        assert result.tokens[r].tolist() == expected[:n], f"row {r}"
        assert bool(result.finished[r]) == (end < n)
        assert result.sum_logprobs[r].item() == pytest.approx(sum(logprobs[: end + 1]), abs=1e-3)
    assert first(plain[0][0], eot) != first(plain[1][0], eot)


@pytest.fixture(scope="module")
def jfk_features(tiny_en):
    mel = log_mel_spectrogram(load_audio(str(JFK)), tiny_en.checkpoint.config.n_mels, 0)
    return tiny_en.encode(pad_or_trim(mel, N_FRAMES)[None])


@pytest.mark.parametrize(
    "beam_size, without_timestamps", [(None, False), (5, False), (None, True)]
)  # the last: decode() hands the whole greedy loop to the runtime
def test_decode_on_runtime_equals_plain_decode(
    tiny_en, jfk_features, beam_size, without_timestamps
):
    runtime = Runtime(tiny_en.model, "float32", max_windows=1, max_rows=5)
    options = DecodingOptions(
        language="en", beam_size=beam_size, without_timestamps=without_timestamps
    )
    ours = decode(RuntimeWhisper(runtime), tiny_en.tokenizer, jfk_features, options)[0]
    reference = decode(tiny_en.model, tiny_en.tokenizer, jfk_features, options)[0]
    assert ours.tokens == reference.tokens
    assert ours.avg_logprob == pytest.approx(reference.avg_logprob, abs=1e-4)
    assert ours.no_speech_prob == pytest.approx(reference.no_speech_prob, abs=1e-4)
    assert "ask not what your country can do for you" in ours.text


def test_greedy_loop_on_tiny_en_equals_decode(tiny_en, jfk_features):
    """The device-side greedy loop (no timestamps) gives decode()'s tokens on real weights."""
    tokenizer = tiny_en.tokenizer.with_options("en", "transcribe")
    options = DecodingOptions(language="en", without_timestamps=True)
    reference = decode(tiny_en.model, tiny_en.tokenizer, jfk_features, options)[0]
    runtime = Runtime(tiny_en.model, "float32", max_windows=1)
    batch = runtime.prefill(
        runtime.cross(jfk_features), [list(tokenizer.sot_sequence_including_notimestamps)]
    )
    result = runtime.greedy(
        batch, 224, tokenizer.eot,
        suppress=suppress_token_list(tokenizer, "-1"),
        suppress_first=tokenizer.encode(" ") + [tokenizer.eot],
    )  # fmt: skip
    tokens = result.tokens[0].tolist()
    assert result.finished[0] and tokens[: tokens.index(tokenizer.eot)] == reference.tokens


@pytest.mark.parametrize("beam_size, without_timestamps", [(None, False), (5, False), (None, True)])
@pytest.mark.parametrize("on_runtime", [False, True])
def test_windows_with_their_own_prompts_decode_as_alone(
    tiny_en, beam_size, without_timestamps, on_runtime
):
    """Each window of a batch after its own previous text (prompts of different lengths, left-
    padded in `decode`, ragged in the runtime) gives the tokens of decoding it alone."""
    from conftest import DEV_DIR, short_english_clips

    clips = [DEV_DIR / c["audio"] for c in short_english_clips()[:3]]
    mels = [log_mel_spectrogram(load_audio(str(c)), 80, 0) for c in clips]
    features = tiny_en.encode(torch.stack([pad_or_trim(m, N_FRAMES) for m in mels]))
    tokenizer = tiny_en.tokenizer.with_options("en", "transcribe")
    prompts = [tokenizer.encode(" The printing press, and the art of printing."), [], "Yes."]
    options = DecodingOptions(
        language="en", beam_size=beam_size, without_timestamps=without_timestamps
    )
    model = tiny_en.model
    if on_runtime:  # buffers for one row: the decode grows them after projecting cross K,V
        model = RuntimeWhisper(Runtime(tiny_en.model, "float32", max_windows=1, max_rows=1))
    together = decode(model, tiny_en.tokenizer, features, options, prompts)
    for i, prompt in enumerate(prompts):
        alone_options = DecodingOptions(
            language="en", beam_size=beam_size, without_timestamps=without_timestamps, prompt=prompt
        )
        alone = decode(tiny_en.model, tiny_en.tokenizer, features[i : i + 1], alone_options)[0]
        assert together[i].tokens == alone.tokens, i
        assert together[i].avg_logprob == pytest.approx(alone.avg_logprob, abs=1e-4)
        assert together[i].no_speech_prob == pytest.approx(alone.no_speech_prob, abs=1e-4)


STEP_KERNELS = """
import torch
import torch.nn.functional as F
from whisperforge import kernels as K

def rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm())

g = torch.Generator().manual_seed(0)
dt = torch.float16  # the interpreter computes in numpy, which has no bfloat16
M, D = 3, 512
x = torch.randn(M, D, generator=g).to(dt)
w = (torch.randn(D, D, generator=g) / 16).to(dt)
parts = K.skinny_linear(x, w, None, False, (16, 128, 4, 3), partial=True)  # 2 partial sums
assert parts.shape == (2, M, D) and rel(parts.sum(0), x.float() @ w.float().T) < 1e-5
# Unsplit with K = 384: at one row the weights are preloaded as two tiles (256 + 128) and
# multiplied on the CUDA cores (ONE_ROW); at three they stream through the MMA.
x3, w3 = torch.randn(M, 384, generator=g).to(dt), (torch.randn(64, 384, generator=g) / 16).to(dt)
b3 = torch.randn(64, generator=g).to(dt)
assert K.preload(1, 16, 384, None) == 256 and K.preload(M, 16, 384, None) == 0
assert K.preload(1, 16, 896, None) == 0  # 512 + 384: not two powers of two
for rows in (1, M):
    y = K.skinny_linear(x3[:rows], w3, b3, True, (16, 128, 4, 3))
    assert rel(y, F.gelu(x3[:rows].float() @ w3.float().T + b3.float())) < 2e-3, rows
ln = torch.nn.LayerNorm(D).to(dt)
ln.weight.data.normal_(generator=g)
b = torch.randn(D, generator=g).to(dt)
stream = torch.randn(M, D, generator=g).to(dt)
expected = stream.float() + parts.sum(0) + b.float()
h = K.add_layer_norm(stream, parts, b, ln)
assert rel(stream, expected) < 2e-3
assert rel(h, F.layer_norm(expected, (D,), ln.weight.float(), ln.bias.float())) < 2e-3

# Folded: the residual add in a split matmul's epilogue (its last program sums the splits),
# leaving band statistics and stream * g, from which the next matmul's epilogue normalizes.
stats = K.StreamStats(torch.zeros(D // 16 * M * 2), torch.zeros(M, D).to(dt), torch.zeros(64, dtype=torch.int32))
stream = torch.randn(M, D, generator=g).to(dt)
expected = (stream.float() + (x.float() @ w.float().T).to(dt).float() + b.float()).to(dt)
K.skinny_linear(x, w, b, False, (16, 128, 4, 3), stats=stats, residual=(stream, ln.weight))
assert rel(stream, expected) < 1e-3 and stats.band == 16 and not stats.counters.any()
assert rel(stats.scaled, expected.float() * ln.weight.float()) < 1e-3
w2 = (torch.randn(2 * D, D, generator=g) / 16).to(dt)
normed = F.layer_norm(expected.float(), (D,), ln.weight.float(), ln.bias.float()).to(dt)
for partial in (False, True):
    y = K.skinny_linear(
        stats.scaled, w2, None, False, (32, 128, 4, 3), partial=partial, stats=stats,
        norm=K.norm_through(w2, ln),
    )
    assert rel(y.sum(0) if partial else y, normed.float() @ w2.float().T) < 2e-3
from whisperforge.quantize import QuantizedWeight, dequantize, quantize_weight
w8 = QuantizedWeight(*quantize_weight(w2.float(), "int8"))  # an int8 step linear
y = K.skinny_linear(
    stats.scaled, w8.data, None, False, (32, 128, 4, 3), w8.scale, stats=stats,
    norm=K.norm_through(w8, ln),
)
assert rel(y, normed.float() @ w8.float().T) < 2e-3

tokens, positions = torch.tensor([3, 7, 49]), torch.tensor([0, 5, 447])
emb, pos = torch.randn(50, D, generator=g).to(dt), torch.randn(448, D, generator=g).to(dt)
x, h = K.embed_layer_norm(tokens, positions, emb, pos, ln)
assert torch.equal(x, emb[tokens] + pos[positions])
assert rel(h, F.layer_norm(x.float(), (D,), ln.weight.float(), ln.bias.float())) < 1e-3
for group in (0, 64):  # int8 rows with a scale each, or per 64 columns (quantize's embedding)
    q, scale = quantize_weight(emb.float(), "int8", group=group)
    x, h = K.embed_layer_norm(tokens, positions, q, pos, ln, scale)
    assert torch.equal(x, dequantize(q[tokens], scale[tokens]).to(dt) + pos[positions])

W, G, H, dh, A = 2, 2, 3, 64, 1500  # 1500 keys: 12 or 6 splits, the last one short
q = torch.randn(3, W * G, H * dh, generator=g)  # a query's partial sums, before its bias
q_bias = torch.randn(H * dh, generator=g).to(dt)
kv = torch.randn(W + 1, A, 2 * H * dh, generator=g).to(dt)
query = (q.sum(0).to(dt).float() + q_bias.float()).to(dt).float()
heads = lambda t: t.float().reshape(W, -1, H, dh).transpose(1, 2)
ref = F.scaled_dot_product_attention(heads(query), heads(kv[:W, :, : H * dh]), heads(kv[:W, :, H * dh :]))
assert K.cross_keys(W * H, A, q.device) == 128 and K.cross_keys(132 * 2 * 6, A, q.device) == 256
for keys in (128, 256):
    out = K.cross_attention(q, q_bias, kv, W, H, keys)
    assert rel(out, ref.transpose(1, 2).reshape(W * G, H * dh)) < 2e-3

# Beam search's reorder: rows that are each other's sources, a prefix of the positions, a row
# that keeps its own (3).
cache = torch.randn(2, 5, 4, 16, 8, generator=g).to(dt)
source = torch.tensor([1, 0, 0, 3])
expected = cache.clone()
expected[:, :4, :, :10] = expected[:, source, :, :10]
K.reorder_rows(cache, source, 10)
assert torch.equal(cache, expected)
print("ok")
"""


def test_step_kernels_in_the_interpreter():
    """The decode step's Triton kernels (CUDA only) in Triton's CPU interpreter, against torch:
    split partial sums, the fused residual + layer norm over them, the same folded into the
    matmuls (residual add in a split matmul's epilogue, layer norm on the way into the next),
    the embedding (float16 or int8) + layer norm, cross-attention split over the keys, and
    beam search's reorder of the self K,V."""
    run_interpreted(STEP_KERNELS)


FOLDED_STEP = """
import torch
from whisperforge import runtime as R
from whisperforge.model import ModelConfig
from whisperforge.presets import random_model
from whisperforge.quantize import quantize_model

config = ModelConfig(
    n_mels=80, n_audio_ctx=8, n_audio_state=512, n_audio_head=8, n_audio_layer=1,
    n_vocab=1000, n_text_ctx=16, n_text_state=512, n_text_head=8, n_text_layer=2,
)  # D = 512: the step's matmuls split K in two
torch.set_grad_enabled(False)
g = torch.Generator().manual_seed(0)
mel = torch.randn(2, 80, 16, generator=g)
tokens = torch.randint(0, 1000, (4, 6), generator=g)  # 2 windows x 2 rows
for weights in (None, "int8"):
    model = random_model(config, seed=0)
    if weights:
        model = quantize_model(model, weights, dynamic=False)
    features = model.encoder(mel)
    hidden = model.decoder(tokens, audio_features=features.repeat_interleave(2, 0))
    expected = model.decoder.logits(hidden)  # every step's logits [rows, tokens, vocab]
    runtime = R.Runtime(model, "float16", max_windows=2, max_rows=4, graphs=False)
    assert runtime._folds(4)
    for windows, group in ((2, 2), (1, 1)):  # one row: `self_attention_out`
        rows = windows * group
        cross = runtime.cross(features[:windows].half())
        batch = runtime.prefill(cross, tokens[:rows, :4], group=group)
        for t in range(4, 6):  # two steps: the second attends to the K,V the first wrote
            logits = runtime.step(batch, tokens[:rows, t])
            want = expected[:rows, t]
            error = float((logits - want).norm() / want.norm())
            assert error < 2e-3, (weights, rows, t, error)
print("ok")
"""


def test_folded_step_in_the_interpreter():
    """A whole decode step with the layer norms folded into its matmuls (`_layer_folded`) in
    Triton's CPU interpreter, on float16 and int8 weights, against the plain model's logits."""
    run_interpreted(FOLDED_STEP)


TIMESTAMP_RULES = """
import types
import torch
from whisperforge import kernels as K
from whisperforge.decoding import ApplyTimestampRules

# An English model's ids (tiny.en): the rules read only these three.
ids = types.SimpleNamespace(eot=50256, no_timestamps=50362, timestamp_begin=50363)
V, tb, text = 51864, 50363, 300
g = torch.Generator().manual_seed(0)

def check(sampled, max_initial, dtype, boost=()):
    rows, sb = len(sampled), 3
    tokens = torch.tensor([[50257, 50362, 50359] + s for s in sampled])
    logits = (torch.randn(rows, V, generator=g) * 3).to(dtype)
    for r in boost:  # the timestamps' mass beats the best text token: only timestamps remain
        logits[r, tb:] += 12
    expected, got = logits.clone(), logits.clone()
    ApplyTimestampRules(ids, sb, max_initial).apply(expected, tokens)  # the torch path (CPU)
    rules = K.TimestampRules(tb, ids.eot, ids.no_timestamps, max_initial)
    K.timestamp_rules(got, tokens[:, sb:], rules, tokens.shape[1] - sb)
    assert torch.equal(got, expected), (sampled, max_initial, (got != expected).nonzero()[:5])

for dtype in (torch.float32, torch.float16):
    check([[], []], 50, dtype, boost=[1])  # the first sampled token: a timestamp, at most 1 s
    check([[], []], None, dtype)
    check([[tb + 4], [text]], None, dtype)  # one token: a timestamp closes a pair
    check(
        [
            [tb, text, text, text],  # text after a timestamp: none before tb + 1
            [text, text, tb + 5, tb + 7],  # a pair closed: text must follow
            [tb + 2, text, text, tb + 9],  # a segment ended: a timestamp >= tb + 9 or EOT
            [text, text, text, text],  # no timestamp yet
            [tb + 1, tb + 1, text, tb + 3],
            [text, text, text, text],
        ],
        None, dtype, boost=[3, 5],
    )  # fmt: skip
print("ok")
"""


def test_timestamp_rules_in_the_interpreter():
    """The timestamp rules' kernel (`kernels.timestamp_rules`, CUDA only) in Triton's CPU
    interpreter against `decoding.ApplyTimestampRules`' torch path: each rule, the first
    step's, and the last rule (timestamps winning the step) both ways, float32 and float16."""
    run_interpreted(TIMESTAMP_RULES)


BEAM_STEP = """
import torch
from whisperforge import kernels as K
from whisperforge.decoding import BeamSearch

V, eot, beam = 4100, 4000, 5  # two full bands of 2048 logits and a short one
g = torch.Generator().manual_seed(0)

def run(step, patience, n_audio, all_logits):
    search = BeamSearch(beam, eot, None, patience)
    tokens = torch.tensor([[1, 2, 3 + a] for a in range(n_audio) for _ in range(beam)])
    sums, steps = torch.zeros(len(tokens)), []
    for logits in all_logits:
        first = search.finished is None
        search._make_room(tokens, headroom=2)  # grows often
        tokens, source = step(logits, tokens, sums.clone(), sums, search.finished, beam, eot, first)
        steps.append((tokens, source, sums.clone()))
    return steps, search.finished

for patience, n_audio in ((1.0, 3), (2.0, 2), (0.4, 2)):
    rows = n_audio * beam
    all_logits = []
    for k in range(7):
        logits = torch.randn(rows, V, generator=g) * 2
        logits[(torch.arange(rows) + k) % 3 == 0, eot] += 5  # EOT among the best often
        all_logits.append(logits)
    expected, expected_finished = run(BeamSearch._step, patience, n_audio, all_logits)
    got, got_finished = run(K.beam_step, patience, n_audio, all_logits)
    for (t0, s0, l0), (t1, s1, l1) in zip(expected, got):
        assert torch.equal(t0, t1) and torch.equal(s0, s1), (patience, t0[:, -1], t1[:, -1])
        assert torch.allclose(l0, l1, atol=1e-5), (l0, l1)
    count = expected_finished.count
    assert torch.equal(count, got_finished.count) and count.sum() > 0, count
    for a, n in enumerate(count.tolist()):
        assert torch.equal(expected_finished.lengths[a, :n], got_finished.lengths[a, :n])
        assert torch.allclose(expected_finished.scores[a, :n], got_finished.scores[a, :n], atol=1e-5)
        for s, length in enumerate(expected_finished.lengths[a, :n].tolist()):
            want = expected_finished.tokens[a, s, :length]
            assert torch.equal(want, got_finished.tokens[a, s, :length]) and want[-1] == eot
print("ok")
"""


def test_beam_step_in_the_interpreter():
    """Beam search's step kernels (`kernels.beam_step`, CUDA only) in Triton's CPU interpreter
    against `decoding.BeamSearch._step`'s torch path over seven steps of several audios: the
    first step's single beam, EOTs among the best (finished candidates recorded, up to the
    patience's limit), the next beams' tokens, sources and sums."""
    run_interpreted(BEAM_STEP, timeout=600)


GREEDY_WITH_RULES = """
import types
import torch
from whisperforge import runtime as R
from whisperforge.decoding import ApplyTimestampRules
from whisperforge.model import ModelConfig
from whisperforge.presets import random_model

config = ModelConfig(
    n_mels=80, n_audio_ctx=8, n_audio_state=128, n_audio_head=2, n_audio_layer=1,
    n_vocab=600, n_text_ctx=32, n_text_state=128, n_text_head=2, n_text_layer=2,
)  # ids 500 and up are "timestamps": the rules have room to act
ids = types.SimpleNamespace(eot=400, no_timestamps=499, timestamp_begin=500)
torch.set_grad_enabled(False)
g = torch.Generator().manual_seed(1)
model = random_model(config, seed=0)
rt = R.Runtime(model, "float16", max_windows=2, max_rows=2, graphs=False)
cross = rt.cross(model.encoder(torch.randn(2, 80, 16, generator=g)).half())
prompts = torch.randint(0, 400, (2, 4), generator=g)
suppress, first = [7, *range(401, 499)], [3]  # the special tokens, as decoding suppresses
steps = 20

# decoding's host loop on the runtime's logits: torch rules, then the choice
batch = rt.prefill(cross, prompts)
rules = ApplyTimestampRules(ids, 4, 10)
tokens, logits = prompts.clone(), rt.logits[:2].clone()
for i in range(steps):
    logits[:, suppress + (first if i == 0 else [])] = float("-inf")
    rules.apply(logits, tokens)
    choice = logits.argmax(dim=-1)
    choice[tokens[:, -1] == ids.eot] = ids.eot
    tokens = torch.cat([tokens, choice[:, None]], dim=1)
    logits = rt.step(batch, choice).clone()
expected = tokens[:, 4:]
assert (expected >= 500).any() and (expected < 400).any(), expected  # both kinds were chosen

# the device loop with the rules' kernel before each choice
batch = rt.prefill(cross, prompts)
got = rt.greedy(batch, steps, ids.eot, suppress, first, stop=False, rules=rules.rules()).tokens
assert torch.equal(got, expected), (got, expected)
print("ok")
"""


def test_greedy_with_timestamp_rules_in_the_interpreter():
    """`Runtime.greedy` with the timestamp rules' kernel before each choice (the device loop
    `decoding.decode` runs for greedy with timestamps) gives decoding's host loop's tokens:
    the torch rules and an argmax over the same runtime's logits, in Triton's interpreter."""
    run_interpreted(GREEDY_WITH_RULES)


BEAM_LOOP = """
import types
import torch
from whisperforge import runtime as R
from whisperforge.decoding import ApplyTimestampRules, BeamSearch
from whisperforge.model import ModelConfig
from whisperforge.presets import random_model

config = ModelConfig(
    n_mels=80, n_audio_ctx=8, n_audio_state=128, n_audio_head=2, n_audio_layer=1,
    n_vocab=600, n_text_ctx=32, n_text_state=128, n_text_head=2, n_text_layer=2,
)  # ids 500 and up are "timestamps"
ids = types.SimpleNamespace(eot=400, no_timestamps=499, timestamp_begin=500)
torch.set_grad_enabled(False)
g = torch.Generator().manual_seed(1)
model = random_model(config, seed=0)
W, beam, steps = 2, 3, 8
rt = R.Runtime(model, "float16", max_windows=4, max_rows=12, graphs=False)
features = model.encoder(torch.randn(W, 80, 16, generator=g)).half()
# Prompts of 4 and 6 tokens, left-padded as decoding pads them.
lengths = [4, 6]
P = max(lengths)
prompts = torch.randint(0, 400, (W, P), generator=g)
pad = torch.tensor([P - n for n in lengths])
prompts[torch.arange(P) < pad[:, None]] = 0
tokens0 = prompts.repeat_interleave(beam, dim=0)
padding = pad.repeat_interleave(beam)
suppress, first = [7, *range(401, 499)], [3]
rules = ApplyTimestampRules(ids, P, 10)
emb = rt.model.decoder.token_embedding.weight
emb[ids.eot] = emb[235] * 1.5  # EOT among the best candidates: searches complete

def host(max_candidates):
    cache = R.RuntimeCache(rt, rt.cross(features), beam, padding)
    cache.prefill(tokens0)
    search = BeamSearch(beam, ids.eot, types.SimpleNamespace(reorder=cache.reorder))
    search.patience = max_candidates / beam
    tokens, sums, logits = tokens0.clone(), torch.zeros(W * beam), rt.logits[: W * beam].clone()
    for i in range(steps):
        logits[:, suppress + (first if i == 0 else [])] = float("-inf")
        rules.apply(logits, tokens)
        tokens, done = search.update(tokens, logits, sums)
        if done:
            break
        rt.step(cache.batch, tokens[:, -1])
        logits = rt.logits[: W * beam].clone()
    return search, tokens, sums

def device(max_candidates, stop):
    cache = R.RuntimeCache(rt, rt.cross(features), beam, padding)
    decoder = R.RuntimeDecoder(rt)
    rt.beam = lambda *args, **kwargs: R.Runtime.beam(rt, *args, stop=stop, **kwargs)
    tokens, sums, finished, _ = decoder.search(
        cache, tokens0, 0, steps, ids.eot, suppress, first, rules.rules(), max_candidates
    )
    search = BeamSearch(beam, ids.eot, None)
    search.patience, search.finished = max_candidates / beam, finished
    return search, tokens, sums

for max_candidates, stops in ((2, (False, True)), (3, (True,))):
    want, want_tokens, want_sums = host(max_candidates)
    count = want.finished.count
    assert count.sum() > 0, count  # candidates finished (all of them: max_candidates 2)
    expected = want.finalize(want_tokens.view(W, beam, -1), want_sums.view(W, beam))
    for stop in stops:  # late: the step after completion changes nothing; not at all
        R.READ_LATE = stop
        got, tokens, sums = device(max_candidates, stop)
        assert torch.equal(got.finished.count, count), (got.finished.count, count)
        assert torch.equal(tokens, want_tokens), (tokens, want_tokens)
        assert torch.allclose(sums, want_sums, atol=1e-4), (sums, want_sums)
        result = got.finalize(tokens.view(W, beam, -1), sums.view(W, beam))
        assert [[t.tolist() for t in c] for c in result[0]] == [[t.tolist() for t in c] for c in expected[0]]
print("ok")
"""


def test_beam_loop_in_the_interpreter():
    """`Runtime.beam`, beam search all on the device (the filters, the choice and the reorder
    in the step's graph), gives decoding's host loop over the same runtime its candidates,
    sums and beams, in Triton's interpreter: windows with prompts of different lengths, a
    search that completes (the steps after it change nothing, whether the flag is read a
    step late or never) and one that runs out of steps."""
    run_interpreted(BEAM_LOOP, timeout=600)


GREEDY_KERNELS = """
import torch
from whisperforge import runtime as R
from whisperforge import kernels as K
from whisperforge.model import ModelConfig
from whisperforge.presets import random_model

config = ModelConfig(
    n_mels=80, n_audio_ctx=8, n_audio_state=64, n_audio_head=1, n_audio_layer=1,
    n_vocab=5000, n_text_ctx=16, n_text_state=128, n_text_head=2, n_text_layer=1,
)  # 5000 logits: 313 bands of 16, joined in two blocks; the choice kernel's bands of 512
torch.set_grad_enabled(False)
model = random_model(config, seed=0)
w = model.decoder.token_embedding.weight.data
w[4321] = w[17]  # a tie between bands: the first index wins
rt = R.Runtime(model, "float16", max_windows=1, max_rows=4, graphs=False)
g = torch.Generator().manual_seed(0)
rows = 3
h = torch.randn(4, 128, generator=g).half()
h[1] = rt.model.decoder.token_embedding.weight[17] * 4  # row 1's best is the tie
rt.bias[torch.randint(0, 5000, (50,), generator=g)] = float("-inf")
rt.eot.fill_(7)
rt.finished[2] = True
rt.pos[:rows] = torch.tensor([3, 5, 9])
rt.sum_logprobs[:rows] = torch.tensor([-1.0, -2.0, -3.0])
state = [t.clone() for t in rt._loop_state()]

def restore():
    for t, saved in zip(rt._loop_state(), state):
        t.copy_(saved)

def run(select):
    restore()
    select()
    return [t.clone() for t in rt._loop_state()]

logits = (h[:rows].float() @ rt.model.decoder.token_embedding.weight.float().T).half().float()
def torch_path():
    rt.logits[:rows] = logits
    rt.pos[:rows] += 1
    rt.fused = False
    rt._select(rows)
    rt.fused = True
def choice_kernel(tile=K.CHOICE_TILE):
    rt.logits[:rows] = logits
    rt.pos[:rows] += 1
    K.CHOICE_TILE, default = tile, K.CHOICE_TILE  # 64: 313 bands of 16 ids, three join blocks
    rt._select(rows)
    K.CHOICE_TILE = default
expected = run(torch_path)
assert expected[0][1] == 17, expected[0]
kernels = [choice_kernel, lambda: choice_kernel(64)]
kernels += [lambda: rt._logits_select(h[:rows].contiguous(), rows)]
for got in map(run, kernels):
    for a, b in zip(got, expected):  # logits and sums: within the matmul's rounding
        assert torch.allclose(a[:rows].float(), b[:rows].float(), rtol=1e-3, atol=1e-3), (a, b)
    assert all(torch.equal(a[:rows], b[:rows]) for a, b in zip(got[:3] + got[4:5], expected[:3] + expected[4:5]))
    assert not rt.stream_stats.counters.any()

# An int8 embedding (quantize's, a scale per 64 columns): the fold scales each group's sums.
from whisperforge.quantize import quantize_model
quantize_model(rt.model, "int8", dynamic=False)
weight = rt.model.decoder.token_embedding.weight
logits = rt.model.decoder.logits(h[:rows]).float()
assert rt.model.decoder.token_embedding.qweight.dtype == torch.int8
assert rt.model.decoder.token_embedding.scale.shape == (5000, 2)
expected = run(torch_path)
got = run(lambda: rt._logits_select(h[:rows].contiguous(), rows))
assert torch.allclose(got[5][:rows], expected[5][:rows], rtol=1e-3, atol=1e-3)
assert torch.equal(got[0], expected[0]) and torch.equal(got[4], expected[4])
print("ok")
"""


def test_greedy_choice_in_the_interpreter():
    """The greedy choice on the device, in Triton's CPU interpreter: the choice kernel over
    the logits (10 bands, or 313 joined in three blocks) and the choice folded into the logits
    matmul (bands joined by the last program,
    positions advanced; float16 and int8 embeddings) give `_select`'s torch path's tokens,
    sums, history, finished flags and logits, first index on ties."""
    run_interpreted(GREEDY_KERNELS)


SAMPLING = """
import torch
from whisperforge import runtime as R
from whisperforge.model import ModelConfig
from whisperforge.presets import random_model

config = ModelConfig(
    n_mels=80, n_audio_ctx=8, n_audio_state=64, n_audio_head=1, n_audio_layer=1,
    n_vocab=5000, n_text_ctx=16, n_text_state=128, n_text_head=2, n_text_layer=1,
)  # 5000 logits: bands of the embedding joined in two blocks; the choice kernel's of 256
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.set_grad_enabled(False)
rt = R.Runtime(random_model(config, seed=0, device=device), "float16", max_rows=256, graphs=False)
emb = rt.model.decoder.token_embedding.weight
g = torch.Generator().manual_seed(0)
# Every row the same: most of the probability on a few ids, one of them suppressed.
likely = torch.tensor([17, 4321, 2500, 999, 3000, 64])
u = torch.randn(128, generator=g)
u /= u.norm()
emb[likely] = (u[None, :] * torch.tensor([8, 7.5, 7, 7, 6.5, 6.5])[:, None] / 20).half().to(device)
h = (20 * u).half().to(device).expand(256, -1).contiguous()
rt.bias[999] = float("-inf")
rt.eot.fill_(7)
logits = (h.float() @ emb.float().T).half().float()
T = 0.8
expected = torch.softmax((logits[0] + rt.bias) / T, dim=-1).cpu()
rest = torch.ones(5000, dtype=torch.bool)
rest[likely] = False

def grouped(p):  # the likely ids one by one, the rest as one
    return torch.cat([p[likely], p[rest].sum()[None]])

untempered = torch.softmax(logits[0] + rt.bias, dim=-1).cpu()
assert (grouped(untempered) - grouped(expected)).abs().sum() / 2 > 0.1  # tells T from 1

def draw(select, rows, seed):
    state = torch.arange(rows, device=device)
    rt.pos[:rows] = state % 5 + 3
    rt.finished[:rows] = False
    rt.finished[5] = True  # a finished row repeats EOT and adds nothing
    rt.sum_logprobs[:rows] = -1.0
    rt._sample = True
    rt.temperature.fill_(T)
    rt.seed.fill_(seed)
    torch.manual_seed(seed)  # the torch path's noise
    select(rows)
    rt._sample = False
    return rt.token[:rows].clone(), rt.sum_logprobs[:rows].clone(), rt.pos[:rows].clone()

def from_logits(rows):
    rt.logits[:rows] = logits[:rows]
    rt.pos[:rows] += 1
    rt._select(rows)

def torch_path(rows):
    fused, rt.fused = rt.fused, False
    from_logits(rows)
    rt.fused = fused

paths = [("torch", torch_path, 256, 8)]
if rt.fused:  # the choice kernel, and the draw in the logits matmul's epilogue (<= 16 rows)
    paths += [("choice kernel", from_logits, 256, 8)]
    paths += [("logits matmul", lambda rows: rt._logits_select(h[:rows], rows), 16, 64)]
for name, select, rows, seeds in paths:
    counts = torch.zeros(5000)
    live = torch.arange(rows) != 5
    for seed in range(seeds):
        token, sums, pos = draw(select, rows, 1000 * seed + 1)
        assert token[5] == 7 and sums[5] == -1.0, (name, token[5], sums[5])
        assert torch.equal(pos.cpu(), torch.arange(rows) % 5 + 4), name
        assert torch.equal(rt.history[torch.arange(rows), pos], token), name
        z = rt.logits[:rows] + rt.bias
        want = -1.0 + torch.log_softmax(z, dim=-1).gather(1, token[:, None])[:, 0]
        assert torch.allclose(sums[live], want[live], atol=1e-4), (name, sums, want)
        counts += torch.bincount(token[live].cpu(), minlength=5000).float()
        if seed == 1:
            assert not torch.equal(first, token), name  # another seed, other draws
        first = token
    assert counts[999] == 0, name
    tv = (grouped(counts / counts.sum()) - grouped(expected)).abs().sum() / 2
    assert tv < 0.06, (name, float(tv))
print("ok")
"""


def test_sampling_draws_from_the_tempered_distribution():
    """`Runtime.greedy` at a temperature (the choice by the Gumbel-max trick), on the torch
    path: each row's draws follow softmax(logits / T) (total variation over the likely ids and
    the rest), never a suppressed id; the sums add the untempered log-probability of the
    drawn token; finished rows repeat EOT; another seed draws otherwise."""
    run_script(SAMPLING)


def test_sampling_kernels_in_the_interpreter():
    """The same for the choice kernel and the draw in the logits matmul's epilogue (CUDA only),
    in Triton's CPU interpreter, beside the torch path."""
    run_interpreted(SAMPLING, timeout=600)


def test_sampling_on_the_runtime_scores_what_it_draws(tiny_en, jfk_features):
    """`decode` at a temperature runs its whole loop on the runtime: near 0 it gives greedy's
    tokens; at 0.7 (best of 3) the same seed repeats the draws, and the avg_logprob is what
    the plain model gives the drawn tokens under the filters (the untempered log-softmax)."""
    tokenizer = tiny_en.tokenizer.with_options("en", "transcribe")
    runtime = RuntimeWhisper(Runtime(tiny_en.model, "float32", max_windows=1, max_rows=3))
    greedy = DecodingOptions(language="en", without_timestamps=True)
    options = DecodingOptions(language="en", without_timestamps=True, temperature=0.7, best_of=3)
    reference = decode(tiny_en.model, tokenizer, jfk_features, greedy)[0]
    with torch.random.fork_rng():  # the later tests' draws stay as they were
        cold = replace(greedy, temperature=1e-6)
        cold = decode(runtime, tokenizer, jfk_features, cold)[0]
        assert cold.tokens == reference.tokens
        assert cold.avg_logprob == pytest.approx(reference.avg_logprob, abs=1e-4)
        torch.manual_seed(0)
        drawn = decode(runtime, tokenizer, jfk_features, options)[0]
        torch.manual_seed(0)
        assert decode(runtime, tokenizer, jfk_features, options)[0].tokens == drawn.tokens

    prompt = list(tokenizer.sot_sequence_including_notimestamps)
    tokens = prompt + drawn.tokens + [tokenizer.eot]
    with torch.inference_mode():
        hidden = tiny_en.model.decoder(torch.tensor([tokens[:-1]]), audio_features=jfk_features)
        logits = tiny_en.model.decoder.logits(hidden[0, len(prompt) - 1 :]).float()
        logits[:, suppress_token_list(tokenizer, "-1")] = float("-inf")
        logits[0, tokenizer.encode(" ") + [tokenizer.eot]] = float("-inf")  # SuppressBlank
    chosen = torch.tensor(tokens[len(prompt) :])[:, None]
    total = float(torch.log_softmax(logits, dim=-1).gather(1, chosen).sum())
    assert drawn.avg_logprob * (len(drawn.tokens) + 1) == pytest.approx(total, abs=1e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_model_on_the_second_gpu_transcribes_as_on_the_first():
    """Triton's launches and the CUDA graphs' captures follow the model's GPU (cuda:1), not the
    current one: the same tokens there as on cuda:0, beam search, greedy and sampling."""
    from whisperforge import WhisperModel

    audio = load_audio(JFK)
    runs = []
    for index in (0, 1):
        model = WhisperModel("tiny.en", device="cuda", device_index=index, compute_type="float16")
        for options in ({}, {"beam_size": 1, "temperature": 0.0}, {"temperature": 0.7}):
            torch.manual_seed(0)
            runs.append([t for s in model.transcribe(audio, **options)[0] for t in s.tokens])
    assert runs[:3] == runs[3:] and all(runs)
