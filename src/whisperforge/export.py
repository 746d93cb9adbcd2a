"""Export a model as static-shape graphs (ONNX for onnxruntime, torch.export for ExecuTorch or
AOTInductor), and run ONNX exports through the unchanged decoding loop.

Five graphs, written as small wrapper modules over the plain network's weights (the reference
network in `model.py` is untouched). L decoder layers, D the width, H heads of dh = D / H,
N = n_text_ctx (448), A = n_audio_ctx (1500); caches are one tensor per layer (`self_k.0`, ...):

    encoder          mel [B, n_mels, 2A]                 -> audio_features [B, A, D]
    cross_kv         audio_features                      -> cross_k.i, cross_v.i [B, H, A, dh]
    decoder_prefill  tokens [B, T], cross_k.i, cross_v.i -> hidden [B, T, D],
                                                            self_k, self_v [L, B, H, T, dh]
    decoder_step     tokens [B, 1], position [], self_k.i, self_v.i [B, H, N, dh],
                     cross_k.i, cross_v.i                -> hidden [B, 1, D],
                                                            new_k, new_v [L, B, H, 1, dh]
    logits           hidden [R, D]                       -> logits [R, n_vocab] (float32)

Batch (B, R) and the prompt length T are dynamic; the caches have fixed lengths (A and N).
The step reads the static self-attention cache (the entries before `position`) and returns the
new token's K,V, which the caller writes at `position`: returning the whole cache instead would
copy it every step. The step has no Python control flow on tensor values (the mask is a
comparison with `position`), so it exports as one graph.

ONNX exports keep each weight once, in `weights.bin`, which all five graphs reference.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoints import (
    STAGING,
    Checkpoint,
    _heads,
    check_no_dangling_link,
    resolve_checkpoint,
    written_aside,
)
from .errors import InvalidOptionError, ModelFormatError, ModelNotFoundError, WhisperforgeError
from .model import ModelConfig, Whisper, merge_heads, split_heads
from .quantize import COMPUTE_TYPES as MODEL_COMPUTE_TYPES
from .runtime import encoder_blocks

if TYPE_CHECKING:
    import onnx

    from .transcribe import WhisperModel


FORMATS = ("onnx", "torch-export")
COMPUTE_TYPES = {"float32": torch.float32, "float16": torch.float16}
MANIFEST = "whisperforge-export.json"
WEIGHTS = "weights.bin"
TOKENIZER = "tokenizer.json"
GRAPHS = ("encoder", "cross_kv", "decoder_prefill", "decoder_step", "logits")
# Every file an export writes (either format): a folder of only these is an earlier export.
EXPORT_FILES = (
    MANIFEST,
    WEIGHTS,
    TOKENIZER,
    *(f"{g}.{ext}" for ext in ("onnx", "pt2") for g in GRAPHS),
)
EXPORT_VERSION = 1


# --- export-friendly wrappers over the plain network -----------------------------------------


def _layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """`model.LayerNorm` (fp32 math) written so that fp16 weights export too."""
    weight, bias = norm.weight.float(), norm.bias.float()
    return F.layer_norm(x.float(), norm.normalized_shape, weight, bias, norm.eps).to(x.dtype)


class Encoder(nn.Module):
    def __init__(self, model: Whisper):
        super().__init__()
        self.encoder = model.encoder

    def forward(self, mel: Tensor) -> Tensor:
        enc = self.encoder
        x = F.gelu(enc.conv1(mel))
        x = F.gelu(enc.conv2(x)).transpose(1, 2)
        x = x + enc.positional_embedding.to(x.dtype)
        return encoder_blocks(enc, x, _layer_norm)


class CrossKV(nn.Module):
    """Holds only the cross-attention K,V projections: a torch.export program keeps every
    parameter of its module, used or not."""

    def __init__(self, model: Whisper):
        super().__init__()
        self.kv = nn.ModuleList(block.cross_attn.kv for block in model.decoder.blocks)
        self.n_head = model.config.n_text_head

    def forward(self, audio_features: Tensor) -> tuple[list[Tensor], list[Tensor]]:
        # `TextDecoder.cross_kv`, head-major.
        pairs = [kv(audio_features).chunk(2, dim=-1) for kv in self.kv]
        H = self.n_head
        return [split_heads(k, H) for k, _ in pairs], [split_heads(v, H) for _, v in pairs]


def _cross_attention(block: nn.Module, x: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """x [B, T, D] attends to one window's head-major K,V [B, H, 1500, dh]. Written out rather
    than SDPA, whose ONNX form scales a transposed copy of K at every call."""
    attn = block.cross_attn
    q = split_heads(attn.query(_layer_norm(block.cross_attn_ln, x)), attn.n_head) * scale
    weights = (q @ k.transpose(-1, -2)).float().softmax(dim=-1).to(q.dtype)
    return attn.out(merge_heads(weights @ v))


class DecoderPrefill(nn.Module):
    """The prompt [B, T] from position 0: hidden states and the prompt's self K,V."""

    def __init__(self, model: Whisper):
        super().__init__()
        self.decoder = model.decoder
        self.n_head = model.config.n_text_head

    def forward(
        self, tokens: Tensor, cross_k: list[Tensor], cross_v: list[Tensor]
    ) -> tuple[Tensor, Tensor, Tensor]:
        dec, H = self.decoder, self.n_head
        scale = (dec.token_embedding.embedding_dim // H) ** -0.5
        x = dec.token_embedding(tokens) + dec.positional_embedding[: tokens.shape[1]]
        keys, values = [], []
        for i, block in enumerate(dec.blocks):
            qkv = block.attn.qkv(_layer_norm(block.attn_ln, x))
            q, k, v = (split_heads(t, H) for t in qkv.chunk(3, dim=-1))
            keys.append(k)
            values.append(v)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + block.attn.out(merge_heads(a))
            x = x + _cross_attention(block, x, cross_k[i], cross_v[i], scale)
            x = x + block.mlp(_layer_norm(block.mlp_ln, x))
        return _layer_norm(dec.ln, x), torch.stack(keys), torch.stack(values)


class DecoderStep(nn.Module):
    """One token per row at `position`, attending to the cache entries before it and itself.

    Caches come one tensor per layer, head-major ([B, H, length, dh]), so that the graph reads
    them where they lie: picking a layer out of a stacked cache, or moving heads to the front,
    would copy the whole cache at every step (onnxruntime has no views)."""

    def __init__(self, model: Whisper):
        super().__init__()
        self.decoder = model.decoder
        self.n_head = model.config.n_text_head

    def forward(
        self,
        tokens: Tensor,
        position: Tensor,
        self_k: list[Tensor],
        self_v: list[Tensor],
        cross_k: list[Tensor],
        cross_v: list[Tensor],
    ) -> tuple[Tensor, Tensor, Tensor]:
        dec, H = self.decoder, self.n_head
        scale = (dec.token_embedding.embedding_dim // H) ** -0.5
        x = dec.token_embedding(tokens) + dec.positional_embedding.index_select(
            0, position.reshape(1)
        )
        # Cache entries at and after `position` are stale or empty: masked out.
        stale = torch.arange(self_k[0].shape[2], device=tokens.device) >= position
        new_keys, new_values = [], []
        for i, block in enumerate(dec.blocks):
            qkv = block.attn.qkv(_layer_norm(block.attn_ln, x))
            q, k, v = (split_heads(t, H) for t in qkv.chunk(3, dim=-1))  # [B, H, 1, dh]
            new_keys.append(k)
            new_values.append(v)
            # Scores over the cache and over the new key side by side, so the cache is read
            # once and never copied. The query is scaled first, which keeps fp16 scores in range.
            q = q * scale
            past = (q @ self_k[i].transpose(-1, -2)).float().masked_fill(stale, float("-inf"))
            current = (q * k).sum(dim=-1, keepdim=True).float()
            weights = torch.cat([past, current], dim=-1).softmax(dim=-1).to(q.dtype)
            a = weights[..., :-1] @ self_v[i] + weights[..., -1:] * v
            x = x + block.attn.out(merge_heads(a))
            x = x + _cross_attention(block, x, cross_k[i], cross_v[i], scale)
            x = x + block.mlp(_layer_norm(block.mlp_ln, x))
        return _layer_norm(dec.ln, x), torch.stack(new_keys), torch.stack(new_values)


class Logits(nn.Module):
    def __init__(self, model: Whisper):
        super().__init__()
        self.token_embedding = model.decoder.token_embedding  # only it: see `CrossKV`

    def forward(self, hidden: Tensor) -> Tensor:
        # `TextDecoder.logits` as a linear layer: exported, `hidden @ W.T` would store a
        # transposed copy of the embedding instead of sharing it with the decoder graphs.
        return F.linear(hidden, self.token_embedding.weight).float()


def example_inputs(config: ModelConfig, dtype: torch.dtype) -> dict[str, tuple[Any, ...]]:
    """Inputs to trace each graph with: batch 2 and a 3-token prompt, so that neither is taken
    for a constant (1 would be)."""
    B, T, L, H = 2, 3, config.n_text_layer, config.n_text_head
    dh, A, N = config.n_text_state // H, config.n_audio_ctx, config.n_text_ctx
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator).to(dtype)

    def caches(length: int) -> list[Tensor]:
        return [randn(B, H, length, dh) for _ in range(L)]

    tokens = torch.randint(0, config.n_vocab, (B, T), generator=generator)
    return {
        "encoder": (randn(B, config.n_mels, 2 * A),),
        "cross_kv": (randn(B, A, config.n_audio_state),),
        "decoder_prefill": (tokens, caches(A), caches(A)),
        "decoder_step": (
            tokens[:, :1],
            torch.tensor(T),
            caches(N),
            caches(N),
            caches(A),
            caches(A),
        ),
        "logits": (randn(B, config.n_text_state),),
    }


def _dynamic_shapes(n_layer: int) -> dict[str, tuple[Any, ...]]:
    batch = torch.export.Dim("batch", min=1, max=4096)
    length = torch.export.Dim("tokens", min=1, max=448)
    rows = torch.export.Dim("rows", min=1, max=1 << 20)
    caches = [{0: batch}] * n_layer
    return {
        "encoder": ({0: batch},),
        "cross_kv": ({0: batch},),
        "decoder_prefill": ({0: batch, 1: length}, caches, caches),
        "decoder_step": ({0: batch}, None, caches, caches, caches, caches),
        "logits": ({0: rows},),
    }


def graph_names(n_layer: int) -> dict[str, tuple[list[str], list[str]]]:
    """Each graph's input and output names; per-layer caches are `self_k.0`, `self_k.1`, ..."""

    def per_layer(*names: str) -> list[str]:
        return [f"{name}.{i}" for name in names for i in range(n_layer)]

    return {
        "encoder": (["mel"], ["audio_features"]),
        "cross_kv": (["audio_features"], per_layer("cross_k", "cross_v")),
        "decoder_prefill": (
            ["tokens", *per_layer("cross_k", "cross_v")],
            ["hidden", "self_k", "self_v"],
        ),
        "decoder_step": (
            ["tokens", "position", *per_layer("self_k", "self_v", "cross_k", "cross_v")],
            ["hidden", "new_k", "new_v"],
        ),
        "logits": (["hidden"], ["logits"]),
    }


def wrappers(model: Whisper) -> dict[str, nn.Module]:
    return {
        "encoder": Encoder(model),
        "cross_kv": CrossKV(model),
        "decoder_prefill": DecoderPrefill(model),
        "decoder_step": DecoderStep(model),
        "logits": Logits(model),
    }


# --- export ----------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """Silence the exporters' log lines and warnings (torchvision missing, deprecations):
    nothing in them is the user's to act on."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_program(module: nn.Module, args: tuple[Any, ...], graph: str, n_layer: int):
    """torch.export of one wrapper: strict shapes, dynamic batch, no graph breaks."""
    dynamic = _dynamic_shapes(n_layer)[graph]
    with torch.no_grad():
        return torch.export.export(module.eval(), args, dynamic_shapes=dynamic)


def export_model(
    model: str | os.PathLike,
    out_dir: str | os.PathLike,
    format: str = "onnx",
    compute_type: str = "float32",
) -> Path:
    """Write the five graphs of `model` (a name or path, as `WhisperModel` takes), its tokenizer
    and a manifest to `out_dir`; returns the folder.

    `WhisperModel(out_dir)` transcribes with an ONNX export. A torch-export folder holds one
    `.pt2` per graph (`torch.export.load`), for ExecuTorch or AOTInductor.
    """
    from .transcribe import WhisperModel  # transcribe imports this module

    if format not in FORMATS:
        raise InvalidOptionError(
            f"unknown export format {format!r}; use one of {', '.join(FORMATS)}"
        )
    if compute_type not in COMPUTE_TYPES:
        raise InvalidOptionError(
            f"unsupported compute_type {compute_type!r} for export; use float32 or float16"
        )
    out = Path(out_dir).expanduser()
    check_no_dangling_link(out)  # before the model loads (`written_aside` checks it too)
    if out.exists() and not out.is_dir():
        raise InvalidOptionError(f"{out} is a file; give --out a new or empty folder")
    # An earlier export is replaced, also one cut short (its files without the manifest): one
    # with a graph at least, as a folder of someone's weights.bin or tokenizer.json alone was
    # taken for an export and written over.
    names = {path.name for path in out.iterdir()} - {STAGING} if out.is_dir() else set()
    earlier = (out / MANIFEST).is_file() or (
        names <= set(EXPORT_FILES) and not names <= {WEIGHTS, TOKENIZER}
    )
    if names and not earlier:
        raise InvalidOptionError(f"{out} holds other files; give --out a new or empty folder")
    if is_export_folder(model):
        raise InvalidOptionError(f"{model} is an export already; export the model it came from")
    if format == "onnx" and importlib.util.find_spec("onnxscript") is None:
        raise WhisperforgeError(
            "ONNX export needs the onnx and onnxscript packages: pip install 'whisperforge[export]'"
        )

    loaded = WhisperModel(model, device="cpu", compute_type="float32")
    dtype = COMPUTE_TYPES[compute_type]
    plain = loaded.model.to(dtype).eval()
    modules, inputs = wrappers(plain), example_inputs(plain.config, dtype)
    if loaded.checkpoint.compute_type:  # a `whisperforge quantize` folder
        warnings.warn(f"{model} holds {loaded.checkpoint.compute_type} weights: the export "
                      f"holds them as {compute_type} (3-4x the size; the graphs have no "
                      "quantized matmuls)", stacklevel=2)  # fmt: skip
    try:
        with written_aside(out, replaced=EXPORT_FILES, last=MANIFEST) as staging:
            _write_export(loaded, model, format, compute_type, modules, inputs, staging)
    except OSError as error:
        raise WhisperforgeError(
            f"cannot write {out}: {error.strerror or error}; give --out a folder you can write to"
        ) from None
    return out


def _write_export(loaded: WhisperModel, model: str, format: str, compute_type: str,
                  modules: dict[str, nn.Module], inputs: dict[str, tuple[Any, ...]],
                  out: Path) -> None:  # fmt: skip
    """The graphs, weights, tokenizer and manifest of an export, to `out`."""
    plain = loaded.model
    n_layer = plain.config.n_text_layer
    with quiet_exporter():
        if format == "onnx":
            _save_onnx({g: _onnx_proto(modules[g], inputs[g], g, n_layer) for g in GRAPHS}, out)
            files = [f"{g}.onnx" for g in GRAPHS] + [WEIGHTS]
        else:
            for graph in GRAPHS:
                program = export_program(modules[graph], inputs[graph], graph, n_layer)
                torch.export.save(program, out / f"{graph}.pt2")
            files = [f"{g}.pt2" for g in GRAPHS]

    checkpoint = loaded.checkpoint
    tokenizer = None
    if checkpoint.tokenizer_file is not None:
        tokenizer = TOKENIZER
        shutil.copyfile(checkpoint.tokenizer_file, out / tokenizer)
        files.append(tokenizer)
    heads = checkpoint.alignment_heads
    # What word timestamps load (see `OnnxDecoder`): a path made absolute, else the name.
    path = Path(model).expanduser()
    source = str(path.resolve()) if path.exists() else str(model)
    manifest = {
        "whisperforge_export": EXPORT_VERSION,
        "format": format,
        "compute_type": compute_type,
        "config": dataclasses.asdict(plain.config),
        "alignment_heads": heads.tolist() if heads is not None else None,
        "tokenizer": tokenizer,
        "source": source,
        "graphs": {g: {"inputs": i, "outputs": o} for g, (i, o) in graph_names(n_layer).items()},
        "files": files,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


def _onnx_proto(
    module: nn.Module, args: tuple[Any, ...], graph: str, n_layer: int
) -> onnx.ModelProto:
    input_names, output_names = graph_names(n_layer)[graph]
    try:
        with torch.no_grad():
            program = torch.onnx.export(
                module.eval(),
                args,
                dynamo=True,  # through torch.export: the same graph capture as the .pt2 format
                dynamic_shapes=_dynamic_shapes(n_layer)[graph],
                input_names=input_names,
                output_names=output_names,
                optimize=True,
                verbose=False,
            )
    except Exception as error:
        # torch.onnx wraps a Ctrl-C during its torch.export step in a TorchExportError: it
        # came out as a hundred lines of traceback and exit status 1, not an interrupt.
        cause: BaseException | None = error
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is not None:
            raise KeyboardInterrupt from None
        raise
    return program.model_proto


def _save_onnx(protos: dict[str, onnx.ModelProto], out: Path) -> None:
    """Save each graph with its large weights in one shared `weights.bin`, each stored once
    (the prefill, step and logits graphs hold the same decoder weights)."""
    import onnx

    offsets: dict[bytes, int] = {}
    with open(out / WEIGHTS, "wb") as weights:
        for graph, proto in protos.items():
            for tensor in proto.graph.initializer:
                if not tensor.HasField("raw_data") or len(tensor.raw_data) < 1024:
                    continue  # small constants stay in the graph
                data = tensor.raw_data
                key = hashlib.sha256(data).digest() + bytes(str(tensor.data_type), "ascii")
                if key not in offsets:
                    weights.write(b"\0" * (-weights.tell() % 64))  # aligned for mmap
                    offsets[key] = weights.tell()
                    weights.write(data)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                del tensor.external_data[:]
                for field, value in (("location", WEIGHTS), ("offset", str(offsets[key])),
                                     ("length", str(len(data)))):  # fmt: skip
                    entry = tensor.external_data.add()
                    entry.key, entry.value = field, value
            (out / f"{graph}.onnx").write_bytes(proto.SerializeToString(deterministic=True))


# --- the ONNX runner -------------------------------------------------------------------------


def is_export_folder(path: str | Path) -> bool:
    return (Path(path).expanduser() / MANIFEST).is_file()


def read_manifest(folder: str | Path) -> dict:
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ModelNotFoundError(
            f"{folder}: no such export folder; run `whisperforge export` first"
        )
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelFormatError(
            f"{folder}: not a whisperforge export ({MANIFEST} is missing); "
            "create one with `whisperforge export MODEL --out DIR`"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ModelFormatError(f"{path}: not valid JSON ({error}); export again") from None
    if manifest.get("whisperforge_export") != EXPORT_VERSION:
        raise ModelFormatError(
            f"{folder}: an export from another whisperforge version; export again"
        )
    missing = [name for name in manifest.get("files", []) if not (folder / name).is_file()]
    if missing:
        raise ModelFormatError(f"{folder}: {', '.join(missing)} missing; export again")
    return manifest


class OnnxGraphs:
    """The five onnxruntime sessions of an ONNX export, on the CPU."""

    def __init__(self, folder: str | Path, threads: int = 0):
        import onnxruntime as ort

        self.folder = Path(folder).expanduser()
        self.manifest = read_manifest(self.folder)
        if self.manifest["format"] != "onnx":
            raise InvalidOptionError(
                f"{self.folder} holds torch.export programs (for ExecuTorch or AOTInductor), which "
                "whisperforge does not run; export with --format onnx to transcribe from a folder"
            )
        self.config = ModelConfig(**self.manifest["config"])
        self.compute_type: str = self.manifest["compute_type"]
        self.dtype = COMPUTE_TYPES[self.compute_type]
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads  # 0: onnxruntime's choice (all physical cores)
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # The decode loop runs torch ops (logit filters, search) between graph runs: threads
        # that spin waiting for the next run would take the cores those ops need.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.sessions = {}
        for graph in GRAPHS:
            try:
                self.sessions[graph] = ort.InferenceSession(
                    str(self.folder / f"{graph}.onnx"), options, providers=["CPUExecutionProvider"]
                )
            except Exception as error:  # noqa: BLE001 - onnxruntime raises its own types
                reason = str(error).splitlines()[0][:300]
                raise ModelFormatError(
                    f"{self.folder / graph}.onnx: {reason}; export again"
                ) from None
        self.n_layer = self.config.n_text_layer

    def run(self, graph: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self.sessions[graph]
        outputs = session.run(None, inputs)
        return {output.name: array for output, array in zip(session.get_outputs(), outputs)}

    def array(self, tensor: Tensor) -> np.ndarray:
        """A float tensor as the export's numpy dtype, on the CPU."""
        return tensor.detach().to("cpu", self.dtype).numpy()


def _per_layer(name: str, arrays: list[np.ndarray]) -> dict[str, np.ndarray]:
    return {f"{name}.{i}": array for i, array in enumerate(arrays)}


class OnnxCache:
    """What `decoding.Inference` holds as its cache: per layer, the static self K,V
    [B, H, N, dh] that the step graph reads, and the cross K,V [B, H, 1500, dh] of each row's
    window."""

    def __init__(self, cross_k: list[np.ndarray], cross_v: list[np.ndarray], n_text_ctx: int):
        B, H, _, dh = cross_k[0].shape
        self.cross_k, self.cross_v = cross_k, cross_v
        self.self_k = [np.zeros((B, H, n_text_ctx, dh), cross_k[0].dtype) for _ in cross_k]
        self.self_v = [np.zeros_like(k) for k in self.self_k]
        self.length = 0

    def write(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Append the K,V [L, B, H, T, dh] of T more tokens."""
        end = self.length + keys.shape[3]
        for cache, new in zip(self.self_k + self.self_v, [*keys, *values]):
            cache[:, :, self.length : end] = new
        self.length = end

    def reorder(self, source: Tensor) -> None:
        """Keep row `source[i]` as row i (beam search), as `model.KVCache.reorder`."""
        rows, n = source.cpu().numpy(), self.length
        for cache in self.self_k + self.self_v:
            cache[:, :, :n] = cache[rows, :, :n]

    def inputs(self, self_attention: bool) -> dict[str, np.ndarray]:
        """The caches as the graphs' inputs (the prefill takes only the cross K,V)."""
        inputs = {**_per_layer("cross_k", self.cross_k), **_per_layer("cross_v", self.cross_v)}
        if self_attention:
            inputs.update(_per_layer("self_k", self.self_k), **_per_layer("self_v", self.self_v))
        return inputs


class OnnxEncoder:
    def __init__(self, graphs: OnnxGraphs):
        self.graphs = graphs

    def __call__(self, mel: Tensor) -> Tensor:
        outputs = self.graphs.run("encoder", {"mel": self.graphs.array(mel)})
        return torch.from_numpy(outputs["audio_features"])


class OnnxDecoder:
    """The `TextDecoder` interface that `decoding` and `timing` use, on the exported graphs.

    Calls with `cross_weights` (word timestamps) need the attention scores, which the graphs do
    not output: they run on the plain PyTorch model that `fallback` loads on first use.
    """

    def __init__(self, graphs: OnnxGraphs, fallback: Callable[[], Whisper]):
        self.graphs = graphs
        self._fallback = fallback
        self._plain: Whisper | None = None

    def plain(self) -> Whisper:
        if self._plain is None:
            self._plain = self._fallback()
        return self._plain

    def new_cache(
        self,
        audio_features: Tensor,
        repeats: int = 1,
        max_length: int | None = None,
        padding: Tensor | None = None,
    ) -> OnnxCache:
        if padding is not None:
            raise InvalidOptionError(
                "the ONNX decoder takes one prompt for all windows of a batch; decode windows "
                "with their own previous text one at a time, or on the PyTorch model"
            )
        features = self.graphs.array(audio_features)
        outputs = self.graphs.run("cross_kv", {"audio_features": features})
        layers = range(self.graphs.n_layer)
        cross_k = [outputs[f"cross_k.{i}"] for i in layers]
        cross_v = [outputs[f"cross_v.{i}"] for i in layers]
        if repeats > 1:  # rows grouped by window, as `TextDecoder.new_cache`
            cross_k = [k.repeat(repeats, axis=0) for k in cross_k]
            cross_v = [v.repeat(repeats, axis=0) for v in cross_v]
        return OnnxCache(cross_k, cross_v, self.graphs.config.n_text_ctx)

    def __call__(
        self,
        tokens: Tensor,
        cache: OnnxCache | None = None,
        audio_features: Tensor | None = None,
        cross_weights: list[Tensor] | None = None,
    ) -> Tensor:
        """Hidden states [B, T, D] of tokens [B, T] continuing `cache`; without one, of the
        whole sequence over `audio_features`."""
        if cross_weights is not None:
            plain = self.plain()
            assert audio_features is not None, "pass the audio features with cross_weights"
            return plain.decoder(
                tokens,
                audio_features=audio_features.to(plain.dtype),
                cross_weights=cross_weights,
            )
        if cache is None:
            assert audio_features is not None, "pass a cache or the audio features"
            cache = self.new_cache(audio_features)
        ids = tokens.cpu().numpy().astype(np.int64)
        if cache.length == 0:
            outputs = self.graphs.run("decoder_prefill", {"tokens": ids, **cache.inputs(False)})
            cache.write(outputs["self_k"], outputs["self_v"])
            return torch.from_numpy(outputs["hidden"])
        caches = cache.inputs(True)  # the arrays themselves: steps write into them
        steps = []
        for t in range(ids.shape[1]):  # after the prompt: one token per step
            position = np.array(cache.length, dtype=np.int64)
            outputs = self.graphs.run(
                "decoder_step", {"tokens": ids[:, t : t + 1], "position": position, **caches}
            )
            cache.write(outputs["new_k"], outputs["new_v"])
            steps.append(outputs["hidden"])
        return torch.from_numpy(np.concatenate(steps, axis=1) if len(steps) > 1 else steps[0])

    def logits(self, hidden: Tensor) -> Tensor:
        """Scores [..., n_vocab] (float32) of hidden states [..., D]."""
        rows = self.graphs.array(hidden.reshape(-1, hidden.shape[-1]))
        logits = self.graphs.run("logits", {"hidden": rows})["logits"]
        return torch.from_numpy(logits).reshape(*hidden.shape[:-1], -1)


class OnnxWhisper:
    """A `Whisper` for `decoding.decode`, `detect_language` and `timing` over an ONNX export:
    the encoder and the cached decoder run on onnxruntime (CPU); word timestamps run the
    plain PyTorch model (see `OnnxDecoder`)."""

    pads_prompts = False  # `decoding.decode` runs windows with prompts of other lengths apart

    def __init__(self, graphs: OnnxGraphs, fallback: Callable[[], Whisper]):
        self.graphs = graphs
        self.config = graphs.config
        self.encoder = OnnxEncoder(graphs)
        self.decoder = OnnxDecoder(graphs, fallback)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        return self.graphs.dtype


def load_onnx_export(
    folder: str | os.PathLike, device: str, compute_type: str, cpu_threads: int
) -> tuple[Checkpoint, OnnxWhisper]:
    """What `WhisperModel(folder)` runs on: the export's checkpoint description (config,
    alignment heads, tokenizer; no weights) and the ONNX model."""
    if device not in ("auto", "cpu"):
        raise InvalidOptionError(
            f"ONNX exports run on onnxruntime's CPU provider here, not {device!r}; use "
            "device='cpu', or the model itself on CUDA (the GPU runtime is faster)"
        )
    graphs = OnnxGraphs(folder, cpu_threads)
    # "auto" (the fastest type here, as faster-whisper users pass it): the export's own, the
    # only one its graphs run in (quantized types run on the model, not on an export).
    accepted = {"default", "auto", graphs.compute_type}
    if graphs.compute_type == "float32":  # what 16-bit types fall back to on the CPU (warned)
        accepted |= {"float16", "bfloat16"}
    if compute_type not in accepted:
        float_type = compute_type if compute_type in COMPUTE_TYPES else "float32"  # bfloat16's
        again = (
            "quantized types run on the model itself, not on an export"
            if MODEL_COMPUTE_TYPES.get(compute_type, (None, None))[1]
            else f"export again with --compute-type {float_type}"
        )
        raise InvalidOptionError(
            f"{graphs.folder} is a {graphs.compute_type} export; pass compute_type='default' "
            f"(--compute-type default), or {again}"
        )
    manifest = graphs.manifest
    checkpoint = Checkpoint(
        config=graphs.config,
        state_dict={},
        alignment_heads=_heads(
            manifest["alignment_heads"], graphs.config, str(graphs.folder / MANIFEST)
        ),
        tokenizer_file=graphs.folder / manifest["tokenizer"] if manifest["tokenizer"] else None,
        source=f"ONNX export {graphs.folder}",
    )
    return checkpoint, OnnxWhisper(graphs, lambda: _plain_model(manifest["source"]))


def _plain_model(source: str) -> Whisper:
    """The PyTorch model an export came from, in float32 on the CPU (word timestamps)."""
    from .transcribe import build_model  # transcribe imports this module

    try:
        checkpoint = resolve_checkpoint(source, local_files_only=True)
    except WhisperforgeError as error:
        raise ModelNotFoundError(
            f"word timestamps on an ONNX export run the PyTorch model it was exported from "
            f"({source}), which does not load here: {error}. Install that model, or "
            "transcribe without word timestamps"
        ) from None
    return build_model(checkpoint, torch.device("cpu"), torch.float32)
