"""Word timestamps: dynamic time warping over the cross-attention of the alignment heads.

The decoder is run once more over a window's text with <|notimestamps|>; the attention that
the alignment heads pay to the audio frames, normalised and median-filtered, is a
token-by-frame similarity matrix; DTW finds the monotonic path through it, and each word
starts where the path first reaches its first token. Semantics follow openai-whisper's
`timing.py`, including its heuristics for over-long words.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .audio import HOP_LENGTH, SAMPLE_RATE
from .model import Whisper
from .results import Segment, Word
from .runtime import current_device
from .tokenizer import Tokenizer

TOKENS_PER_SECOND = SAMPLE_RATE / HOP_LENGTH / 2  # 50 audio positions per second
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
# openai-whisper's warning: the alignment heads follow the spoken words, not their translation.
TRANSLATED_WORD_TIMES = "Word-level timestamps on translations may not be reliable."


@dataclass
class WordTiming:
    word: str
    tokens: list[int]
    start: float
    end: float
    probability: float


def median_filter(x: Tensor, width: int) -> Tensor:
    """Median over a sliding window of odd `width` along the last axis (reflect-padded)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = F.pad(x[None], (pad, pad, 0, 0), mode="reflect")[0]
    return padded.unfold(-1, width, 1).sort()[0][..., pad]


def dtw(cost_matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lowest-cost monotonic path through `cost_matrix` [N, M]: (row indices, column indices).

    Each cell depends on its left, upper and upper-left neighbours, so all cells of one
    anti-diagonal are independent: sweep diagonals with numpy instead of a cell loop. Ties
    go diagonal < up < left in the same order as the reference.
    """
    x = cost_matrix.astype(np.float64)
    N, M = x.shape
    cost = np.full((N + 1, M + 1), np.inf, dtype=np.float32)
    cost[0, 0] = 0
    trace = np.full((N + 1, M + 1), -1, dtype=np.int8)
    for d in range(2, N + M + 1):
        i = np.arange(max(1, d - M), min(N, d - 1) + 1)
        j = d - i
        c0, c1, c2 = cost[i - 1, j - 1], cost[i - 1, j], cost[i, j - 1]
        choice = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        best = np.choose(choice, [c0, c1, c2]).astype(np.float64)
        cost[i, j] = (x[i - 1, j - 1] + best).astype(np.float32)
        trace[i, j] = choice
    trace[0, :] = 2
    trace[:, 0] = 1
    i, j = N, M
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        step = trace[i, j]
        if step == 0:
            i, j = i - 1, j - 1
        elif step == 1:
            i -= 1
        else:
            j -= 1
    rows, cols = np.array(path[::-1]).T
    return rows, cols


@torch.inference_mode()
def find_alignment(
    model: Whisper,
    tokenizer: Tokenizer,
    text_tokens: list[int],
    audio_features: Tensor,
    num_frames: int,
    alignment_heads: Tensor,
    medfilt_width: int = 7,
) -> list[WordTiming]:
    """Word timings, relative to the window start, of `text_tokens` in one window."""
    if not text_tokens:
        return []
    sot_sequence = list(tokenizer.sot_sequence)
    tokens = torch.tensor(
        [sot_sequence + [tokenizer.no_timestamps] + text_tokens + [tokenizer.eot]],
        device=audio_features.device,
    )
    cross_qk: list[Tensor] = []
    with current_device(audio_features.device):  # quantized linears launch Triton kernels
        hidden = model.decoder(tokens, audio_features=audio_features[None], cross_weights=cross_qk)
        logits = model.decoder.logits(hidden[0, len(sot_sequence) :])[:, : tokenizer.eot]
    token_probs = logits.softmax(dim=-1)
    text_token_probs = token_probs[np.arange(len(text_tokens)), text_tokens].tolist()

    weights = torch.stack([cross_qk[layer][0, head] for layer, head in alignment_heads.tolist()])
    weights = weights[:, :, : num_frames // 2].softmax(dim=-1)
    std, mean = torch.std_mean(weights, dim=-2, keepdim=True, unbiased=False)
    weights = median_filter((weights - mean) / std, medfilt_width)
    matrix = weights.mean(dim=0)[len(sot_sequence) : -1]
    text_indices, time_indices = dtw(-matrix.double().cpu().numpy())

    words, word_tokens = tokenizer.split_to_word_tokens(text_tokens + [tokenizer.eot])
    if len(word_tokens) <= 1:
        return []
    word_boundaries = np.pad(np.cumsum([len(t) for t in word_tokens[:-1]]), (1, 0))
    jumps = np.pad(np.diff(text_indices), (1, 0), constant_values=1).astype(bool)
    jump_times = time_indices[jumps] / TOKENS_PER_SECOND
    start_times = jump_times[word_boundaries[:-1]]
    end_times = jump_times[word_boundaries[1:]]
    probabilities = [
        float(np.mean(text_token_probs[i:j])) for i, j in itertools.pairwise(word_boundaries)
    ]
    return [
        WordTiming(word, tokens, float(start), float(end), probability)
        for word, tokens, start, end, probability in zip(
            words, word_tokens, start_times, end_times, probabilities
        )
    ]


def merge_punctuations(alignment: list[WordTiming], prepended: str, appended: str) -> None:
    """Attach opening punctuation to the next word and closing punctuation to the previous."""
    i, j = len(alignment) - 2, len(alignment) - 1
    while i >= 0:
        previous, following = alignment[i], alignment[j]
        if previous.word.startswith(" ") and previous.word.strip() in prepended:
            following.word = previous.word + following.word
            following.tokens = previous.tokens + following.tokens
            previous.word, previous.tokens = "", []
        else:
            j = i
        i -= 1
    i, j = 0, 1
    while j < len(alignment):
        previous, following = alignment[i], alignment[j]
        if not previous.word.endswith(" ") and following.word in appended:
            previous.word = previous.word + following.word
            previous.tokens = previous.tokens + following.tokens
            following.word, following.tokens = "", []
        else:
            i = j
        j += 1


def add_word_timestamps(
    segments: list[Segment],
    model: Whisper,
    tokenizer: Tokenizer,
    audio_features: Tensor,
    num_frames: int,
    alignment_heads: Tensor,
    prepend_punctuations: str = PREPEND_PUNCTUATIONS,
    append_punctuations: str = APPEND_PUNCTUATIONS,
    last_speech_timestamp: float = 0.0,
) -> None:
    """Fill `words` of the segments of one window, and tighten segment bounds to the words."""
    if not segments:
        return
    per_segment = [[t for t in s.tokens if t < tokenizer.eot] for s in segments]
    text_tokens = [t for tokens in per_segment for t in tokens]
    alignment = find_alignment(
        model, tokenizer, text_tokens, audio_features, num_frames, alignment_heads
    )
    durations = np.array([t.end - t.start for t in alignment])
    durations = durations[durations.nonzero()]
    median_duration = min(0.7, float(np.median(durations)) if len(durations) else 0.0)
    max_duration = median_duration * 2

    # Words spanning a long pause at a sentence boundary are cut to a plausible length.
    if len(durations) > 0:
        sentence_end_marks = ".。!！?？"
        for i in range(1, len(alignment)):
            if alignment[i].end - alignment[i].start > max_duration:
                if alignment[i].word in sentence_end_marks:
                    alignment[i].end = alignment[i].start + max_duration
                elif alignment[i - 1].word in sentence_end_marks:
                    alignment[i].start = alignment[i].end - max_duration

    merge_punctuations(alignment, prepend_punctuations, append_punctuations)
    time_offset = segments[0].seek * HOP_LENGTH / SAMPLE_RATE
    word_index = 0
    for segment, tokens in zip(segments, per_segment):
        saved_tokens = 0
        words: list[Word] = []
        while word_index < len(alignment) and saved_tokens < len(tokens):
            timing = alignment[word_index]
            if timing.word:
                words.append(
                    Word(
                        start=round(time_offset + timing.start, 2),
                        end=round(time_offset + timing.end, 2),
                        word=timing.word,
                        probability=timing.probability,
                    )
                )
            saved_tokens += len(timing.tokens)
            word_index += 1

        if words:
            # The first words after a pause must not stretch back into the silence.
            first = words[0]
            if first.end - last_speech_timestamp > median_duration * 4 and (
                first.end - first.start > max_duration
                or (len(words) > 1 and words[1].end - first.start > max_duration * 2)
            ):
                if len(words) > 1 and words[1].end - words[1].start > max_duration:
                    boundary = max(words[1].end / 2, words[1].end - max_duration)
                    first.end = words[1].start = boundary
                first.start = max(0, first.end - max_duration)
            # Prefer the segment's own start if the first word is too long, and likewise the end.
            if segment.start < first.end and segment.start - 0.5 > first.start:
                first.start = max(0, min(first.end - median_duration, segment.start))
            else:
                segment.start = first.start
            last = words[-1]
            if segment.end > last.start and segment.end + 0.5 < last.end:
                last.end = max(last.start + median_duration, segment.end)
            else:
                segment.end = last.end
            last_speech_timestamp = segment.end
        segment.words = words
