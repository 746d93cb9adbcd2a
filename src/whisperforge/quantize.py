"""Quantized weights: int8 and fp8 linears swapped into the plain model at load time.

In the spirit of gpt-fast's `WeightOnlyInt8QuantHandler`: after the model is built, its
`nn.Linear` modules are replaced by modules that hold quantized weights with one scale per
output channel (w ~ q * scale[n], symmetric, absmax / 127 for int8, absmax / 448 for fp8 e4m3).
The network code does not change; on a GPU the runtime's `linear()` seam hands a
`QuantizedWeight` to its kernel here.

What is quantized, and how (`compute_type`, faster-whisper's names plus `float8`):

- `int8` on the CPU: every linear of the encoder and decoder, and the tied logits projection,
  becomes an `Int8Linear`: fbgemm's dynamic int8 GEMM (int8 weights, activations quantized per
  call), about 2-3x float32 in the encoder's GEMMs and 7x in the logits GEMV. Three choices keep
  its words those of float32 (within 0.21 points for tiny.en and base on the dev clips, level on
  the 19-minute file; torch.ao's recipe was 0.54-0.97 worse; benchmarks/RESULTS.md, 2026-11-23):
  activations get a scale per row (per audio frame or token, not one for the whole window); the
  decoder's step linears take their call's 8 largest input channels in float (LLM.int8's
  outliers); and activations get 8 bits, not torch's default 7, wherever fbgemm's kernel cannot
  overflow with them (VNNI; see `int8_overflows`). The price: a greedy step's linears cost more
  than float32's (~190 vs ~65 us at one row on AVX2), so int8 transcribes 1.35x faster than
  float32 on an AVX2 CPU, not 1.68x as without these choices (on an AVX-512 VNNI one, greedy,
  0.78x float32's time and 0.75x faster-whisper int8's; RESULTS.md, session 41).
- `int8`, `int8_float16`, `int8_bfloat16` on CUDA: weight-only int8 for the decoder's per-step
  linears (fp16/bf16 activations), through a Triton stream kernel for up to 64 rows (a step's,
  in the config tuned for the matmul's role) and dequantize + cuBLAS for more. The encoder
  and the cross K,V projection run once per window at 1500+ rows, compute-bound, and stay
  float.
- `float8` (Ada/Hopper): the same linears as fp8 e4m3 weights, multiplied by
  `torch._scaled_mm` with each activation row quantized to fp8 on the fly (its own scale), or,
  for up to 64 rows (a decode step's), by the Triton stream kernel with the fp8 weights widened
  in registers (weight-only: the activations stay 16-bit). e4m3 keeps 3 mantissa bits a
  weight; with the last layer's fc2 int8, as the embedding is (`weight_format`), float8 is
  within 0.3 WER points of float16 and float32 on the dev clips for tiny.en and base on the
  GPU, as int8 is (a mean over five equally good draws of the weights; benchmarks/RESULTS.md,
  session 35).

The token embedding, which is also the output projection (tied logits), is quantized too, to
int8 under every compute type (`weight_format`, `QuantizedEmbedding`): it is the largest single
matrix, 71 % of the weights a decode step reads for tiny.en, 42 % for large-v3-turbo (8 % for
large-v3), so leaving it float would cap a step's speed-up well short of 2x.

The embedding's int8 scales are one per 64 columns of each vocabulary row (`EMBEDDING_GROUP`):
with one per row it cost tiny.en on the GPU most of its clips whose text differs from
float32's (44 of 53 alike, 47 per 64 columns, at float16's WER on the clips); the float32 scales
add 1/16 to its bytes, and the stream kernel scales each group's sums as it goes
(`kernels._stream_tile`). The CPU's fbgemm takes one scale per row, so there `Int8Linear`
re-quantizes the rows per row for the logits. The step linears keep one scale per output
channel: per 64 columns they cost the GPU's int8 step 14-16 % at one row, and per 64 or 32
left tiny.en's WER where it was (benchmarks/RESULTS.md, session 21: on the 19-minute file,
int8 costs tiny.en what random noise of int8's size on the float32 weights costs it, ~0.4
points, whatever the scales' layout; base, nothing).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .errors import InvalidOptionError
from .kernels import StreamConfig, skinny_linear, tl, triton, tuned_config  # triton: None on CPUs
from .model import Whisper

# name -> (activation dtype, None for the device's default; quantized weights, None for float)
COMPUTE_TYPES: dict[str, tuple[torch.dtype | None, str | None]] = {
    "float32": (torch.float32, None),
    "float16": (torch.float16, None),
    "bfloat16": (torch.bfloat16, None),
    "int8": (None, "int8"),
    "int8_float32": (torch.float32, "int8"),
    "int8_float16": (torch.float16, "int8"),
    "int8_bfloat16": (torch.bfloat16, "int8"),
    "float8": (None, "float8"),
}
QMAX = {"int8": 127.0, "float8": 448.0}  # the largest magnitude each weight format holds
EMBEDDING = "decoder.token_embedding.weight"
EMBEDDING_GROUP = 64  # columns per scale of the token embedding (see above)
# The decoder's linears that run at every decode step (the cross K,V projection runs per window).
STEP_LINEARS = ("attn.qkv", "attn.out", "cross_attn.query", "cross_attn.out", "mlp.0", "mlp.2")
LAST_STEP_LINEAR = STEP_LINEARS[-1]  # fc2: in the last layer, int8 under float8 (`weight_format`)
# The CPU's int8: each step linear keeps its call's 8 largest input channels in float
# (Int8Linear). Only in attn.out, cross_attn.out and mlp.2 is 1.26x faster on long-form, but base
# then falls 0.32 points behind float32 on the dev clips (all six: 0.21; RESULTS.md).
OUTLIER_COLUMNS = 8


@dataclass(frozen=True)
class ComputeType:
    dtype: torch.dtype  # activations, and the weights that stay float
    weights: str | None  # "int8" or "float8"; None: float weights


def has_fp8(device: torch.device) -> bool:
    """Whether `device` has fp8 tensor cores (Ada, Hopper), which float8 weights need."""
    return (
        device.type == "cuda"
        and torch.cuda.is_available()
        and torch.cuda.get_device_capability(device) >= (8, 9)
    )


def resolve_compute_type(
    compute_type: str, device: torch.device, saved: str | None = None
) -> ComputeType:
    """`compute_type` on `device`. "default" is the type a quantized checkpoint was saved for
    (`saved`), else float16 on CUDA and float32 on the CPU. On the CPU, 16-bit activations
    fall back to float32, with a warning when asked for by name (CTranslate2 refuses them there
    and falls back only for "default"). "auto" is
    CTranslate2's "the fastest type here": int8 on the CPU (0.78x float32's time, RESULTS.md
    session 41), float16 on CUDA (int8 and float8 steps gain at most 7 %, session 45)."""
    name = saved if compute_type == "default" and saved else compute_type
    if name == "auto":
        name = "int8" if device.type == "cpu" else "float16"
    if name == "default":
        return ComputeType(torch.float16 if device.type == "cuda" else torch.float32, None)
    if name not in COMPUTE_TYPES:
        raise InvalidOptionError(
            f"unsupported compute_type {name!r}; use one of default, auto, "
            f"{', '.join(COMPUTE_TYPES)}"
        )
    dtype, weights = COMPUTE_TYPES[name]
    if weights == "float8" and not has_fp8(device):
        raise InvalidOptionError(
            f"compute_type {name!r} needs an NVIDIA GPU with fp8 tensor cores (Ada or Hopper); "
            "use int8 (or float32) here"
        )
    if device.type == "cpu":
        if dtype not in (None, torch.float32) and compute_type != "default":
            fallback = "int8" if weights else "float32"
            warnings.warn(
                f"{name} is slow or unsupported on the CPU; using {fallback}", stacklevel=3
            )
        return ComputeType(torch.float32, weights)
    return ComputeType(dtype or torch.float16, weights)


# --- weights ---------------------------------------------------------------------------------


ROW_BAND = 1 << 22  # elements of a weight quantized at once (16 MB of float32)


def quantize_weight(
    weight: Tensor, weights: str, scale: Tensor | None = None, group: int = 0
) -> tuple[Tensor, Tensor]:
    """[N, K] float -> (q [N, K] int8 or float8_e4m3fn, scale float32), symmetric: one scale per
    output channel ([N]), or with `group` one per `group` columns of each ([N, K // group]);
    w ~ dequantize(q, scale). A given `scale` (a quantized checkpoint's) sets the layout and
    reproduces the saved q exactly from its dequantized weights; one made for a narrower range
    (fp8's absmax / 448, loaded as int8) is replaced by a fresh one rather than clipping them.
    A large weight goes a band of rows at a time (`ROW_BAND`): whole, its float temporaries
    were twice its float32 size (base's token embedding: +210 MB at load). A given scale is
    kept or replaced band by band, which is sound as each row's scales stand alone."""
    N, K = weight.shape
    if N > max(1, ROW_BAND // K):
        return _in_bands(N, K, lambda rows: quantize_weight(
            weight[rows], weights, None if scale is None else scale[rows], group
        ))  # fmt: skip
    w = weight.detach().float()
    if scale is not None:
        group = K // scale.shape[1] if scale.dim() == 2 else 0
    blocks = w.reshape(N, -1, group or K)  # [N, groups, columns]
    if scale is not None:
        scale = scale.to(device=w.device, dtype=torch.float32).reshape(N, -1)
        q = blocks / scale[:, :, None]
        if q.abs().amax() > QMAX[weights] * (1 + 1e-3):
            scale = None
    if scale is None:
        scale = blocks.abs().amax(dim=2).clamp(min=1e-12) / QMAX[weights]
        q = blocks / scale[:, :, None]
    q, scale = q.reshape(N, K), scale if group else scale.reshape(N)
    if weights == "int8":
        return q.round_().clamp_(-127, 127).to(torch.int8), scale
    return q.to(torch.float8_e4m3fn), scale


def _in_bands(
    rows: int, columns: int, quantize: Callable[[slice], tuple[Tensor, Tensor]]
) -> tuple[Tensor, Tensor]:
    """`quantize` (q, scale of a slice of rows) over bands of at most `ROW_BAND` elements,
    joined: the float temporaries of a large weight taken whole were twice its float32 size."""
    band = max(1, ROW_BAND // columns)
    parts = [quantize(slice(i, i + band)) for i in range(0, rows, band)]
    return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])


def dequantize(q: Tensor, scale: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """q * its scales (per output channel or per group of columns), computed in `dtype`."""
    N = q.shape[0]
    groups = scale.numel() // N
    weight = q.to(dtype)
    weight.view(N, groups, -1).mul_(scale.to(dtype).reshape(N, groups, 1))  # in place: one copy
    return weight  # (tiny.en's int8 folder loaded 54 MB over quantizing on the fly, with two)


class QuantizedWeight(NamedTuple):
    """What the runtime's `linear()` receives for a quantized linear: it calls `linear` here."""

    data: Tensor  # [N, K] int8 or float8_e4m3fn
    scale: Tensor  # [N] float32, or [N, K // group] (quantize_weight)

    def linear(
        self,
        x: Tensor,
        bias: Tensor | None = None,
        gelu: bool = False,
        *,
        out: Tensor | None = None,
        partial: bool = False,
    ) -> Tensor:
        return quantized_linear(x, self, bias, gelu, out=out, partial=partial)

    def float(self) -> Tensor:
        """The dequantized weight in float32 (as `Tensor.float` for a float weight)."""
        return dequantize(self.data, self.scale)

    def stream_config(self, x: Tensor) -> StreamConfig | None:
        """The stream kernel config (STREAM_CONFIGS') the runtime folds layer norms and residual
        adds into for x @ self (`folded_linear`)."""
        key = (x.shape[0], *self.data.shape, self.data.dtype, x.dtype, "stream")
        if key not in _quantized_choice:
            _quantized_choice[key] = tuned_config(
                STREAM_CONFIGS, x, self.data.shape[0], self.data.dtype
            )
        return _quantized_choice[key]


class _Quantized(nn.Module):
    """A module holding `qweight` and `scale`. The scales stay float32 through `.to(dtype)` or
    `.half()` (in 16 bits they would add their own error); `dtype`, the dtype of the
    activations, follows such conversions."""

    dtype: torch.dtype

    def __init__(self, q: Tensor, scale: Tensor, dtype: torch.dtype):
        super().__init__()
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale)
        self.dtype = dtype

    @property
    def weight(self) -> QuantizedWeight:
        return QuantizedWeight(self.qweight, self.scale)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> _Quantized:
        self.dtype = fn(torch.zeros((), dtype=self.dtype)).dtype
        scale = self.scale
        super()._apply(fn, recurse)
        self.scale = scale.to(self.scale.device)
        return self


class QuantizedLinear(_Quantized):
    """nn.Linear with quantized weights; the bias stays in the activations' dtype."""

    def __init__(self, q: Tensor, scale: Tensor, bias: Tensor | None, dtype: torch.dtype):
        super().__init__(q, scale, dtype)
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        y = quantized_linear(x.reshape(-1, x.shape[-1]), self.weight, self.bias)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, weights={self.qweight.dtype}"


class QuantizedEmbedding(_Quantized):
    """The token embedding and the tied output projection (`TokenEmbedding`'s interface), int8
    under every compute type with a scale per `EMBEDDING_GROUP` columns (`weight_format`).
    `dynamic` (the CPU's int8): the projection is an `Int8Linear` on the same rows re-quantized
    with one scale per row, as fbgemm takes them (a second int8 copy: together half of the
    float32 matrix). On AVX2 that GEMV is ~7x faster than float32, where torch's weight-only
    int8 matmul is ~2.5x slower; fbgemm GEMVs per group of 64 columns were 2.4x slower."""

    def __init__(
        self, q: Tensor, scale: Tensor, dtype: torch.dtype, n_vocab: int, dynamic: bool = False
    ):
        super().__init__(q, scale, dtype)
        self.num_embeddings, self.embedding_dim = n_vocab, q.shape[1]
        self.projection = Int8Linear(q, scale, None) if dynamic else None

    def forward(self, tokens: Tensor) -> Tensor:
        q, scale = self.qweight[tokens.reshape(-1)], self.scale[tokens.reshape(-1)]
        rows = dequantize(q, scale).reshape(*tokens.shape, self.embedding_dim)
        return rows.to(self.dtype)

    def logits(self, hidden: Tensor) -> Tensor:
        if self.projection is not None:
            return self.projection(hidden.float())
        scores = quantized_linear(hidden.reshape(-1, hidden.shape[-1]), self.weight)
        return scores[:, : self.num_embeddings].float().reshape(*hidden.shape[:-1], -1)


# --- the module swap -------------------------------------------------------------------------


def weight_format(name: str, weights: str, columns: int, layers: int) -> tuple[str, int]:
    """How the weight `name` ([N, columns]; a module's name or its weight's) of a model with
    `layers` decoder layers is stored under `weights`: (format, columns per scale, 0 for one per
    output channel). Under float8 two matrices are int8, those whose output reaches the logits
    through no further layer: the tied token embedding / logits projection, with a scale per
    `EMBEDDING_GROUP` columns (in e4m3 it cost base 0.64 WER points on the dev clips), and the
    last layer's fc2, the final update of the residual stream (e4m3 there carried 40 % of
    float8's KL divergence from float32 for base, and with it int8 base's float8 went from
    0.39 to 0.17 points over float32's WER on the clips, a mean over five draws of the
    weights; benchmarks/RESULTS.md, sessions 15 and 35). int8 and e4m3 weights are read and
    widened alike, so this costs no speed."""
    if name == EMBEDDING:
        return "int8", EMBEDDING_GROUP if columns % EMBEDDING_GROUP == 0 else 0
    if name.removesuffix(".weight") == f"decoder.blocks.{layers - 1}.{LAST_STEP_LINEAR}":
        return "int8", 0
    return weights, 0


def _fused_scale(scales: dict[str, Tensor], name: str) -> Tensor | None:
    """The saved (canonical, unfused) scales of the model's linear `name`: a fused qkv / kv
    projection's output channels are its parts', in order."""
    base, _, proj = name.rpartition(".")
    parts = {"qkv": ("query", "key", "value"), "kv": ("key", "value")}.get(proj, (proj,))
    found = [scales.get(f"{base}.{part}.weight") for part in parts]
    return None if any(s is None for s in found) else torch.cat(found)  # type: ignore[arg-type]


def quantize_model(
    model: Whisper,
    weights: str | None,
    scales: dict[str, Tensor] | None = None,
    dynamic: bool | None = None,
) -> Whisper:
    """Swap the model's linears and token embedding for quantized ones, in place (see the module
    docstring for which, per device). Call it on the model in its final device and dtype.
    `scales`: a quantized checkpoint's, by canonical name, so its weights come back exactly.
    `dynamic`: every linear as an `Int8Linear` (the CPU's int8; the default there), or
    weight-only step linears (the GPU's; on the CPU too for tests and accuracy figures)."""
    if weights is not None:
        for name, _ in list(model.named_modules()):
            quantize_module(model, name, weights, scales, dynamic)
    return model


def quantize_module(
    model: Whisper,
    name: str,
    weights: str,
    scales: dict[str, Tensor] | None = None,
    dynamic: bool | None = None,
) -> None:
    """Swap the model's module `name` for its quantized form, if `quantize_model` quantizes it;
    any other module is left as it is. `build_model` swaps each linear on the CPU as soon as its
    weights are in, so that the float model never exists whole beside the quantized one."""
    if dynamic is None:
        dynamic = weights == "int8" and model.device.type == "cpu"
    scales = scales or {}
    layers = len(model.decoder.blocks)
    module = model.get_submodule(name)
    if name == EMBEDDING.removesuffix(".weight"):
        kind, group = weight_format(EMBEDDING, weights, module.weight.shape[1], layers)
        q, scale = quantize_weight(module.weight, kind, scales.get(EMBEDDING), group)
        quantized: nn.Module = QuantizedEmbedding(
            q, scale, model.dtype, module.num_embeddings, dynamic
        )
    elif isinstance(module, nn.Linear):
        step = name.startswith("decoder.blocks.") and name.split(".", 3)[3] in STEP_LINEARS
        if not (dynamic or step):
            return
        kind, group = weight_format(name, weights, module.in_features, layers)
        q, scale = quantize_weight(module.weight, kind, _fused_scale(scales, name), group)
        if dynamic:
            quantized = Int8Linear(q, scale, module.bias, OUTLIER_COLUMNS if step else 0)
        else:
            quantized = QuantizedLinear(q, scale, module.bias, model.dtype)
    else:
        return
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent), child, quantized)


class Int8Linear(nn.Module):
    """The CPU's int8 linear: fbgemm's dynamic int8 GEMM on exactly these q and scales (int8
    weights per output channel), activations quantized per call, asymmetric. It differs from
    torch.ao's dynamic `Linear` in three ways, each worth words on the dev clips (RESULTS.md,
    2026-11-23; measured by teacher-forced KL to float32, tiny.en, 17 clips: 0.030 before, 0.005
    with all):
    - Per-row activation scales. fbgemm takes one scale per call; several rows (an encoder
      window's 1500 frames, beams) are each divided by their absmax first and the products
      multiplied back, so one loud frame no longer coarsens the grid of every other frame. Halves
      the encoder's error for ~1 ms per encoder GEMM; a single row (a greedy step) skips it.
    - 8-bit activations where fbgemm's kernel cannot overflow with them (`int8_overflows`), 7
      bits (torch's reduce_range) elsewhere. With 7 bits the decoder's linears alone cost as much
      as all other int8 error together.
    - `outliers`: that many input channels, the call's largest in magnitude, are multiplied in
      float (their int8 weight rows dequantized) and left out of the int8 GEMM, so a few loud
      channels do not coarsen the grid of the rest (the decoder's step linears).
    fbgemm takes one scale per output channel: weights with scales per group of columns
    (`weight_format`) are re-quantized per channel from their dequantized values. Otherwise
    they are used as given (a quantized checkpoint's come back exactly); 7-bit weights derived
    from them would allow 8-bit activations everywhere, but the second rounding cost more than
    it gained."""

    def __init__(self, q: Tensor, scale: Tensor, bias: Tensor | None, outliers: int = 0):
        super().__init__()
        if scale.dim() == 2:
            q, scale = _in_bands(*q.shape, lambda rows: quantize_weight(
                dequantize(q[rows], scale[rows]), "int8"
            ))  # fmt: skip
        self.in_features, self.out_features = q.shape[1], q.shape[0]
        self.outliers = outliers
        if outliers:  # [K, N]: an input channel's weights are one contiguous row to gather
            self.register_buffer("columns", q.t().contiguous())
            self.register_buffer("scale", scale.float())
        zero = torch.zeros(q.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # torch 2.13 deprecates quantized tensors, which fbgemm's packed linear still takes;
            # its warning names torch internals that no user of this package can act on.
            warnings.filterwarnings("ignore", "torch.quantize_per_tensor", UserWarning)
            weight = torch._make_per_channel_quantized_tensor(
                q.cpu(), scale.cpu().double(), zero, 0
            )
        self.packed = torch.ops.quantized.linear_prepack(weight, None)  # bias: added after scaling
        bias = None if bias is None else bias.detach().float()
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.reduce_range = int8_overflows()

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        extra = None
        if self.outliers:
            channels = rows.abs().amax(dim=0).topk(self.outliers).indices
            extra = (rows[:, channels] @ self.columns[channels].float()).mul_(self.scale)
            rows = rows.index_fill(1, channels, 0.0)
        if rows.shape[0] == 1:
            y = torch.ops.quantized.linear_dynamic(rows, self.packed, self.reduce_range)
            y = y if self.bias is None else y.add_(self.bias)
        else:
            # two plain reductions: ~3x faster than .abs().amax(), which writes a copy
            absmax = torch.maximum(rows.amax(dim=1, keepdim=True), -rows.amin(dim=1, keepdim=True))
            absmax = absmax.clamp_(min=1e-30)  # a row of zeros stays zeros
            y = torch.ops.quantized.linear_dynamic(rows / absmax, self.packed, self.reduce_range)
            y = y.mul_(absmax) if self.bias is None else torch.addcmul(self.bias, y, absmax)
        y = y if extra is None else y.add_(extra)
        return y.reshape(*x.shape[:-1], self.out_features)

    def weight_bias(self) -> tuple[Tensor, Tensor | None]:
        """The int8 weight (a per-channel quantized tensor) and the bias."""
        weight, _ = torch.ops.quantized.linear_unpack(self.packed)
        return weight, self.bias

    def extra_repr(self) -> str:
        bits = 7 if self.reduce_range else 8
        return f"in={self.in_features}, out={self.out_features}, activations={bits} bits per row"


@functools.cache
def int8_overflows() -> bool:
    """Whether fbgemm's int8 GEMM here overflows with 8-bit activations. Without VNNI (AVX2,
    plain AVX-512) it sums pairs of u8 x s8 products in saturating int16 (vpmaddubsw), and two
    255 x 127 products exceed 32767: hence torch's 7-bit activations (reduce_range). VNNI sums
    into int32. A probe of the kernel itself, so it follows whatever fbgemm picks (including
    FBGEMM_ENABLE_INSTRUCTIONS=AVX2, which emulates such a CPU): 64 products of 255 x 127."""
    zero = torch.zeros(4, dtype=torch.long)
    scale = torch.full((4,), 1 / 127, dtype=torch.double)
    weight = torch._make_per_channel_quantized_tensor(
        torch.full((4, 64), 127, dtype=torch.int8), scale, zero, 0
    )
    packed = torch.ops.quantized.linear_prepack(weight, None)
    y = torch.ops.quantized.linear_dynamic(torch.ones(2, 64), packed, False)
    return not torch.allclose(y, torch.full_like(y, 64.0))


# --- kernels ---------------------------------------------------------------------------------


def quantized_linear(
    x: Tensor,
    w: QuantizedWeight,
    bias: Tensor | None = None,
    gelu: bool = False,
    *,
    out: Tensor | None = None,
    partial: bool = False,
) -> Tensor:
    """x [M, K] @ dequantized w^T (+ bias, then GELU), in x's dtype (into `out` if given;
    `partial`: see kernels.linear)."""
    partial = partial and bias is None and not gelu
    key = (x.shape[0], *w.data.shape, w.data.dtype, x.dtype, x.device.type)
    choice = _quantized_choice.get(key)
    if choice is None:
        choice = _quantized_choice[key] = _pick_quantized(x, w)
    if isinstance(choice, tuple):  # the Triton kernel applies bias and GELU itself
        return skinny_linear(x, w.data, bias, gelu, choice, scale=w.scale, out=out, partial=partial)
    y = choice(x, w)
    if bias is not None:
        y = y + bias
    y = F.gelu(y) if gelu else y
    return y if out is None else out.copy_(y)


def _dequantized(x: Tensor, w: QuantizedWeight) -> Tensor:
    """Dequantize (int8 or fp8), then the float matmul (cuBLAS): for many rows, and the
    reference."""
    return F.linear(x, dequantize(w.data, w.scale, x.dtype))


def _int8_pack_mm(x: Tensor, w: QuantizedWeight) -> Tensor:
    """PyTorch's weight-only int8 matmul. On an AVX2 CPU it is slower than float32: the CPU's
    int8 is the dynamic path; this serves the GPU recipe's accuracy figures there."""
    return torch._weight_int8pack_mm(x.contiguous(), w.data, w.scale.to(x.dtype))


# The configs STREAM_CONFIGS was tuned among (benchmarks/tune_step.py --compute-type)
QUANTIZED_CANDIDATES: list[StreamConfig] = [
    (16, 128, 4, 3), (16, 256, 2, 3), (16, 256, 4, 3), (32, 128, 4, 3), (32, 256, 4, 3),
    (32, 256, 4, 4), (64, 256, 8, 3), (64, 256, 8, 4),
]  # fmt: skip
_quantized_choice: dict[tuple, Callable[[Tensor, QuantizedWeight], Tensor] | StreamConfig] = {}
# The step matmuls' configs on int8 / fp8 weights, chosen in the whole graphed greedy step as
# kernels.STEP_CONFIGS (benchmarks/tune_step.py --compute-type int8 / float8, H200, large-v3)
# and used on every GPU. Keys: (1 row or up to 16, kernels.step_role, weight dtype).
_I8, _F8 = torch.int8, torch.float8_e4m3fn
STREAM_CONFIGS: dict[tuple[int, str, torch.dtype], StreamConfig] = {
    (1, "out", _I8): (64, 256, 8, 3),
    (1, "fc2", _I8): (64, 256, 8, 3),
    (1, "qkv", _I8): (16, 256, 2, 3),  # unsplit, preloaded; 2 warps: -5 % (session 32)
    (1, "fc1", _I8): (16, 256, 2, 3),
    (1, "logits", _I8): (32, 256, 4, 3),  # the embedding: int8 for every type
    (16, "out", _I8): (32, 128, 4, 3),
    (16, "fc2", _I8): (32, 256, 4, 3),  # (32, 256, 4, 4): +1.5-2 % (session 33)
    (16, "qkv", _I8): (32, 256, 4, 3),
    (16, "fc1", _I8): (32, 128, 4, 3),
    (16, "logits", _I8): (64, 256, 8, 3),
    (1, "out", _F8): (64, 256, 8, 3),
    (1, "fc2", _F8): (32, 256, 4, 3),  # (64, 256, 8, 4): large-v3 -4 %, tiny +16 % (session 33)
    (1, "qkv", _F8): (16, 256, 2, 3),
    (1, "fc1", _F8): (16, 256, 2, 3),
    (16, "out", _F8): (64, 256, 8, 3),
    (16, "fc2", _F8): (32, 256, 4, 4),  # re-tuned with the early launches (session 33)
    (16, "qkv", _F8): (32, 256, 4, 3),
    (16, "fc1", _F8): (32, 256, 4, 3),
}


def _pick_quantized(x: Tensor, w: QuantizedWeight):
    """How x @ w runs. The CPU: PyTorch's int8 matmul (float32, one scale per row), else
    dequantize. CUDA: up to 64 rows of a decode step's matmul in 16 bits on the Triton stream
    kernel (it widens int8 or fp8 weights in registers) in STREAM_CONFIGS' config for its role,
    the same in every process as kernels.linear's; more rows (a prefill: compute-bound, of ever
    new shapes) or another shape: dequantize + cuBLAS for int8, fp8 activations + _scaled_mm for
    fp8. (PyTorch's int8 matmul on CUDA took 4-18x the time of either at 16-64 rows: RESULTS,
    session 23.)"""
    fp8 = w.data.dtype == torch.float8_e4m3fn
    if not x.is_cuda:
        if fp8:
            return _fp8_linear
        per_row = w.scale.dim() == 1
        return _int8_pack_mm if x.dtype == torch.float32 and per_row else _dequantized
    if x.shape[0] <= 64 and x.dtype != torch.float32:  # tl.dot would round float32 to tf32
        config = tuned_config(STREAM_CONFIGS, x, w.data.shape[0], w.data.dtype)
        if config is not None:
            return config
    return _fp8_linear if fp8 else _dequantized


if triton is not None:

    @triton.jit
    def _fp8_rows_kernel(x_ptr, q_ptr, s_ptr, K, BLOCK: tl.constexpr):
        """One row of x to fp8 e4m3 with its own scale (absmax / 448), in one pass."""
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < K
        x = tl.load(x_ptr + row.to(tl.int64) * K + cols, mask=mask, other=0.0).to(tl.float32)
        scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / 448.0
        q = (x / scale).to(q_ptr.dtype.element_ty)
        tl.store(q_ptr + row.to(tl.int64) * K + cols, q, mask=mask)
        tl.store(s_ptr + row, scale)


def fp8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """x [M, K] -> (fp8 e4m3 [M, K], float32 scales [M, 1]): each row scaled by its absmax."""
    if x.is_cuda and triton is not None:
        M, K = x.shape
        q = torch.empty(M, K, device=x.device, dtype=torch.float8_e4m3fn)
        scale = torch.empty(M, 1, device=x.device, dtype=torch.float32)
        block = triton.next_power_of_2(K)
        _fp8_rows_kernel[(M,)](x.contiguous(), q, scale, K, BLOCK=block, num_warps=8)
        return q, scale
    x = x.float()
    scale = x.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 448.0
    return (x / scale).to(torch.float8_e4m3fn), scale


_fp8_out: dict[torch.dtype, torch.dtype] = {}  # activation dtype -> what _scaled_mm can write


def _fp8_linear(x: Tensor, w: QuantizedWeight) -> Tensor:
    """fp8 activations (per-row scales) times fp8 weights (per-channel scales): _scaled_mm.
    Older cuBLAS writes row-wise scaled products only in bf16; then the result is cast."""
    q, x_scale = fp8_rows(x)
    out = _fp8_out.setdefault(x.dtype, x.dtype)
    kwargs = {"scale_a": x_scale, "scale_b": w.scale.float()[None, :]}
    try:
        y = torch._scaled_mm(q, w.data.t(), out_dtype=out, **kwargs)
    except RuntimeError:
        if out == torch.bfloat16 or not x.is_cuda:
            raise
        out = _fp8_out[x.dtype] = torch.bfloat16
        y = torch._scaled_mm(q, w.data.t(), out_dtype=out, **kwargs)
    return y.to(x.dtype)
