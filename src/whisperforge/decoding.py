"""Decoding one 30 s window, with the reference's semantics (openai-whisper `decoding.py`).

A decode composes small pieces: an `Inference` that runs the decoder with its KV cache, logit
filters (suppression, timestamp rules), a search (greedy/sampling or beam), and a ranker that
picks one candidate per audio. The transcription loops in `transcribe.py` call `decode` per
window and add temperature fallback around it.
"""

from __future__ import annotations

import math
import numbers
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.distributions import Categorical

from . import kernels, runtime
from .audio import CHUNK_LENGTH, available_memory
from .errors import InvalidOptionError, check_whole_number
from .model import KVCache, Whisper
from .tokenizer import Tokenizer, parse_token_ids


@dataclass(frozen=True)
class DecodingOptions:
    task: str = "transcribe"  # or "translate"; "lang_id" (openai-whisper's): the language only
    language: str | None = None  # None: detect from the audio
    temperature: float = 0.0
    sample_len: int | None = None  # most tokens to sample; default n_text_ctx // 2
    best_of: int | None = None  # independent samples when temperature > 0
    beam_size: int | None = None  # beams when temperature == 0; None is greedy
    patience: float | None = None  # beam search patience (arXiv:2204.05424)
    # Candidates are ranked by log-prob / length ** length_exponent (faster-whisper's, i.e.
    # CTranslate2's, length_penalty), or, where length_penalty (openai-whisper's) is set, by
    # log-prob / ((5 + length) / 6) ** length_penalty (the Google NMT alpha).
    length_penalty: float | None = None
    prompt: str | list[int] | None = None  # previous text, for context
    prefix: str | list[int] | None = None  # forced start of this window's text
    # False: openai-whisper's prefix, in the prompt before the first timestamp (which then
    # often ends the window at once); True: faster-whisper's, after <|0.00|> and part of the
    # window's text, as if sampled.
    prefix_in_text: bool = False
    suppress_tokens: str | Sequence[int] | None = "-1"  # -1: the non-speech symbols
    suppress_blank: bool = True  # no blank or EOT as the first sampled token
    without_timestamps: bool = False
    max_initial_timestamp: float | None = 1.0
    # faster-whisper's (CTranslate2's) additions. hotwords: words to favour, put in the prompt
    # (where there is no prefix); the other two act on the tokens this window has sampled.
    hotwords: str | None = None
    repetition_penalty: float = 1.0  # > 1: each sampled token's score / penalty (CTRL's)
    no_repeat_ngram_size: int = 0  # > 0: no n-gram of this size sampled twice
    length_exponent: float = 1.0  # see length_penalty
    fp16: bool = True  # openai-whisper's; False: `OpenAIWhisper.decode` decodes in float32


@dataclass
class DecodingResult:
    tokens: list[int]
    text: str
    avg_logprob: float
    no_speech_prob: float
    temperature: float
    compression_ratio: float
    language: str | None = None
    # openai-whisper's: every language's probability (task "lang_id" only), and the window's
    # encoder output (`OpenAIWhisper.decode` only).
    language_probs: dict[str, float] | None = None
    audio_features: Tensor | None = None


def compression_ratio(text: str) -> float:
    """Bytes over zlib-compressed bytes: high for repetitive (looping) text."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


# --- inference: the decoder with its cache ---------------------------------------------------


class Inference:
    """Runs the decoder over growing token sequences with a KV cache.

    `logits(tokens)` feeds only the tokens not yet in the cache (the whole prompt on the
    first call, one token after that) and returns the scores of the last position, plus, on
    the first call, the scores at the start-of-transcript position for the no-speech figure.
    """

    def __init__(
        self,
        model: Whisper,
        audio_features: Tensor,
        n_group: int = 1,
        padding: Tensor | None = None,
    ):
        self.model = model
        self.cache: KVCache = model.decoder.new_cache(
            audio_features, repeats=n_group, padding=padding
        )

    def logits(self, tokens: Tensor, sot_index: int | None = None) -> tuple[Tensor, Tensor | None]:
        new_tokens = tokens[:, self.cache.length :]
        hidden = self.model.decoder(new_tokens, self.cache)
        sot_logits = None
        if sot_index is not None:
            sot_logits = self.model.decoder.logits(hidden[:, sot_index])
        return self.model.decoder.logits(hidden[:, -1]), sot_logits

    def reorder(self, source: Tensor) -> None:
        self.cache.reorder(source)


# --- logit filters ---------------------------------------------------------------------------


class LogitFilter:
    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        """Edit `logits` [B, V] in place, given the tokens so far [B, T]."""
        raise NotImplementedError


@dataclass
class SuppressBlank(LogitFilter):
    """No leading space-only token and no immediate EOT as the first sampled token."""

    tokenizer: Tokenizer
    sample_begin: int

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        if tokens.shape[1] == self.sample_begin:
            logits[:, self.tokenizer.encode(" ") + [self.tokenizer.eot]] = -np.inf


@dataclass
class SuppressTokens(LogitFilter):
    suppress: list[int]
    _index: Tensor | None = field(default=None, init=False, repr=False)

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        if self._index is None or self._index.device != logits.device:  # not a copy a step
            self._index = torch.tensor(self.suppress, dtype=torch.long, device=logits.device)
        logits.index_fill_(1, self._index, -np.inf)


@dataclass
class RepetitionPenalty(LogitFilter):
    """The repetition penalty of CTRL (arXiv:1909.05858), as faster-whisper applies it: the
    score of every token sampled so far in this window is divided by `penalty` where it is
    positive and multiplied by it where it is negative, once per distinct token."""

    penalty: float
    sample_begin: int

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        sampled = tokens[:, self.sample_begin :]
        if sampled.shape[1]:
            scores = logits.gather(1, sampled)
            penalized = torch.where(scores < 0, scores * self.penalty, scores / self.penalty)
            logits.scatter_(1, sampled, penalized)


@dataclass
class NoRepeatNgram(LogitFilter):
    """No n-gram of `size` tokens sampled twice in this window: each token that would complete
    an n-gram already sampled is ruled out."""

    size: int
    sample_begin: int

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        sampled = tokens[:, self.sample_begin :]
        if sampled.shape[1] < self.size:
            return
        grams = sampled.unfold(1, self.size, 1)  # [B, n-grams, size]
        current = sampled[:, sampled.shape[1] - self.size + 1 :]  # the last size - 1 tokens
        repeats = (grams[:, :, :-1] == current[:, None, :]).all(dim=-1)
        rows, starts = repeats.nonzero(as_tuple=True)
        logits[rows, grams[rows, starts, -1]] = -np.inf


@dataclass
class ApplyTimestampRules(LogitFilter):
    """Timestamp tokens come in pairs (start, end) around text, never go back in time, and win
    the step whenever their total probability beats the best text token."""

    tokenizer: Tokenizer
    sample_begin: int
    max_initial_timestamp_index: int | None

    def rules(self) -> kernels.TimestampRules:
        """These rules as the runtime's kernel takes them."""
        tokenizer = self.tokenizer
        return kernels.TimestampRules(
            tokenizer.timestamp_begin, tokenizer.eot, tokenizer.no_timestamps,
            self.max_initial_timestamp_index,
        )  # fmt: skip

    def apply(self, logits: Tensor, tokens: Tensor) -> None:
        sampled = tokens[:, self.sample_begin :]
        n = sampled.shape[1]
        adjacent = logits.is_contiguous() and tokens.stride(-1) == 1  # as the kernel reads them
        if logits.is_cuda and kernels.triton is not None and adjacent:
            # The same rules in one kernel (~25 torch calls cost the host ~0.3 ms a step).
            kernels.timestamp_rules(logits, sampled, self.rules(), n)
            return
        # The reference's per-row rules as whole-batch masks: one pass per rule, not a host loop
        # with small GPU writes per row (which at 80 rows cost more than the decode step).
        tb, eot = self.tokenizer.timestamp_begin, self.tokenizer.eot
        logits[:, self.tokenizer.no_timestamps] = -np.inf
        if n > 0:
            vocab = torch.arange(logits.shape[1], device=logits.device)
            is_timestamp = sampled >= tb
            last = is_timestamp[:, -1]
            penultimate = is_timestamp[:, -2] if n >= 2 else torch.ones_like(last)
            pair_closed = last & penultimate  # text must follow
            segment_ended = last & ~penultimate  # the next one starts with a timestamp or EOT
            logits.masked_fill_(pair_closed[:, None] & (vocab >= tb), -np.inf)
            logits.masked_fill_(segment_ended[:, None] & (vocab < eot), -np.inf)
            # Never go back in time; a segment that just opened must have nonzero length.
            last_index = n - 1 - is_timestamp.flip(1).int().argmax(dim=1)  # of the last timestamp
            latest = sampled.gather(1, last_index[:, None])
            limit = torch.where(segment_ended[:, None], latest, latest + 1)
            earlier = (vocab >= tb) & (vocab < limit)
            logits.masked_fill_(is_timestamp.any(dim=1, keepdim=True) & earlier, -np.inf)

        if tokens.shape[1] == self.sample_begin:
            logits[:, :tb] = -np.inf  # the first sampled token is a timestamp
            if self.max_initial_timestamp_index is not None:
                logits[:, tb + self.max_initial_timestamp_index + 1 :] = -np.inf

        logprobs = F.log_softmax(logits.float(), dim=-1)
        timestamp_logprob = logprobs[:, tb:].logsumexp(dim=-1)
        max_text_logprob = logprobs[:, :tb].max(dim=-1).values
        # A mask, not indexing by it: that would wait for the GPU to count the rows.
        logits[:, :tb].masked_fill_((timestamp_logprob > max_text_logprob)[:, None], -np.inf)


# --- searches --------------------------------------------------------------------------------


class TokenSearch:
    def update(self, tokens: Tensor, logits: Tensor, sum_logprobs: Tensor) -> tuple[Tensor, bool]:
        """Append one token per sequence; returns the tokens and whether all are complete."""
        raise NotImplementedError

    def finalize(
        self, tokens: Tensor, sum_logprobs: Tensor
    ) -> tuple[list[list[Tensor]], list[list[float]]]:
        """Candidates per audio [n_audio][n_candidates], each ending with EOT."""
        raise NotImplementedError


@dataclass
class GreedySearch(TokenSearch):
    """Argmax at temperature 0, else sampling from the tempered distribution."""

    temperature: float
    eot: int
    complete: runtime.CompletionFlag = field(default_factory=runtime.CompletionFlag, init=False)

    def update(self, tokens: Tensor, logits: Tensor, sum_logprobs: Tensor) -> tuple[Tensor, bool]:
        if self.temperature == 0:
            next_tokens = logits.argmax(dim=-1)
        else:
            # Unvalidated: the validation checks the logits on the host, a wait for the GPU.
            tempered = logits / self.temperature
            next_tokens = Categorical(logits=tempered, validate_args=False).sample()
        logprobs = F.log_softmax(logits.float(), dim=-1)
        current = logprobs[torch.arange(logprobs.shape[0]), next_tokens]
        finished = tokens[:, -1] == self.eot
        sum_logprobs += current * ~finished
        next_tokens.masked_fill_(finished, self.eot)  # not by indexing: no wait for the GPU
        tokens = torch.cat([tokens, next_tokens[:, None]], dim=-1)
        return tokens, self.complete.read(tokens[:, -1] == self.eot)

    def finalize(
        self, tokens: Tensor, sum_logprobs: Tensor
    ) -> tuple[list[list[Tensor]], list[list[float]]]:
        tokens = F.pad(tokens, (0, 1), value=self.eot)  # make sure each sequence has an EOT
        return [list(group) for group in tokens], sum_logprobs.tolist()


@dataclass
class BeamSearch(TokenSearch):
    """Beam search over `beam_size` beams per audio, run as one batch of n_audio * beam_size.

    Each step expands every beam by its top beam_size + 1 tokens, keeps the best beam_size
    unfinished continuations per audio, and collects finished ones until `patience *
    beam_size` candidates exist: openai-whisper's ranking, step for step, as tensor operations
    on the device (on CUDA two kernels, `kernels.beam_step`). The host copies nothing but the
    completion flags a step (`runtime.CompletionFlag`), and the finished candidates once, in
    `finalize`.

    openai-whisper keys candidates by their token sequence, which merges equal sequences; the
    beams of an audio are distinct after the first step (kept candidates are distinct keys,
    extended by distinct tokens), and equal before it (`decode` repeats each start), so the
    first step ranks one beam per audio instead.
    """

    beam_size: int
    eot: int
    inference: Inference
    patience: float = 1.0
    complete: runtime.CompletionFlag = field(default_factory=runtime.CompletionFlag, init=False)
    finished: kernels.BeamFinished | None = field(default=None, init=False)
    # The state before the latest step, should the flags say the search was complete before it.
    previous: tuple[Tensor, Tensor] | None = field(default=None, init=False)

    @property
    def max_candidates(self) -> int:
        return round(self.beam_size * self.patience)

    def update(self, tokens: Tensor, logits: Tensor, sum_logprobs: Tensor) -> tuple[Tensor, bool]:
        first = self.finished is None
        self._make_room(tokens)
        before = sum_logprobs.clone()
        self.previous = tokens, before
        step = self._step
        if logits.is_cuda and kernels.beam_kernels_fit(self.beam_size) and logits.is_contiguous():
            step = kernels.beam_step
        tokens, source = step(
            logits, tokens.contiguous(), before, sum_logprobs, self.finished, self.beam_size,
            self.eot, first,
        )  # fmt: skip
        self.inference.reorder(source)
        if not self.complete.read(self.finished.count >= self.max_candidates):
            return tokens, False
        if self.complete.late:  # complete before this step: undo it
            tokens, before = self.previous
            sum_logprobs.copy_(before)
        return tokens, True

    def _make_room(self, tokens: Tensor, headroom: int = 64) -> None:
        """Room in `finished` for candidates one token longer than `tokens` [rows, T]: grown
        `headroom` tokens past that when it is short."""
        if self.finished is not None and self.finished.tokens.shape[2] > tokens.shape[1]:
            return
        n_audio, device = tokens.shape[0] // self.beam_size, tokens.device
        slots = self.max_candidates + 1
        grown = torch.zeros(
            n_audio, slots, tokens.shape[1] + headroom, dtype=torch.long, device=device
        )
        if self.finished is None:
            zeros = torch.zeros(n_audio, slots, device=device)
            count = torch.zeros(n_audio, dtype=torch.long, device=device)
            self.finished = kernels.BeamFinished(grown, zeros.long(), zeros, count)
        else:
            grown[:, :, : self.finished.tokens.shape[2]] = self.finished.tokens
            self.finished.tokens = grown

    @staticmethod
    def _step(
        logits: Tensor, tokens: Tensor, before: Tensor, sum_logprobs: Tensor,
        finished: kernels.BeamFinished, beam: int, eot: int, first: bool,
    ) -> tuple[Tensor, Tensor]:  # fmt: skip
        """The step as torch operations (the CPU's, and the kernels' reference): as
        `kernels.beam_step`, the next beams' tokens and the rows they continue."""
        n_audio, length = tokens.shape[0] // beam, tokens.shape[1]
        max_candidates = finished.lengths.shape[1] - 1
        logprobs = F.log_softmax(logits.float(), dim=-1)
        top_logprobs, top_tokens = logprobs.topk(beam + 1)
        scores = before[:, None] + top_logprobs  # [rows, beam + 1]
        if first:  # the beams are still one sequence: rank the first alone
            scores.view(n_audio, beam, beam + 1)[:, 1:] = -np.inf
        # All of an audio's candidates, best first; ties keep the order openai-whisper's
        # stable sort over its insertion order keeps (beam by beam, each by its top-k order).
        scores, order = scores.view(n_audio, -1).sort(dim=-1, descending=True, stable=True)
        candidates = top_tokens.view(n_audio, -1).gather(1, order)
        sources = order // (beam + 1) + torch.arange(n_audio, device=tokens.device)[:, None] * beam
        ended = candidates == eot
        unfinished_so_far = (~ended).cumsum(dim=-1)
        kept = ~ended & (unfinished_so_far <= beam)  # exactly `beam` per audio
        # Finished candidates count if they rank above the last one kept: among the first
        # 2 * beam, since a beam's top beam + 1 holds at most one EOT.
        n = min(2 * beam, scores.shape[1])
        finishing = (ended & (unfinished_so_far < beam))[:, :n]
        slot = finished.count[:, None] + finishing.cumsum(dim=-1) - 1
        added = finishing & (slot < max_candidates)
        slot = torch.where(added, slot, max_candidates)  # the spare slot
        ends = torch.full((n_audio, n, 1), eot, dtype=tokens.dtype, device=tokens.device)
        sequences = torch.cat([tokens[sources[:, :n]], ends], dim=-1)  # [n_audio, n, length + 1]
        index = slot[:, :, None].expand(-1, -1, length + 1)
        finished.tokens[:, :, : length + 1].scatter_(1, index, sequences)
        finished.lengths.scatter_(1, slot, length + 1)
        finished.scores.scatter_(1, slot, scores[:, :n])
        finished.count += added.sum(dim=-1)

        picked = kept.byte().sort(dim=-1, descending=True, stable=True).indices[:, :beam]
        source = sources.gather(1, picked).flatten()
        sum_logprobs.copy_(scores.gather(1, picked).flatten())
        next_tokens = candidates.gather(1, picked).flatten()
        return torch.cat([tokens[source], next_tokens[:, None]], dim=-1), source

    def finalize(
        self, tokens: Tensor, sum_logprobs: Tensor
    ) -> tuple[list[list[Tensor]], list[list[float]]]:
        # tokens [n_audio, beam_size, T]: if too few beams finished, take the best unfinished.
        finished = self.finished
        assert finished is not None
        counts, lengths = finished.count.tolist(), finished.lengths.tolist()
        scores, finished_tokens = finished.scores.tolist(), finished.tokens.cpu()
        sums = sum_logprobs.cpu()
        results: list[dict[tuple[int, ...], float]] = []
        for i, count in enumerate(counts):
            candidates = {
                tuple(finished_tokens[i, s, : lengths[i][s]].tolist()): scores[i][s]
                for s in range(count)
            }
            for j in np.argsort(sums[i].numpy())[::-1].tolist():
                if len(candidates) >= self.beam_size:
                    break
                candidates[(*tokens[i, j].tolist(), self.eot)] = sums[i, j].item()
            results.append(candidates)
        return (
            [[torch.tensor(seq) for seq in candidates] for candidates in results],
            [list(candidates.values()) for candidates in results],
        )


def rank_by_likelihood(
    tokens: list[list[Tensor]], sum_logprobs: list[list[float]], options: DecodingOptions
) -> list[int]:
    """Index of the best candidate per audio: log-probability over a length penalty
    (`DecodingOptions.length_penalty`)."""
    alpha, exponent = options.length_penalty, options.length_exponent

    def score(logprob: float, length: int) -> float:
        length = max(length, 1)  # an empty text (end of text first) has its log-prob as score
        penalty = length**exponent if alpha is None else ((5 + length) / 6) ** alpha
        return logprob / penalty

    return [
        int(np.argmax([score(lp, len(t)) for t, lp in zip(candidates, logprobs)]))
        for candidates, logprobs in zip(tokens, sum_logprobs)
    ]


# --- the decode ------------------------------------------------------------------------------


def token_ids_or_text(
    name: str, value: str | Iterable[int] | None, text: bool = True
) -> str | list[int] | None:
    """A prompt (text, or token ids) or suppress_tokens (token ids, or openai-whisper's
    comma-separated string of them) as a list, refused by name if it is neither."""
    if value is None or (text and isinstance(value, str)):
        return value
    if isinstance(value, str):  # suppress_tokens="-1,50257", as openai-whisper's CLI spells it
        return parse_token_ids(value)
    if isinstance(value, Iterable):
        ids = list(value)
        if all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
            return [int(t) for t in ids]
    kind = "text or a list of token ids" if text else "a list of token ids, e.g. [-1]"
    raise InvalidOptionError(f"{name} must be {kind}, not {value!r}")


def suppress_token_list(
    tokenizer: Tokenizer, suppress_tokens: str | Sequence[int] | None
) -> list[int]:
    """The tokens never sampled: the user's list (-1: non-speech symbols) plus task tokens."""
    tokens = token_ids_or_text("suppress_tokens", suppress_tokens, text=False) or []
    if -1 in tokens:
        tokens.remove(-1)
        tokens += tokenizer.non_speech_tokens
    tokens += [
        tokenizer.transcribe,
        tokenizer.translate,
        tokenizer.sot,
        tokenizer.sot_prev,
        tokenizer.sot_lm,
    ]
    tokens.append(tokenizer.no_speech)  # its probability is read separately
    return sorted(set(tokens))


def forced_tokens(
    tokenizer: Tokenizer, options: DecodingOptions, n_text_ctx: int, sample_len: int
) -> list[int]:
    """The prefix's tokens, with <|0.00|> before them where it is part of the text."""
    if not options.prefix:
        return []
    prefix = options.prefix
    tokens = tokenizer.encode(" " + prefix.strip()) if isinstance(prefix, str) else list(prefix)
    max_prefix_len = n_text_ctx // 2 - sample_len
    tokens = tokens[-max_prefix_len:] if max_prefix_len > 0 else tokens
    if options.prefix_in_text and not options.without_timestamps:
        tokens = [tokenizer.timestamp_begin, *tokens]
    return tokens


def initial_tokens(
    tokenizer: Tokenizer, options: DecodingOptions, n_text_ctx: int, sample_len: int
) -> list[int]:
    """The tokens a window's decode starts from: [<|startofprev|> hotwords... prompt...]
    <|startoftranscript|> [lang task] [<|notimestamps|>] [[<|0.00|>] prefix...]"""
    sot_sequence = (
        tokenizer.sot_sequence_including_notimestamps
        if options.without_timestamps
        else tokenizer.sot_sequence
    )
    tokens = [*sot_sequence, *forced_tokens(tokenizer, options, n_text_ctx, sample_len)]
    # The context before <|startoftranscript|>: hotwords (unless a prefix is given, as in
    # faster-whisper), then as much of the prompt's end as fits in half the text context.
    room = n_text_ctx // 2 - 1
    context = []
    if options.hotwords and not options.prefix:
        context = tokenizer.encode(" " + options.hotwords.strip())[:room]
    if options.prompt and len(context) < room:
        prompt = options.prompt
        prompt_tokens = (
            tokenizer.encode(" " + prompt.strip()) if isinstance(prompt, str) else list(prompt)
        )
        context += prompt_tokens[-(room - len(context)) :]
    if context:
        tokens = [tokenizer.sot_prev] + context + tokens
    return tokens


def validate_options(options: DecodingOptions) -> None:
    temperature = options.temperature
    if not isinstance(temperature, numbers.Real) or not 0 <= temperature < math.inf:
        raise InvalidOptionError(
            f"temperature {temperature!r} must be a number from 0 (greedy) up, e.g. 0.2"
        )
    for name in ("beam_size", "best_of", "sample_len"):
        value = getattr(options, name)
        if value is not None:
            check_whole_number(name + (" (max_new_tokens)" if name == "sample_len" else ""), value)
    patience = options.patience
    if patience is not None and (
        not isinstance(patience, numbers.Real) or not 0 < patience < math.inf
    ):
        raise InvalidOptionError(
            f"patience {patience!r} must be above 0 (1: stop at beam_size finished candidates)"
        )
    if options.beam_size is not None and options.best_of is not None:
        raise InvalidOptionError("beam_size and best_of can't be given together")
    if options.temperature == 0 and options.best_of is not None:
        raise InvalidOptionError("best_of with greedy sampling (temperature 0) is not compatible")
    if options.patience is not None and options.beam_size is None:
        raise InvalidOptionError("patience requires beam_size to be given")
    if options.length_penalty is not None and not 0 <= options.length_penalty <= 1:
        raise InvalidOptionError("length_penalty (alpha) should be a value between 0 and 1")
    if not isinstance(options.length_exponent, numbers.Real) or not math.isfinite(
        options.length_exponent
    ):
        raise InvalidOptionError(
            f"length_penalty {options.length_exponent!r} must be a number: candidates are "
            f"ranked by log-prob / length ** length_penalty (1: by the mean log-prob)"
        )
    initial = options.max_initial_timestamp
    if initial is not None and (
        not isinstance(initial, numbers.Real) or not 0 <= initial < math.inf
    ):
        raise InvalidOptionError(
            f"max_initial_timestamp {initial!r} must be seconds from 0 on (how late the first "
            "timestamp may come; None: no limit)"
        )
    if options.repetition_penalty <= 0:
        raise InvalidOptionError("repetition_penalty must be above 0 (1 leaves scores as they are)")
    check_whole_number("no_repeat_ngram_size", options.no_repeat_ngram_size, 0, " (0: off)")


def check_context_room(start_length: int, sample_len: int | None, n_ctx: int) -> None:
    """Refuse a decode whose start tokens (prompt, task tokens, prefix) leave no room in the
    text context for its text, or for the `sample_len` (max_new_tokens) asked for, as
    faster-whisper refuses it: past the context a long prefix failed with a tensor shape error,
    and a max_new_tokens past it was cut short without a word. The prompt alone never fills
    it (half the context at most); a long prefix or max_new_tokens does."""
    room = n_ctx - start_length
    if room >= (sample_len or 1):
        return
    if room < 1:
        raise InvalidOptionError(
            f"the prompt and prefix take {start_length} tokens of the model's {n_ctx}-token "
            "text context, leaving no room for the transcript; use a shorter prefix"
        )
    raise InvalidOptionError(
        f"max_new_tokens (sample_len) {sample_len} and the {start_length} "
        f"token{'s' if start_length != 1 else ''} a window starts with (prompt, previous "
        f"text, prefix) exceed the model's {n_ctx}-token text "
        f"context; use max_new_tokens of at most {room}, or a shorter prompt or prefix"
    )


def check_rows_fit(model: Whisper, n_audio: int, n_group: int, audio_features: Tensor) -> None:
    """Refuse a decode whose rows' self-attention caches and scores cannot fit the memory left:
    on the CPU the allocation does not fail, the process is killed (beam_size 10000 on tiny.en
    asks for 60 GB). A GPU raises its own out-of-memory error, which the pipelines handle by
    halving their batches; refused here is one window's rows past the whole GPU's memory."""
    device = audio_features.device
    config, size = model.config, audio_features.dtype.itemsize
    per_row = 2 * config.n_text_layer * config.n_text_ctx * config.n_text_state * size
    per_row += 4 * config.n_vocab * 4  # logits, log-probs and the filters' float32 copies
    if device.type == "cpu":
        free, what = available_memory(), "memory free"
    elif device.type == "cuda":
        free, what = torch.cuda.get_device_properties(device).total_memory, "GPU memory"
        n_audio = 1  # what halving cannot help
    else:
        return
    need = n_audio * n_group * per_row
    if free is not None and need > free:
        raise InvalidOptionError(
            f"{n_audio} window(s) x {n_group} beams or samples need about {need / 1e9:.1f} GB "
            f"for their caches, more than the {free / 1e9:.1f} GB of {what}; use a smaller "
            "beam_size or best_of (5 is the usual), or fewer windows at once (batch_size)"
        )


@torch.inference_mode()
def detect_language(
    model: Whisper, tokenizer: Tokenizer, audio_features: Tensor
) -> tuple[list[str], list[dict[str, float]]]:
    """The most likely language per window and the probability of each language."""
    if not model.config.is_multilingual:
        return ["en"] * audio_features.shape[0], [
            {"en": 1.0} for _ in range(audio_features.shape[0])
        ]
    sot = torch.full((audio_features.shape[0], 1), tokenizer.sot, device=audio_features.device)
    with runtime.current_device(audio_features.device):  # quantized linears launch Triton kernels
        hidden = model.decoder(sot, audio_features=audio_features)
        logits = model.decoder.logits(hidden[:, 0])
    language_tokens = torch.tensor(tokenizer.all_language_tokens, device=logits.device)
    probs = logits[:, language_tokens].softmax(dim=-1).cpu()
    codes = tokenizer.all_language_codes
    all_probs = [dict(zip(codes, row.tolist())) for row in probs]
    return [codes[int(row.argmax())] for row in probs], all_probs


@torch.inference_mode()
def decode(
    model: Whisper,
    tokenizer: Tokenizer,
    audio_features: Tensor,
    options: DecodingOptions,
    prompts: Sequence[str | list[int] | None] | None = None,
) -> list[DecodingResult]:
    """Decode each window of `audio_features` [n_audio, n_audio_ctx, D] with one set of options.

    `prompts`, one per window, replaces `options.prompt` (each window's own previous text).
    Initial token sequences of different lengths are left-padded to the longest, so the
    start-of-transcript and the first sampled token sit in the same column for every row; the
    cache masks the padding and starts each row's positions after it.
    """
    with runtime.current_device(audio_features.device):
        return _decode(model, tokenizer, audio_features, options, prompts)


def _decode(
    model: Whisper,
    tokenizer: Tokenizer,
    audio_features: Tensor,
    options: DecodingOptions,
    prompts: Sequence[str | list[int] | None] | None,
) -> list[DecodingResult]:
    validate_options(options)
    n_audio = audio_features.shape[0]
    if prompts is not None and len(prompts) != n_audio:
        raise ValueError(f"{len(prompts)} prompts for {n_audio} windows")
    if options.task == "lang_id":  # openai-whisper's: only the language, nothing decoded
        languages, probs = detect_language(model, tokenizer, audio_features)
        nan = float("nan")
        return [
            DecodingResult([], "", nan, nan, options.temperature, nan, language, language_probs)
            for language, language_probs in zip(languages, probs)
        ]
    if options.language is None:
        languages, _ = detect_language(model, tokenizer, audio_features)
        if len(set(languages)) > 1:  # one tokenizer per call: decode each language apart
            return [
                decode(
                    model,
                    tokenizer,
                    audio_features[i : i + 1],
                    replace(options, language=language),
                    None if prompts is None else prompts[i : i + 1],
                )[0]
                for i, language in enumerate(languages)
            ]
        options = replace(options, language=languages[0])
    tokenizer = tokenizer.with_options(options.language, options.task)

    n_ctx = model.config.n_text_ctx
    sample_len = options.sample_len or n_ctx // 2
    window_options = (
        [options] * n_audio
        if prompts is None
        else [replace(options, prompt=prompt) for prompt in prompts]
    )
    starts = [initial_tokens(tokenizer, o, n_ctx, sample_len) for o in window_options]
    check_context_room(max(len(start) for start in starts), options.sample_len, n_ctx)
    lengths = sorted({len(start) for start in starts})
    if len(lengths) > 1 and not getattr(model, "pads_prompts", True):
        # An ONNX export's graphs take no padding mask: each prompt length is decoded apart.
        assert prompts is not None  # only prompts give the windows different starts
        results: list[DecodingResult | None] = [None] * n_audio
        for length in lengths:
            rows = [i for i, start in enumerate(starts) if len(start) == length]
            decoded = decode(
                model, tokenizer, audio_features[rows], options, [prompts[i] for i in rows]
            )
            for i, result in zip(rows, decoded):
                results[i] = result
        return results  # type: ignore[return-value]
    suppress = (
        suppress_token_list(tokenizer, options.suppress_tokens) if options.suppress_tokens else []
    )
    n_vocab = model.config.n_vocab
    if any(not 0 <= t < n_vocab for t in [*suppress, *(t for start in starts for t in start)]):
        raise InvalidOptionError(
            f"token ids in a prompt, prefix or suppress_tokens must lie in 0..{n_vocab - 1} "
            "(-1 in suppress_tokens: the non-speech symbols)"
        )
    sample_begin = max(len(start) for start in starts)
    sot_index = sample_begin - len(starts[0]) + starts[0].index(tokenizer.sot)
    n_group = options.beam_size or options.best_of or 1
    check_rows_fit(model, n_audio, n_group, audio_features)
    pad = [sample_begin - len(start) for start in starts]
    padding = None  # rows all full: the plain cache path, bit for bit as before
    if any(pad):
        padding = torch.tensor(pad, device=audio_features.device).repeat_interleave(n_group)
    # faster-whisper's prefix counts as sampled: it is the window's text, the timestamp rules
    # see its <|0.00|>. The step loop below runs it (the device loop takes no sampled history).
    prefix_sampled = options.prefix_in_text and bool(options.prefix)
    if prefix_sampled:
        sample_begin -= len(forced_tokens(tokenizer, options, n_ctx, sample_len))

    filters: list[LogitFilter] = []
    if options.repetition_penalty != 1:  # first, as CTranslate2 does: on the model's scores
        filters.append(RepetitionPenalty(options.repetition_penalty, sample_begin))
    if options.no_repeat_ngram_size > 0:
        filters.append(NoRepeatNgram(options.no_repeat_ngram_size, sample_begin))
    if options.suppress_blank:
        filters.append(SuppressBlank(tokenizer, sample_begin))
    if suppress:
        filters.append(SuppressTokens(suppress))
    if not options.without_timestamps:
        precision = CHUNK_LENGTH / model.config.n_audio_ctx  # 0.02 s per timestamp token
        max_index = None
        if options.max_initial_timestamp:
            max_index = round(options.max_initial_timestamp / precision)
        filters.append(ApplyTimestampRules(tokenizer, sample_begin, max_index))

    inference = Inference(model, audio_features, n_group, padding)
    search: TokenSearch
    if options.beam_size is not None:
        search = BeamSearch(options.beam_size, tokenizer.eot, inference, options.patience or 1.0)
    else:
        search = GreedySearch(options.temperature, tokenizer.eot)

    # The padding's token is never seen (masked); the start-of-transcript is a valid id.
    tokens = torch.tensor(
        [[tokenizer.sot] * p + start for p, start in zip(pad, starts)], device=audio_features.device
    ).repeat_interleave(n_group, dim=0)
    sum_logprobs = torch.zeros(n_audio * n_group, device=audio_features.device)
    no_speech_probs = [float("nan")] * n_audio
    # Every filter is a fixed set of tokens, or the timestamp rules where the runtime has them
    # as a kernel: then the GPU runtime runs the whole loop on the device, with no host sync
    # per step (greedy and sampling; beam search where the runtime has the fused step).
    device_loop = getattr(model.decoder, "search", None)
    device_filters = (SuppressBlank, SuppressTokens)
    on_device = getattr(model.decoder, "timestamp_rules_on_device", False)
    if on_device:
        device_filters += (ApplyTimestampRules,)
    beam_on_device = (
        isinstance(search, BeamSearch) and on_device and kernels.beam_kernels_fit(search.beam_size)
    )
    if (
        device_loop is not None
        and not prefix_sampled
        and (isinstance(search, GreedySearch) or beam_on_device)
        and all(isinstance(f, device_filters) for f in filters)
    ):
        first = tokenizer.encode(" ") + [tokenizer.eot] if options.suppress_blank else []
        rules = next((f.rules() for f in filters if isinstance(f, ApplyTimestampRules)), None)
        candidates = search.max_candidates if isinstance(search, BeamSearch) else None
        tokens, sum_logprobs, finished, sot_probs = device_loop(
            inference.cache, tokens, sot_index, sample_len, tokenizer.eot, suppress, first,
            rules, candidates, options.temperature,
        )  # fmt: skip
        if isinstance(search, BeamSearch):
            search.finished = finished
        no_speech_probs = sot_probs[::n_group, tokenizer.no_speech].tolist()
        sample_len = 0  # done: no step loop below
    for step in range(sample_len):
        logits, sot_logits = inference.logits(tokens, sot_index if step == 0 else None)
        if sot_logits is not None:
            no_speech = sot_logits.softmax(dim=-1)[:, tokenizer.no_speech]
            no_speech_probs = no_speech[::n_group].tolist()
        for logit_filter in filters:
            logit_filter.apply(logits, tokens)
        tokens, completed = search.update(tokens, logits, sum_logprobs)
        if completed or tokens.shape[-1] > n_ctx:
            break

    candidates, candidate_logprobs = search.finalize(
        tokens.reshape(n_audio, n_group, -1), sum_logprobs.reshape(n_audio, n_group)
    )

    def until_eot(seq: Tensor) -> Tensor:
        """Up to the first EOT after the prompt: one in the prompt (token ids given as the
        initial_prompt, as faster-whisper takes them) emptied every result (openai-whisper's
        too)."""
        sampled = seq[sample_begin:]
        return sampled[: int((sampled == tokenizer.eot).nonzero()[0, 0])]

    sampled = [[until_eot(seq) for seq in group] for group in candidates]
    chosen = rank_by_likelihood(sampled, candidate_logprobs, options)
    results = []
    for i, best in enumerate(chosen):
        result_tokens = sampled[i][best].tolist()
        text = tokenizer.decode_text(result_tokens).strip()
        results.append(
            DecodingResult(
                tokens=result_tokens,
                text=text,
                avg_logprob=candidate_logprobs[i][best] / (len(result_tokens) + 1),
                no_speech_prob=no_speech_probs[i],
                temperature=options.temperature,
                compression_ratio=compression_ratio(text),
                language=options.language,
            )
        )
    return results
