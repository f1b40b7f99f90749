"""REFOPS_TEST_SHARD (tests/conftest.py): n shards of one suite, disjoint and together the whole suite."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
TARGET = "tests/refops/ops/test_checkpoint.py"


def collect(shard: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "REFOPS_TEST_SHARD"}
    if shard is not None:
        env["REFOPS_TEST_SHARD"] = shard
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", TARGET],
                          cwd=ROOT, env=env, capture_output=True, text=True)


def ids(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_shards_are_disjoint_and_cover_the_suite():
    whole = ids(collect(None))
    shards = [ids(collect(f"{i}/3")) for i in range(3)]
    assert len(whole) >= 6
    assert sorted(sum(shards, [])) == sorted(whole)
    assert all(len(s) in (len(whole) // 3, len(whole) // 3 + 1) for s in shards)


def test_a_malformed_shard_is_a_usage_error():
    result = collect("3/3")
    assert result.returncode == 4, result.stdout + result.stderr  # pytest's usage-error exit code
    assert "REFOPS_TEST_SHARD='3/3'" in result.stderr + result.stdout
