"""benchmarks/report.py writes RESULTS.md from a run of scripts/bench.sh;
the sections written by hand (same-run A/Bs of one change, headed "by hand,
not by report.py") survive a new run's table."""

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_report():
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("report", ROOT / "benchmarks" / "report.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_only_the_hand_written_sections_are_kept(tmp_path):
    report = load_report()
    old = tmp_path / "RESULTS.md"
    old.write_text(
        "# Benchmark results\n\nLatest run.\n\n"
        "### Targets\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
        "### Issue 9, puts: same-run A/B (by hand, not by report.py; taken before)\n\n"
        "| x | y |\n|---|---|\n| 3 | 4 |\n\nWhy: docs.\n\n"
        "### Host sweep\n\n| c |\n|---|\n\n"
        "### Issue 9, reads: same-run A/B (by hand, not by report.py)\n\nline\n")
    kept = report.hand_written_sections(str(old))
    assert kept == (
        "### Issue 9, puts: same-run A/B (by hand, not by report.py; taken before)\n\n"
        "| x | y |\n|---|---|\n| 3 | 4 |\n\nWhy: docs.\n\n"
        "### Issue 9, reads: same-run A/B (by hand, not by report.py)\n\nline\n")


def test_a_first_run_has_none_to_keep(tmp_path):
    assert load_report().hand_written_sections(str(tmp_path / "absent.md")) == ""
