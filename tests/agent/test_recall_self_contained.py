"""A self-contained question asked after long small talk (issue 37): the user gives their name
and an allergy, chats about rail passes until those turns are offloaded, then asks for them.
The memory tool's `recall` (top 3) and build-prompt must both bring the facts back, not three
chunks of small talk. With e5 embeddings, as a new user runs it (`contextd dev`): the vector arm
finds small talk near any short question."""

from dataclasses import dataclass

import httpx
import pytest

from tests.support.waiting import wait_for

OWN_DATABASE = True  # it runs a worker (`e5_server`): see tests/conftest.py

SMALL = {
    "context_limit": 4000,
    "reserve_tokens": 400,
    "min_recent_turns": 4,
    "min_recent_tokens": 300,
}
SMALL_TALK_PARTS = 30


@dataclass(frozen=True)
class Script:
    """A conversation in one language: the facts, the small talk, the questions and the
    words each answer must hold."""

    facts: tuple[tuple[str, str], ...]  # (user turn, assistant turn)
    ask: str  # the small-talk question, with {n}
    answer: str  # the assistant's long friendly answer, with {n}
    questions: tuple[tuple[str, str], ...]  # (question, a word its answer holds)


ENGLISH = Script(
    facts=(
        ("Hi! My name is Marta Kowalski.", "Nice to meet you, Marta! How can I help today?"),
        (
            "Before we start: I am allergic to peanuts, so keep that in mind for any food tips.",
            "Thanks for telling me, I will keep that in mind.",
        ),
    ),
    ask="Tell me about rail passes please, part {n}.",
    answer=(
        "Happy to help with part {n}! Rail passes are a lovely way to see the country at your "
        "own pace. A flexible pass lets you choose your travel days within a month, while a "
        "continuous pass covers every day in a row. Seat reservations on fast trains usually "
        "cost a little extra, and night trains need a berth booked ahead. Youth and senior "
        "travellers often get a discount, and first class is quieter on busy routes. Enjoy "
        "planning, and ask me anything else you would like to know!"
    ),
    questions=(("What is my name?", "Kowalski"), ("What am I allergic to?", "peanuts")),
)
CHINESE = Script(
    facts=(
        ("你好！我叫王小梅。", "你好，小梅！今天有什么可以帮你的？"),
        ("先说一下：我对花生过敏，推荐吃的时候请注意。", "谢谢告诉我，我会记住的。"),
    ),
    ask="请给我介绍一下铁路通票，第{n}部分。",
    answer=(
        "很高兴继续介绍第{n}部分！铁路通票是按自己的节奏游览各地的好方式。灵活通票可以在一个月内"
        "自选出行日期，连续通票则覆盖连续的每一天。高速列车的座位预订通常要另外付一点费用，"
        "夜车需要提前订好卧铺。青年和老年旅客常常可以享受折扣，一等座在繁忙线路上更安静。"
        "祝你计划愉快，还有什么想了解的尽管问我！"
    ),
    questions=(("我叫什么名字？", "王小梅"), ("我对什么过敏？", "花生")),
)


async def chat_until_offloaded(client: httpx.AsyncClient, sid: str, script: Script) -> None:
    """The facts, then small talk appended exchange by exchange (the worker offloads as the
    watermark is crossed), until a chunk holds the facts' turns and every chunk is embedded."""
    assert (await client.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    turns = [
        {"role": role, "content": text}
        for user, assistant in script.facts
        for role, text in (("user", user), ("assistant", assistant))
    ]
    for n in range(1, SMALL_TALK_PARTS + 1):
        turns += [
            {"role": "user", "content": script.ask.format(n=n)},
            {"role": "assistant", "content": script.answer.format(n=n)},
        ]
    for start in range(0, len(turns), 6):
        batch = {"turns": turns[start : start + 6]}
        assert (await client.post(f"/v1/sessions/{sid}/turns", json=batch)).status_code == 201
    fact_turns = 2 * len(script.facts)

    async def chunks() -> list[dict]:
        resp = await client.get(f"/v1/sessions/{sid}/chunks", params={"limit": 500})
        return [c for c in resp.json()["chunks"] if c["status"] == "active"]

    await wait_for(
        chunks,
        lambda found: (
            any(c["turn_last"] >= fact_turns for c in found) and all(c["embedded"] for c in found)
        ),
        timeout=300,
        what="the facts' turns offloaded and embedded",
    )


@pytest.mark.parametrize("script", [ENGLISH, CHINESE], ids=["en", "zh"])
async def test_self_contained_questions_find_the_facts_after_small_talk(
    e5_client: httpx.AsyncClient, script: Script
) -> None:
    client = e5_client
    sid = f"allergy-{'zh' if script is CHINESE else 'en'}"
    await chat_until_offloaded(client, sid, script)
    for question, word in script.questions:
        resp = await client.post(
            f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": question, "top_k": 3}
        )
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        matches = answer["data"]["matches"]
        assert 1 <= len(matches) <= 3, answer
        assert any(word in m["text"] for m in matches), (question, answer["text"])
        assert word in answer["text"]

        built = await client.post(
            f"/v1/sessions/{sid}/build-prompt",
            json={"query": question, "recall": {"mode": "always"}},
        )
        assert built.status_code == 200, built.text
        prompt = "\n".join(str(m["content"]) for m in built.json()["messages"])
        assert word in prompt, (question, built.json()["recall"])


async def test_no_match_says_which_case_it_is(e5_client: httpx.AsyncClient) -> None:
    """Nothing stored yet, or the answer in the current window: the "No match" answer says
    which (a history that holds nothing relevant: `test_memory_tool_api`)."""
    client, sid = e5_client, "no-match-cases"
    assert (await client.put(f"/v1/sessions/{sid}", json=SMALL)).status_code == 200
    greeting = [
        {"role": "user", "content": "Hello there!"},
        {"role": "assistant", "content": "Hi! How can I help you today?"},
    ]
    assert (await client.post(f"/v1/sessions/{sid}/turns", json={"turns": greeting})).is_success

    async def recall(query: str) -> dict:
        resp = await client.post(
            f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": query, "top_k": 3}
        )
        assert resp.status_code == 200, resp.text
        return resp.json()

    empty = await recall("What is the boiling point of mercury in kelvin?")
    assert empty["data"]["matches"] == [] and empty["data"]["no_match"] == "nothing_stored"
    assert empty["text"].startswith("No match: nothing of this conversation has been offloaded")

    said = [
        {"role": "user", "content": "My passport number is X4417-2290, 我的护照号码。"},
        {"role": "assistant", "content": "Got it, thanks."},
    ]
    assert (await client.post(f"/v1/sessions/{sid}/turns", json={"turns": said})).is_success
    for query in ("What is my passport number?", "我的护照号码是多少？"):
        window = await recall(query)
        assert window["data"]["matches"] == [] and window["data"]["no_match"] == "in_window"
        assert window["text"].startswith("No match in the offloaded history")
        assert "(turns 3)" in window["text"], window["text"]


@pytest.mark.parametrize(
    ("turns", "query"),
    [
        (
            (
                "帮我订明天去里昂的火车，预算最多120欧元。",
                "好的，已订好，车票 LY-40917，96欧元。",
                "那张车票号是多少？",
                "LY-40917。",
            ),
            "预算是多少？",
        ),
        (
            (
                "Book the 9:40 train to Lyon, a budget of at most 120 EUR.",
                "Booked: ticket LY-40917, 96 EUR.",
                "Thanks so much! How much luggage can I take?",
                "Two bags.",
            ),
            "How much is the budget?",
        ),
    ],
    ids=["zh", "en"],
)
async def test_in_window_names_the_turns_about_the_question_not_those_asking_alike(
    e5_client: httpx.AsyncClient, turns: tuple[str, ...], query: str
) -> None:
    """多少 ("how much") is in any question about an amount, as "much" is in English: the turns
    a No match points to are those holding what the question asks about."""
    sid = f"asked-alike-{'zh' if '预算' in query else 'en'}"
    said = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text}
        for i, text in enumerate(turns)
    ]
    assert (await e5_client.post(f"/v1/sessions/{sid}/turns", json={"turns": said})).is_success
    resp = await e5_client.post(
        f"/v1/sessions/{sid}/memory", json={"type": "recall", "query": query}
    )
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["data"]["no_match"] == "in_window"
    assert "(turns 1)" in answer["text"], answer["text"]
