"""`contextd eval locomo|madial|notes|agent|trust`: drive a running server over HTTP and write a
Markdown report (spec §8)."""

import argparse
import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.eval.answering import AnswerSetup


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    ev = sub.add_parser("eval", help="evaluate a running server (writes a Markdown report)")
    ev_sub = ev.add_subparsers(dest="eval_command", required=True)
    lo = ev_sub.add_parser("locomo", help="LoCoMo evidence recall vs. BM25 and truncation")
    lo.add_argument("--data", required=True, help="path to a LoCoMo JSON file")
    lo.add_argument("--url", default="http://127.0.0.1:8080", help="running contextd")
    lo.add_argument("--api-key", default=None)
    lo.add_argument("--out", default="eval-report", help="report directory")
    lo.add_argument("--conversations", type=int, default=None, help="first N conversations")
    lo.add_argument(
        "--budgets", type=_ints, default=(250, 500, 1000, 2000), help="e.g. 250,500,1000,2000"
    )
    lo.add_argument("--k", type=_ints, default=(5, 10), help="e.g. 5,10")
    lo.add_argument(
        "--categories", type=_ints, default=(1, 2, 3, 4, 5), help="question categories asked"
    )
    lo.add_argument(
        "--tune-conversations",
        type=int,
        default=4,
        help="the first N conversations are the tune split, the rest the check split",
    )
    lo.add_argument("--context-limit", type=int, default=4000)
    lo.add_argument("--reserve-tokens", type=int, default=500)
    lo.add_argument("--min-recent-turns", type=int, default=4)
    lo.add_argument("--min-recent-tokens", type=int, default=500)
    lo.add_argument("--target-ratio", type=float, default=0.1)
    lo.add_argument("--concurrency", type=int, default=1, help="questions in flight")
    lo.add_argument("--timeout", type=float, default=900.0, help="offload/embedding deadline, s")
    lo.add_argument(
        "--no-wait-embedded",
        action="store_true",
        help="do not wait for chunk embeddings (servers with embedding kind none)",
    )
    lo.add_argument(
        "--reuse-run",
        default=None,
        metavar="RUN_ID",
        help="evaluate the sessions an earlier run ingested (e.g. after a restart with other "
        "query-time settings) instead of ingesting again",
    )
    lo.add_argument(
        "--memory-tool",
        action="store_true",
        help="also score the memory tool's recall at each budget, beside build-prompt",
    )
    lo.add_argument(
        "--ablate",
        action="store_true",
        help="remove each fragment of the build at --answer-budget in turn (a notes section, "
        "each recalled item, the user-memory block, the entity table) and report what each "
        "kind was worth",
    )
    _add_answer_arguments(lo)
    lo.add_argument("--label", default="", help="free text shown in the report header")
    ma = ev_sub.add_parser("madial", help="MADial-Bench remembered-item recall through the API")
    ma.add_argument("--data", required=True, help="folder of the MADial-Bench JSON files")
    ma.add_argument("--lang", choices=("zh", "en"), required=True)
    ma.add_argument("--url", default="http://127.0.0.1:8080", help="running contextd")
    ma.add_argument("--api-key", default=None)
    ma.add_argument("--out", default="eval-report", help="report directory")
    ma.add_argument("--k", type=_ints, default=(5, 10), help="e.g. 5,10")
    ma.add_argument("--dialogues", type=int, default=None, help="first N dialogues")
    ma.add_argument("--timeout", type=float, default=600.0, help="worker deadline, s")
    _add_answer_arguments(ma)
    ma.add_argument("--label", default="", help="free text shown in the report header")
    from app.eval.notes_driver import add_notes_parser

    add_notes_parser(ev_sub)
    _add_agent_parser(ev_sub)
    from app.eval.trust_driver import add_trust_parser

    add_trust_parser(ev_sub)


def _add_answer_arguments(parser: argparse.ArgumentParser) -> None:
    """`--answer-llm` and its companions (nothing is called without a URL)."""
    parser.add_argument(
        "--answer-llm",
        default=None,
        metavar="URL",
        help="OpenAI-compatible endpoint that answers each question from the built prompt",
    )
    parser.add_argument(
        "--answer-model",
        default="gpt-4o-mini",
        help="model name it is sent (the published runs used gpt-4o-mini)",
    )
    parser.add_argument(
        "--judge-llm",
        default=None,
        metavar="URL",
        help="endpoint of the judge (default: --answer-llm)",
    )
    parser.add_argument("--judge-model", default=None, help="judge model (default: --answer-model)")
    parser.add_argument(
        "--llm-api-key-env",
        default="OPENAI_API_KEY",
        metavar="NAME",
        help="environment variable holding the bearer key of both endpoints (unset: no key)",
    )
    parser.add_argument("--answer-budget", type=int, default=1000, help="recall budget B read")
    parser.add_argument("--llm-timeout", type=float, default=120.0, help="per model call, s")


def answer_setup(
    args: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> "AnswerSetup | None":
    """The answering model and judge of `--answer-llm` (None without it); the bearer key from
    the variable of `environ` that `--llm-api-key-env` names."""
    from app.core.chat import ChatEndpoint
    from app.eval.answering import AnswerSetup

    if not args.answer_llm:
        if args.judge_llm:
            raise SystemExit("--judge-llm needs --answer-llm")
        return None
    key = environ.get(args.llm_api_key_env) or None
    answer = ChatEndpoint(args.answer_llm, args.answer_model, key, args.llm_timeout)
    judge = ChatEndpoint(
        args.judge_llm or args.answer_llm,
        args.judge_model or args.answer_model,
        key,
        args.llm_timeout,
    )
    return AnswerSetup(answer=answer, judge=judge)


def _add_agent_parser(ev_sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from app.eval.agent import parse_ranges

    ag = ev_sub.add_parser(
        "agent", help="tool-calling trajectories: what the next call needs, vs. truncation/clearing"
    )
    ag.add_argument("--data", required=True, help="path to a tau-bench style trajectories JSON")
    ag.add_argument("--url", default="http://127.0.0.1:8080", help="running contextd")
    ag.add_argument("--api-key", default=None)
    ag.add_argument("--out", default="eval-report", help="report directory")
    ag.add_argument(
        "--limits", type=_ints, default=(2500, 3500, 6000, 12000), help="context limits C"
    )
    ag.add_argument("--reserve-tokens", type=int, default=500)
    ag.add_argument("--tasks", type=parse_ranges, default=None, help="e.g. 0-24 or 0-3,12")
    ag.add_argument("--trials", type=parse_ranges, default=(0, 1, 2, 3), help="e.g. 0-3")
    ag.add_argument(
        "--tune-tasks",
        type=parse_ranges,
        default=tuple(range(12)),
        help="tasks of the tune split (the others form the check split)",
    )
    ag.add_argument("--runs", type=int, default=None, help="the first N runs selected")
    ag.add_argument("--concurrency", type=int, default=2, help="replays in flight")
    ag.add_argument("--label", default="", help="free text shown in the report header")


def run(args: argparse.Namespace) -> int:
    if args.eval_command == "madial":
        return _run_madial(args)
    if args.eval_command == "locomo":
        return _run_locomo(args)
    if args.eval_command == "agent":
        return _run_agent(args)
    if args.eval_command == "notes":
        from app.eval.notes_driver import run_notes_command

        return run_notes_command(args)
    if args.eval_command == "trust":
        from app.eval.trust_driver import run_trust_command

        return run_trust_command(args)
    raise SystemExit(f"unknown eval {args.eval_command}")


def _run_agent(args: argparse.Namespace) -> int:
    import time

    from app.eval.agent import load_runs
    from app.eval.agent_driver import AgentEvalConfig, run_agent_eval
    from app.eval.agent_report import AgentEvalResult, headline_table, write_report
    from app.eval.agent_score import score_replay

    cfg = AgentEvalConfig(
        url=args.url,
        api_key=args.api_key,
        limits=tuple(args.limits),
        reserve_tokens=args.reserve_tokens,
        concurrency=args.concurrency,
        tune_tasks=tuple(args.tune_tasks),
    )
    runs = load_runs(args.data, args.tasks, args.trials)[: args.runs]
    started = time.monotonic()
    replays = asyncio.run(run_agent_eval(runs, cfg))
    figures = [
        f
        for replay in replays
        for f in score_replay(
            replay, replay.limit - cfg.reserve_tokens, cfg.tune_tasks, cfg.clearing_keep
        )
    ]
    result = AgentEvalResult(cfg, replays, figures, time.monotonic() - started)
    report, results = write_report(result, Path(args.out), args.data, args.label)
    print(headline_table(result))
    print(f"report: {report}\nfigures: {results}")
    return 0


def _run_madial(args: argparse.Namespace) -> int:
    from app.eval.madial import lexical_only, load_madial
    from app.eval.madial_driver import MadialConfig, run_madial
    from app.eval.madial_report import (
        madial_json,
        madial_table,
        reply_table,
        write_madial_report,
    )

    cfg = MadialConfig(
        url=args.url,
        lang=args.lang,
        api_key=args.api_key,
        ks=tuple(args.k),
        timeout_s=args.timeout,
        answering=answer_setup(args),
        answer_budget=args.answer_budget,
    )
    memories, dialogues = load_madial(args.data, args.lang)
    if args.dialogues is not None:
        dialogues = dialogues[: args.dialogues]
    result = asyncio.run(run_madial(memories, dialogues, cfg))
    out = Path(args.out)
    path = write_madial_report(result, out, args.data, args.label)
    (out / f"madial_{args.lang}_results.json").write_text(json.dumps(madial_json(result), indent=1))
    print(madial_table(result))
    if result.replies:
        print(f"\nreplies judged:\n{reply_table(result.replies)}")
    print(f"lexical only (no query embedding): {lexical_only(result.contextd)}")
    print(f"report: {path}")
    return 0


def _run_locomo(args: argparse.Namespace) -> int:
    from app.eval.ablation import kind_rows, rank_rows
    from app.eval.answer_eval import answer_summary
    from app.eval.answer_report import ablation_table, answer_table
    from app.eval.driver import EvalConfig, run_locomo
    from app.eval.locomo import load_locomo, summarise
    from app.eval.report import split_tables, summary_table, write_report

    cfg = EvalConfig(
        url=args.url,
        api_key=args.api_key,
        budgets=tuple(args.budgets),
        ks=tuple(args.k),
        tune_conversations=args.tune_conversations,
        categories=tuple(args.categories),
        context_limit=args.context_limit,
        reserve_tokens=args.reserve_tokens,
        min_recent_turns=args.min_recent_turns,
        min_recent_tokens=args.min_recent_tokens,
        target_ratio=args.target_ratio,
        wait_embedded=not args.no_wait_embedded,
        ingest_timeout_s=args.timeout,
        concurrency=args.concurrency,
        reuse_run_id=args.reuse_run,
        memory_tool=args.memory_tool,
        answering=answer_setup(args),
        ablate=args.ablate,
        answer_budget=args.answer_budget,
    )
    conversations = load_locomo(args.data, args.conversations)
    result = asyncio.run(run_locomo(conversations, cfg))
    ablated = [a.outcomes for a in result.ablations]
    out = Path(args.out)
    path = write_report(result, out, args.data, args.label)
    summaries = {
        name: summarise(rows, cfg.budgets, cfg.ks)
        for name, rows in (
            ("contextd", result.contextd),
            ("memory_tool", result.tool),
            ("bm25", result.bm25),
            ("bm25_framed", result.bm25_framed),
            ("truncation", result.truncation),
        )
    }
    (out / "locomo_results.json").write_text(
        json.dumps(
            {
                "summary": summaries,
                "sessions": [asdict(c) for c in result.conversations],
                "questions": [asdict(r) for r in result.contextd],
                "memory_tool_questions": [asdict(r) for r in result.tool],
                "answers": [asdict(a) for a in result.answers],
                "answer_summary": answer_summary(result.answers),
                "ablation": [asdict(kind) for kind in kind_rows(ablated)],
                "ablation_by_rank": [asdict(kind) for kind in rank_rows(ablated)],
                "ablation_questions": [asdict(a) for a in result.ablations],
            },
            indent=1,
        )
    )
    print(summary_table(result))
    print(split_tables(result))
    if result.answers:
        print(f"\nanswers judged at B{cfg.answer_budget}:\n{answer_table(result.answers)}")
    if result.ablations:
        print(f"\nfragments removed at B{cfg.answer_budget}:\n{ablation_table(result.ablations)}")
        print(f"\nby rank:\n{ablation_table(result.ablations, rows_by='rank')}")
        print(f"\nby category:\n{ablation_table(result.ablations, rows_by='category')}")
    print(f"report: {path}")
    return 0
