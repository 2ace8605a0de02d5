"""Pictures of the benchmarks, side by side with the peers (matplotlib).

    python3 benches/plot/plot.py peer PEER_BENCH.json OUT.png
        the fixed-rate latency of each proxy by percentile (p50 to max), and its CPU per
        100k requests at saturation, at the fixed rate and over h2c
    python3 benches/plot/plot.py idle IDLE_OUTPUT.txt OUT.png
        bytes per idle connection, HTTP/1.1 and h2c, from benches/idle/run.sh's lines
    python3 benches/plot/plot.py soak RSS.csv OUT.png
        resident memory over a soak (benches/soak/run.sh), with the +-5% band around the
        value at 5 minutes that the soak is judged by

The benchmark scripts call this after their run (matplotlib is installed with pip when
missing). Nothing is measured here: it draws what the runs wrote.
"""

import json
import re
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"nginx": "#009639", "haproxy": "#1f77b4", "ours": "#d62728", "legate": "#d62728",
          "direct": "#7f7f7f", "legate-before": "#ff9896", "legate-hyper": "#9467bd"}
# Any other target (a `--proxy NAME=...` of peer-bench, say).
OTHER = "#8c564b"


def label(name):
    return "legate" if name == "ours" else name


def peer(path, out):
    with open(path) as f:
        run = json.load(f)
    targets = {name: t for name, t in run["targets"].items() if name != "direct"}
    fig, (lat, cpu) = plt.subplots(1, 2, figsize=(12, 4.5))

    points = [("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms"), ("p99.9", "p999_ms"),
              ("max", "max_ms")]
    for name, t in targets.items():
        rate = t.get("rate") or {}
        ys = [rate.get(key) for _, key in points]
        if any(y is None for y in ys):
            continue
        lat.plot([p for p, _ in points], ys, marker="o", label=label(name),
                 color=COLORS.get(name))
    target_rps = next((t["rate"].get("target_rps") for t in targets.values()
                       if t.get("rate")), None)
    lat.set_yscale("log")
    lat.set_ylabel("latency, ms (log scale)")
    lat.set_title(f"fixed rate ({target_rps} req/s): latency by percentile")
    lat.grid(True, which="both", alpha=0.3)
    lat.legend()

    groups = [("saturation", "HTTP/1.1\nsaturation"), ("rate", "HTTP/1.1\nfixed rate"),
              ("h2c", "h2c")]
    width = 0.8 / max(1, len(targets))
    for i, (name, t) in enumerate(targets.items()):
        xs, ys = [], []
        for g, (scenario, _) in enumerate(groups):
            value = (t.get(scenario) or {}).get("cpu_s_per_100k")
            if value is not None:
                xs.append(g + i * width)
                ys.append(value)
        bars = cpu.bar(xs, ys, width, label=label(name), color=COLORS.get(name))
        cpu.bar_label(bars, fmt="%.2f", fontsize=8)
    cpu.set_xticks([g + width * (len(targets) - 1) / 2 for g in range(len(groups))],
                   [text for _, text in groups])
    cpu.set_ylabel("proxy CPU s per 100k requests (lower is better)")
    cpu.set_title("CPU per request")
    cpu.legend()
    fig.suptitle(f"peer-bench {run.get('mode', '')} run, {run.get('date_utc', '')}")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


LINE = re.compile(r"^([\w-]+)\s+(h1|h2):.*per conn (\d+)")


def idle(path, out):
    per = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                per.setdefault(m.group(2), {})[m.group(1)] = int(m.group(3))
    if not per:
        sys.exit(f"no `NAME h1|h2: ... per conn N` lines in {path}")
    fig, axes = plt.subplots(1, len(per), figsize=(5 * len(per), 4))
    if len(per) == 1:
        axes = [axes]
    for ax, proto in zip(axes, sorted(per)):
        names = list(per[proto])
        bars = ax.bar([label(n) for n in names], [per[proto][n] for n in names],
                      color=[COLORS.get(n, OTHER) for n in names])
        ax.bar_label(bars)
        ax.set_title("HTTP/1.1" if proto == "h1" else "h2c")
        ax.set_ylabel("bytes per idle connection (lower is better)")
    fig.suptitle("idle connections: resident memory per connection")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def soak(path, out):
    seconds, mib = [], []
    with open(path) as f:
        next(f, None)  # the header
        for line in f:
            t, kib = line.strip().split(",")
            seconds.append(float(t) / 60)
            mib.append(int(kib) / 1024)
    if not seconds:
        sys.exit(f"no samples in {path}")
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(seconds, mib, color=COLORS["legate"], label="legate")
    warm = next((m for t, m in zip(seconds, mib) if t >= 5), None)
    if warm is not None:
        ax.axhspan(warm * 0.95, warm * 1.05, color="#cccccc", alpha=0.5,
                   label="within 5% of the value at 5 min")
    ax.set_xlabel("minutes")
    ax.set_ylabel("resident memory (MiB)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="lower right")
    ax.set_title("soak: resident memory under churn")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    kinds = {"peer": peer, "idle": idle, "soak": soak}
    if len(sys.argv) != 4 or sys.argv[1] not in kinds:
        sys.exit(__doc__)
    kinds[sys.argv[1]](sys.argv[2], sys.argv[3])
