#!/bin/sh
# What `make test` needs besides Python, set up before the tests or named precisely:
# - Chromium for the inspector's browser tests (driven by Playwright's API; the system's browser,
#   never a downloaded build): Debian's `chromium`, installed with apt-get when this runs as root;
# - Node.js 20+ with npm for the TypeScript client and agent-loop tests (their packages come from
#   npm, pinned by tests/clients/ts/package-lock.json, installed by the tests themselves).
set -eu
CHROMIUM="${CONTEXTD_TEST_CHROMIUM:-/usr/bin/chromium}"
missing=0

if [ ! -x "$CHROMIUM" ]; then
  if [ -z "${CONTEXTD_TEST_CHROMIUM:-}" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "make test: installing Debian's chromium for the inspector's browser tests (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  fi
fi
if [ ! -x "$CHROMIUM" ]; then
  cat >&2 <<MSG
make test: the inspector's browser tests need Chromium, and $CHROMIUM is not there.
  Debian or Ubuntu:     sudo apt-get install chromium     (then make test again)
  a Chromium elsewhere: CONTEXTD_TEST_CHROMIUM=/path/to/chromium make test
MSG
  missing=1
fi

node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ] || ! command -v npm >/dev/null; then
  cat >&2 <<MSG
make test: the TypeScript client and agent-loop tests need Node.js 20 or newer with npm
  (found: $(node --version 2>/dev/null || echo 'no node'), $(npm --version 2>/dev/null || echo 'no npm')).
  Install them from https://nodejs.org or your system's packages, then make test again.
MSG
  missing=1
fi
exit "$missing"
