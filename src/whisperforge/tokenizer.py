"""Whisper's tokenizer: byte-level BPE text tokens plus the special tokens that steer decoding.

Text comes from the checkpoint's `tokenizer.json` (Hugging Face `tokenizers`) or, for an
OpenAI `.pt` checkpoint without one, from openai-whisper's tiktoken vocabulary files.
Special token ids are looked up by name, so English-only and multilingual (and 100-language
v3) vocabularies all work.
"""

from __future__ import annotations

import itertools
import json
import re
import string
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Literal, Protocol

from .errors import InvalidOptionError, ModelFormatError, UnknownLanguageError

# Whisper's languages, in token order (code, name). The first `num_languages` of a model apply.
_LANGUAGE_TABLE = """
en english|zh chinese|de german|es spanish|ru russian|ko korean|fr french|ja japanese|
pt portuguese|tr turkish|pl polish|ca catalan|nl dutch|ar arabic|sv swedish|it italian|
id indonesian|hi hindi|fi finnish|vi vietnamese|he hebrew|uk ukrainian|el greek|ms malay|
cs czech|ro romanian|da danish|hu hungarian|ta tamil|no norwegian|th thai|ur urdu|hr croatian|
bg bulgarian|lt lithuanian|la latin|mi maori|ml malayalam|cy welsh|sk slovak|te telugu|
fa persian|lv latvian|bn bengali|sr serbian|az azerbaijani|sl slovenian|kn kannada|
et estonian|mk macedonian|br breton|eu basque|is icelandic|hy armenian|ne nepali|
mn mongolian|bs bosnian|kk kazakh|sq albanian|sw swahili|gl galician|mr marathi|pa punjabi|
si sinhala|km khmer|sn shona|yo yoruba|so somali|af afrikaans|oc occitan|ka georgian|
be belarusian|tg tajik|sd sindhi|gu gujarati|am amharic|yi yiddish|lo lao|uz uzbek|
fo faroese|ht haitian creole|ps pashto|tk turkmen|nn nynorsk|mt maltese|sa sanskrit|
lb luxembourgish|my myanmar|bo tibetan|tl tagalog|mg malagasy|as assamese|tt tatar|
haw hawaiian|ln lingala|ha hausa|ba bashkir|jw javanese|su sundanese|yue cantonese
"""


def asks_detection(language: str) -> bool:
    """Whether a language given as text asks for it to be detected: none (openai-whisper's
    --language None) or auto (whisper.cpp's -l auto)."""
    return language.strip().lower() in ("none", "auto")


LANGUAGES: dict[str, str] = dict(
    entry.strip().split(" ", 1) for entry in _LANGUAGE_TABLE.replace("\n", "").split("|")
)
# Names and a few aliases to codes, so `language="German"` works too.
TO_LANGUAGE_CODE: dict[str, str] = {
    **{name: code for code, name in LANGUAGES.items()},
    "burmese": "my", "valencian": "ca", "flemish": "nl", "haitian": "ht",
    "letzeburgesch": "lb", "pushto": "ps", "panjabi": "pa", "moldavian": "ro",
    "moldovan": "ro", "sinhalese": "si", "castilian": "es", "mandarin": "zh",
    # ISO 639 codes (and locales' old ones) that Whisper spells otherwise
    "jv": "jw", "iw": "he", "nb": "no", "fil": "tl", "filipino": "tl", "in": "id", "ji": "yi",
}  # fmt: skip

TASKS = ("transcribe", "translate")


def special_token_names(num_languages: int) -> list[str]:
    """Whisper's special tokens in id order, the first right after the text vocabulary."""
    names = ["<|endoftext|>", "<|startoftranscript|>"]
    names += [f"<|{code}|>" for code in list(LANGUAGES)[:num_languages]]
    names += ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>"]
    names += ["<|nospeech|>", "<|notimestamps|>"]
    return names + [f"<|{i * 0.02:.2f}|>" for i in range(1501)]


class TextCodec(Protocol):
    """What the tokenizer needs from a BPE implementation."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int], errors: str = "replace") -> str: ...
    def token_to_id(self, token: str) -> int | None: ...


def _restore_merges(spec: dict) -> bool:
    """Put back the BPE merges a converted tokenizer.json lost; True if any were missing.

    Whisper's vocabulary is tiktoken's, where a token's id is the rank of the merge that makes
    it, so every token past the 256 bytes has a merge. The `base` package's file lacks its very
    first one ("Ġ t"), which cost every word starting " t" its token (" the" became " " + "the",
    prompts and prefixes unlike openai-whisper's). A lost merge is found as BPE finds it: the
    token's bytes merged with the ranks below its own leave two parts."""
    model = spec.get("model") or {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list):
        return False
    pairs = [m.split(" ") if isinstance(m, str) else list(m) for m in merges]
    made = {"".join(pair) for pair in pairs}
    special = {token["content"] for token in spec.get("added_tokens", [])}
    lost = []
    for token, rank in vocab.items():
        if rank < 256 or len(token) < 2 or token in made or token in special:
            continue
        parts = list(token)  # byte-level: one character a byte
        while len(parts) > 2:
            ranks = [vocab.get(a + b, rank) for a, b in itertools.pairwise(parts)]
            best = min(range(len(ranks)), key=ranks.__getitem__)
            if ranks[best] >= rank:
                break
            parts[best : best + 2] = [parts[best] + parts[best + 1]]
        if len(parts) == 2 and all(part in vocab for part in parts):
            lost.append(parts)
    if not lost:
        return False
    pairs = sorted(pairs + lost, key=lambda pair: vocab.get("".join(pair), len(vocab)))
    as_text = not merges or isinstance(merges[0], str)  # the file's own spelling of a merge
    model["merges"] = [" ".join(p) if as_text else p for p in pairs]
    return True


def _name_specials_as_openai(spec: dict) -> bool:
    """Name special tokens as openai-whisper does; True if any was renamed. Hugging Face's
    files for the first models call the no-speech token "<|nocaptions|>" and (English-only
    ones) Hebrew's "<|iw|>", which `decode` would show and `special_tokens` would list."""
    renames = {"<|nocaptions|>": "<|nospeech|>", "<|iw|>": "<|he|>"}
    names = {token.get("content") for token in spec.get("added_tokens", [])}
    renamed = False
    for token in spec.get("added_tokens", []):
        new = renames.get(token.get("content"))
        if new is not None and new not in names:
            token["content"], renamed = new, True
    return renamed


class HuggingFaceCodec:
    """A `tokenizer.json` read with the `tokenizers` library."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer as HFTokenizer

        try:
            text = path.read_text(encoding="utf-8")
            spec = json.loads(text)
            changed = _restore_merges(spec) | _name_specials_as_openai(spec)
            self.hf = HFTokenizer.from_str(json.dumps(spec) if changed else text)
        except Exception as error:  # noqa: BLE001 (tokenizers raises a bare Exception)
            raise ModelFormatError(f"{path}: not a readable tokenizer.json ({error})") from None
        # Text is text: a prompt that spells "<|endoftext|>" must not become the control token
        # (tiktoken's `disallowed_special=()` below does the same).
        self.hf.encode_special_tokens = True

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], errors: str = "replace") -> str:
        """The tokens' text; `errors` as bytes.decode's, for bytes that are not whole UTF-8
        characters (the library's own decode always replaces them)."""
        if errors == "replace":
            return self.hf.decode(ids, skip_special_tokens=False)
        pieces = (self.hf.id_to_token(i) or "" for i in ids)
        return bytes(self._byte_of[c] for piece in pieces for c in piece).decode("utf-8", errors)

    @cached_property
    def _byte_of(self) -> dict[str, int]:
        """Byte-level BPE's alphabet back to bytes: bytes that print stand for themselves, the
        others for the characters from U+0100 on, in byte order."""
        printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
        others = [b for b in range(256) if b not in printable]
        return {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(others)}

    def token_to_id(self, token: str) -> int | None:
        return self.hf.token_to_id(token)


@cache
def get_encoding(name: str = "gpt2", num_languages: int = 99):  # -> tiktoken.Encoding
    """openai-whisper's `whisper.tokenizer.get_encoding`: its vocabulary files ("gpt2" for
    English-only models, "multilingual") as a tiktoken Encoding, with Whisper's special tokens.
    Needs openai-whisper (the files) and tiktoken."""
    import base64
    import importlib.util

    spec = importlib.util.find_spec("whisper")
    if spec is None or spec.origin is None or importlib.util.find_spec("tiktoken") is None:
        raise ModelFormatError(
            "the model has no tokenizer.json; copy the model's tokenizer.json into its "
            "folder (beside a .pt file), or `pip install openai-whisper tiktoken` for "
            "openai-whisper's vocabulary"
        )
    import tiktoken

    vocab_path = Path(spec.origin).parent / "assets" / f"{name}.tiktoken"
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in vocab_path.read_text().splitlines() if line)
    }
    specials = special_token_names(num_languages)
    return tiktoken.Encoding(
        name=vocab_path.name,
        explicit_n_vocab=len(ranks) + len(specials),
        pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
        mergeable_ranks=ranks,
        special_tokens={token: len(ranks) + i for i, token in enumerate(specials)},
    )


class TiktokenCodec:
    """openai-whisper's own vocabulary files, for models that come without tokenizer.json
    (`.pt` files, CTranslate2 and transformers folders): Whisper's token ids are its."""

    def __init__(self, multilingual: bool, num_languages: int):
        self._encoding = get_encoding("multilingual" if multilingual else "gpt2", num_languages)
        self._special = {
            name: self._encoding.encode_single_token(name)
            for name in self._encoding.special_tokens_set
        }

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, disallowed_special=())

    def decode(self, ids: list[int], errors: str = "replace") -> str:
        return self._encoding.decode(ids, errors=errors)

    def token_to_id(self, token: str) -> int | None:
        return self._special.get(token)


@dataclass
class Tokenizer:
    """Special tokens and the start-of-transcript sequence for one model, language and task."""

    codec: TextCodec
    multilingual: bool
    num_languages: int
    language: str | None = None
    task: str | None = "transcribe"  # None: no task token (openai-whisper's English tokenizer)
    sot_sequence: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.task is not None and self.task not in TASKS:
            raise InvalidOptionError(f"unknown task {self.task!r}; use one of {TASKS}")
        sequence = [self.sot]
        if self.multilingual:
            if self.language is not None:
                sequence.append(self.to_language_token(self.language))
            if self.task is not None:
                sequence.append(self.transcribe if self.task == "transcribe" else self.translate)
        self.sot_sequence = tuple(sequence)

    def with_options(self, language: str | None, task: str) -> Tokenizer:
        return Tokenizer(self.codec, self.multilingual, self.num_languages, language, task)

    def _special(self, name: str) -> int:
        token_id = self.codec.token_to_id(name)
        if token_id is None:
            raise ModelFormatError(f"the tokenizer lacks the special token {name}")
        return token_id

    @cached_property
    def eot(self) -> int:
        return self._special("<|endoftext|>")

    @cached_property
    def sot(self) -> int:
        return self._special("<|startoftranscript|>")

    @cached_property
    def transcribe(self) -> int:
        return self._special("<|transcribe|>")

    @cached_property
    def translate(self) -> int:
        return self._special("<|translate|>")

    @cached_property
    def sot_lm(self) -> int:
        return self._special("<|startoflm|>")

    @cached_property
    def sot_prev(self) -> int:
        return self._special("<|startofprev|>")

    @cached_property
    def no_speech(self) -> int:
        return self._special("<|nospeech|>")

    @cached_property
    def no_timestamps(self) -> int:
        return self._special("<|notimestamps|>")

    @cached_property
    def timestamp_begin(self) -> int:
        # Timestamp tokens follow <|notimestamps|> whether or not the vocabulary names them.
        return self.no_timestamps + 1

    @cached_property
    def all_language_codes(self) -> tuple[str, ...]:
        return tuple(list(LANGUAGES)[: self.num_languages])

    @cached_property
    def all_language_tokens(self) -> tuple[int, ...]:
        return tuple(self.sot + 1 + i for i in range(self.num_languages))

    def to_language_token(self, language: str) -> int:
        """The token of a language (a code, a name or a locale). One the tokenizer lacks raises
        UnknownLanguageError, a KeyError as openai-whisper's is (and a ValueError)."""
        code = normalize_language(language, self.all_language_codes)
        return self.sot + 1 + self.all_language_codes.index(code)

    @cached_property
    def language_token(self) -> int:
        """The token of this tokenizer's language (openai-whisper's property)."""
        if self.language is None:
            raise ValueError("This tokenizer does not have language token configured")
        return self.to_language_token(self.language)

    @property
    def sot_sequence_including_notimestamps(self) -> tuple[int, ...]:
        return (*self.sot_sequence, self.no_timestamps)

    @cached_property
    def special_tokens(self) -> dict[str, int]:
        """Each special token's id by its text ("<|endoftext|>": 50257, ..., "<|30.00|>"), as
        openai-whisper's `Tokenizer.special_tokens` (in id order here)."""
        tokens = {}
        for name in special_token_names(self.num_languages)[:-1501]:  # all but timestamps
            token_id = self.codec.token_to_id(name)
            if token_id is not None:
                tokens[name] = token_id
        for i in range(1501):  # timestamps follow <|notimestamps|>, named or not
            tokens[f"<|{i * 0.02:.2f}|>"] = self.timestamp_begin + i
        return tokens

    @cached_property
    def encoding(self):  # -> tiktoken.Encoding
        """openai-whisper's tiktoken Encoding of this vocabulary (`get_encoding`), for code that
        calls `tokenizer.encoding` directly; needs openai-whisper and tiktoken. The tokenizer
        itself encodes with the model's own tokenizer.json where it has one (the same ids)."""
        return get_encoding("multilingual" if self.multilingual else "gpt2", self.num_languages)

    def encode(
        self,
        text: str,
        *,
        allowed_special: Literal["all"] | Collection[str] = (),
        disallowed_special: Literal["all"] | Collection[str] = (),
    ) -> list[int]:
        """Token ids of `text`, openai-whisper's `encode(text, **kwargs)` with tiktoken's two
        keywords: special-token text in `allowed_special` ("all" or a set such as
        {"<|endoftext|>"}) becomes that token, in `disallowed_special` ("all": every other one)
        raises ValueError. Unlike tiktoken's default (which raises), text that spells a special
        token is encoded as plain text unless asked otherwise: a prompt is text."""
        if not allowed_special and not disallowed_special:
            return self.codec.encode(text)
        names = self.special_tokens
        allowed = set(names) if allowed_special == "all" else set(allowed_special) & names.keys()
        disallowed = set(names) if disallowed_special == "all" else set(disallowed_special)
        disallowed -= allowed
        if found := next((name for name in disallowed if name in text), None):
            raise ValueError(
                f"the text holds the special token {found!r}; pass it in allowed_special to "
                "encode it as that token, or leave disallowed_special out to encode it as text"
            )
        if not allowed or not any(name in text for name in allowed):
            return self.codec.encode(text)
        pattern = "(" + "|".join(re.escape(n) for n in sorted(allowed, key=len, reverse=True)) + ")"
        tokens: list[int] = []
        for i, piece in enumerate(re.split(pattern, text)):
            tokens += [names[piece]] if i % 2 else self.codec.encode(piece) if piece else []
        return tokens

    def decode(self, tokens: list[int], errors: str = "replace") -> str:
        """openai-whisper's `decode`: timestamp tokens are dropped, other special tokens are
        shown as their text ("<|en|>"); `errors` is tiktoken's (bytes.decode's) for bytes that
        are not whole characters. Transcript text is `decode_text`'s."""
        return self.codec.decode([t for t in tokens if t < self.timestamp_begin], errors)

    def decode_text(self, tokens: list[int]) -> str:
        """The text of the text tokens alone: every special token is dropped (a transcript)."""
        return self.codec.decode([t for t in tokens if t < self.eot])

    def decode_with_timestamps(self, tokens: list[int], errors: str = "replace") -> str:
        """Every token's text, timestamp tokens shown as <|1.08|> (openai-whisper's)."""
        pieces: list[str] = []
        run: list[int] = []
        for token in tokens:
            if token >= self.timestamp_begin:
                pieces.append(self.codec.decode(run, errors))
                run = []
                pieces.append(f"<|{(token - self.timestamp_begin) * 0.02:.2f}|>")
            else:
                run.append(token)
        pieces.append(self.codec.decode(run, errors))
        return "".join(pieces)

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Tokens of symbols that are not spoken (the `suppress_tokens=[-1]` set of the reference).

        Speaker tags and sound annotations like "(laughs)" or "♪" would otherwise be
        transcribed; tokens that are a lone symbol, with or without a leading space, are
        suppressed, while symbols inside longer tokens stay possible.
        """
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += [
            "<<",
            ">>",
            "<<<",
            ">>>",
            "--",
            "---",
            "-(",
            "-[",
            "('",
            '("',
            "((",
            "))",
            "(((",
            ")))",
            "[[",
            "]]",
            "{{",
            "}}",
            "♪♪",
            "♪♪♪",
        ]
        # Musical notes are three bytes in UTF-8: suppress their first byte's token too.
        miscellaneous = set("♩♪♫♬♭♮♯")
        assert all(0x2640 <= ord(c) <= 0x267F for c in miscellaneous)
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + sorted(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return tuple(sorted(result))

    def split_to_word_tokens(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """Words and their tokens: split on spaces, or on characters for unspaced scripts."""
        if self.language in {"zh", "ja", "th", "lo", "my", "yue"}:
            return self.split_tokens_on_unicode(tokens)
        return self.split_tokens_on_spaces(tokens)

    def split_tokens_on_spaces(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """Words that start with a space (or are punctuation or a special token)."""
        words, word_tokens = self.split_tokens_on_unicode(tokens)
        merged_words: list[str] = []
        merged_tokens: list[list[int]] = []
        for word, subtokens in zip(words, word_tokens):
            starts_word = subtokens[0] >= self.eot or word.startswith(" ")
            is_punctuation = word.strip() in string.punctuation
            if starts_word or is_punctuation or not merged_words:
                merged_words.append(word)
                merged_tokens.append(list(subtokens))
            else:
                merged_words[-1] += word
                merged_tokens[-1].extend(subtokens)
        return merged_words, merged_tokens

    def split_tokens_on_unicode(self, tokens: list[int]) -> tuple[list[str], list[list[int]]]:
        """Group tokens so that each group decodes to whole characters (no U+FFFD halves)."""
        full_text = self.decode_with_timestamps(tokens)
        words: list[str] = []
        word_tokens: list[list[int]] = []
        current: list[int] = []
        offset = 0
        for token in tokens:
            current.append(token)
            decoded = self.decode_with_timestamps(current)
            position = offset + decoded.find("\ufffd")
            if "\ufffd" not in decoded or full_text[position : position + 1] == "\ufffd":
                words.append(decoded)
                word_tokens.append(current)
                current = []
                offset += len(decoded)
        return words, word_tokens


@cache
def _vocabulary(multilingual: bool, num_languages: int) -> TextCodec:
    """Whisper's English-only or multilingual vocabulary with `num_languages` language tokens:
    the installed tiny.en's or base's tokenizer.json where it has that many (99), else
    openai-whisper's vocabulary files (which need openai-whisper and tiktoken)."""
    from .model_names import packaged_model_folders

    folders = packaged_model_folders("base" if multilingual else "tiny.en")
    if num_languages == 99 and folders and (folders[0] / "tokenizer.json").is_file():
        return HuggingFaceCodec(folders[0] / "tokenizer.json")
    return TiktokenCodec(multilingual, num_languages)


@cache
def get_tokenizer(
    multilingual: bool,
    *,
    num_languages: int = 99,
    language: str | None = None,
    task: str | None = None,
) -> Tokenizer:
    """openai-whisper's `whisper.tokenizer.get_tokenizer`: a multilingual tokenizer defaults to
    English and transcribe; an English-only one has neither (its sot_sequence is sot alone)."""
    if language is not None:
        language = normalize_language(language, tuple(LANGUAGES))
    if multilingual:
        language, task = language or "en", task or "transcribe"
    else:
        language, task = None, None
    codec = _vocabulary(bool(multilingual), num_languages)
    return Tokenizer(codec, bool(multilingual), num_languages, language, task)


def parse_token_ids(text: str) -> list[int]:
    """Token ids written as openai-whisper writes `suppress_tokens`: "-1,50362"."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InvalidOptionError(
            f"expected comma-separated token ids such as -1,50362, got {text!r}"
        ) from None


def normalize_language(language: str, codes: Sequence[str]) -> str:
    """A language code from a code, a name or a locale (pt-BR); a clear error for anything else."""
    if not isinstance(language, str):
        raise UnknownLanguageError(
            f"language must be a code or a name such as en, de or German, not {language!r}"
        )
    key = language.lower().strip()
    # A locale (pt-BR, zh_CN, en-US: Common Voice's and most manifests' codes) by its language:
    # Whisper has one token a language, not a region.
    base = re.split(r"[-_]", key, maxsplit=1)[0]
    code = next((c for c in (key, base) if c in LANGUAGES or c in TO_LANGUAGE_CODE), None)
    code = TO_LANGUAGE_CODE.get(code, code) if code is not None else None
    if code is None:
        raise UnknownLanguageError(f"unknown language {language!r}; use a code such as en, de, fr")
    if code not in codes:
        if list(codes) == ["en"]:
            raise UnknownLanguageError(
                f"this model is English-only and cannot transcribe {LANGUAGES[code].title()}; "
                "use a multilingual model such as base"
            )
        raise UnknownLanguageError(
            f"this model does not know {LANGUAGES[code].title()}; it knows {', '.join(codes)}"
        )
    return code
