"""benchmarks/gpu/module_tier_te.py on CPU with the fake TE: it runs, writes its record, and exits 0 only when
every correct setting passes and every planted bug is caught."""

from __future__ import annotations

import importlib.util
import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[4]


def _script():
    spec = importlib.util.spec_from_file_location("module_tier_te", REPO / "benchmarks" / "gpu" / "module_tier_te.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_passes_correct_settings_and_catches_planted_bugs_with_the_fake_te(tmp_path):
    status = _script().main([str(tmp_path), "--fake-te", "--recipes", "none", "fp8_current_scaling"])
    assert status == 0
    record = json.loads((tmp_path / "module_tier.json").read_text())
    assert [r["recipe"] for r in record["settings"]].count("fp8_current_scaling") == 4
    assert all(r.get("not applicable") or r["ok"] for r in record["settings"])
    assert record["bugs"] and all(not b["ok"] for b in record["bugs"])
    page = (tmp_path / "module_tier.md").read_text()
    assert "| fp8_current_scaling | bfloat16 | quantized | **pass** |" in page
    assert "| bias +0.05 | fp8_current_scaling | bfloat16 | yes |" in page


def test_the_script_exits_1_when_a_planted_bug_is_not_caught(tmp_path, monkeypatch):
    script = _script()
    real = script._run_setting

    def blind(*args, bug=None, **kwargs):
        return real(*args, **kwargs)  # the "bug" is never planted: nothing to catch

    monkeypatch.setattr(script, "_run_setting", blind)
    assert script.main([str(tmp_path), "--fake-te", "--recipes", "none"]) == 1
    assert "**NO**" in (tmp_path / "module_tier.md").read_text()
