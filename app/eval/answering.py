"""Answer-level eval (`--answer-llm`): an answering model reads a built prompt and answers, two
judges grade the answer against the gold one.

The answering model gets the build's messages as they are, after one system message of
instructions (`prompts/answer_system.txt` for LoCoMo, adapted from the Mem0 evaluation's answer
prompt; `prompts/madial_reply_system.txt` for MADial). The instructions are put in front by the
eval, not sent as the build's C0, so the build and its evidence recall are those the eval scores
at the same budget without a model.

Two judges grade each answer (temperature 0, JSON mode, `{"label": "CORRECT" | "WRONG"}`):
- **published**: the LLM-as-a-Judge prompt of the Mem0 paper's LoCoMo evaluation, verbatim
  (`prompts/locomo_judge.txt`), the "J" score peers publish. It asks for generous grading: an
  answer that "touches on the same topic" counts.
- **strict** (`prompts/strict_judge.txt`): every fact of the gold answer is required; an
  on-topic answer naming another thing, a hedge between candidates or a contradiction is wrong.
  Published audits of LoCoMo found about 6 % of its answer key wrong and lenient judges accepting
  most on-topic wrong answers, so the lenient figure flatters every system alike; the strict one
  is the one to read for "did the user get the right answer".
Sources and licences of the texts: `prompts/SOURCES.md`.

A model or judge that fails (timeout, HTTP error, a reply without a label) scores the question as
wrong and is counted apart (`error`), so a flaky endpoint shows in the report instead of
stopping a long run. Only the URLs given are called.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from app.core.chat import ChatEndpoint, ChatUnavailable, chat_json, chat_text

PROMPTS = Path(__file__).parent / "prompts"
PUBLISHED_JUDGE = "locomo_judge.txt"
STRICT_JUDGE = "strict_judge.txt"
LOCOMO_ANSWER = "answer_system.txt"
MADIAL_REPLY = "madial_reply_system.txt"
JudgeName = Literal["published", "strict"]


def prompt_text(name: str) -> str:
    """A prompt file of `app/eval/prompts/`, as sent."""
    return (PROMPTS / name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class AnswerSetup:
    """The answering model and the judge model (often the same endpoint)."""

    answer: ChatEndpoint
    judge: ChatEndpoint


@dataclass(frozen=True)
class Graded:
    """One answer and its two judgments; `error`: why the answer or a judgment is missing (the
    question then counts as wrong for that judge)."""

    answer: str
    published: bool
    strict: bool
    error: str | None = None

    def correct(self, judge: JudgeName) -> bool:
        return self.published if judge == "published" else self.strict


def judge_messages(template: str, question: str, gold: str, answer: str) -> list[dict[str, str]]:
    """The judge's one user message: the template with the question, gold and generated answer
    put in (`str.format`: braces in the values are kept as they are)."""
    content = template.format(question=question, gold_answer=gold, generated_answer=answer)
    return [{"role": "user", "content": content}]


def judged_correct(reply: Any) -> bool:
    """Whether a judge's JSON reply says CORRECT (the Mem0 script's test: `label == "CORRECT"`,
    here after trimming and upper-casing); a reply without a string label is an error."""
    label = reply.get("label") if isinstance(reply, Mapping) else None
    if not isinstance(label, str):
        raise ChatUnavailable(f"judge reply has no string label: {str(reply)[:200]}")
    return label.strip().upper() == "CORRECT"


def answer_messages(system: str, built: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The instructions as the first system message, then the built prompt's messages."""
    return [{"role": "system", "content": system}, *(dict(m) for m in built)]


async def grade(
    client: httpx.AsyncClient,
    setup: AnswerSetup,
    system: str,
    built: Sequence[Mapping[str, Any]],
    question: str,
    gold: str,
) -> Graded:
    """Ask the answering model with `built` (the prompt's messages, the question last), then
    both judges."""
    try:
        answer = await chat_text(
            client, setup.answer, answer_messages(system, built), purpose="answering model"
        )
    except ChatUnavailable as exc:
        return Graded("", False, False, str(exc))
    answer = answer.strip()
    verdicts: dict[str, bool] = {}
    for name, template in (("published", PUBLISHED_JUDGE), ("strict", STRICT_JUDGE)):
        try:
            reply = await chat_json(
                client,
                setup.judge.base_url,
                setup.judge.model,
                setup.judge.api_key,
                judge_messages(prompt_text(template), question, gold, answer),
                setup.judge.timeout_s,
                purpose=f"{name} judge",
            )
            verdicts[name] = judged_correct(reply)
        except ChatUnavailable as exc:
            return Graded(answer, verdicts.get("published", False), False, str(exc))
    return Graded(answer, verdicts["published"], verdicts["strict"])


def llm_client() -> httpx.AsyncClient:
    """The client the answering model and judge are called with (no proxy from the
    environment: only the URLs given are called)."""
    return httpx.AsyncClient(trust_env=False)
