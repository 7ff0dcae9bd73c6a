"""The conflict rules of remembered statements (`app.memories.conflicts`), English and Chinese."""

import pytest

from app.memories.conflicts import Statement, contradicts, statement

CONFLICTING: tuple[tuple[str, str], ...] = (
    ("I live in Paris.", "We moved to Lyon last month."),
    ("I live in Paris", "I now live in Berlin"),
    ("We are based in Boston.", "We relocated to Denver."),
    ("My address is 12 Rue de Rivoli, Paris.", "My address is now 3 Quai Perrache, Lyon."),
    ("My name is Anna Smith.", "Call me Bob."),
    ("My email is anna@example.com", "My new email is anna.smith@example.org"),
    ("My phone number is 555-0101.", "My phone is now 555-0199."),
    ("I work at Acme.", "I now work for Globex."),
    ("I'm allergic to peanuts.", "I have no allergies."),
    ("I have no allergies.", "I'm allergic to shellfish."),
    ("I'm allergic to peanuts.", "I'm no longer allergic to peanuts."),
    ("Our budget is $5,000.", "The budget changed to $8,000."),
    ("Budget: 5k", "Budget is now 7.5k"),
    ("The deadline is Friday.", "The deadline moved to next Monday."),
    ("I prefer aisle seats.", "I prefer window seats."),
    ("My favourite colour is blue.", "My favorite color is green."),
    ("I like cilantro.", "I hate cilantro."),
    ("I love sushi", "I don't eat sushi"),
    ("我住在上海。", "我们搬到了杭州。"),
    ("我住在北京", "我现在住在深圳"),
    ("我的地址是朝阳区建国路88号", "地址改成了海淀区中关村大街1号"),
    ("我叫王伟。", "我的名字是李娜。"),
    ("我的邮箱是 wang@example.com", "邮箱改成 wang.wei@example.cn"),
    ("我的手机号是13800000000", "手机号换成13900000000"),
    ("我在阿里巴巴工作", "我现在在腾讯上班"),
    ("我对花生过敏。", "我没有过敏。"),
    ("我没有任何过敏", "我对海鲜过敏"),
    ("我对芒果过敏", "我已经不对芒果过敏了"),
    ("预算 5 万", "预算改成 8 万"),
    ("预算五万元", "预算调整为八万"),
    ("预算3000元以内", "预算提高到5000元"),
    ("截止日期是周五。", "截止日期改到下周一。"),
    ("我更喜欢靠窗的座位", "我更喜欢靠过道的座位"),
    ("最喜欢的颜色是蓝色", "最喜欢的颜色换成绿色"),
    ("我喜欢香菜", "我不喜欢香菜"),
)
COMPATIBLE: tuple[tuple[str, str], ...] = (
    ("I live in Paris.", "I live in Paris, near the Louvre."),
    ("I'm allergic to peanuts.", "I'm allergic to shellfish."),
    ("I like tea.", "I like coffee."),
    ("I live in Paris.", "My budget is $5,000."),
    ("Our budget is $5,000.", "Our budget is 5k."),
    ("The deadline is Friday.", "I prefer window seats."),
    ("My name is Anna Smith.", "My name is Anna Smith"),
    ("I prefer aisle seats.", "I prefer aisle seats on long flights."),
    ("I hate cilantro.", "I hate olives."),
    ("The weather was nice.", "We went to the beach."),
    ("我住在上海", "我住在上海，离地铁很近"),
    ("我对花生过敏", "我对海鲜过敏"),
    ("我喜欢喝茶", "我喜欢咖啡"),
    ("预算 5 万", "预算五万"),
    ("预算 5 万", "截止日期是周五"),
    ("我叫王伟", "我叫王伟"),
    ("我更喜欢靠窗的座位", "我更喜欢清淡的口味"),
    ("今天天气不错", "我们去了海边"),
    ("I live in Paris.", "我住在巴黎"),  # a different value in another language: no rule here
)


def test_the_set_is_large_enough() -> None:
    assert len(CONFLICTING) + len(COMPATIBLE) >= 40
    assert sum(any("\u4e00" <= c <= "\u9fff" for c in a) for a, _ in CONFLICTING) >= 15


@pytest.mark.parametrize(("old", "new"), CONFLICTING)
def test_conflicting_statements_contradict(old: str, new: str) -> None:
    assert contradicts(old, new), (statement(old), statement(new))


@pytest.mark.parametrize(("old", "new"), COMPATIBLE)
def test_statements_that_can_both_hold_do_not(old: str, new: str) -> None:
    assert not contradicts(old, new), (statement(old), statement(new))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("We moved to Lyon last month.", Statement("home", "lyon")),
        ("预算改成 8 万", Statement("budget", "80000")),
        ("The budget is $5,000.", Statement("budget", "5000")),
        ("I have no allergies.", Statement("allergy", "none", exclusive=False)),
        ("对花生过敏", Statement("allergy", "花生", exclusive=False)),
        ("I'm no longer allergic to peanuts", Statement("allergy", "peanut", False, False)),
        ("I prefer aisle seats", Statement("preference:seat", "aisle")),
        ("我不喜欢香菜", Statement("preference:香菜", "香菜", False, False)),
        ("Thanks, that helps.", None),
    ],
)
def test_a_statement_names_its_slot_and_value(text: str, expected: Statement | None) -> None:
    assert statement(text) == expected
