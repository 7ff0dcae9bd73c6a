"""The API process computes numpy on one BLAS thread (`app.core.cpu.one_blas_thread`): started
by the app's lifespan, whatever the limit was before."""

from threadpoolctl import threadpool_info, threadpool_limits

from app.core.config import Settings
from app.main import create_app


def blas_threads() -> list[int]:
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


async def test_the_api_process_runs_numpy_on_one_blas_thread(settings: Settings) -> None:
    lexical_only = settings.model_copy(
        update={"embedding": settings.embedding.model_copy(update={"kind": "none"})}
    )
    threadpool_limits(limits=2, user_api="blas")
    assert blas_threads() and set(blas_threads()) == {2}
    app = create_app(lexical_only)
    async with app.router.lifespan_context(app):
        assert set(blas_threads()) == {1}
