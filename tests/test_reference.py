"""whisperforge against openai-whisper on the same real weights and the real dev audio.

openai-whisper is a test-only dependency; its model is loaded from the `.pt` that our own
converter writes, so both sides run the identical tiny.en / base weights in fp32.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import DEV_DIR, english_wer, manifest, short_english_clips

from whisperforge import load_audio
from whisperforge.checkpoints import save_openai

whisper = pytest.importorskip("whisper")


def reference_model(checkpoint, tmp_path_factory):
    path = tmp_path_factory.mktemp("openai") / "model.pt"
    save_openai(checkpoint, path)
    return whisper.load_model(str(path), device="cpu")


@pytest.fixture(scope="module")
def tiny_en_reference(tiny_en_checkpoint, tmp_path_factory):
    return reference_model(tiny_en_checkpoint, tmp_path_factory)


@pytest.fixture(scope="module")
def base_reference(base_checkpoint, tmp_path_factory):
    return reference_model(base_checkpoint, tmp_path_factory)


@pytest.fixture(scope="module")
def greedy_pairs(tiny_en_greedy, tiny_en_reference):
    """(clip, openai tokens, openai text, our tokens, our text) for each short English clip."""
    pairs = []
    for clip in short_english_clips():
        audio = load_audio(DEV_DIR / clip["audio"])
        expected = whisper.transcribe(tiny_en_reference, audio, fp16=False, temperature=0.0)
        segments = tiny_en_greedy[clip["audio"]]
        pairs.append(
            (
                clip,
                [t for s in expected["segments"] for t in s["tokens"]],
                expected["text"],
                [t for s in segments for t in s.tokens],
                "".join(s.text for s in segments),
            )
        )
    return pairs


def test_greedy_tokens_identical_to_openai_whisper(greedy_pairs):
    assert len(greedy_pairs) >= 20
    differing = [clip["audio"] for clip, ref, _, ours, _ in greedy_pairs if ref != ours]
    assert not differing, f"token sequences differ on {differing}"


def test_wer_equal_to_openai_whisper(greedy_pairs):
    exact = [p for p in greedy_pairs if p[0]["ref_kind"] == "exact"]
    references = [clip["text"] for clip, *_ in exact]
    ours = english_wer(references, [text for *_, text in exact])
    theirs = english_wer(references, [text for _, _, text, _, _ in exact])
    assert ours == theirs
    assert ours < 0.15  # tiny.en on clean read speech; a broken decoder lands far above


def test_beam_search_matches_openai_whisper(tiny_en, tiny_en_reference):
    audio = load_audio(DEV_DIR / "openai-whisper__jfk.flac")
    expected = whisper.transcribe(
        tiny_en_reference, audio, fp16=False, temperature=0.0, beam_size=5
    )
    segments, _ = tiny_en.transcribe(audio, beam_size=5, temperature=0.0)
    assert [t for s in segments for t in s.tokens] == [
        t for s in expected["segments"] for t in s["tokens"]
    ]


@pytest.mark.parametrize("language", ["de", "es", "fr", "it", "ja", "ko", "pt"])
def test_language_detection_matches_openai_whisper(base, base_reference, language):
    clip = next(r for r in manifest() if r["language"] == language and r["ref_kind"] == "exact")
    audio = load_audio(DEV_DIR / clip["audio"])
    code, probability, _ = base.detect_language(audio)
    mel = whisper.log_mel_spectrogram(torch.from_numpy(whisper.pad_or_trim(audio)))
    _, reference_probs = base_reference.detect_language(mel)
    assert code == language == max(reference_probs, key=reference_probs.get)
    assert probability == pytest.approx(reference_probs[language], abs=0.01)


@pytest.mark.parametrize(
    "options",
    [
        {}, {"word_timestamps": True}, {"beam_size": 5, "temperature": 0.0, "length_penalty": 0.5},
        # its last segment instantaneous: openai-whisper keeps it, emptied
        {"word_timestamps": True, "initial_prompt": "Um, uh, so like, corpus.",
         "clip": "mfa__cold_corpus.wav"},
    ],
)  # fmt: skip
def test_openai_whisper_api_gives_openai_whispers_result(
    tiny_en_checkpoint, tmp_path, capsys, options
):
    """`whisperforge.transcribe(whisperforge.load_model(...), ...)` in place of openai-whisper's,
    on its defaults (greedy, the fallback ladder) and options (its length_penalty is the Google
    NMT alpha): the same result dict, word times included."""
    import whisperforge

    path = tmp_path / "tiny.en.pt"
    save_openai(tiny_en_checkpoint, path)
    reference = whisper.load_model(str(path), device="cpu")
    # openai-whisper knows tiny.en's alignment heads by its name only; from a path it takes
    # every head of the upper layers. These are the heads the package's model comes with.
    config, heads = tiny_en_checkpoint.config, tiny_en_checkpoint.alignment_heads
    mask = torch.zeros(config.n_text_layer, config.n_text_head, dtype=torch.bool)
    mask[heads[:, 0], heads[:, 1]] = True
    reference.register_buffer("alignment_heads", mask.to_sparse(), persistent=False)
    options = dict(options)
    audio = load_audio(DEV_DIR / options.pop("clip", "openai-whisper__jfk.flac"))
    expected = whisper.transcribe(reference, audio, verbose=True, fp16=False, **options)
    printed_by_openai_whisper = capsys.readouterr().out
    # whisper.transcribe(model, audio, ...), as openai-whisper's module has it; the one model
    # loaded serves the checks below too (a load is 0.9 s, and it was loaded four times).
    loaded = whisperforge.load_model(str(path), device="cpu")
    result = whisperforge.transcribe(loaded, audio, verbose=True, fp16=False, **options)
    assert (result["text"], result["language"]) == (expected["text"], expected["language"])
    assert len(result["segments"]) == len(expected["segments"])
    assert list(result) == list(expected)  # text, segments, language: nothing of ours added
    for ours, theirs in zip(result["segments"], expected["segments"]):
        assert list(ours) == list(theirs)  # the same keys in the same order: the same JSON
        assert ours["tokens"] == theirs["tokens"]
        assert (ours["start"], ours["end"]) == pytest.approx((theirs["start"], theirs["end"]))
        assert len(ours.get("words", [])) == len(theirs.get("words", []))
        for our_word, their_word in zip(ours.get("words", []), theirs.get("words", [])):
            assert list(our_word) == list(their_word)
            assert our_word["word"] == their_word["word"]
            assert (our_word["start"], our_word["end"]) == pytest.approx(
                (their_word["start"], their_word["end"]), abs=0.005
            )
    if "initial_prompt" not in options:  # (an emptied segment's line shows no text here)
        assert capsys.readouterr().out == printed_by_openai_whisper  # verbose=True's lines too
    with pytest.raises(whisperforge.InvalidOptionError, match="token ids"):
        loaded.transcribe(audio, suppress_tokens="x")
    with pytest.raises(TypeError, match="beam_width"):
        loaded.transcribe(audio, beam_width=5)
    ours = loaded.eval()  # what scripts ask of it
    mel = whisperforge.log_mel_spectrogram(whisperforge.pad_or_trim(audio))
    for model in (ours, reference):  # an English-only model has no language to detect
        with pytest.raises(ValueError, match="language tokens"):
            model.detect_language(mel)
    assert ours.num_languages == reference.num_languages and vars(ours.dims) == vars(reference.dims)
    assert next(ours.parameters()).device == next(reference.parameters()).device
    network = ours.model  # nn.Module's moves, as scripts chain them: the same device stays put
    assert ours.to("cpu").cpu().half().float().to(torch.float16) is ours and ours.model is network
    if not torch.cuda.is_available():
        with pytest.raises(whisperforge.InvalidOptionError, match="no CUDA GPU"):
            ours.cuda()


def test_openai_whisper_readme_example_runs_on_whisperforge(
    base_checkpoint, base_reference, tmp_path
):
    """openai-whisper's lower-level example (pad_or_trim, log_mel_spectrogram, detect_language,
    decode) with `import whisperforge as whisper`: the same language and the same tokens."""
    import numpy as np

    import whisperforge

    path = tmp_path / "base.pt"
    save_openai(base_checkpoint, path)
    model = whisperforge.load_model(str(path), device="cpu")
    clip = next(r for r in manifest() if r["language"] == "de" and r["ref_kind"] == "exact")
    audio = whisperforge.pad_or_trim(whisperforge.load_audio(DEV_DIR / clip["audio"]))
    assert isinstance(audio, np.ndarray) and audio.shape == (480000,)
    mel = whisperforge.log_mel_spectrogram(audio, n_mels=model.dims.n_mels).to(model.device)
    reference_mel = whisper.log_mel_spectrogram(audio)
    assert torch.allclose(mel, reference_mel, atol=1e-4)
    token, probs = model.detect_language(mel)
    reference_token, reference_probs = base_reference.detect_language(reference_mel)
    assert max(probs, key=probs.get) == max(reference_probs, key=reference_probs.get) == "de"
    assert int(token) == int(reference_token)
    result = whisperforge.decode(model, mel, whisperforge.DecodingOptions(fp16=False))
    expected = whisper.decode(base_reference, reference_mel, whisper.DecodingOptions(fp16=False))
    assert (result.language, result.tokens, result.text) == (
        expected.language, expected.tokens, expected.text
    )  # fmt: skip
    assert torch.allclose(result.audio_features, expected.audio_features, atol=1e-3)
    found, reference_found = (  # openai-whisper's task for the language alone
        api.decode(m, mel, api.DecodingOptions(task="lang_id", fp16=False))
        for api, m in ((whisperforge, model), (whisper, base_reference))
    )
    assert (found.language, found.tokens, found.text) == ("de", reference_found.tokens, "")
    assert found.language_probs == pytest.approx(reference_found.language_probs, abs=1e-5)
    # The encoder's output in place of the mel, as openai-whisper takes it.
    features = model.embed_audio(mel[None])
    assert torch.allclose(features, base_reference.embed_audio(reference_mel[None]), atol=1e-3)
    assert model.detect_language(features)[1][0] == pytest.approx(probs, abs=1e-5)
    assert whisperforge.decode(model, features[0], fp16=False).tokens == expected.tokens
    # openai-whisper gives the language as it was given.
    assert model.transcribe(audio, language="German", temperature=0.0)["language"] == "German"
    with pytest.raises(whisperforge.InvalidOptionError, match="pad_or_trim"):
        whisperforge.decode(model, whisperforge.log_mel_spectrogram(audio[:16000]))


def test_openai_detect_language_and_decode_take_a_numpy_mel(base, tiny_en):
    """A mel as a NumPy array (librosa's, np.load's; read-only here) gives what its tensor
    gives: it was a raw AttributeError ('numpy.ndarray' object has no attribute 'to')."""
    import numpy as np

    import whisperforge

    audio = whisperforge.pad_or_trim(load_audio(DEV_DIR / "openai-whisper__jfk.flac"))
    mel = whisperforge.log_mel_spectrogram(audio)
    array = mel.numpy().astype(np.float64)
    array.setflags(write=False)
    multilingual = whisperforge.openai_api.OpenAIWhisper(base)
    token, probs = whisperforge.detect_language(multilingual, array)
    assert max(probs, key=probs.get) == "en"
    assert int(token) == base.tokenizer.to_language_token("en")
    model = whisperforge.openai_api.OpenAIWhisper(tiny_en)
    options = whisperforge.DecodingOptions(fp16=False, without_timestamps=True)
    assert whisperforge.decode(model, array, options).tokens == model.decode(mel, options).tokens
    with pytest.raises(whisperforge.InvalidOptionError, match="NumPy float array"):
        whisperforge.detect_language(multilingual, mel.tolist())


def test_openai_whisper_fp16_false_decodes_in_float32(tiny_en, monkeypatch):
    """fp16=False on a model loaded in float16 (a GPU's default) decodes with a float32 copy,
    loaded once from where the model came from, as openai-whisper's float32 weights give it;
    a model wrapped without its source says it cannot, and what to do. Here the CPU models are
    only labelled float16."""
    import numpy as np

    import whisperforge

    audio = load_audio(DEV_DIR / "openai-whisper__jfk.flac")
    loaded = whisperforge.load_model("tiny.en", device="cpu")
    mel = whisperforge.log_mel_spectrogram(whisperforge.pad_or_trim(audio))
    expected = loaded.transcribe(audio, temperature=0.0)  # float32 already: the model itself
    expected_window = loaded.decode(mel)
    assert loaded.float32_model is None
    monkeypatch.setattr(loaded.model, "dtype", torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = loaded.transcribe(audio, temperature=0.0, fp16=False)
        copy = loaded.float32_model
        assert copy is not None and copy is not loaded.model and copy.dtype == torch.float32
        decoded = loaded.decode(mel, whisperforge.DecodingOptions(fp16=False))
        assert loaded.float32_model is copy  # loaded once
    assert result["segments"][0]["tokens"] == expected["segments"][0]["tokens"]
    assert decoded.tokens == expected_window.tokens

    wrapped = whisperforge.openai_api.OpenAIWhisper(tiny_en)
    monkeypatch.setattr(tiny_en, "dtype", torch.float16)
    silence = np.zeros(16000 * 2, dtype=np.float32)  # not decoded: the label does not matter
    with pytest.warns(UserWarning, match="compute_type='float32'"):
        assert wrapped.transcribe(silence, fp16=False, language="en")["segments"] == []


def test_word_timestamps_on_a_translation_warn_as_openai_whisper_does(base, base_reference, capsys):
    """The alignment heads follow the spoken words, not the English ones: openai-whisper warns
    that such word times may not be reliable, and so does its API here, and the command."""
    import whisperforge
    from whisperforge import cli

    clip = DEV_DIR / "picovoice-leopard__test_de.wav"
    audio = load_audio(clip)[: 4 * 16000]  # warned of before any decoding: a few words will do
    # The language given: the warning does not depend on it, and neither side then encodes the
    # window once more to detect it (4 of base's encoder passes here, not 7).
    options = {
        "task": "translate",
        "word_timestamps": True,
        "fp16": False,
        "temperature": 0.0,
        "language": "de",
    }
    with pytest.warns(UserWarning, match="translations may not be reliable") as theirs:
        whisper.transcribe(base_reference, audio, **options)
    with pytest.warns(UserWarning) as ours:
        whisperforge.openai_api.OpenAIWhisper(base).transcribe(audio, **options)
    said = [w for w in ours if "translations" in str(w.message)]
    assert [str(w.message) for w in said] == [
        str(w.message) for w in theirs if "translations" in str(w.message)
    ]
    assert said[0].filename == __file__  # the caller's line, as warnings should point
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # transcribing, with word times, is not warned about
        whisperforge.openai_api.OpenAIWhisper(base).transcribe(
            audio, word_timestamps=True, temperature=0.0, language="de"
        )
    # The command warns before it loads a model (tiny.en then refuses to translate).
    command = ["transcribe", str(clip), "--task", "translate", "--word_timestamps", "True"]
    assert cli.main(command) == 1
    assert "warning: Word-level timestamps on translations" in capsys.readouterr().err
