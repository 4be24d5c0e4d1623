"""Shared helpers of the benchmarks: timing, output folder, JSON and markdown tables."""
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
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


def fewer(reference, got):
    """reference / got as "<n>x" (how many times fewer bytes `got` is), "-" where either is missing or zero."""
    return f"{reference / got:.0f}x" if reference and got else "-"


def not_reached(seconds, steps=None):
    """What a table says where a run never reached the target: within its whole budget, N s (and S steps)."""
    return f"not reached within {seconds:.1f} s" + (f" ({steps} steps)" if steps is not None else "")


# Rows that are not horovod-ext's methods: PyTorch DDP's own hooks (baselines.py), named as a reader should read them.
PEERS = {"ddp": "DDP dense (peer)", "ddp-fp16": "DDP fp16 hook (peer)", "powersgd": "DDP PowerSGD hook (peer)",
         "powersgd-r1": "DDP PowerSGD hook rank 1 (peer)", "powersgd-r2": "DDP PowerSGD hook rank 2 (peer)",
         "powersgd-hook": "DDP PowerSGD hook (peer)"}


def shown(method):
    """A method's name in a table: a peer's says whose it is; ours as the benchmark names it."""
    return PEERS.get(method, method)


def markdown_table(headers, rows):
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def horovodrun_json(prefix, ranks, script, args, timeout, hosts=None):
    """Run `script args --json FILE` under horovodrun -np ranks (inside `prefix`, e.g. a namespace) and return the
    JSON rank 0 wrote; a failure raises with the end of the output."""
    return launched_json(prefix + ["horovodrun", "-np", str(ranks), "-H", hosts or f"localhost:{ranks}", "--gloo",
                                   sys.executable], ranks, script, args, timeout)


def torchrun_json(prefix, ranks, script, args, timeout):
    """horovodrun_json's run under torchrun --standalone --nproc_per_node ranks (torch.distributed, no Horovod)."""
    return launched_json(prefix + [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                                   str(ranks)], ranks, script, args, timeout)


def launched_json(launcher, ranks, script, args, timeout):
    out = tempfile.mktemp(suffix=".json")
    cmd = launcher + [script, *map(str, args), "--json", out]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"{os.path.basename(script)} at {ranks} ranks failed:\n{proc.stdout[-3000:]}"
                           f"{proc.stderr[-3000:]}")
    with open(out) as f:
        result = json.load(f)
    os.unlink(out)
    return result


def progress(items, desc):
    """tqdm over items where it is installed (the README's set-up installs it), else the items as they are."""
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, ax, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def bar_plot(path, title, groups, ylabel, log=False):
    """Grouped bars: groups = {group label: {series label: value}}; saved as PNG."""
    plt = _pyplot()
    series = list(dict.fromkeys(s for values in groups.values() for s in values))
    width = 0.8 / max(len(series), 1)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(groups) * max(1, len(series)) * 0.5), 4))
    for i, name in enumerate(series):
        xs = [g + i * width for g in range(len(groups))]
        ax.bar(xs, [values.get(name, 0) for values in groups.values()], width, label=name)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))])
    ax.set_xticklabels(list(groups), rotation=20, ha="right")
    ax.set(title=title, ylabel=ylabel)
    if log:
        ax.set_yscale("log")
    return _save(plt, fig, ax, path)


def line_plot(path, title, xs, lines, xlabel, ylabel, logx=False, logy=False):
    """lines = {label: [y for each x]}, or with xs None {label: (its xs, its ys)}; saved as PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, ys in lines.items():
        line_xs, ys = ys if xs is None else (xs, ys)
        ax.plot(line_xs, ys, marker="o" if len(ys) <= 50 else None, label=label)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    return _save(plt, fig, ax, path)
