"""``scripts/test``'s skip summary (tests/_skips.py): skips by reason, failures in full."""

from __future__ import annotations

import pytest

from tests._skips import summary

pytest_plugins = ["pytester"]


def test_skips_collapse_to_a_line_per_reason_and_failures_stay_whole(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.parametrize("n", range(40))
        @pytest.mark.parametrize("provider", ["redis [sync]", "etcd [async]"])
        def test_session(provider, n):
            pytest.skip(f"provider {provider} lacks session")

        @pytest.mark.parametrize("n", range(3))
        def test_server(n):
            pytest.skip("PostgreSQL is not reachable")

        def test_broken():
            assert 1 + 1 == 3, "arithmetic"
        """
    )
    # the plugin is imported already (by this module): no rewriting of it to warn about
    quiet = "ignore::pytest.PytestAssertRewriteWarning"
    result = pytester.runpytest("-p", "tests._skips", "-ra", "-W", quiet)
    result.assert_outcomes(failed=1, skipped=83)
    out = result.stdout.str()
    assert "SKIPPED [" not in out
    result.stdout.fnmatch_lines(
        [
            "*= 83 skipped, by reason =*",
            "80  lacks session: etcd 40, redis 40",
            " 3  PostgreSQL is not reachable",
        ]
    )
    assert "AssertionError: arithmetic" in out  # the failure's traceback, in full
    result.stdout.fnmatch_lines(["FAILED *::test_broken*"])


def test_reasons_count_and_order() -> None:
    reasons = ["provider a [sync] lacks x, y", "b", "provider c [async] lacks x, y", "b", "b"]
    reasons += ["provider a [async] lacks x, y"]
    assert summary(reasons) == ["3  b", "3  lacks x, y: a 2, c 1"]
    assert summary([]) == []
    long = [f"provider store-{i} [sync] lacks session" for i in range(12)]
    assert summary(long, width=40) == [
        "12  lacks session: store-0 1, store-1 1,",
        "    store-10 1, store-11 1, store-2 1,",
        "    store-3 1, store-4 1, store-5 1,",
        "    store-6 1, store-7 1, store-8 1,",
        "    store-9 1",
    ]
