"""Counts test cases over every suite and prints the summary line.

GoogleTest JSON reports (one per executable) count test cases; a meson test
whose executable wrote no report (it crashed, or is not a GoogleTest
program) counts as one case with meson's verdict; several meson test logs
may be given (the main build's and the fuzz build's). A log given as
"cases:PATH" (the sanitizer builds', whose suites wrote no reports) counts
each of its tests as one case with meson's verdict, whatever the reports
say. pytest's JUnit XML counts Python cases. Exit status 1 when anything
failed or nothing ran.
"""
import json
import os
import sys
import xml.etree.ElementTree as ET


def main(results_dir, *meson_logs):
    passed = failed = skipped = 0
    reported = set()
    report_failed = set()  # executables whose report already counts a failure
    for name in sorted(os.listdir(results_dir)):
        path = os.path.join(results_dir, name)
        if name.endswith(".json"):
            try:
                with open(path) as f:
                    report = json.load(f)
            except (OSError, ValueError):
                continue
            reported.add(os.path.splitext(name)[0])
            for suite in report.get("testsuites", []):
                for case in suite.get("testsuite", []):
                    if case.get("result") == "SKIPPED" or case.get("status") == "NOTRUN":
                        skipped += 1
                    elif case.get("failures"):
                        failed += 1
                        report_failed.add(os.path.splitext(name)[0])
                    else:
                        passed += 1
        elif name.endswith(".xml"):
            root = ET.parse(path).getroot()
            for case in root.iter("testcase"):
                if case.find("skipped") is not None:
                    skipped += 1
                elif case.find("failure") is not None or case.find("error") is not None:
                    failed += 1
                else:
                    passed += 1
    for meson_log in meson_logs:
        whole = meson_log.startswith("cases:")
        if whole:
            meson_log = meson_log[len("cases:"):]
        if not os.path.exists(meson_log):
            continue
        with open(meson_log) as f:
            for line in f:
                t = json.loads(line)
                exe = os.path.basename(t.get("cmd", [""])[0])
                verdict = t.get("result")
                if whole:
                    if verdict == "OK":
                        passed += 1
                    elif verdict == "SKIP":
                        skipped += 1
                    else:
                        failed += 1
                    continue
                if exe in reported and verdict in ("OK", "SKIP"):
                    continue
                if exe in reported:
                    # Failing cases were counted from the report; a failing
                    # run whose report shows none crashed (e.g. at exit).
                    if exe not in report_failed:
                        failed += 1
                elif verdict == "OK":
                    passed += 1
                elif verdict == "SKIP":
                    skipped += 1
                else:
                    failed += 1
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed or passed == 0 else 0


if __name__ == "__main__":
    # count_results.py RESULTS_DIR MESON_TESTLOG.json [MORE_TESTLOGS.json...]
    sys.exit(main(sys.argv[1], *sys.argv[2:]))
