"""The answering model and judges of `--answer-llm` against a real loopback chat server: what
each call sends, and a failing model or judge counted as an error, not a crash."""

import argparse
import json
from typing import Any

import pytest

from app.core.chat import ChatEndpoint
from app.eval import add_parser, answer_setup
from app.eval.answering import (
    LOCOMO_ANSWER,
    AnswerSetup,
    grade,
    llm_client,
    prompt_text,
)
from tests.support.loopback import closed_port_url, loopback_server

BUILT = [
    {"role": "system", "content": "<recalled_history>\n[…]\nuser: Ann: I keep a parrot.\n"},
    {"role": "user", "content": "What pet does Ann keep?"},
]


def reply(content: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}


def setup(answer_url: str, judge_url: str | None = None) -> AnswerSetup:
    return AnswerSetup(
        answer=ChatEndpoint(answer_url, "answerer", None, 5.0),
        judge=ChatEndpoint(judge_url or answer_url, "judge", None, 5.0),
    )


async def ask(answers: AnswerSetup, gold: str = "a parrot") -> Any:
    async with llm_client() as client:
        return await grade(
            client, answers, prompt_text(LOCOMO_ANSWER), BUILT, "What pet does Ann keep?", gold
        )


async def test_the_answer_then_both_judges_each_with_its_prompt() -> None:
    def handler(method: str, path: str, body: Any) -> tuple[int, Any]:
        if body["model"] == "answerer":
            return 200, reply("  A parrot. \n")
        strict = "Grade strictly" in body["messages"][0]["content"]
        return 200, reply(json.dumps({"label": "WRONG" if strict else "CORRECT"}))

    with loopback_server(handler) as srv:
        graded = await ask(setup(srv.url))
    assert (graded.answer, graded.published, graded.strict, graded.error) == (
        "A parrot.",
        True,
        False,
        None,
    )
    (_, path, answer), (_, _, published), (_, _, strict) = srv.requests
    assert path == "/v1/chat/completions"
    assert answer["model"] == "answerer" and answer["temperature"] == 0
    assert "response_format" not in answer  # the answer is prose, not JSON
    assert answer["messages"] == [
        {"role": "system", "content": prompt_text(LOCOMO_ANSWER)},
        *BUILT,
    ]
    for judged in (published, strict):
        assert judged["model"] == "judge"
        assert judged["response_format"] == {"type": "json_object"}
        [message] = judged["messages"]
        assert "Gold answer: a parrot\nGenerated answer: A parrot." in message["content"]
    assert "generous with your grading" in published["messages"][0]["content"]
    assert "Grade strictly" in strict["messages"][0]["content"]


async def test_a_failing_answering_model_is_an_error_scored_wrong() -> None:
    graded = await ask(setup(closed_port_url()))
    assert (graded.answer, graded.published, graded.strict) == ("", False, False)
    assert graded.error and "answering model" in graded.error


async def test_a_judge_reply_without_a_label_is_an_error_scored_wrong() -> None:
    def handler(method: str, path: str, body: Any) -> tuple[int, Any]:
        if body["model"] == "answerer":
            return 200, reply("a parrot")
        if "Grade strictly" in body["messages"][0]["content"]:
            return 200, reply(json.dumps({"verdict": "CORRECT"}))
        return 200, reply(json.dumps({"label": "CORRECT"}))

    with loopback_server(handler) as srv:
        graded = await ask(setup(srv.url))
    assert (graded.answer, graded.published, graded.strict) == ("a parrot", True, False)
    assert graded.error and "no string label" in graded.error


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["eval", "locomo", "--data", "x.json", *argv])


def test_answer_setup_from_the_command_line() -> None:
    assert answer_setup(parse(), {}) is None  # no URL: no model
    made = answer_setup(
        parse("--answer-llm", "http://127.0.0.1:9/v1", "--answer-model", "m",
              "--llm-api-key-env", "ANSWER_KEY"),
        {"ANSWER_KEY": "sk-test", "OPENAI_API_KEY": "other"},
    )  # fmt: skip
    assert made is not None
    assert made.answer == ChatEndpoint("http://127.0.0.1:9/v1", "m", "sk-test", 120.0)
    assert made.judge == made.answer  # the judge defaults to the answering endpoint and model
    made = answer_setup(
        parse("--answer-llm", "http://a", "--judge-llm", "http://b", "--judge-model", "j"), {}
    )
    assert made is not None and made.answer.api_key is None and made.answer.model == "gpt-4o-mini"
    assert (made.judge.base_url, made.judge.model) == ("http://b", "j")
    with pytest.raises(SystemExit, match="--judge-llm needs --answer-llm"):
        answer_setup(parse("--judge-llm", "http://b"), {})
