"""What the Python benchmark programs (python_bench.py, host_sweep.py)
share: the figures they print and write as JSON (Out), and running their
named sections, each skipped with its reason when it cannot run."""

import json
import time
import traceback


class Out:
    """Results (rates), values and skipped sections: printed as a table as
    they come, written as JSON by dump(). The widths only align the table."""

    def __init__(self, system_width, variant_width, procs_width, key_width):
        self.results, self.values, self.skipped = [], {}, {}
        self._widths = (system_width, variant_width, procs_width, key_width)

    def add(self, bench, system, variant, row_bytes, procs, rate):
        sw, vw, pw, _ = self._widths
        gb = rate * row_bytes / 1e9
        print(f"  {bench:<8} {system:<{sw}} {variant:<{vw}} {row_bytes:7d} B"
              f"  P={procs:<{pw}}  {rate:12.0f} rows/s  {gb:7.2f} GB/s", flush=True)
        self.results.append(dict(bench=bench, system=system, variant=variant,
                                 row_bytes=row_bytes, procs=procs, rows_per_s=rate,
                                 gb_per_s=gb))

    def value(self, key, v):
        v = float(v)
        print(f"  {key:<{self._widths[3]}} {v:.3f}", flush=True)
        self.values[key] = v

    def skip(self, what, reason):
        print(f"  skipped {what}: {reason}", flush=True)
        self.skipped[what] = reason

    def dump(self, path):
        with open(path, "w") as f:
            json.dump(dict(results=self.results, values=self.values,
                           skipped=self.skipped), f, indent=1)


def run_sections(args, out, shmcache, reason, sections, quiet=()):
    """Runs fn(args, out, shmcache) for each (name, fn) of `sections` that
    args.sections (comma-separated) names, after a "== name" line. With
    shmcache None each is skipped with `reason`; one that raises is skipped
    with its error (and a traceback, except for the exception types in
    `quiet`, whose message is the whole reason) and the next one runs.
    Returns the seconds each section that was tried took, by name."""
    timings = {}
    for name, fn in sections:
        if name not in args.sections.split(","):
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        if shmcache is None:
            out.skip(name, reason)
            continue
        try:
            fn(args, out, shmcache)
        except quiet as e:
            out.skip(name, str(e))
        except Exception as e:
            traceback.print_exc()
            out.skip(name, f"{type(e).__name__}: {e}")
        timings[name] = time.perf_counter() - t0
    return timings
