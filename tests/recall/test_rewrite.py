from app.domain.text import terms
from app.recall.rewrite import content_term_count, needs_context, rewrite_query

ORDER_TURNS = [
    "Hi, I need help with a delivery.",
    "Sure. Your order AB-12345 ships on Friday from the Berlin warehouse.",
]


def test_that_order_number_again_pulls_the_id_from_the_last_turn():
    q = rewrite_query("what was that order number again?", ORDER_TURNS)
    assert q.resolved_anaphora
    assert q.raw == "what was that order number again?"
    assert q.rewritten.startswith(q.raw)
    assert "order" in terms(q.rewritten)
    assert "ab-12345" in terms(q.rewritten)
    assert q.ids == ["AB-12345"]
    assert q.appended[0] == "AB-12345"  # most specific first
    assert "Berlin" in q.entities


def test_chinese_anaphora_appends_context_terms():
    turns = ["我们讨论了两个方案：A方案用Redis缓存，B方案直接查Postgres。", "好的，先用缓存方案吧"]
    q = rewrite_query("刚才说的那个方案是什么？", turns)
    assert q.resolved_anaphora
    assert q.rewritten.startswith("刚才说的那个方案是什么？")
    assert {"Redis", "Postgres", "缓存"} <= set(q.appended)
    assert "方案" not in q.appended  # already in the query
    assert len(q.appended) <= 12


def test_mixed_english_and_chinese():
    turns = ["We compared Redis and Memcached for caching session data."]
    q = rewrite_query("那个 Redis 方案 again?", turns)
    assert q.resolved_anaphora
    assert "Memcached" in q.appended
    assert "Redis" not in q.appended
    assert q.entities == ["Redis", "Memcached"]


def test_specific_query_is_left_unchanged():
    query = "How do I configure the embedding model for the staging cluster in Frankfurt?"
    q = rewrite_query(query, ORDER_TURNS)
    assert q.rewritten == q.raw == query
    assert not q.resolved_anaphora and not q.appended
    assert q.entities == ["Frankfurt"]


def test_short_query_is_expanded_without_anaphora():
    q = rewrite_query("and the shipping?", ORDER_TURNS)
    assert q.short_query and not q.resolved_anaphora
    assert "AB-12345" in q.appended


def test_standalone_questions_are_not_rewritten():
    """Words about the past in general ("again", "earlier", 之前) are no reference to the last
    turns: a question that names its subject is searched as asked."""
    turns = [
        "Most customers choose the oak chair; 464 arrived scratched within 30 days.",
        "Bright care happens when the chair arrives; 70 percent keep it.",
    ]
    for query in (
        "What was my order number again?",
        "What did we decide earlier about the refund policy?",
        "When did Caroline go to the LGBTQ support group?",
        "What did Melanie paint recently that she shared with the group?",
        "我之前的订单号是多少？",
        "上次说的退款政策是什么？",
        "shipping date?",
    ):
        q = rewrite_query(query, turns)
        assert q.rewritten == query and not q.appended, (query, q.appended)


def test_query_with_own_id_is_not_expanded():
    q = rewrite_query("AB-99999?", ORDER_TURNS)
    assert q.rewritten == q.raw
    assert q.ids == ["AB-99999"]


def test_no_recent_turns_means_raw_query():
    q = rewrite_query("what was it again?", [])
    assert q.rewritten == q.raw
    assert q.resolved_anaphora is False


def test_only_last_two_turns_are_read():
    turns = ["Invoice INV-777 was paid.", "ok", "Thanks, noted."]
    assert "INV-777" not in rewrite_query("that one?", turns).appended
    assert "INV-777" in rewrite_query("that one?", turns, context_turns=3).appended


def test_extracts_ids_numbers_quotes_and_names():
    q = rewrite_query(
        'Did Alice email bob@acme.io about ticket #4521, order 998877 and "blue banana" '
        "at https://acme.io/t/1. It cost $5.50 for 12 kg, 3.5% off, 订单3个, 「方案A」 王先生",
        [],
    )
    assert q.ids == ["bob@acme.io", "#4521", "998877", "https://acme.io/t/1"]
    assert q.numbers == ["$5.50", "12 kg", "3.5%", "3个"]
    assert q.quoted == ["blue banana", "方案A"]
    assert q.entities == ["Alice", "王先生"]


def test_names_skip_sentence_starts_and_stopwords():
    q = rewrite_query("Yesterday I met Bob Smith in New York. The weather was fine", [])
    assert q.entities == ["Bob Smith", "New York"]


def test_context_markers_and_their_reasons():
    cases = {
        "那个预算是多少": ("deictic", "那个"),
        "刚才说的方案": ("deictic", "刚才"),
        "第二家酒店有早餐吗？": ("deictic", "第二家"),
        "do the same for that one": ("deictic", "the same"),
        "Is the other one cheaper?": ("deictic", "the other one"),
        "what about the second one?": ("deictic", "the second one"),
        "how much was that?": ("pronoun", "that"),
        "is it ready": ("pronoun", "it"),
        "他几点到？": ("pronoun", "他"),
        "When do they open?": ("pronoun", "they"),
        "What about my allergy?": ("ellipsis", "What about"),
        "价格呢？": ("ellipsis", "价格呢？"),
        "那周二怎么样？": ("ellipsis", "那周二怎么样？"),
        "How much?": ("ellipsis", "How much?"),
    }
    for question, (reason, marker) in cases.items():
        need = needs_context(question)
        assert need is not None, question
        assert (need.reason, need.marker) == (reason, marker), question


def test_questions_that_stand_on_their_own():
    for question in (
        "之前提到的预算",
        "what did we decide earlier",
        "so that we can leave early",
        "is it ready for order AB-12345",  # "it" is the order it names
        "What did Jon and Gina compare their journeys to?",  # "their": Jon and Gina
        "schedule the database migration",
        "What is my name?",
        "What am I allergic to?",
        "我叫什么名字？",
        "Who is Anthony?",
        "Is it safe to drink tap water in Tokyo?",  # "it" stands for nothing
        "How far is it from Kyoto to Osaka?",
        "这个月的预算是多少？",  # "this month" is a date
        "其他航班几点起飞？",  # 其他 is "other", not 他
        "Can you book the one-way ticket to Rome?",
    ):
        assert needs_context(question) is None, (question, needs_context(question))


def test_content_term_count_counts_cjk_words_roughly():
    assert content_term_count("what is the price") == 1
    assert content_term_count("what was it again?") == 0
    assert content_term_count("缓存方案") == 2


def test_speaker_labels_are_not_names_and_cjk_honorifics_are():
    turns = ["Melanie: I finished the pottery class.", "Caroline: Wow, did you go with Tom?"]
    q = rewrite_query("what did she say about it?", turns)
    assert q.entities == ["Tom"]
    assert "pottery" in q.appended
    zh = rewrite_query("那个餐厅叫什么名字", ["上周我们去了一家川菜馆，李老板推荐了水煮鱼。"])
    assert zh.entities == ["李老板"]
    assert {"川菜", "水煮"} <= set(zh.appended)
