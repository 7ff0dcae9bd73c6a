"""Pure rules of remembered items: near duplicates in English and Chinese."""

from app.memories.policy import near_duplicate


def test_near_duplicates_in_english_and_chinese() -> None:
    stored = [
        ("a", "User prefers window seats on trains."),
        ("b", "发票只寄电子版到 finance@example.com，不要纸质版"),
    ]
    assert near_duplicate("user prefers WINDOW seats on trains", stored, 0.85) == "a"
    assert near_duplicate("发票只寄电子版到 finance@example.com，不要纸质版。", stored, 0.85) == "b"
    assert near_duplicate("User prefers aisle seats on planes", stored, 0.85) is None
    assert near_duplicate("发票寄纸质版", stored, 0.85) is None
