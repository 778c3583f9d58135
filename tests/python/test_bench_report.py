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


def run_report(tmp_path, *extra):
    """report.py run as bench.sh runs it, on a harness JSON of one copy-out
    get and one zero-copy view of 600 KB rows; returns (Markdown, JSON)."""
    import json
    import subprocess
    import sys
    row = dict(system="shmcache", row_bytes=614400, procs=1, rows_per_s=1000.0,
               gb_per_s=0.6144)
    cpp = tmp_path / "cpp.json"
    cpp.write_text(json.dumps({
        "results": [dict(row, bench="get", variant="copy-out"),
                    dict(row, bench="view", variant="zero-copy", rows_per_s=1e7,
                         gb_per_s=6144.0)],
        "values": {}, "skipped": {"redis": "no --redis_socket"}}))
    md, js = tmp_path / "RESULTS.md", tmp_path / "latest.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), "--cpp", str(cpp),
                    "--markdown", str(md), "--json", str(js), *extra],
                   check=True, capture_output=True, text=True)
    return md.read_text(), json.loads(js.read_text())


def test_a_zero_copy_view_has_no_byte_rate(tmp_path):
    text, _ = run_report(tmp_path)
    rows = {line.split(" | ")[0]: line.split(" | ") for line in text.splitlines()
            if line.startswith("| shmcache ")}
    assert rows["| shmcache Get (copy-out)"][4] == "0.61"
    assert rows["| shmcache View (zero-copy)"][3] == "10.00 M"
    assert rows["| shmcache View (zero-copy)"][4] == "—"


def test_the_tree_measured_and_what_the_script_skipped_are_reported(tmp_path):
    text, js = run_report(tmp_path, "--commit", "abc1234 with uncommitted changes",
                          "--started", "1795939980", "--elapsed", "600",
                          "--skip", "redis=redis-server is not installed")
    assert "Tree measured: abc1234 with uncommitted changes" in text
    assert "redis (redis-server is not installed)" in text
    assert js["commit"] == "abc1234 with uncommitted changes"
    assert js["time"] == "2026-11-29 08:13-08:23 UTC"
    assert js["skipped"]["redis"] == "redis-server is not installed"
