"""Typed settings, read from the environment by `load_settings()` (never at import time).

Variables use the `CONTEXTD_` prefix and `__` between a group and its field, e.g.
`CONTEXTD_SESSION_DEFAULTS__CONTEXT_LIMIT=32000`. `DATABASE_URL`, `DATABASE_REPLICA_URL` and
`REDIS_URL` are read without the prefix, as every hosting platform names them.
"""

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from app.domain.budget import BudgetConfig
from app.embeddings.settings import EmbeddingSettings

MAX_PAGE_SIZE = 10_000  # the largest `max_page_size` a deployment may set
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
ANY_HOST = "*"
UNPREFIXED = ("database_url", "database_replica_url", "redis_url")  # variables without CONTEXTD_


# prometheus_client's multiprocess directory, set by `serve --workers N` and `dev` for their
# processes. Named here, not next to the metrics: prometheus_client decides when it is imported
# whether this process writes its series to that directory, so the process that sets the
# variable must not import it first (app.runtime.processes).
MULTIPROCESS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


class Limits(BaseModel):
    max_body_bytes: int = Field(
        4_194_304, gt=0, description="largest request body, bytes (413 above)"
    )
    max_turn_bytes: int = Field(
        262_144,
        gt=0,
        description="largest turn: content + tool calls + metadata, bytes (413 above)",
    )
    max_metadata_bytes: int = Field(
        16_384, gt=0, description="largest metadata object of a turn or session, bytes as JSON"
    )
    max_tool_result_bytes: int = Field(
        4_194_304,
        gt=0,
        description="largest tool result (a tool turn): content + metadata, bytes (413 above); "
        "the request body's limit applies too",
    )
    # Above the C1 floor's 6,000 tokens (a result that alone would fill the protected recent
    # turns), well under a 128k window; tau-bench's largest result is 2,837 tokens.
    layer_tool_result_tokens: int = Field(
        8_000,
        gt=0,
        description="a tool result above this many tokens is layered on arrival: the window "
        "holds its head, tail and values, the whole text goes to the chunks (C3)",
    )
    layered_view_tokens: int = Field(
        2_000,
        gt=0,
        description="what a layered result costs in the window at most: head, tail and values",
    )
    max_turns_per_request: int = Field(100, gt=0, description="turns in one append call")
    max_page_size: int = Field(
        500, gt=0, le=MAX_PAGE_SIZE, description="largest page of a list endpoint"
    )
    requests_per_minute_per_key: int = Field(
        6_000, ge=0, description="requests one API key may make per minute (429 above; 0: off)"
    )

    @model_validator(mode="after")
    def _view_smaller_than_threshold(self) -> "Limits":
        if self.layered_view_tokens >= self.layer_tool_result_tokens:
            raise ValueError("layered_view_tokens must be below layer_tool_result_tokens")
        return self


class ServerSettings(BaseModel):
    """Connection limits that protect the API from slow or stuck clients."""

    header_timeout_seconds: float = Field(
        10.0, gt=0, description="a request line and headers must arrive within this (else closed)"
    )
    body_timeout_seconds: float = Field(
        30.0, gt=0, description="a request body must arrive whole within this (408 after)"
    )
    keep_alive_seconds: int = Field(
        10,
        gt=0,
        description="an idle keep-alive connection is closed after this; longer than the 5 s "
        "after which common clients (httpx) drop an idle connection, so the client closes "
        "first and never sends a request on a connection the server is closing",
    )
    retry_after_seconds: int = Field(
        5, ge=1, description="Retry-After of a 503 while PostgreSQL is unreachable"
    )


class CacheSettings(BaseModel):
    key_prefix: str = Field(
        "contextd", pattern=r"^[^{}]*$", description="prefix of every Redis key (no braces)"
    )
    cluster: bool = Field(
        False,
        description="`REDIS_URL` names one node of a Redis Cluster; the others are found from it",
    )
    cluster_nodes: str | None = Field(
        None,
        pattern=r"^\s*([^\s,]+:\d+\s*(,\s*[^\s,]+:\d+\s*)*)?$",
        description="more nodes to find the cluster from (host:port, comma-separated): a "
        "process then starts with its cache while the `REDIS_URL` node is down",
    )
    ttl_seconds: int = Field(300, gt=0, description="lifetime of cached session state")
    query_vector_ttl_seconds: int = Field(
        86_400,
        gt=0,
        description="lifetime of a cached query vector (one per distinct query text and model)",
    )
    retry_after_seconds: float = Field(
        5.0, ge=0, description="after a Redis error, go straight to Postgres for this long"
    )
    socket_timeout_seconds: float = Field(0.5, gt=0, description="Redis connect/read timeout")


class DatabaseSettings(BaseModel):
    pool_size: int = Field(10, gt=0, description="SQLAlchemy pool size per process")
    max_overflow: int = Field(10, ge=0, description="extra connections above the pool")
    idempotency_ttl_hours: int = Field(
        24,
        gt=0,
        description=(
            "how long an Idempotency-Key replay holds; the worker deletes older records hourly"
        ),
    )
    statement_timeout_seconds: float = Field(
        60.0, gt=0, description="PostgreSQL cancels any one statement running longer (503)"
    )
    lock_timeout_seconds: float = Field(
        10.0, gt=0, description="a statement waiting longer for a row or table lock fails (503)"
    )
    idle_in_transaction_timeout_seconds: float = Field(
        60.0, gt=0, description="PostgreSQL ends a session idle this long inside a transaction"
    )
    replica_max_lag_seconds: float = Field(
        5.0,
        gt=0,
        description="the read-only endpoints read from the primary while the replica "
        "(`DATABASE_REPLICA_URL`) is further behind than this",
    )
    replica_check_seconds: float = Field(
        1.0,
        gt=0,
        description="how often each process measures the replica's lag, or tries again to "
        "connect to a replica found down",
    )


class OffloadSettings(BaseModel):
    chunk_min_tokens: int = Field(
        60, gt=0, description="smallest chunk (unless a break forces one)"
    )
    chunk_max_tokens: int = Field(160, gt=0, description="largest chunk; longer turns are split")
    chunk_overlap_tokens: int = Field(
        20, ge=0, description="overlap between pieces of a split turn"
    )
    chunk_time_gap_seconds: int = Field(1_800, gt=0, description="a pause this long starts a chunk")
    topic_shift_threshold: float = Field(
        0.08, ge=0, le=1, description="neighbour-turn term overlap below which a chunk may break"
    )


class NotesSettings(BaseModel):
    generator: Literal["rules", "llm"] = Field("rules", description="notes generator (C2)")
    max_tokens: int = Field(400, gt=0, description="hard cap of the notes block")
    rebuild_every_versions: int = Field(
        10, ge=0, description="regenerate from all raw turns every N versions (0: never)"
    )
    llm_base_url: str | None = Field(None, description="OpenAI-compatible chat API for `llm`")
    llm_model: str = Field("gpt-4o-mini", description="chat model of the `llm` generator")
    llm_api_key: str | None = Field(None, description="bearer key of the chat API")
    llm_timeout_seconds: float = Field(20.0, gt=0, description="per notes generation call")


class RecallSettings(BaseModel):
    fusion: Literal["rrf", "relative"] = Field(
        "relative", description="rank fusion (rrf) or min-max normalised score sum (relative)"
    )
    rrf_k: int = Field(60, gt=0, description="reciprocal rank fusion constant")
    weight_exact: float = Field(3.0, ge=0, description="fusion weight of exact ID/quote hits")
    weight_lexical: float = Field(1.0, ge=0, description="fusion weight of the BM25 arm")
    weight_vector: float = Field(1.0, ge=0, description="fusion weight of the vector arm")
    query_adapter: bool = Field(
        True,
        description="the chunk vector arm searches with the query's embedding moved toward the "
        "statements that answer it (`app/recall/adapter.py`, fitted for e5; other embedders are "
        "unchanged); remembered items use the embedding as it is",
    )
    per_item_max_tokens: int = Field(300, gt=0, description="a recalled item is cut to this")
    relevance_floor: float = Field(
        0.25,
        ge=0,
        le=1,
        description="the relevance (0-1, `app/recall/floor.py`: the question's own words an "
        "item holds, IDF-weighted, the share the session holds, a name the question writes, "
        "its e5 similarity, or, for an item in the other script than the question, and for "
        "what a question about the user may find in other words, its e5 and multilingual USE "
        "similarities together) one of recall's first history items must reach for the memory "
        "tool to quote any; below it the tool answers no confident match, the nearest item "
        "marked low confidence. 0.25 quotes nothing for 48 of 50 questions a session has no "
        "answer to, keeps LoCoMo's recall, those asked in the other language than the facts "
        "and those about the user in other words (docs/BENCHMARKS.md, Confident or silent); "
        "the first question an API process judges by meaning loads USE (~2 s, ~230 MB). "
        "Build-prompt keeps its recalled block; its manifest gives each shown item's relevance "
        "and the floor. 0: off; off too with an embedder other than e5",
    )
    rerank_url: str | None = Field(None, description="HTTP cross-encoder; unset: feature rerank")
    rerank_style: Literal["tei", "jina", "cohere"] = Field("tei", description="its API style")
    rerank_model: str | None = Field(None, description="model name (jina, cohere)")
    rerank_api_key: str | None = Field(None, description="bearer key of the rerank API")
    rerank_timeout_seconds: float = Field(2.0, gt=0, description="rerank call budget")
    cross_encoder: Literal["off", "minilm"] = Field(
        "off",
        description="minilm: an English cross-encoder run in process (ms-marco-MiniLM-L-12-v2, "
        "int8 ONNX from the `rerank` extra) re-orders the feature rerank's first "
        "`cross_encoder_candidates`, its order fused with theirs, for a one-line question of at "
        "most 64 tokens and candidates in English, none holding an ID or a quoted string: "
        "LoCoMo's check split B500 .754 -> .783, "
        "B1000 .831 -> .840, at ~0.8 s of CPU a recall on this 2-core machine (docs/BENCHMARKS.md, "
        "A stronger ranking model). `rerank_url`, when set, is used instead",
    )
    cross_encoder_candidates: int = Field(
        10,
        ge=2,
        le=50,
        description="the candidates the cross-encoder reads (its cost grows with them)",
    )
    rewrite_llm_base_url: str | None = Field(
        None, description="OpenAI-compatible chat API for the query rewrite; unset: rules only"
    )
    rewrite_llm_model: str = Field("gpt-4o-mini", description="chat model of the query rewrite")
    rewrite_llm_api_key: str | None = Field(None, description="bearer key of the rewrite API")
    rewrite_llm_timeout_seconds: float = Field(
        1.5, gt=0, description="LLM rewrite budget; on expiry the rule rewrite is used"
    )
    emergency_offload_timeout_seconds: float = Field(
        2.0,
        gt=0,
        description="an inline offload (build-prompt's, an append's past the emergency ratio) "
        "waits at most this for the session lock and for each statement, then gives up "
        "(build-prompt: `emergency_offload_failed`; an append: the worker's job moves the turns)",
    )
    embedder_breaker_failures: int = Field(
        3, gt=0, description="consecutive query-embedding failures that open the circuit breaker"
    )
    embedder_breaker_cooldown_seconds: float = Field(
        30.0,
        gt=0,
        description="while open, recall skips the embedder (`embedder_circuit_open`); then one "
        "call tries it again",
    )
    vector_index_min_chunks: int = Field(
        20_000,
        gt=0,
        description="a session with this many chunks gets an HNSW index of its own (built by the "
        "worker's sweep) and recall searches it through that index instead of an exact scan",
    )
    vector_scan_in_process_mb: int = Field(
        32,
        ge=0,
        description="a session searched by an exact scan whose chunk vectors take at most this "
        "many MB is scanned in process (its vectors kept with its BM25 index); a larger one in "
        "PostgreSQL; 0: always in PostgreSQL",
    )
    vector_index_ef_search: int = Field(
        100, gt=0, description="HNSW candidate list of a session's vector index search (recall)"
    )
    vector_index_build_memory_mb: int = Field(
        512, gt=0, description="maintenance_work_mem of one session's vector index build"
    )
    lexical_index_cache_sessions: int = Field(
        256,
        ge=0,
        description="per-process BM25 indexes (with chunk vectors, see "
        "`vector_scan_in_process_mb`), windows and notes kept (one per session)",
    )
    user_memory_budget_tokens: int = Field(
        150,
        ge=0,
        description="tokens for the user's remembered items in build-prompt (about this user)",
    )
    user_memory_top_k: int = Field(
        5, ge=0, description="the user's remembered items offered to build-prompt at most"
    )
    persist_manifests: bool = Field(False, description="store every build's manifest")
    manifests_kept_per_session: int = Field(50, ge=1, description="retention of stored manifests")


class MemorySettings(BaseModel):
    """The memory tool (`POST /v1/sessions/{id}/memory`): limits and who may offload or forget."""

    remember_max_chars: int = Field(2_000, gt=0, description="longest `remember` text (422 above)")
    remember_per_minute: int = Field(
        20, ge=0, description="`remember` calls per session per minute (429 above)"
    )
    dedup_jaccard: float = Field(
        0.85,
        gt=0,
        le=1,
        description="term-set overlap at which `remember` returns the existing item",
    )
    recall_item_max_tokens: int = Field(
        200, gt=0, description="a `recall` result item is cut to this many tokens"
    )
    recall_max_top_k: int = Field(20, gt=0, description="largest `top_k` a `recall` may ask for")
    # A `recall` is a call the model chose to make and waits on (an LLM round trip costs seconds),
    # unlike build-prompt, which runs before every model call: it may wait longer for its query
    # embedding than `embedding.query_timeout_seconds`. A dialogue query of three lines takes
    # 0.3-0.5 s on a 2-core machine at load 6, so at 0.7 s some recalls went lexical only and,
    # after three in a row, the circuit breaker skipped the embedder for every recall for 30 s
    # (MADial R@5 through the API zh .565 / en .512 on the tune split, against .645 / .658).
    recall_query_timeout_seconds: float = Field(
        3.0,
        gt=0,
        description="longest wait of a memory-tool `recall` for its query embedding, queueing "
        "included; past it the recall goes on lexically (`vector_timeout`)",
    )
    capture_user_statements: bool = Field(
        True,
        description='what the user says about themselves in a session with a user_id ("I live '
        'in Paris", "我对花生过敏") becomes user memory at the append, a candidate until '
        "evidence promotes it",
    )
    promote_after_days: float = Field(
        7.0,
        gt=0,
        description="a user-memory item seen again this many days after it was first seen is "
        "promoted long-term (evidence over time)",
    )
    decay_days: float = Field(
        90.0,
        gt=0,
        description="a user-memory item with no new evidence for this many days loses weight in "
        "ranking",
    )
    stale_weight: float = Field(
        0.5,
        gt=0,
        le=1,
        description="what a user-memory item's ranking score is multiplied by once past "
        "`decay_days` without new evidence",
    )
    conflict_llm_base_url: str | None = Field(
        None,
        description="OpenAI-compatible chat API that judges whether a new fact contradicts an "
        "item the conflict rules say nothing about; unset: rules only",
    )
    conflict_llm_model: str = Field("gpt-4o-mini", description="chat model of the conflict judge")
    conflict_llm_api_key: str | None = Field(None, description="bearer key of the judge's API")
    conflict_llm_timeout_seconds: float = Field(
        2.0, gt=0, description="per judged pair; on expiry or failure the rules' answer stands"
    )
    conflict_llm_candidates: int = Field(
        3,
        ge=1,
        description="items of the owner the judge is asked about per new fact at most, those "
        "sharing most words first",
    )
    offload_for_all_keys: bool = Field(
        False, description="`offload` without the memory:offload scope (tenants.settings can too)"
    )
    forget_for_all_keys: bool = Field(
        False, description="`forget` without the memory:forget scope (tenants.settings can too)"
    )


class WorkerSettings(BaseModel):
    concurrency: int = Field(
        2,
        gt=0,
        description="jobs of any kind one worker process runs at once (a session's offload, "
        "notes and erasure before embeddings and sweeps)",
    )
    session_slots: int = Field(
        1,
        ge=0,
        description="more jobs one worker process runs at once, only a session's offload, notes "
        "and erasure: these never wait for an embedding batch to end; 0: none",
    )
    sweep_lookback_hours: float = Field(
        24.0,
        gt=0,
        description="the sweep looks for sessions over their watermark or with drifted counters "
        "among those written to within this long; an idle session is left to its next append "
        "or build, which check the watermark themselves",
    )
    heartbeat_seconds: float = Field(5.0, gt=0, description="worker heartbeat interval")
    stalled_after_seconds: float = Field(
        30.0, gt=0, description="a job whose worker is silent this long is retried"
    )
    maintenance_interval_seconds: float = Field(
        10.0, gt=0, description="how often a worker looks for stalled jobs"
    )
    poll_seconds: float = Field(
        0.5,
        gt=0,
        description="how often an idle worker looks for jobs besides being notified: a job "
        "that waited for a session's lock is taken within this once the lock is free",
    )
    nice: int = Field(
        10,
        ge=0,
        le=19,
        description="steps the worker process lowers its CPU priority by (`contextd worker` and "
        "the worker process of `contextd dev`): on shared cores the API's builds go first",
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="CONTEXTD_", env_nested_delimiter="__", extra="ignore"
    )

    database_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_URL", "CONTEXTD_DATABASE_URL"),
        description="PostgreSQL with pgvector; unset under `contextd dev` (embedded server)",
    )
    database_replica_url: str | None = Field(
        None,
        validation_alias=AliasChoices("DATABASE_REPLICA_URL", "CONTEXTD_DATABASE_REPLICA_URL"),
        description="a streaming replica of `DATABASE_URL` the read-only endpoints read from "
        "(docs/RELIABILITY.md, Read replicas); unset: every read on the primary",
    )
    redis_url: str | None = Field(
        None,
        validation_alias=AliasChoices("REDIS_URL", "CONTEXTD_REDIS_URL"),
        description="Redis/Valkey; unset under `contextd dev` (embedded server)",
    )
    host: str = Field("127.0.0.1", description="address the API binds to")
    port: int = Field(8080, description="port the API binds to")
    data_dir: Path = Field(Path(".contextd"), description="embedded stack data (`contextd dev`)")
    auth_disabled: bool = Field(False, description="serve without API keys (dev on loopback only)")
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        list(LOOPBACK_HOSTS),
        description="names a request's Host header may give, any port, comma-separated (another "
        "Host: 421); `*`: any, only behind a proxy that checks Host (refused with auth disabled)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO", description="root log level: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)"
    )
    log_format: Literal["auto", "json", "text"] = Field(
        "auto",
        description="log lines: one JSON object (with request_id) or plain text; auto: short "
        "readable lines under `contextd dev`, JSON under every other command",
    )
    log_text: bool = Field(
        False,
        description="debug only: logs carry conversation text (queries, SQL parameters); "
        "off: lengths and hashes",
    )

    session_defaults: BudgetConfig = BudgetConfig()
    limits: Limits = Limits()
    server: ServerSettings = ServerSettings()
    cache: CacheSettings = CacheSettings()
    db: DatabaseSettings = DatabaseSettings()
    offload: OffloadSettings = OffloadSettings()
    notes: NotesSettings = NotesSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    recall: RecallSettings = RecallSettings()
    memory: MemorySettings = MemorySettings()
    worker: WorkerSettings = WorkerSettings()

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _split_hosts(cls, value: object) -> object:
        if isinstance(value, str):  # CONTEXTD_ALLOWED_HOSTS=api.example.com,localhost
            value = value.split(",")
        if isinstance(value, list | tuple):
            return [str(name).strip().lower() for name in value if str(name).strip()]
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_name(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value  # `debug` as well as `DEBUG`

    @field_validator("database_url", "database_replica_url")
    @classmethod
    def _postgresql_url(cls, value: str | None) -> str | None:
        if value:
            to_sqlalchemy_url(value)  # refused at start, not at the first connection
        return value

    @model_validator(mode="after")
    def _refuse_unsafe_auth(self) -> "Settings":
        if self.auth_disabled and self.host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(
                "CONTEXTD_AUTH_DISABLED is only allowed when binding to a loopback address "
                f"(CONTEXTD_HOST is {self.host!r})"
            )
        if self.auth_disabled and ANY_HOST in self.allowed_hosts:
            # Any Host would let a web page reach a keyless server by DNS rebinding.
            raise ValueError(
                "CONTEXTD_ALLOWED_HOSTS='*' is not allowed with CONTEXTD_AUTH_DISABLED"
            )
        return self

    @property
    def sqlalchemy_url(self) -> str:
        # A plain property: a cached one would survive `model_copy(update={"database_url": ...})`.
        if not self.database_url:
            raise RuntimeError(
                "DATABASE_URL is not set (use `contextd dev` for the embedded stack)"
            )
        return to_sqlalchemy_url(self.database_url)

    @property
    def replica_sqlalchemy_url(self) -> str | None:
        return to_sqlalchemy_url(self.database_replica_url) if self.database_replica_url else None


def to_sqlalchemy_url(url: str) -> str:
    """Accept plain `postgresql://` URLs and select the psycopg 3 driver."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    raise ValueError(f"unsupported database URL scheme: {url.split(':', 1)[0]}")


def load_settings(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]


def settings_problem(error: ValidationError | SettingsError) -> str:
    """What is wrong with the environment's settings, in one line naming each variable."""
    if isinstance(error, SettingsError):
        # pydantic-settings reads a list or object setting as JSON and names only its group.
        group = str(error).split('field "', 1)[-1].split('"', 1)[0]
        return (
            f"CONTEXTD_{group.upper()}__...: a value is not valid JSON (a list is written as "
            '["a", "b"]; CONTEXTD_ALLOWED_HOSTS and CONTEXTD_CACHE__CLUSTER_NODES are '
            "comma-separated)"
        )
    problems = []
    for problem in error.errors():
        message = problem["msg"].removeprefix("Value error, ")
        location = [str(part) for part in problem["loc"]]
        if location and location[0].lower() in UNPREFIXED:
            variable = location[0].upper()
        elif location:
            variable = "CONTEXTD_" + "__".join(part.upper() for part in location)
        else:
            problems.append(message)  # a rule between settings: its message names them
            continue
        given = problem.get("input")
        shown = f"={given!r}" if isinstance(given, str) else ""
        problems.append(f"{variable}{shown}: {message}")
    return "; ".join(problems)


def settings_table() -> str:
    """The configuration reference as a Markdown table (docs/CONFIGURATION.md; a test compares)."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, field in model.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                walk(annotation, f"{prefix}{name.upper()}__")
                continue
            env = name.upper() if name in UNPREFIXED else prefix + name.upper()
            default = field.default
            if isinstance(default, list):  # as the variable is written: comma-separated
                default = ",".join(default)
            elif isinstance(default, tuple):  # as the variable is written: JSON
                default = json.dumps(list(default))
            default = "(unset)" if default is None else f"`{default}`"
            rows.append(f"| `{env}` | {default} | {field.description} |")

    walk(Settings, "CONTEXTD_")
    return "\n".join(rows)


def session_settings_table() -> str:
    """The budget fields a session can set (`PUT /v1/sessions/{id}`) as a Markdown table, each
    with the deployment default it falls back to (docs/CONFIGURATION.md; a test compares)."""
    rows = ["| field | default | variable of the default | meaning |", "|---|---|---|---|"]
    for name, field in BudgetConfig.model_fields.items():
        env = f"CONTEXTD_SESSION_DEFAULTS__{name.upper()}"
        default = list(field.default) if isinstance(field.default, tuple) else field.default
        rows.append(f"| `{name}` | `{json.dumps(default)}` | `{env}` | {field.description} |")
    return "\n".join(rows)
