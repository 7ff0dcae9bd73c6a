"""Queued jobs name their task and pass their arguments by keyword: a task module that moves must
keep its name, queue and parameters, or jobs already in the queue stop running after an upgrade.
A parameter added later has a default, so that a job queued before still runs: `tenant_id`, which
every job naming a session, its rows or a receipt carries since issue 40 (a job without it learns
it from its rows, `tests/jobs/test_old_job_shapes.py`)."""

import inspect

from app.core.config import load_settings
from app.runtime.worker import create_job_app

# task name -> (queue, parameters after the job context, with their defaults)
TASKS = {
    "offload:run": (
        "contextd",
        "session_pk: str, trigger: str = 'watermark', tenant_id: str | None = None",
    ),
    "offload:embed_chunks": (
        "contextd-background",
        "chunk_ids: list[str], tenant_id: str | None = None",
    ),
    "offload:sweep": ("contextd-background", "timestamp: int"),
    "notes:refresh": (
        "contextd",
        "session_pk: str, rebuild: bool = False, tenant_id: str | None = None",
    ),
    "memory:erase": ("contextd", "receipt_id: str, tenant_id: str | None = None"),
    "memory:embed": ("contextd-background", "memory_ids: list[str], tenant_id: str | None = None"),
    "memory:sweep_embeddings": ("contextd-background", "timestamp: int"),
    "memory:sweep_validity": ("contextd-background", "timestamp: int"),
    "sessions:purge_idempotency": ("contextd-background", "timestamp: int"),
}


def parameters(func: object) -> str:
    signature = inspect.signature(func)  # type: ignore[arg-type]
    return ", ".join(str(p) for p in list(signature.parameters.values())[1:])


def test_the_worker_registers_every_task_under_its_name_queue_and_parameters() -> None:
    # Nothing connects when the app is built: the URL only has to parse.
    job_app = create_job_app(load_settings(database_url="postgresql://u@h/db"))
    ours = {name: task for name, task in job_app.tasks.items() if "builtin" not in name}
    assert sorted(ours) == sorted(TASKS)
    assert {name: (task.queue, parameters(task.func)) for name, task in ours.items()} == TASKS


def test_the_periodic_tasks_keep_their_ids() -> None:
    job_app = create_job_app(load_settings(database_url="postgresql://u@h/db"))
    assert sorted(job_app.periodic_registry.periodic_tasks) == [
        ("memory:sweep_embeddings", "sweep_embeddings"),
        ("memory:sweep_validity", "sweep_validity"),
        ("offload:sweep", "sweep"),
        ("sessions:purge_idempotency", "purge_idempotency"),
    ]
