"""The fast path: the plain network's weights driven through static buffers and CUDA graphs.

A decode step of Whisper is tiny work (one token per sequence), so in plain PyTorch it is bound by
kernel launches and host syncs, not by the GPU. The runtime removes both:

- Cross-attention K,V are projected once per window into a static buffer (`encode`/`cross`).
- Self-attention K,V live in static per-row caches; a step writes one position per row and
  attends up to each row's own length, so rows may have different prompt lengths. The torch
  path (CPU, tests, the reference for the kernels) attends over `cache[:bucket]` with a mask,
  bucket from a short ladder; on CUDA a Triton kernel appends K,V and attends by length.
- Each (windows on a ladder, rows per window[, bucket]) step is captured once as a CUDA graph
  and replayed, and so is each prefill (windows, rows per window, prompt length on a ladder);
  on CUDA the step runs the Triton kernels of `kernels.py`: the few-row matmuls streaming
  their weights in the configs tuned for the whole step (the same in every process, so the
  same transcripts), the layer norms folded into the epilogues of the matmuls around them
  (`Runtime._layer_folded`, `FOLD`), the attention by each row's length, the cross-attention
  split over the keys, a greedy step's choice in its logits matmul; on Hopper they chain by
  programmatic dependent launch (`kernels.USE_PDL`).
- The greedy loop state (last tokens, lengths, finished flags, sums of log-probs, the tokens
  so far) stays on the GPU; `greedy` runs a whole decode (or sampling's, by the Gumbel-max
  trick in the same choice) with no host sync per step. So does
  beam search's (`beam`): a step's graph runs the step, the filters, the choice and the
  reorder of the self K,V, and the host reads one completion flag a step late.
- Beams (or best-of samples) of one window are rows of one batch that share the window's cross
  K,V: cross-attention takes them as `group` queries of that window, so it reads K,V once.
- A runtime works on its model's GPU whatever the current device: its methods make that device
  current, and it captures its graphs on a stream of its own there (`_on_device`, `_capture`),
  so one process may drive models on several GPUs.

The API that batching, streaming and serving build on:

    rt = Runtime(model, "float16")
    cross = rt.encode(mels)                      # [W, n_mels, 3000] -> cross K,V of W windows
    batch = rt.prefill(cross, prompts, group=1)  # W * group prompts, rows grouped by window
    logits = rt.step(batch, next_tokens)         # one token per row -> logits [rows, n_vocab]
    rt.reorder(batch, source)                    # beam search: row i continues row source[i]
    result = rt.greedy(batch, 128, eot, suppress)  # or the whole greedy loop on the device
    result = rt.beam(batch, 5, 128, eot, suppress)   # or beam search's (group = beams; CUDA)

The buffers belong to the runtime: one batch is decoded at a time. On the CPU (tests) the same
step code runs eagerly, and the device loops with timestamp rules or beams are CUDA's only.
`RuntimeWhisper` lets `decoding.decode` use the runtime unchanged (on the CPU too).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import kernels
from .kernels import (
    _INTERPRETED,
    CHOICE_TILE,
    REORDER_COPY_BYTES,
    BeamFinished,
    StreamStats,
    TimestampRules,
    _beam_kernels,
    _launch,
    add_layer_norm,
    cross_attention,
    decode_attention,
    embed_layer_norm,
    folded_linear,
    linear,
    norm_through,
    reorder_rows,
    scale_layout,
    self_attention_out,
    stream_config,
    timestamp_rules,
    triton,
    weight_and_scale,
)
from .model import AudioEncoder, CrossAttention, SelfAttention, Whisper, merge_heads, split_heads

COMPUTE_TYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BUCKETS = (64, 128, 256)  # past lengths a step graph covers; n_text_ctx is always the last
PROMPT_LADDER = (8, 16, 32, 64, 128, 256)  # prompt lengths a prefill graph covers; then n_text_ctx
WINDOW_LADDER = (1, 2, 4, 8, 16, 24, 32, 48, 64)  # windows per step graph; more run eagerly


def resolve_dtype(compute_type: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(compute_type, torch.dtype):
        return compute_type
    if compute_type in (None, "default"):
        return torch.float16 if device.type == "cuda" else torch.float32
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(f"compute_type {compute_type!r}: use default, {', '.join(COMPUTE_TYPES)}")
    return COMPUTE_TYPES[compute_type]


def layer_norm(ln: nn.LayerNorm, x: Tensor) -> Tensor:
    # In the compute dtype: the kernel accumulates in fp32 anyway, and the reference's casts to
    # fp32 and back would cost two extra passes over the activations.
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


def encoder_blocks(
    encoder: AudioEncoder, x: Tensor, norm: Callable[[nn.LayerNorm, Tensor], Tensor]
) -> Tensor:
    """The encoder's blocks and final layer norm on x [B, T, D] (after the convolutions and
    positions), attention by SDPA (flash where it can), each layer norm by `norm`."""
    for block in encoder.blocks:
        q, k, v = block.attn.qkv(norm(block.attn_ln, x)).chunk(3, dim=-1)
        H = block.attn.n_head
        a = F.scaled_dot_product_attention(split_heads(q, H), split_heads(k, H), split_heads(v, H))
        x = x + block.attn.out(merge_heads(a))
        x = x + block.mlp(norm(block.mlp_ln, x))
    return norm(encoder.ln_post, x)


# Layer norms and residual adds folded into the step's matmuls (`Runtime._layer_folded`) where
# they can be; the benchmarks set False to compare.
FOLD = True
# At one row, the self-attention's output projection in the attention's kernel
# (`self_attention_out`); the benchmarks set False to compare.
SELF_OUT = True


def current_device(device: torch.device) -> contextlib.AbstractContextManager:
    """Makes `device` the current CUDA device for a block: Triton launches its kernels, and a
    CUDA graph captures, on the current device, not on their tensors' (a model on cuda:1)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _on_device(method: Callable) -> Callable:
    """A `Runtime` method run in inference mode with the runtime's device current (see
    `current_device`)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with torch.inference_mode(), current_device(self.device):
            return method(self, *args, **kwargs)

    return run


@dataclass
class Cross:
    """Cross-attention K,V of `windows` audio windows, held in the runtime's static buffer."""

    windows: int
    features: Tensor  # the encoder output [windows, n_audio_ctx, D]


@dataclass
class Batch:
    """Rows being decoded: `group` rows per window, grouped by window. The per-row state lives on
    the device in the runtime's buffers; the host keeps only the longest row's length, which is
    all it needs to pick a bucket."""

    windows: int
    group: int
    prompt_lengths: list[int]
    max_length: int  # tokens in the longest row's cache
    hidden: Tensor  # final hidden states of the prompt [rows, P, D] (no-speech, word timing)

    @property
    def rows(self) -> int:
        return self.windows * self.group


# Whether searches read their completion flags a step late (`CompletionFlag`). None: where
# the flags are on CUDA; the tests set True to run the late path on the CPU.
READ_LATE: bool | None = None


class CompletionFlag:
    """Whether a search is complete: computed on the device each step, read one step late.

    Reading a device flag at once makes the host wait for the GPU every step, and the GPU then
    idles while the host queues the next step. On CUDA the flag of step t is copied to pinned
    memory as it is computed and read only after step t+1 is queued, so a search that completes
    at step t runs step t+1 too, and undoes it (`decoding.BeamSearch`) or ignores it (greedy,
    whose finished rows only append EOT; `Runtime.beam`, whose steps change nothing once
    done). On the CPU nothing runs ahead: the flag is read at once.
    """

    def __init__(self) -> None:
        self.pending: tuple[Tensor, torch.cuda.Event | None] | None = None
        self.late = False  # whether `read` answers for the step before

    def read(self, flags: Tensor) -> bool:
        """Whether all `flags` were true as of the previous call (`late`) or this one."""
        self.late = flags.is_cuda if READ_LATE is None else READ_LATE
        if not self.late:
            return bool(flags.all())
        if flags.is_cuda:
            host = torch.empty(flags.shape, dtype=torch.bool, pin_memory=True)  # cached by torch
            host.copy_(flags, non_blocking=True)
            event: torch.cuda.Event | None = torch.cuda.Event()
            event.record()
        else:
            host, event = flags.clone(), None
        previous, self.pending = self.pending, (host, event)
        if previous is None:
            return False
        if previous[1] is not None:
            previous[1].synchronize()  # step t's copy, done while the GPU works on step t+1
        return bool(previous[0].all())


@dataclass(frozen=True)
class BeamLoop:
    """What `Runtime.beam`'s step graphs are captured for."""

    beam: int
    max_candidates: int
    eot: int


@dataclass
class BeamResult:
    """`Runtime.beam`'s search: each row's chosen tokens after its prompt [rows, n], their sums
    of log-probabilities, and each window's finished candidates (prompt, tokens, EOT)."""

    tokens: Tensor
    sum_logprobs: Tensor
    finished: BeamFinished


@dataclass
class GreedyResult:
    tokens: Tensor  # [rows, n] sampled tokens; EOT repeats after a row finished
    finished: Tensor  # [rows] bool
    sum_logprobs: Tensor  # [rows] fp32, over the tokens up to and including EOT


class Runtime:
    """See the module docstring. `graphs=None` uses CUDA graphs on a CUDA device."""

    def __init__(
        self,
        model: Whisper,
        compute_type: str | torch.dtype | None = None,
        *,
        max_windows: int = 16,
        max_rows: int | None = None,
        buckets: Sequence[int] = BUCKETS,
        prompt_ladder: Sequence[int] | None = None,
        graphs: bool | None = None,
        encoder_graphs: bool = True,
        fused: bool | None = None,
    ):
        # None: the model's own dtype ("default" is faster-whisper's: float16 on CUDA).
        dtype = model.dtype if compute_type is None else resolve_dtype(compute_type, model.device)
        if model.dtype != dtype:  # a copy: the reference model keeps its weights
            model = copy.deepcopy(model).to(dtype)
        self.model = model.eval()
        self.config = model.config
        self.device, self.dtype = model.device, dtype
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self._capture_stream = torch.cuda.Stream(self.device) if self.graphs else None
        self.encoder_graphs = encoder_graphs and self.graphs
        # The Triton kernels (fused residual + layer norm, self-attention by length) on CUDA.
        on_cuda = triton is not None and (self.device.type == "cuda" or _INTERPRETED)
        self.fused = on_cuda if fused is None else fused and on_cuda
        n_ctx = self.config.n_text_ctx
        self.buckets = sorted({b for b in buckets if b < n_ctx} | {n_ctx})
        # Prompt lengths prefill pads to (then n_ctx): with graphs, one graph per length.
        ladder = (PROMPT_LADDER if self.graphs else ()) if prompt_ladder is None else prompt_ladder
        self.prompt_ladder = sorted(n for n in ladder if n < n_ctx)
        self.n_head = self.config.n_text_head
        self.d_head = self.config.n_text_state // self.n_head
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._rules: TimestampRules | None = None  # `greedy`'s or `beam`'s, while it runs
        self._beam: BeamLoop | None = None  # `beam`'s, while it runs
        self._sample = False  # whether `greedy` samples (temperature > 0), while it runs
        self._prefill_out: dict[tuple, Tensor] = {}  # what each prefill graph writes its hidden to
        self.max_windows = self.max_rows = 0
        self._allocate(max_windows, max_rows or max_windows)
        # Each layer's norms through the matmuls after them, for `_layer_folded`.
        self._norms_through = [
            (
                norm_through(block.attn.qkv.weight, block.attn_ln),
                norm_through(block.cross_attn.query.weight, block.cross_attn_ln),
                norm_through(block.mlp[0].weight, block.mlp_ln),
            )
            for block in self.model.decoder.blocks
        ] if self.fused else []  # fmt: skip

    # --- static buffers --------------------------------------------------------------------

    def _allocate(self, windows: int, rows: int) -> None:
        """(Re)allocate every static buffer; graphs captured over the old ones are dropped."""
        cfg, dev, dt = self.config, self.device, self.dtype
        D, H, T, A = cfg.n_text_state, self.n_head, cfg.n_text_ctx, cfg.n_audio_ctx
        layers = range(cfg.n_text_layer)
        self._graphs.clear()
        self._prefill_out.clear()
        # A fresh memory pool too: the old one goes with the last graph that used it.
        self._pool = torch.cuda.graph_pool_handle() if self.graphs else None
        # No room until every buffer is there: an allocation that fails (out of memory) leaves
        # the next call to allocate again, not to use the buffers of another size it left.
        self.max_windows = self.max_rows = 0
        # Per layer: the cross K,V of each window side by side, as the kv projection writes them.
        self.cross_kv = [torch.zeros(windows, A, 2 * D, device=dev, dtype=dt) for _ in layers]
        # Per layer: self K (heads 0..H-1) and V (heads H..2H-1) of each row at each position;
        # one tensor for all layers, so that beam search reorders them at once.
        self.self_kv = torch.zeros(len(layers), rows, 2 * H, T, self.d_head, device=dev, dtype=dt)
        self.features = torch.zeros(windows, A, cfg.n_audio_state, device=dev, dtype=dt)
        self.mel = torch.zeros(windows, cfg.n_mels, 2 * A, device=dev, dtype=dt)
        # Loop state, one entry per row.
        self.token = torch.zeros(rows, dtype=torch.long, device=dev)  # the token to feed next
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)  # its position = row length
        self.finished = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.sum_logprobs = torch.zeros(rows, dtype=torch.float32, device=dev)
        self.history = torch.zeros(rows, T + 1, dtype=torch.long, device=dev)  # tokens so far
        self.prompt = torch.zeros(rows, T, dtype=torch.long, device=dev)  # prefill's, right-padded
        self.prompt_length = torch.zeros(rows, dtype=torch.long, device=dev)
        self.hidden = torch.zeros(rows, D, device=dev, dtype=dt)
        # The residual stream's band statistics and the counters of the folded step.
        self.stream_stats = StreamStats(
            torch.zeros(D // 16 * rows * 2, device=dev),
            torch.zeros(rows, D, device=dev, dtype=dt),
            torch.zeros(1024, device=dev, dtype=torch.int32),
        )
        self.logits = torch.zeros(rows, cfg.n_vocab, device=dev)
        self.bias = torch.zeros(cfg.n_vocab, device=dev)  # added to the logits: -inf suppresses
        self.eot = torch.zeros((), dtype=torch.long, device=dev)
        # `greedy`'s sampling: its temperature and the seed of the kernels' noise.
        self.temperature = torch.zeros((), device=dev)
        self.seed = torch.zeros((), dtype=torch.long, device=dev)
        self.row_index = torch.arange(rows, device=dev)
        self.head_index = torch.arange(2 * H, device=dev)
        self.key_index = torch.arange(T, device=dev)
        self.reorder_source = torch.zeros(rows, dtype=torch.long, device=dev)  # `reorder`'s graphs'
        # `beam`'s loop: the next beams' tokens so far, the rows they continue, whether the
        # search completed, how many choices it made before, and its finished candidates.
        self.beam_history = torch.zeros(rows, T + 1, dtype=torch.long, device=dev)
        self.beam_source = torch.zeros(rows, dtype=torch.long, device=dev)
        self.beam_done = torch.zeros((), dtype=torch.bool, device=dev)
        self.beam_choices = torch.zeros((), dtype=torch.int32, device=dev)
        self._beam_finished: dict[int, BeamFinished] = {}  # by max_candidates
        self.max_windows, self.max_rows = windows, rows

    def _reserve(self, windows: int, rows: int) -> None:
        if windows > self.max_windows or rows > self.max_rows:
            # `prefill` may grow the rows after `cross` projected its windows: keep those.
            projected, kept = self.cross_kv, self.max_windows
            self._allocate(max(windows, self.max_windows), max(rows, self.max_rows))
            for new, old in zip(self.cross_kv, projected):
                new[:kept].copy_(old[:kept])

    def _loop_state(self) -> list[Tensor]:
        return [self.token, self.pos, self.finished, self.sum_logprobs, self.history, self.logits]

    # --- graphs ----------------------------------------------------------------------------

    def _replay(self, key: tuple, fn: Callable[[], None], repeatable: bool = True) -> None:
        """Run `fn` (which reads and writes only static buffers) through a CUDA graph captured on
        first use (`_capture`); without graphs, run it."""
        if not self.graphs:
            fn()
            return
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._graphs[key] = self._capture(fn, repeatable)
            if not repeatable:
                return
        graph.replay()

    def _capture(self, fn: Callable[[], None], repeatable: bool) -> torch.cuda.CUDAGraph:
        """A CUDA graph of `fn`, after one eager run of it (cuBLAS handles, workspaces, lazy
        kernels). That run must not disturb a decode in flight: the loop state is saved around
        it, and the cache writes it makes are the ones the real run makes. Where a second run
        would not repeat the first (`repeatable=False`: a reorder moves the cache again), the
        eager run is the real one. Both run on the runtime's own stream: torch.cuda.graph's
        default one is made on the device of the first capture in the process, and capturing
        there for a model on another GPU fails."""
        stream, current = self._capture_stream, torch.cuda.current_stream()
        saved = [t.clone() for t in self._loop_state()] if repeatable else []
        stream.wait_stream(current)
        with torch.cuda.stream(stream):
            fn()
        current.wait_stream(stream)
        for t, s in zip(self._loop_state(), saved):
            t.copy_(s)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (the batched pipeline's VAD) may use the GPU meanwhile.
        with torch.cuda.graph(
            graph, pool=self._pool, stream=stream, capture_error_mode="thread_local"
        ):
            fn()
        return graph

    def _padded_windows(self, windows: int) -> int:
        """The ladder size a step graph runs for `windows`; the extra rows compute garbage that
        nothing reads. Eager (exact) beyond the ladder."""
        if not self.graphs:
            return windows
        return next((w for w in WINDOW_LADDER if w >= windows), windows)

    def _bucket(self, length: int) -> int:
        return next(b for b in self.buckets if b >= length)

    # --- encoder and cross K,V -------------------------------------------------------------

    def _encoder(self, mel: Tensor) -> Tensor:
        """The plain encoder, with layer norms in the compute dtype; attention is SDPA (flash)."""
        enc = self.model.encoder
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = self.dtype != torch.float32  # float32 means float32
        try:
            x = F.gelu(enc.conv1(mel))
            x = F.gelu(enc.conv2(x)).transpose(1, 2)
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
        x = (x + enc.positional_embedding).contiguous()
        if self.fused:  # residual adds, biases and layer norms fused: a pass less per sub-layer
            shape, x = x.shape, x.flatten(0, 1)
            h = layer_norm(enc.blocks[0].attn_ln, x)
            for i, block in enumerate(enc.blocks):
                H = block.attn.n_head
                q, k, v = block.attn.qkv(h).view(shape[0], shape[1], -1).chunk(3, dim=-1)
                a = F.scaled_dot_product_attention(
                    split_heads(q, H), split_heads(k, H), split_heads(v, H)
                )
                a = F.linear(merge_heads(a).flatten(0, 1), block.attn.out.weight)
                h = add_layer_norm(x, a, block.attn.out.bias, block.mlp_ln)
                fc1, fc2 = block.mlp[0], block.mlp[2]
                if self.dtype == torch.float32:
                    m = F.gelu(fc1(h))
                else:  # bias and GELU in the matmul's epilogue (cuBLASLt's tanh form: within
                    # fp16 rounding of the exact one) saves a pass over the largest activation
                    m = torch._addmm_activation(fc1.bias, h, fc1.weight.T, use_gelu=True)
                m = F.linear(m, fc2.weight)
                next_ln = enc.blocks[i + 1].attn_ln if i + 1 < len(enc.blocks) else enc.ln_post
                h = add_layer_norm(x, m, fc2.bias, next_ln)
            return h.view(shape)
        return encoder_blocks(enc, x, layer_norm)

    @_on_device
    def encoder(self, mel: Tensor) -> Tensor:
        """Audio features [W, n_audio_ctx, D] of mel windows [W, n_mels, 3000] (a view of a static
        buffer: copy it to keep it past the next call)."""
        W = mel.shape[0]
        mel = mel.to(self.device, self.dtype)
        if not self.encoder_graphs:
            return self._encoder(mel)
        self._reserve(W, self.max_rows)
        self.mel[:W].copy_(mel)

        def run() -> None:
            self.features[:W].copy_(self._encoder(self.mel[:W]))

        self._replay(("encoder", W), run)
        return self.features[:W]

    @_on_device
    def cross(self, features: Tensor) -> Cross:
        """Project each decoder layer's cross K,V of these windows into the static buffer: once per
        window, however many tokens are decoded."""
        W, A, _ = features.shape
        # The step's graphs run a ladder's windows: reserve them now, since growing the buffers
        # later (at the first step) would drop the prefill's caches.
        self._reserve(self._padded_windows(W), self.max_rows)
        flat = features.to(self.dtype).reshape(W * A, -1)
        for block, kv in zip(self.model.decoder.blocks, self.cross_kv):
            proj = block.cross_attn.kv
            torch.addmm(proj.bias, flat, proj.weight.T, out=kv[:W].view(W * A, -1))
        return Cross(W, features)

    def encode(self, mel: Tensor) -> Cross:
        """Mel windows [W, n_mels, 3000] -> the cross K,V of W windows, ready to `prefill`."""
        return self.cross(self.encoder(mel))

    # --- the decoder -----------------------------------------------------------------------

    def _cross_attention(self, attn: CrossAttention, x: Tensor, layer: int, windows: int) -> Tensor:
        return attn.out(self._cross_core(attn, x, layer, windows))

    def _cross_core(self, attn: CrossAttention, x: Tensor, layer: int, windows: int) -> Tensor:
        """Cross-attention before its output projection. x [rows, T, D] or [rows, D], rows
        grouped by window: all queries of a window's rows attend to its K,V in one call, so
        beams read their shared K,V once."""
        H, dh, D = self.n_head, self.d_head, self.config.n_text_state
        if x.dim() == 2 and self.fused and self.dtype != torch.float32:  # a step: Triton
            q = linear(x, attn.query.weight, partial=True)
            return cross_attention(q, attn.query.bias, self.cross_kv[layer], windows, H)
        q = linear(x, attn.query.weight, attn.query.bias) if x.dim() == 2 else attn.query(x)
        q = q.reshape(windows, -1, H, dh).transpose(1, 2)  # [W, H, group * T, dh]
        kv = self.cross_kv[layer][:windows]
        k = kv[..., :D].unflatten(-1, (H, dh)).transpose(1, 2)  # [W, H, A, dh]
        v = kv[..., D:].unflatten(-1, (H, dh)).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(x.shape)

    def _self_attention_step(
        self,
        attn: SelfAttention,
        x: Tensor,
        layer: int,
        write: tuple[Tensor, ...],
        mask: Tensor,
        bucket: int,
    ) -> Tensor:
        """x [rows, 1, D]: write this token's K,V at each row's own position, attend over the
        bucket; `mask` hides the positions past each row's length."""
        R, H, dh, D = x.shape[0], self.n_head, self.d_head, self.config.n_text_state
        qkv = attn.qkv(x[:, 0])  # [R, 3D]
        cache = self.self_kv[layer]
        cache.index_put_(write, qkv[:, D:].view(R, 2 * H, dh))
        q = qkv[:, :D].view(R, H, 1, dh)
        out = F.scaled_dot_product_attention(
            q, cache[:R, :H, :bucket], cache[:R, H:, :bucket], attn_mask=mask
        )
        return attn.out(out.reshape(R, 1, D))

    def _forward(self, rows: int, windows: int, bucket: int) -> None:
        """One decode step of rows [0, rows): feeds self.token at self.pos, writes the K,V there,
        the final hidden state and the logits; then every row's length grows by one."""
        dec = self.model.decoder
        token, pos = self.token[:rows], self.pos[:rows]
        x = (dec.token_embedding(token) + dec.positional_embedding[pos])[:, None]  # [R, 1, D]
        visible = self.key_index[:bucket] <= pos[:, None]  # the past and the token itself
        mask = torch.zeros(rows, 1, 1, bucket, device=x.device, dtype=x.dtype)
        mask.masked_fill_(~visible[:, None, None], float("-inf"))
        write = (self.row_index[:rows, None], self.head_index[None, :], pos[:, None])
        for i, block in enumerate(dec.blocks):
            x = x + self._self_attention_step(
                block.attn, layer_norm(block.attn_ln, x), i, write, mask, bucket
            )
            x = x + self._cross_attention(
                block.cross_attn, layer_norm(block.cross_attn_ln, x), i, windows
            )
            x = x + block.mlp(layer_norm(block.mlp_ln, x))
        hidden = layer_norm(dec.ln, x[:, 0])
        self.hidden[:rows].copy_(hidden)
        self.logits[:rows].copy_(dec.logits(hidden))
        pos += 1

    def _forward_fused(self, rows: int, windows: int, select: bool) -> None:
        """`_forward` with the Triton kernels: the embedding and the first layer norm are one
        kernel; each residual add, the bias of the projection before it and the next layer norm
        are one; self-attention writes the token's K,V and attends up to each row's own length
        in one; cross-attention is split over the keys and joined. On Hopper the kernels chain
        by programmatic dependent launch (see USE_PDL). `select`: then the greedy choice
        (`_select`), in the logits matmul's epilogue where the layers fold."""
        dec = self.model.decoder
        token, pos = self.token[:rows], self.pos[:rows]
        blocks = dec.blocks
        embedding = dec.token_embedding
        data, scale = weight_and_scale(embedding.weight)
        x, h = embed_layer_norm(
            token, pos, data, dec.positional_embedding, blocks[0].attn_ln, scale
        )
        folds = self._folds(rows)
        layer = self._layer_folded if folds else self._layer_fused
        for i, block in enumerate(blocks):
            last = i + 1 == len(blocks)
            next_ln = dec.ln if last else blocks[i + 1].attn_ln
            h = layer(block, i, x, h, windows, next_ln, last)
        if select and folds and self._rules is None:
            return self._logits_select(h, rows)
        if scale is None:
            linear(h, embedding.weight, out=self.logits[:rows])
        else:
            self.logits[:rows].copy_(dec.logits(h))
        pos += 1
        if select:
            self._select(rows)

    def _layer_fused(
        self, block: nn.Module, i: int, x: Tensor, h: Tensor, windows: int,
        next_ln: nn.LayerNorm, last: bool,
    ) -> Tensor:  # fmt: skip
        """Decoder layer i of `_forward_fused` as separate kernels: x [rows, D] is updated in
        place, h = its first layer norm on entry; returns next_ln(x) (self.hidden if last)."""
        rows = x.shape[0]
        qkv = block.attn.qkv
        a = decode_attention(
            linear(h, qkv.weight), qkv.bias, self.self_kv[i], self.pos[:rows], self.n_head
        )
        out = block.attn.out
        h = add_layer_norm(x, linear(a, out.weight, partial=True), out.bias, block.cross_attn_ln)
        c = self._cross_core(block.cross_attn, h, i, windows)
        out = block.cross_attn.out
        h = add_layer_norm(x, linear(c, out.weight, partial=True), out.bias, block.mlp_ln)
        fc1, fc2 = block.mlp[0], block.mlp[2]
        m = linear(h, fc1.weight, fc1.bias, gelu=True)
        m = linear(m, fc2.weight, partial=True)
        return add_layer_norm(x, m, fc2.bias, next_ln, out=self.hidden[:rows] if last else None)

    def _folds(self, rows: int) -> bool:
        """Whether a step of `rows` runs `_layer_folded`: where `linear` streams the weights
        (the Triton kernels, half precision, up to 16 rows)."""
        half = self.dtype != torch.float32
        return FOLD and self.fused and half and rows <= 16

    def _layer_folded(
        self, block: nn.Module, i: int, x: Tensor, h: Tensor, windows: int,
        next_ln: nn.LayerNorm, last: bool,
    ) -> Tensor | None:  # fmt: skip
        """`_layer_fused` in 9 kernels instead of 12 (8 at one row: `self_attention_out`):
        each residual add is the epilogue of the matmul before it, and each layer norm the
        epilogue of the matmul after it, from what the first leaves in self.stream_stats
        (`_skinny_linear_kernel`). h is used by the
        first layer only (the embedding kernel's norm); returns next_ln(x) in self.hidden if
        last."""
        rows, stats = x.shape[0], self.stream_stats
        stream = functools.partial(folded_linear, stats=stats)
        scaled = stats.scaled[:rows]  # x times the next norm's weight
        qkv_norm, query_norm, fc1_norm = self._norms_through[i]
        qkv, out = block.attn.qkv, block.attn.out
        q = stream(h, qkv.weight) if i == 0 else stream(scaled, qkv.weight, norm=qkv_norm)
        residual = (x, block.cross_attn_ln.weight)
        if rows == 1 and SELF_OUT:  # one stage: see `self_attention_out`
            cache, pos = self.self_kv[i], self.pos[:1]
            self_attention_out(
                q, qkv.bias, cache, pos, self.n_head, out.weight, out.bias, residual=residual,
                stats=stats,
            )  # fmt: skip
        else:
            a = decode_attention(q, qkv.bias, self.self_kv[i], self.pos[:rows], self.n_head)
            stream(a, out.weight, out.bias, residual=residual)
        query, out = block.cross_attn.query, block.cross_attn.out
        q = stream(scaled, query.weight, partial=True, norm=query_norm)
        c = cross_attention(q, query.bias, self.cross_kv[i], windows, self.n_head)
        stream(c, out.weight, out.bias, residual=(x, block.mlp_ln.weight))
        fc1, fc2 = block.mlp[0], block.mlp[2]
        m = stream(scaled, fc1.weight, fc1.bias, gelu=True, norm=fc1_norm)
        if last:  # the step's final norm is kept in self.hidden
            m = linear(m, fc2.weight, partial=True)
            return add_layer_norm(x, m, fc2.bias, next_ln, out=self.hidden[:rows])
        stream(m, fc2.weight, fc2.bias, residual=(x, next_ln.weight))
        return None

    def _logits_select(self, h: Tensor, rows: int) -> None:
        """The logits of h [rows, D] by the embedding with `_select` and the step's `pos += 1`
        in the matmul's epilogue (`_logits_select_kernel`), in the config `linear` picks."""
        w = self.model.decoder.token_embedding.weight
        block_n, block_k, warps, stages = stream_config(h, w)
        data, scale = weight_and_scale(w)
        N = self.config.n_vocab  # quantize's embedding may have rows past it
        bands = triton.cdiv(N, block_n)
        parts, index = self._choice_parts(bands, rows)
        kernels._logits_select_kernel[(bands, triton.cdiv(rows, 16))](
            h, data, scale if scale is not None else data, self.logits, parts, index,
            self.stream_stats.counters, self.bias, self.token, self.pos, self.finished,
            self.sum_logprobs, self.history, self.eot, self.seed, self.temperature,
            self.history.stride(0), rows, N, bands, K=data.shape[1],
            **scale_layout(scale, data.shape[1]), BLOCK_M=16, BLOCK_N=block_n, BLOCK_K=block_k,
            BLOCK_BANDS=256, LINE=128 // data.element_size(), SAMPLE=self._sample,
            num_warps=warps, num_stages=stages, **_launch(h),
        )  # fmt: skip

    def _choice_parts(self, bands: int, rows: int) -> tuple[Tensor, Tensor]:
        """`_choose_band`'s scratch for `bands` bands of `rows` rows: each band's value, sum
        of exp and draw's key [3, bands, rows], and its chosen id [bands, rows]."""
        parts = torch.empty(3, bands, rows, device=self.device, dtype=torch.float32)
        return parts, torch.empty(bands, rows, device=self.device, dtype=torch.int32)

    def _select(self, rows: int) -> None:
        """The choice from self.logits + self.bias, as `decoding.GreedySearch`'s: the argmax, or
        while `greedy` samples a draw at self.temperature (the Gumbel-max trick); finished rows
        repeat EOT and stop adding log-probabilities (untempered, as openai-whisper's)."""
        if self.fused:  # one kernel, one pass over the logits
            if self._rules is not None:  # `greedy`'s timestamp rules first, on logits + bias
                per_row = (self.prompt_length, self.pos)  # the sampled tokens: after the prompt
                rules, bias = self._rules, self.bias
                timestamp_rules(self.logits[:rows], self.history, rules, per_row=per_row, bias=bias)
            V, block_m = self.config.n_vocab, min(triton.next_power_of_2(rows), 8)
            block_v = CHOICE_TILE // block_m
            bands = triton.cdiv(V, block_v)
            parts, index = self._choice_parts(bands, rows)
            kernels._greedy_select_kernel[(bands, triton.cdiv(rows, block_m))](
                self.logits, self.bias, parts, index, self.stream_stats.counters, self.token,
                self.pos, self.finished, self.sum_logprobs, self.history, self.eot, self.seed,
                self.temperature, self.history.stride(0), rows, bands, V=V, BLOCK_M=block_m,
                BLOCK_V=block_v, BLOCK_BANDS=128, SAMPLE=self._sample, num_warps=4,
                **_launch(self.logits),
            )  # fmt: skip
            return
        logits = self.logits[:rows] + self.bias
        if self._sample:  # the default generator: torch.manual_seed repeats it
            noise = -torch.log(-torch.log(torch.rand_like(logits).clamp_min(1e-20)))
            token = (logits + self.temperature * noise).argmax(dim=-1)
        else:
            token = logits.argmax(dim=-1)
        logprob = logits.gather(1, token[:, None])[:, 0] - logits.logsumexp(dim=-1)
        finished = self.finished[:rows]
        self.sum_logprobs[:rows] += torch.where(finished, 0.0, logprob)
        token = torch.where(finished, self.eot, token)
        self.history[:rows].scatter_(1, self.pos[:rows, None], token[:, None])
        finished |= token == self.eot
        self.token[:rows].copy_(token)

    def _run_step(self, batch: Batch, select: bool) -> None:
        if batch.max_length >= self.config.n_text_ctx:
            raise ValueError(f"the rows are full: {self.config.n_text_ctx} tokens is the context")
        windows = self._padded_windows(batch.windows)
        rows = windows * batch.group
        bucket = 0 if self.fused else self._bucket(batch.max_length + 1)  # fused: any length
        self._reserve(windows, rows)

        def run() -> None:
            if self.fused:
                self._forward_fused(rows, windows, select)
                return
            self._forward(rows, windows, bucket)
            if select:
                self._select(rows)

        rules = self._rules if select else None
        beam = self._beam if select else None
        sample = self._sample and select
        if beam is not None:  # the beam loop's step: the choice and the reorder in the graph

            def run() -> None:
                self._forward_fused(rows, windows, select=False)
                self._beam_choice(rows)

        key = ("step", select, windows, batch.group, bucket, rules, beam, sample)
        self._replay(key, run, repeatable=beam is None)  # a reorder moves the cache again
        batch.max_length += 1

    @_on_device
    def prefill(
        self, cross: Cross, prompts: Sequence[Sequence[int]] | Tensor, group: int = 1
    ) -> Batch:
        """Start `group` rows per window of `cross` with their prompts (lengths may differ),
        filling their self K,V caches; self.logits[:rows] then scores each row's next token."""
        W = cross.windows
        R = W * group
        if len(prompts) != R:
            raise ValueError(f"{len(prompts)} prompts for {W} windows x {group} rows each")
        if isinstance(prompts, Tensor):
            tokens = prompts.to(self.device, torch.long)
            lengths = [tokens.shape[1]] * R
        else:  # right-padded: a row's padding sits past its length, where the mask hides it
            lengths = [len(p) for p in prompts]
            tokens = torch.zeros(R, max(lengths), dtype=torch.long)
            for r, p in enumerate(prompts):
                tokens[r, : lengths[r]] = torch.as_tensor(p, dtype=torch.long)
            tokens = tokens.to(self.device)
        P = max(lengths)
        if min(lengths) < 1 or P >= self.config.n_text_ctx:
            raise ValueError(f"prompts need 1 to {self.config.n_text_ctx - 1} tokens")
        windows = self._padded_windows(W)  # as the steps will run them (see `cross`)
        self._reserve(windows, windows * group)
        self.prompt[:R].zero_()
        self.prompt[:R, :P].copy_(tokens)
        self.prompt_length[:R].copy_(torch.as_tensor(lengths))
        # Padded to the ladder: the padding past a row's tokens is causal-masked from them, and
        # steps overwrite its K,V.
        ladder = self.prompt_ladder
        padded = next((n for n in ladder if n >= P), self.config.n_text_ctx) if ladder else P
        if self.graphs:  # a graph per (windows, rows per window, padded length)
            key = ("prefill", W, group, padded)

            def run() -> None:  # the captured run's output is what the replays write
                self._prefill_out[key] = self._prefill(W, R, padded)

            self._replay(key, run)
            # The graph's own buffer, which its next replay rewrites: a copy.
            hidden = self._prefill_out[key][:, :P].clone()
        else:
            hidden = self._prefill(W, R, padded)[:, :P]
        return Batch(W, group, lengths, P, hidden)

    def _prefill(self, W: int, R: int, P: int) -> Tensor:
        """`prefill` of R rows of W windows from self.prompt[:R, :P] (each row's length in
        self.prompt_length): the final hidden states [R, P, D]."""
        dec, H, dh, D = self.model.decoder, self.n_head, self.d_head, self.config.n_text_state
        tokens, length = self.prompt[:R, :P], self.prompt_length[:R]
        x = dec.token_embedding(tokens) + dec.positional_embedding[:P]
        for i, block in enumerate(dec.blocks):
            qkv = block.attn.qkv(layer_norm(block.attn_ln, x))  # [R, P, 3D]
            cache = self.self_kv[i]
            cache[:R, :, :P] = qkv[..., D:].unflatten(-1, (2 * H, dh)).transpose(1, 2)
            q = qkv[..., :D].unflatten(-1, (H, dh)).transpose(1, 2)
            a = F.scaled_dot_product_attention(
                q, cache[:R, :H, :P], cache[:R, H:, :P], is_causal=P > 1
            )  # causal: padding sits after a row's tokens, so no real token sees it
            x = x + block.attn.out(merge_heads(a))
            x = x + self._cross_attention(
                block.cross_attn, layer_norm(block.cross_attn_ln, x), i, W
            )
            x = x + block.mlp(layer_norm(block.mlp_ln, x))
        hidden = layer_norm(dec.ln, x)
        last = hidden[torch.arange(R, device=self.device), length - 1]
        self.hidden[:R].copy_(last)
        self.logits[:R].copy_(dec.logits(last))
        self.pos.zero_()  # rows past R (graph padding) write at 0, which nothing reads
        self.pos[:R].copy_(length)
        self.token.zero_()
        self.history[:R, :P].copy_(tokens)
        self.finished.zero_()
        self.sum_logprobs.zero_()
        return hidden

    @_on_device
    def step(self, batch: Batch, tokens: Tensor) -> Tensor:
        """Feed one token per row [rows]; returns the logits of the next [rows, n_vocab] (a view
        of a static buffer, valid until the next step)."""
        self.token[: batch.rows].copy_(tokens.reshape(-1))
        self._run_step(batch, select=False)
        return self.logits[: batch.rows]

    @_on_device
    def reorder(self, batch: Batch, source: Tensor) -> None:
        """Beam search: row i continues row source[i] (rows of the same window). With graphs,
        as a CUDA graph per (rows, length rounded up to 32): its ~14 kernels cost the host
        ~0.2-0.6 ms a step as calls (beam search on the GPU is bound by the host's time)."""
        R, n = batch.rows, batch.max_length
        if self.graphs:  # positions past a row's length are never read: copying them is harmless
            n = min(-(-n // 32) * 32, self.config.n_text_ctx)
        self.reorder_source[:R].copy_(source)
        self._replay(("reorder", R, n), lambda: self._reorder(R, n), repeatable=False)

    def _reorder(self, R: int, n: int) -> None:
        source = self.reorder_source[:R]
        # Every layer's K,V at once: a gather and a copy per layer cost as much as the step
        # itself (large-v3, 5 beams: 1.06 ms against 1.66; RESULTS, session 23).
        cache = self.self_kv
        if self.fused and cache[:, :R, :, :n].nbytes > REORDER_COPY_BYTES:
            reorder_rows(cache, source, n)
        else:
            cache[:, :R, :, :n] = cache[:, source, :, :n]
        for state in self._loop_state():
            state[:R] = state[source]

    @_on_device
    def greedy(
        self,
        batch: Batch,
        max_new_tokens: int,
        eot: int,
        suppress: Sequence[int] = (),
        suppress_first: Sequence[int] = (),
        rules: TimestampRules | None = None,
        stop: bool = True,
        temperature: float = 0.0,
    ) -> GreedyResult:
        """Greedy decoding of every row from the prefill's logits, all on the device; at a
        `temperature` above 0, sampling (`decoding.GreedySearch`'s): each row draws each token
        from softmax(logits / temperature), with noise seeded from torch's default generator,
        so `torch.manual_seed` repeats a decode on one device.

        `suppress` tokens are never chosen; `suppress_first` adds to them for the first token
        (decoding's SuppressBlank); `rules`: decoding's timestamp rules apply before each choice
        (the fused step only). Whether all rows finished comes to the host a step late
        (`CompletionFlag`) to stop, unless `stop` is False (a forced length, for benchmarks).
        """
        if rules is not None and not self.fused:
            raise ValueError(
                "the timestamp rules run on the device with CUDA only (the fused step); on the "
                "CPU decode through RuntimeWhisper and decoding.decode"
            )
        self._rules, self._sample = rules, temperature > 0
        if self._sample:
            self.temperature.fill_(temperature)
            self.seed.fill_(int(torch.randint(0, 2**62, ())))
        try:
            return self._greedy(batch, max_new_tokens, eot, suppress, suppress_first, stop)
        finally:
            self._rules, self._sample = None, False

    def _loop(
        self, batch: Batch, max_new_tokens: int, suppress: Sequence[int],
        suppress_first: Sequence[int], first_choice: Callable[[], None], done: Tensor, stop: bool,
    ) -> int:  # fmt: skip
        """`greedy`'s and `beam`'s run: `first_choice` from the prefill's logits, then steps
        (each with its choice) until all of `done` is true, read a step late, or until
        `max_new_tokens` choices or the context is full; returns the number of choices."""
        self._suppress([*suppress, *suppress_first])
        first_choice()
        self._suppress(suppress)
        n = min(max_new_tokens, self.config.n_text_ctx - batch.max_length)
        complete = CompletionFlag()
        for i in range(1, n):
            self._run_step(batch, select=True)
            if stop and complete.read(done):
                return i + 1
        return n

    def _suppress(self, tokens: Sequence[int]) -> None:
        """The loops' bias: -inf for `tokens`, never chosen."""
        bias = torch.zeros(self.config.n_vocab)
        bias[list(tokens)] = float("-inf")
        self.bias.copy_(bias)

    def _greedy(
        self,
        batch: Batch,
        max_new_tokens: int,
        eot: int,
        suppress: Sequence[int],
        suppress_first: Sequence[int],
        stop: bool,
    ) -> GreedyResult:
        R = batch.rows
        self.eot.fill_(eot)
        n = self._loop(
            batch, max_new_tokens, suppress, suppress_first, lambda: self._select(R),
            self.finished[:R], stop,
        )  # fmt: skip
        start = torch.tensor(batch.prompt_lengths, device=self.device)[:, None]
        index = start + torch.arange(n, device=self.device)
        return GreedyResult(
            self.history[:R].gather(1, index),
            self.finished[:R].clone(),
            self.sum_logprobs[:R].clone(),
        )

    @_on_device
    def beam(
        self,
        batch: Batch,
        max_candidates: int,
        max_new_tokens: int,
        eot: int,
        suppress: Sequence[int] = (),
        suppress_first: Sequence[int] = (),
        rules: TimestampRules | None = None,
        stop: bool = True,
    ) -> BeamResult:
        """`decoding.BeamSearch` over the batch's rows (`batch.group` beams a window) from the
        prefill's logits, all on the device (the fused step only): each step's graph runs the
        step, the filters (`suppress`, the timestamp `rules`), the choice (`_beam_kernels`)
        and the reorder of the caches, so the host only replays it. The search completes once
        every window has `max_candidates` finished candidates, and the steps after it change
        nothing: the host reads that flag a step late (`CompletionFlag`) to stop, unless `stop`
        is False (a forced length)."""
        if not self.fused:
            raise ValueError(
                "the beam loop runs on the device with CUDA only (the fused step); on the CPU "
                "decode through RuntimeWhisper and decoding.decode"
            )
        beam, W = batch.group, batch.windows
        finished = self._beam_finished.get(max_candidates)
        if finished is None:
            slots, width = max_candidates + 1, self.config.n_text_ctx + 1
            tokens = torch.zeros(
                self.max_windows, slots, width, dtype=torch.long, device=self.device
            )
            zeros = torch.zeros(self.max_windows, slots, device=self.device)
            count = torch.zeros(self.max_windows, dtype=torch.long, device=self.device)
            finished = BeamFinished(tokens, zeros.long(), zeros, count)
            self._beam_finished[max_candidates] = finished
        finished.count.zero_()
        finished.count[W:].fill_(max_candidates)  # the graphs' padding windows: complete
        self.beam_done.zero_()
        self.beam_choices.zero_()
        self._beam, self._rules = BeamLoop(beam, max_candidates, eot), rules
        try:
            self._loop(
                batch, max_new_tokens, suppress, suppress_first,
                lambda: self._beam_choice(batch.rows, batch.max_length), self.beam_done, stop,
            )  # fmt: skip
        finally:
            self._beam = self._rules = None
        R, choices = batch.rows, int(self.beam_choices)
        start = torch.tensor(batch.prompt_lengths, device=self.device)[:, None]
        index = start + torch.arange(choices, device=self.device)
        kept = BeamFinished(*(t[:W].clone() for t in vars(finished).values()))
        return BeamResult(self.history[:R].gather(1, index), self.sum_logprobs[:R].clone(), kept)

    def _beam_choice(self, rows: int, prompt_length: int | None = None) -> None:
        """One choice of `beam`'s loop from self.logits[:rows] + self.bias: the timestamp rules,
        the next beams (tokens into self.history, sums into self.sum_logprobs, their last
        tokens into self.token), the finished candidates, and the self K,V reordered. The
        first choice, from the prefill's logits, is told the longest prompt: its reorder then
        copies that many positions, not the whole context (it runs outside the graphs, whose
        pool already holds a copy's scratch)."""
        loop = self._beam
        assert loop is not None
        logits = self.logits[:rows]
        first = prompt_length is not None
        if self._rules is not None:
            per_row = (self.prompt_length, self.pos)  # the sampled tokens: after the prompt
            timestamp_rules(logits, self.history, self._rules, per_row=per_row, bias=self.bias)
        finished = self._beam_finished[loop.max_candidates]
        done = self.beam_done
        _beam_kernels(
            logits, self.bias, self.history, self.beam_history, self.beam_source,
            self.sum_logprobs, self.sum_logprobs, finished, loop.beam, loop.eot, first,
            self.config.n_text_ctx, loop=(self.pos, self.token, done),
        )  # fmt: skip
        self.beam_choices += ~done  # this choice counts: the search was not complete
        done |= (finished.count[: rows // loop.beam] >= loop.max_candidates).all()
        length = prompt_length if first else self.pos[:rows]  # positions cached
        reorder_rows(self.self_kv, self.beam_source[:rows], length)
        self.history[:rows].copy_(self.beam_history[:rows])


# --- decoding.decode on the runtime ---------------------------------------------------------


class RuntimeCache:
    """What `decoding.Inference` holds as its cache, backed by the runtime's buffers."""

    def __init__(self, runtime: Runtime, cross: Cross, group: int, padding: Tensor | None):
        self.runtime, self.cross, self.group = runtime, cross, group
        self.padding = padding  # [rows] left padding of decoding's prompts, see KVCache
        self.batch: Batch | None = None

    def prefill(self, tokens: Tensor) -> Tensor:
        """Start the rows with decoding's (left-padded) prompts; their final hidden states
        [rows, P, D] laid out as the prompts were. The runtime takes prompts of different
        lengths as they are (right-padded, each row's positions its own)."""
        if self.padding is None:
            self.batch = self.runtime.prefill(self.cross, tokens, self.group)
            return self.batch.hidden
        pad = self.padding.tolist()
        prompts = [row[p:] for row, p in zip(tokens.tolist(), pad)]
        self.batch = self.runtime.prefill(self.cross, prompts, self.group)
        P = tokens.shape[1]  # column c of a row is its token c - pad: shift the hidden back
        index = (torch.arange(P, device=tokens.device) - self.padding[:, None]).clamp(min=0)
        hidden = self.batch.hidden
        return hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1]))

    @property
    def length(self) -> int:
        return 0 if self.batch is None else self.batch.max_length

    def reorder(self, source: Tensor) -> None:
        assert self.batch is not None
        self.runtime.reorder(self.batch, source)


class RuntimeDecoder(nn.Module):
    """The `TextDecoder` interface that `decoding` uses, with cached calls going to the runtime.
    Uncached calls (language detection, word timestamps) use the plain decoder."""

    def __init__(self, runtime: Runtime):
        super().__init__()
        self.runtime = runtime
        self.plain = runtime.model.decoder

    def new_cache(
        self,
        audio_features: Tensor,
        repeats: int = 1,
        max_length: int | None = None,
        padding: Tensor | None = None,
    ) -> RuntimeCache:
        return RuntimeCache(self.runtime, self.runtime.cross(audio_features), repeats, padding)

    def forward(
        self,
        tokens: Tensor,
        cache: RuntimeCache | None = None,
        audio_features: Tensor | None = None,
        cross_weights: list[Tensor] | None = None,
    ) -> Tensor:
        if cache is None:
            return self.plain(tokens, audio_features=audio_features, cross_weights=cross_weights)
        if cache.batch is None:
            return cache.prefill(tokens)
        assert tokens.shape[1] == 1, "one token per row after the prompt"
        self.runtime.step(cache.batch, tokens[:, 0])
        return self.runtime.hidden[: tokens.shape[0], None]

    def search(
        self,
        cache: RuntimeCache,
        prompts: Tensor,
        sot_index: int,
        max_new_tokens: int,
        eot: int,
        suppress: Sequence[int],
        suppress_first: Sequence[int],
        rules: TimestampRules | None = None,
        max_candidates: int | None = None,
        temperature: float = 0.0,
    ) -> tuple[Tensor, Tensor, BeamFinished | None, Tensor]:
        """`decoding.decode`'s loop all on the device: greedy or sampling at `temperature`
        (`Runtime.greedy`), or with
        `max_candidates` beam search (`Runtime.beam`; where `timestamp_rules_on_device`), laid
        out as decoding keeps it: the rows' tokens [rows, P + n] after decoding's left-padded
        `prompts` [rows, P] (greedy: EOT repeats after a row finished), their sums of
        log-probabilities, beam search's finished candidates (each after its window's prompt
        row; None for greedy), and the probabilities at the start-of-transcript position (for
        the no-speech figure). `rules`: the timestamp rules, where `timestamp_rules_on_device`."""
        hidden = cache.prefill(prompts)
        sot_probs = self.plain.logits(hidden[:, sot_index]).float().softmax(dim=-1)
        batch = cache.batch
        assert batch is not None
        args = (max_new_tokens, eot, suppress, suppress_first)
        if max_candidates is None:
            greedy = self.runtime.greedy(batch, *args, rules=rules, temperature=temperature)
            tokens = torch.cat([prompts, greedy.tokens], dim=1)
            return tokens, greedy.sum_logprobs, None, sot_probs
        result = self.runtime.beam(batch, max_candidates, *args, rules=rules)
        tokens = torch.cat([prompts, result.tokens], dim=1)
        # A window's candidates hold its own prompt (the runtime's rows are right-padded):
        # decoding's left-padded prompt row goes first instead.
        finished, P = result.finished, prompts.shape[1]
        W, slots, width = finished.tokens.shape
        length = torch.tensor(batch.prompt_lengths[:: cache.group], device=prompts.device)
        column = torch.arange(P + width, device=prompts.device) - P  # [P + width]
        index = (column + length[:, None]).clamp(0, width - 1)  # after each window's prompt
        moved = finished.tokens.gather(2, index[:, None].expand(W, slots, -1))
        moved[:, :, :P] = prompts[:: cache.group, None]
        lengths = finished.lengths + (P - length)[:, None]
        moved = BeamFinished(moved, lengths, finished.scores, finished.count)
        return tokens, result.sum_logprobs, moved, sot_probs

    @property
    def timestamp_rules_on_device(self) -> bool:
        return self.runtime.fused

    def logits(self, hidden: Tensor) -> Tensor:
        static = self.runtime.hidden
        if hidden.data_ptr() == static.data_ptr() and hidden.dim() == 2:  # the step's: computed
            return self.runtime.logits[: hidden.shape[0]].clone()
        return self.plain.logits(hidden)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.plain, name)


class RuntimeWhisper(nn.Module):
    """A `Whisper` for `decoding.decode` whose cached decoder is the runtime."""

    def __init__(self, runtime: Runtime):
        super().__init__()
        self.runtime = runtime
        self.config = runtime.config
        self.encoder = runtime.model.encoder
        self.decoder = RuntimeDecoder(runtime)

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    @property
    def dtype(self) -> torch.dtype:
        return self.runtime.dtype
