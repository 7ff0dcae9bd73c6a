"""VersionedLRU: one value per owner, the least recently used owner evicted first; LRU: values
by key, the least recently used evicted first."""

from app.core.lru import LRU, VersionedLRU


def test_a_newer_version_replaces_the_owners_older_one() -> None:
    lru: VersionedLRU[str] = VersionedLRU(4)
    lru.put(("会话-a", 1), "v1")
    lru.put(("会话-a", 2), "v2")
    assert lru.get(("会话-a", 1)) is None
    assert lru.get(("会话-a", 2)) == "v2"
    assert lru.latest("会话-a") == (2, "v2")
    assert lru.latest("session-b") is None


def test_the_least_recently_used_owner_leaves_first() -> None:
    lru: VersionedLRU[str] = VersionedLRU(2)
    lru.put(("a", 1), "a1")
    lru.put(("b", 1), "b1")
    assert lru.get(("a", 1)) == "a1"  # b is now the least recently used
    lru.put(("c", 7), "c7")
    assert lru.latest("b") is None
    assert lru.get(("b", 1)) is None
    assert lru.latest("a") == (1, "a1")
    assert lru.latest("c") == (7, "c7")
    lru.put(("b", 2), "b2")  # evicts a, the least recently used since c came in
    assert lru.latest("a") is None
    assert [lru.latest(o) for o in ("b", "c")] == [(2, "b2"), (7, "c7")]


def test_an_older_version_put_later_is_what_is_kept() -> None:
    """The caller decides what is current: the last put of an owner is its value."""
    lru: VersionedLRU[str] = VersionedLRU(2)
    lru.put(("a", 5), "a5")
    lru.put(("a", 3), "a3")
    assert lru.latest("a") == (3, "a3")
    assert lru.get(("a", 5)) is None


def test_a_size_of_zero_keeps_nothing() -> None:
    lru: VersionedLRU[str] = VersionedLRU(0)
    lru.put(("a", 1), "a1")
    assert lru.latest("a") is None
    assert lru.get(("a", 1)) is None


def test_lru_keeps_the_most_recently_used() -> None:
    lru: LRU[str, int] = LRU(2)
    lru.put("我叫王小梅。", 1)
    lru.put("b", 2)
    assert lru.get("我叫王小梅。") == 1  # b is now the least recently used
    lru.put("c", 3)
    assert lru.get("b") is None
    assert (lru.get("我叫王小梅。"), lru.get("c")) == (1, 3)
    off: LRU[str, int] = LRU(0)
    off.put("a", 1)
    assert off.get("a") is None
