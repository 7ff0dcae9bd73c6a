"""The relevance floor (`app.recall.floor`): pure, no database."""

from collections import Counter

from app.domain.stem import stem
from app.domain.text import terms
from app.recall.floor import (
    ACROSS_ONE,
    CONFIDENT_WITHIN,
    FAMILIAR_SHARE,
    MEANING_E5_WEIGHT,
    MEANING_ZERO,
    NAMED_RELEVANCE,
    OWN_ONE,
    STRANGER_SHARE,
    VECTOR_ONE,
    VECTOR_ZERO,
    asks_about_the_user,
    compared_lines,
    confident,
    lexical_relevance,
    meaning_relevance,
    query_names,
    query_weights,
    relevance,
    vector_relevance,
)

TRAVEL = [
    "We booked the Hotel Gracery in Shinjuku for four nights, 18,000 yen a night.",
    "The JR Pass costs 50,000 yen for seven days; buy it before you fly.",
    "我们在京都住两晚旅馆，每晚预算不超过九百元。",
    "Flight LH741 leaves Frankfurt at 13:45 on April 4.",
]


def weights_over(query: str, texts: list[str]) -> dict[str, float]:
    df = Counter(key for text in texts for key in {stem(t) for t in terms(text)})
    return query_weights(query, lambda term: df[term], len(texts))


def test_a_question_the_session_answers_is_relevant():
    weights = weights_over("What does the JR Pass cost?", TRAVEL)
    assert lexical_relevance(weights, TRAVEL[1]) == 1.0
    assert lexical_relevance(weights, TRAVEL[0]) == 0.0


def test_terms_the_session_never_holds_weigh_the_most():
    # "boiling", "point", "mercury" and "kelvin" are in no chunk; "four" is in one.
    weights = weights_over("What is the boiling point of mercury for four kelvin?", TRAVEL)
    assert weights.units["mercury"] > weights.units["four"]
    assert 0 < lexical_relevance(weights, TRAVEL[0]) < 0.15


def test_chinese_by_bigrams_not_lone_characters():
    weights = weights_over("京都的旅馆每晚多少钱？", TRAVEL)
    assert "京都" in weights.pieces and "旅馆" in weights.pieces
    assert "京" not in weights.pieces  # a lone character only when the query has nothing longer
    assert lexical_relevance(weights, TRAVEL[2]) > 0.4  # 京都, 旅馆, 每晚 held; 多少钱 not
    unrelated = weights_over("水银的沸点是多少开尔文？", TRAVEL)
    assert lexical_relevance(unrelated, TRAVEL[2]) == 0.0


def test_inflections_compare_by_stem():
    weights = weights_over("When did we book the hotels?", TRAVEL)
    assert lexical_relevance(weights, "I am booking a hotel now.") == 1.0


def test_a_dated_query_leaves_its_date_to_the_chunks_dates():
    # A chunk's days are search terms beside its text, not in it: "May 3, 2023" would sink the
    # turn that answers.
    question = "Who did we meet for dinner on May 3, 2023?"
    dinner = "We had dinner with Aiko at the ryokan."
    weights = weights_over(question, [*TRAVEL, dinner])
    dated = query_weights(question, lambda term: 1, 5, dated=True)
    assert lexical_relevance(weights, dinner) < 0.5
    assert set(dated.units) == {"meet", "dinner"}
    assert lexical_relevance(dated, dinner) == 0.5


def test_a_query_without_terms_is_relevant_to_nothing():
    weights = weights_over("what is it?", TRAVEL)
    assert weights.units == {}
    assert lexical_relevance(weights, TRAVEL[0]) == 0.0


def test_vector_relevance_scales_between_zero_and_one():
    assert vector_relevance(None) == 0.0
    assert vector_relevance(VECTOR_ZERO - 0.05) == 0.0
    assert vector_relevance(VECTOR_ZERO) == 0.0
    assert abs(vector_relevance((VECTOR_ZERO + VECTOR_ONE) / 2) - 0.5) < 1e-9
    assert vector_relevance(VECTOR_ONE) == 1.0


def test_relevance_is_the_stronger_signal_capped_at_one():
    weights = weights_over("What does the JR Pass cost?", TRAVEL)
    unheard = weights_over("What is the boiling point of mercury?", TRAVEL)
    assert unheard.familiar == 0.0
    assert relevance(weights, TRAVEL[1], None) == 1.0
    assert relevance(unheard, TRAVEL[0], VECTOR_ONE + 0.1) == 1.0
    assert relevance(unheard, TRAVEL[0], (VECTOR_ZERO + VECTOR_ONE) / 2) == 0.5
    assert relevance(unheard, TRAVEL[0], None) == 0.0


def test_a_question_about_what_the_session_talks_of_is_familiar():
    # Every word of it is somewhere in the session, though not in this item.
    weights = weights_over("How much does the pass cost?", TRAVEL)
    assert weights.familiar == 1.0
    assert relevance(weights, TRAVEL[0], None) == FAMILIAR_SHARE
    half = weights_over("Which pass covers the ferry?", TRAVEL)
    assert 0 < half.familiar < 1


def test_question_words_count_for_nothing():
    # 什么 and 多少 ask; no answer holds them.
    weights = weights_over("我叫什么名字？", ["你好！我叫王小梅。", *TRAVEL])
    assert not {"什", "么"} & set(weights.units)
    assert weights_over("How many yen is the JR Pass?", TRAVEL).units.keys() == {
        "yen",
        "jr",
        "pass",
    }


def test_confident_when_one_of_the_first_items_reaches_the_floor():
    assert confident([0.1, 0.5, 0.0], 0.5)
    assert not confident([0.1, 0.49], 0.5)
    assert not confident([], 0.5)
    assert confident([0.0, 0.0], 0.0)  # floor 0: everything is quoted, as without a floor
    late = [0.0] * CONFIDENT_WITHIN + [1.0]
    assert not confident(late, 0.5)  # ranked past the first items: not what recall quotes


def test_the_lines_to_compare_by_meaning_without_their_labels():
    chunk = (
        "user: I'm allergic to peanuts.\n"
        "and to shellfish\n"
        "assistant (planner): 好的，我记下了。\n"
        "tool[call_1]: Hotel Gracery, 18,000 yen\n"
        "\n"
        "the 酒店 was fine\n"
        "user (ana): 我也对虾过敏。"
    )
    # Across scripts, every line in the other script ("the 酒店 was fine" is mostly Latin: one
    # CJK word among four).
    assert compared_lines("我对什么过敏？", chunk, across=True) == [
        "I'm allergic to peanuts.",
        "and to shellfish",  # the rest of the user's turn
        "Hotel Gracery, 18,000 yen",
        "the 酒店 was fine",
    ]
    assert compared_lines("What am I allergic to?", chunk, across=True) == [
        "好的，我记下了。",
        "我也对虾过敏。",
    ]
    # In the question's own script, the user's lines only: a tool's output and the assistant's
    # words are not what the user told.
    assert compared_lines("What am I allergic to?", chunk, across=False) == [
        "I'm allergic to peanuts.",
        "and to shellfish",
    ]
    assert compared_lines("我对什么过敏？", chunk, across=False) == ["我也对虾过敏。"]
    only_latin = "user: I'm allergic to peanuts."
    assert compared_lines("What am I allergic to?", only_latin, across=True) == []


def test_a_question_about_the_user_not_how_something_is_done():
    about = [
        "What is my job?",
        "Which languages do I speak?",
        "Does our building have an elevator?",
        "What am I afraid of?",
        "我害怕什么？",
        "我们住的楼有电梯吗？",
    ]
    assert all(asks_about_the_user(q) for q in about), about
    world = [
        "What is the boiling point of mercury in kelvin?",
        "How do I reverse a linked list in Python?",
        "how can I fix a merge conflict in git?",
        "Is the US embassy open on Sundays?",  # "US" is not "us"
        "水银的沸点是多少开尔文？",
        "我该怎么补自行车胎？",
        "我要如何计算贷款的复利？",
    ]
    assert not any(asks_about_the_user(q) for q in world), world


def test_meaning_relevance_scales_the_two_similarities_together():
    def at(combined: float, line: float) -> float:
        # The e5 similarity that, with USE's `line`, makes `combined`.
        return (combined - (1 - MEANING_E5_WEIGHT) * line) / MEANING_E5_WEIGHT

    for across, one in ((True, ACROSS_ONE), (False, OWN_ONE)):
        assert meaning_relevance(at(MEANING_ZERO, 0.3), 0.3, across=across) == 0.0
        assert meaning_relevance(at(MEANING_ZERO - 0.1, 0.2), 0.2, across=across) == 0.0
        middle = (MEANING_ZERO + one) / 2
        assert abs(meaning_relevance(at(middle, 0.4), 0.4, across=across) - 0.5) < 1e-9
        assert meaning_relevance(at(one + 0.1, 0.6), 0.6, across=across) == 1.0
    # The no-history set's question that came nearest across scripts (e5 .80, USE .25
    # together) stays below a floor of .25; a fact across languages (e5 .80, USE .45) passes it.
    assert meaning_relevance(0.80, 0.25, across=True) < 0.25
    assert meaning_relevance(0.80, 0.45, across=True) > 0.25
    # In one script: "What is my company's quarterly revenue target?" against the travel chat
    # (e5 .77, USE .30) stays below it, "What is my job?" against "I work as a pharmacist at a
    # hospital in Leeds." (e5 .83, USE .29) passes it.
    assert meaning_relevance(0.772, 0.301, across=False) < 0.25
    assert meaning_relevance(0.834, 0.289, across=False) > 0.25


def test_an_item_judged_by_meaning_counts_by_its_own_relevance():
    facts = ["I'm allergic to peanuts, so please never suggest satay.", *TRAVEL]
    weights = weights_over("我对什么食物过敏？", facts)
    assert lexical_relevance(weights, facts[0]) == 0.0  # no character of it in English
    assert relevance(weights, facts[0], None, by_meaning=0.6) == 0.6
    assert relevance(weights, facts[0], None) == relevance(weights, facts[0], None, 0.0)


def test_the_names_a_question_writes():
    assert query_names("What Console does Nate own in Tampa?") == ["Console", "Nate", "Tampa"]
    # A sentence's first word, "I'm", months, weekdays and a title's small words are not names.
    assert query_names("I'm asking: Where did Joanna go in July, on a Friday?") == ["Joanna"]
    assert query_names("What might John's sister say? Which Four Seasons?") == [
        "John",
        "Four",
        "Seasons",
    ]
    assert query_names("what is my name?") == []
    assert query_names("《百年孤独》的作者是谁？") == ["百年孤独"]


def test_an_item_that_names_what_the_question_names_is_about_it():
    # A speaker's name is in every chunk of their conversation: lexically it weighs nothing.
    chat = [f"Nate: day {i} of the tournament, lots of games." for i in range(20)]
    chat.append("Nate: I finally bought an Xbox, it was on sale.")
    weights = weights_over("What Console does Nate own?", chat)
    assert lexical_relevance(weights, chat[-1]) < 0.05
    assert relevance(weights, chat[-1], None) == NAMED_RELEVANCE
    assert relevance(weights, "Joanna: I wrote a new screenplay.", None) < 0.05


def test_a_name_is_held_only_as_written():
    # "The Four Seasons" is not "four days in cherry blossom season", lexically or as familiar.
    chat = [
        "April is cherry blossom season; Tokyo for four days, then Kyoto.",
        "Book the ryokan in Hakone for one night.",
    ]
    weights = weights_over("Which composer wrote The Four Seasons?", chat)
    assert weights.familiar == 0.0
    assert relevance(weights, chat[0], None) == 0.0
    assert relevance(weights, "We stayed at the Four Seasons in Kyoto.", None) >= NAMED_RELEVANCE
    # A title in 《》 the same way: its characters are in any Chinese chat.
    zh = ["今年四月我们去京都，住了一百年的老旅馆。", "大阪离京都很近，坐车一个小时。"]
    title = weights_over("《百年孤独》的作者是谁？", zh)
    assert title.familiar == 0.0
    assert relevance(title, zh[0], None) == 0.0
    assert relevance(title, "我最近在读《百年孤独》，作者是马尔克斯。", None) >= NAMED_RELEVANCE


def test_most_asks_like_many():
    weights = weights_over("Which planet has the most moons?", ["The most popular onsen is here."])
    assert set(weights.units) == {"planet", "moon"}


def test_a_question_about_a_stranger_to_the_session_is_about_another_conversation():
    chat = [
        "Jon: I went to church with my friends on Sunday, then we had lunch.",
        "Gina: My dance studio opens next month!",
    ]
    about_us = weights_over("What did Jon do with his church friends?", chat)
    # Jon's weight counts through the named signal, the rest as familiar.
    assert not about_us.stranger and about_us.familiar > 0.5
    # Maria is in no chunk: the words the question shares with this chat are not about her.
    stranger = weights_over("What did Maria do with her church friends?", chat)
    assert stranger.stranger and stranger.familiar == 0.0
    shared = lexical_relevance(about_us, chat[0])
    assert lexical_relevance(stranger, chat[0]) < shared
    held = (stranger.units["church"] + stranger.units["friend"]) / sum(stranger.units.values())
    assert abs(lexical_relevance(stranger, chat[0]) - STRANGER_SHARE * held) < 1e-9
    assert relevance(stranger, chat[0], None) < 0.25 <= relevance(about_us, chat[0], None)
    # 《百年孤独》: a title no chunk holds a character of.
    assert weights_over("《百年孤独》的作者是谁？", ["我们去京都住旅馆。"]).stranger
