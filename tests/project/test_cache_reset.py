"""The cache reset between tests knows every memo it claims to, and empties them."""

from __future__ import annotations

import caches

from webhook.core.podspec import record


def test_every_listed_memo_exists_and_can_be_emptied() -> None:
    found = list(caches.listed())
    assert len(found) == sum(len(names) for names in caches.MEMOS.values())
    assert all(hasattr(memo, "clear") for _, _, memo in found)


def test_reset_empties_memos_and_functools_caches() -> None:
    assert any(c.__module__ == "webhook.core.podspec.record" for c in caches.functools_caches())
    record._PARSED[(0, "x")] = None  # type: ignore[assignment]
    caches.reset()
    assert record._PARSED == {}
    assert all(c.cache_info().currsize == 0 for c in caches.functools_caches())
