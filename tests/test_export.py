"""Export (issue 9): tiny.en exported to ONNX (once per session, through `whisperforge export`)
decodes token for token like the PyTorch fp32 path on onnxruntime, through the same pipelines
and writers; torch.export of the decoder step with static caches matches eager; fp16 graphs
have the right types and shapes; bad inputs get errors that say what to do."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEV_DIR, JFK, pcm_wav, short_english_clips

from whisperforge import (
    BatchedInferencePipeline,
    InvalidOptionError,
    ModelFormatError,
    ModelNotFoundError,
    WhisperModel,
    cli,
    load_audio,
)
from whisperforge.export import (
    MANIFEST,
    _onnx_proto,
    example_inputs,
    export_model,
    export_program,
    graph_names,
    quiet_exporter,
    wrappers,
)
from whisperforge.writers import FORMATS

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")


@pytest.fixture(scope="session")
def onnx_dir(tmp_path_factory):
    """tiny.en exported once per session, through the command, into what an export cut short
    (Ctrl-C, a full disk) leaves: its files without the manifest, which a rerun replaces."""
    out = tmp_path_factory.mktemp("export") / "tiny.en-onnx"
    out.mkdir()
    (out / "encoder.onnx").write_bytes(b"\x08\x07")
    assert cli.main(["export", "tiny.en", "--format", "onnx", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="session")
def onnx_tiny_en(onnx_dir):
    return WhisperModel(onnx_dir, device="cpu")


def greedy_tokens(model: WhisperModel, audio) -> list[int]:
    segments, _ = model.transcribe(audio, beam_size=1, temperature=0.0)
    return [t for s in segments for t in s.tokens]


def test_onnx_greedy_is_token_identical_on_the_short_english_clips(tiny_en_greedy, onnx_tiny_en):
    """Every second of the suite's short English clips (13 of 25); all 53 of 30 s or less are
    benchmarks/export_cpu.py's."""
    clips = [clip["audio"] for clip in short_english_clips()][::2]
    assert len(clips) >= 12
    differ = []
    for clip in clips:
        expected = [t for s in tiny_en_greedy[clip] for t in s.tokens]
        assert expected, f"{clip}: the PyTorch path decoded nothing"
        if greedy_tokens(onnx_tiny_en, load_audio(DEV_DIR / clip)) != expected:
            differ.append(clip)
    assert not differ, f"ONNX tokens differ from PyTorch on {differ}"


def test_onnx_beam_search_word_timestamps_and_batched_pipeline(tiny_en, onnx_tiny_en):
    # Beam search reorders the ONNX cache; word timestamps run the PyTorch fallback.
    audio = load_audio(JFK)
    expected, _ = tiny_en.transcribe(audio, beam_size=5, word_timestamps=True)
    got, _ = onnx_tiny_en.transcribe(audio, beam_size=5, word_timestamps=True)
    expected, got = list(expected), list(got)
    assert [s.tokens for s in got] == [s.tokens for s in expected]
    expected_words = [(w.word, w.start, w.end) for s in expected for w in s.words]
    assert [(w.word, w.start, w.end) for s in got for w in s.words] == expected_words

    expected, _ = BatchedInferencePipeline(tiny_en).transcribe(audio, beam_size=1)
    got, _ = BatchedInferencePipeline(onnx_tiny_en).transcribe(audio, beam_size=1)
    assert [s.tokens for s in got] == [s.tokens for s in expected]


def test_windows_after_prompts_of_other_lengths_decode_as_on_the_model(tiny_en, onnx_tiny_en):
    """`num_workers` > 1 (and the server's batches) decode the windows of several calls together,
    each after its own previous text. The graphs take no padding mask: each prompt length is
    decoded apart (it failed: "the ONNX decoder takes one prompt for all windows")."""
    from whisperforge.decoding import DecodingOptions, decode

    mel = jfk_mel(tiny_en).repeat(2, 1, 1)
    prompts = [None, " And so my fellow Americans,"]
    results = {
        name: decode(model.model, model.tokenizer, model.encode(mel), DecodingOptions(), prompts)
        for name, model in (("pytorch", tiny_en), ("onnx", onnx_tiny_en))
    }
    expected = [r.tokens for r in results["pytorch"]]
    assert [r.tokens for r in results["onnx"]] == expected


def test_torch_export_of_the_step_matches_eager(tiny_en):
    model = tiny_en.model
    n_layer = model.config.n_text_layer
    step = wrappers(model)["decoder_step"]
    tokens, position, *caches = example_inputs(model.config, torch.float32)["decoder_step"]
    with quiet_exporter():
        program = export_program(step, (tokens, position, *caches), "decoder_step", n_layer)
    ops = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert not [op for op in ops if "higher_order" in op], f"control flow in the step: {ops}"
    exported = program.module()
    with torch.no_grad():
        for batch in (1, 2, 3):  # dynamic batch
            rows = [[c[:1].repeat(batch, 1, 1, 1) for c in layers] for layers in caches]
            inputs = (tokens[:1].repeat(batch, 1), position, *rows)
            for got, expected in zip(exported(*inputs), step(*inputs)):
                assert got.shape == expected.shape
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_export_wrappers_match_the_plain_cached_decoder(tiny_en):
    # The graphs' static-cache attention against the reference network's cache, on real audio.
    model = tiny_en.model
    graphs = wrappers(model)
    tokenizer = tiny_en.tokenizer
    prompt = torch.tensor([list(tokenizer.sot_sequence)])
    following = torch.tensor([[tokenizer.timestamp_begin]])
    mel = jfk_mel(tiny_en)
    with torch.no_grad():
        features = tiny_en.encode(mel)
        cache = model.decoder.new_cache(features)
        expected_prompt = model.decoder(prompt, cache)
        expected_step = model.decoder(following, cache)

        cross_k, cross_v = graphs["cross_kv"](features)
        hidden, keys, values = graphs["decoder_prefill"](prompt, cross_k, cross_v)
        n, length = prompt.shape[1], model.config.n_text_ctx
        self_k = [torch.zeros(*k.shape[:2], length, k.shape[3]) for k in cross_k]
        self_v = [torch.zeros_like(k) for k in self_k]
        for i in range(model.config.n_text_layer):
            self_k[i][:, :, :n], self_v[i][:, :, :n] = keys[i], values[i]
        step_hidden, _, _ = graphs["decoder_step"](
            following, torch.tensor(n), self_k, self_v, cross_k, cross_v
        )
        torch.testing.assert_close(graphs["encoder"](mel), features)
    torch.testing.assert_close(hidden, expected_prompt, atol=1e-4, rtol=0)
    torch.testing.assert_close(step_hidden, expected_step, atol=1e-4, rtol=0)


def jfk_mel(model: WhisperModel) -> torch.Tensor:
    from whisperforge.audio import N_FRAMES, N_SAMPLES, log_mel_spectrogram, pad_or_trim

    mel = log_mel_spectrogram(load_audio(JFK), model.checkpoint.config.n_mels, N_SAMPLES)
    return pad_or_trim(mel, N_FRAMES)[None]


def test_fp16_step_export_is_deterministic_and_runs_on_onnxruntime(tiny_en):
    # fp16 on the CPU: the graph's types and shapes, not its speed or its tokens.
    config = tiny_en.model.config
    step = wrappers(copy.deepcopy(tiny_en.model).half())["decoder_step"]
    args = example_inputs(config, torch.float16)["decoder_step"]
    with quiet_exporter():
        first, second = (
            _onnx_proto(step, args, "decoder_step", config.n_text_layer) for _ in range(2)
        )
    data = first.SerializeToString(deterministic=True)
    assert data == second.SerializeToString(deterministic=True)

    session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    tokens, position, *caches = args
    names, _ = graph_names(config.n_text_layer)["decoder_step"]
    arrays = [tokens, position, *(c for layers in caches for c in layers)]
    hidden, new_k, new_v = session.run(None, dict(zip(names, (a.numpy() for a in arrays))))
    B, L, H = tokens.shape[0], config.n_text_layer, config.n_text_head
    assert hidden.dtype == new_k.dtype == new_v.dtype == np.float16
    assert hidden.shape == (B, 1, config.n_text_state)
    assert new_k.shape == new_v.shape == (L, B, H, 1, config.n_text_state // H)
    assert np.isfinite(hidden).all()


def test_cli_transcribes_long_form_with_an_export_like_the_model(onnx_dir, tmp_path, capsys):
    # Two windows (the second prompted with the first's text) through the same writers.
    audio = np.concatenate([load_audio(JFK), load_audio(DEV_DIR / "mfa__cold_corpus.wav")])
    path = tmp_path / "long.wav"
    path.write_bytes(pcm_wav(audio))
    options = [str(path), "--beam-size", "1", "--output-format", "all"]
    for name, model in (
        ("pytorch", ["tiny.en", "--compute-type", "float32"]),
        ("onnx", [str(onnx_dir)]),
    ):
        out = tmp_path / name
        assert cli.main(["transcribe", *options, "--model", *model, "--output-dir", str(out)]) == 0
    capsys.readouterr()
    for format in FORMATS:
        expected = (tmp_path / "pytorch" / f"long.{format}").read_text()
        got = (tmp_path / "onnx" / f"long.{format}").read_text()
        if format == "json":  # log-probabilities agree to float rounding only
            expected, got = json.loads(expected), json.loads(got)
            assert len(got["segments"]) == len(expected["segments"]) > 1
            for segments in (expected["segments"], got["segments"]):
                for segment in segments:
                    del segment["avg_logprob"], segment["no_speech_prob"]
        assert got == expected, format


@pytest.mark.filterwarnings("ignore:float16 is slow")
@pytest.mark.filterwarnings("ignore:bfloat16 is slow")
def test_bad_inputs_get_clear_errors(onnx_dir, tmp_path, capsys):
    with pytest.raises(ModelNotFoundError, match="no such file or folder"):
        WhisperModel(tmp_path / "no-such-export", device="cpu")
    with pytest.raises(InvalidOptionError, match="use one of onnx, torch-export"):
        export_model("tiny.en", tmp_path / "out", format="tflite")
    assert cli.main(["export", "tiny.en", "--format", "tflite", "--out", str(tmp_path)]) == 2
    assert "invalid choice: 'tflite'" in capsys.readouterr().err

    assert cli.main(["export", "no-such-model", "--out", str(tmp_path / "out")]) == 1
    assert "error: unknown model 'no-such-model'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written before the model loads

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(InvalidOptionError, match="new or empty folder"):
        export_model("tiny.en", tmp_path)
    assert cli.main(["export", "tiny.en", "--out", str(tmp_path / "notes.txt")]) == 1
    assert "notes.txt is a file; give --out a new or empty folder" in capsys.readouterr().err
    assert cli.main(["export", "tiny.en", "--out", str(tmp_path / "notes.txt" / "out")]) == 1
    assert "cannot write" in capsys.readouterr().err  # not the OSError's own "[Errno 20]"
    with pytest.raises(InvalidOptionError, match="export the model it came from"):
        export_model(onnx_dir, tmp_path / "again")

    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(onnx_dir / MANIFEST, broken / MANIFEST)
    with pytest.raises(ModelFormatError, match="missing; export again"):
        WhisperModel(broken, device="cpu")

    manifest = json.loads((onnx_dir / MANIFEST).read_text())
    manifest.update(format="torch-export", files=[])
    (broken / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(InvalidOptionError, match="export with --format onnx"):
        WhisperModel(broken, device="cpu")

    with pytest.raises(
        InvalidOptionError, match="float32 export.*quantized types run on the model"
    ):
        WhisperModel(onnx_dir, device="cpu", compute_type="int8")
    with pytest.warns(UserWarning, match="using float32"):  # as the model itself on the CPU
        WhisperModel(onnx_dir, device="cpu", compute_type="float16")

    half = float16_export(onnx_dir, tmp_path)
    with pytest.raises(InvalidOptionError, match="float16 export.*--compute-type float32$"):
        WhisperModel(half, device="cpu", compute_type="bfloat16")  # bfloat16 is not quantized


def float16_export(onnx_dir: Path, tmp_path: Path) -> Path:
    """`onnx_dir` labelled a float16 export (its graphs are not run as such here)."""
    half = tmp_path / "half"
    half.mkdir()
    for path in onnx_dir.iterdir():
        if path.name != MANIFEST:
            (half / path.name).symlink_to(path)
    manifest = json.loads((onnx_dir / MANIFEST).read_text())
    (half / MANIFEST).write_text(json.dumps({**manifest, "compute_type": "float16"}))
    return half


def test_auto_compute_type_is_the_exports_own(onnx_dir, tmp_path):
    """compute_type="auto" (faster-whisper's "the fastest type here") runs an export in its own
    type; it was refused with "a float32 export; ... export again with --compute-type float32"."""
    model = WhisperModel(onnx_dir, device="cpu", compute_type="auto")
    assert model.dtype == torch.float32
    half = float16_export(onnx_dir, tmp_path)
    assert WhisperModel(half, device="cpu", compute_type="auto").dtype == torch.float16


def test_ctrl_c_during_the_onnx_capture_is_an_interrupt(tmp_path, monkeypatch, capsys):
    """torch.onnx wraps a Ctrl-C in its torch.export step in a TorchExportError: the command
    printed a hundred lines of traceback and exited 1; now it exits 130, leaving no folder."""

    def interrupted(*args, **kwargs):
        try:
            raise KeyboardInterrupt  # in torch's first import of torch._dynamo.exc
        except KeyboardInterrupt:  # torch's `except torch._dynamo.exc.UserError` then fails:
            raise AttributeError("module 'torch._dynamo' has no attribute 'exc'") from None

    monkeypatch.setattr(torch.export, "export", interrupted)
    out = tmp_path / "out"
    assert cli.main(["export", "tiny.en", "--out", str(out)]) == 130
    assert "Traceback" not in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())  # no staging folder left either


def test_a_folder_of_someone_elses_weights_bin_is_not_taken_for_an_export(tmp_path, capsys):
    """A folder holding only a weights.bin (or tokenizer.json) of its own was taken for an export
    cut short, and written over."""
    (tmp_path / "weights.bin").write_bytes(b"mine")
    assert cli.main(["export", "tiny.en", "--out", str(tmp_path)]) == 1
    assert "holds other files" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["weights.bin"]
    assert (tmp_path / "weights.bin").read_bytes() == b"mine"
