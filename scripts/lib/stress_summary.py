"""Sums up scripts/stress-tests.sh's runs: every failing test with the
number of runs it failed in, and each run's seed.

    stress_summary.py RESULTS_DIR

RESULTS_DIR/runN/ holds pytest.xml (JUnit) and cpp.jsonl (one line per C++
test, from leak_check_cpp.py), and seed. Exits 1 when anything failed or a
run left no results."""

import collections
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def main():
    out = Path(sys.argv[1])
    fails = collections.Counter()
    seeds = {}
    runs = sorted(out.glob("run*"), key=lambda p: int(p.name[3:]))
    bad = False
    for run in runs:
        seeds[run.name] = (run / "seed").read_text().strip() if (run / "seed").exists() else "?"
        xml = run / "pytest.xml"
        if (run / "pytest.log").exists():
            if not xml.exists():
                fails[f"pytest ({run.name}: no results, see pytest.log)"] += 1
            else:
                for case in ET.parse(xml).getroot().iter("testcase"):
                    for what in ("failure", "error"):
                        if case.find(what) is not None:
                            name = f"{case.get('classname')}::{case.get('name')}"
                            fails[f"{name} ({what})"] += 1
        jl = run / "cpp.jsonl"
        if jl.exists():
            for line in jl.read_text().splitlines():
                r = json.loads(line)
                if r["result"] != "OK":
                    fails[f"meson {r['name']} ({r['why']})"] += 1
    print("seeds: " + ", ".join(f"{k}={v}" for k, v in seeds.items()))
    if not runs:
        print("no runs")
        bad = True
    if fails:
        print(f"failing tests ({sum(fails.values())} failures):")
        for name, n in fails.most_common():
            print(f"  {n} of {len(runs)} runs: {name}")
        bad = True
    else:
        print(f"no failures in {len(runs)} run(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
