"""Shared helpers of the benchmarks: timing, output folder, JSON and markdown tables."""
import json
import os
import platform
import statistics
import time

OUT_DIR = os.environ.get("HVDEXT_BENCH_OUT", os.path.join(os.path.dirname(os.path.abspath(__file__)), "out"))


def best_of(fn, repeat=3, min_seconds=0.0):
    """Median of `repeat` timed calls (after one warm-up), in seconds."""
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine():
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version()}


def write_outputs(name, payload, table_md):
    os.makedirs(OUT_DIR, exist_ok=True)
    with open(os.path.join(OUT_DIR, f"{name}.json"), "w") as f:
        json.dump(payload, f, indent=1)
    with open(os.path.join(OUT_DIR, f"{name}.md"), "w") as f:
        f.write(table_md + "\n")
    return os.path.join(OUT_DIR, f"{name}.md")


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
