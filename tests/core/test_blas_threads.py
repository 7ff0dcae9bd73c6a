"""The API process computes numpy on one BLAS thread (`app.core.cpu.one_blas_thread`), set by
the app's lifespan whatever the limit was before. In a fresh interpreter: in this one an earlier
test may have left OpenBLAS unable to use more than one thread."""

import json
import os
import subprocess
import sys

from app.core.config import Settings

LIFESPAN = """
import asyncio, json
from threadpoolctl import threadpool_info, threadpool_limits
from app.core.config import load_settings
from app.runtime.api import create_app

def blas_threads():
    return sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})

async def main():
    threadpool_limits(limits=2, user_api="blas")
    before = blas_threads()
    app = create_app(load_settings())
    async with app.router.lifespan_context(app):
        return before, blas_threads()

print(json.dumps(asyncio.run(main())))
"""


def test_the_api_process_runs_numpy_on_one_blas_thread(settings: Settings) -> None:
    limits = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in limits}
    env |= {
        "DATABASE_URL": settings.database_url or "",
        "REDIS_URL": settings.redis_url or "",
        "CONTEXTD_EMBEDDING__KIND": "none",
        "CONTEXTD_LOG_LEVEL": "WARNING",
    }
    ran = subprocess.run(
        [sys.executable, "-c", LIFESPAN], env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    before, during = json.loads(ran.stdout.strip().splitlines()[-1])
    assert before == [min(2, os.cpu_count() or 1)]  # numpy's BLAS was free to use two
    assert during == [1]
