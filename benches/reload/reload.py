#!/usr/bin/env python3
"""Live configuration costs, measured against the release binary on loopback.

    cargo build --release -p legate -p testbed
    python3 benches/reload/reload.py [--workers 2]

1. Propagation: the time from a config accepted to every worker serving with it (what
   `POST /reload` reports, `config_propagation_seconds`), p50/p99 over 100 reloads that change
   one route's target, for 10 routes and for 10,000 routes with 1,000 clusters. Also the whole
   `POST /reload` (read, parse, validate, build, propagate).
2. A reload storm: one reload a second against none, same run, under a fixed request rate
   (h2load --rps): the proxy's CPU time and the request latency of each.
3. Memory: resident size before and after 1,000 reloads.

Everything runs on 127.0.0.1 and stops by itself; only processes this script started are
ended, by their PID.
"""

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LEGATE = os.path.join(ROOT, "target", "release", "legate")
NOOP = os.path.join(ROOT, "target", "release", "noop-upstream")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port, admin, upstream, routes, clusters, target):
    lines = [
        f"admin: {{ address: 127.0.0.1:{admin} }}",
        "listeners:",
        "  - name: main",
        f"    address: 127.0.0.1:{port}",
        "    routes:",
    ]
    for i in range(routes - 1):
        lines.append(f"      - match: {{ path: /r{i} }}")
        lines.append(f"        cluster: c{i % clusters}")
    lines.append("      - match: { prefix: / }")
    lines.append(f"        cluster: c{target}")
    lines.append("clusters:")
    for i in range(clusters):
        lines.append(f"  - name: c{i}")
        lines.append(f"    endpoints: [{upstream}]")
    return "\n".join(lines) + "\n"


def post(url):
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30) as r:
        return r.read().decode()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_port(port):
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"nothing listens on {port}")


class Proxy:
    def __init__(self, workers, routes, clusters, upstream):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "legate.yaml")
        self.port, self.admin = free_port(), free_port()
        self.routes, self.clusters, self.upstream = routes, clusters, upstream
        self.write(0)
        self.proc = subprocess.Popen(
            [LEGATE, "-c", self.path, "--concurrency", str(workers)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port)
        wait_port(self.admin)

    def write(self, target):
        text = config(self.port, self.admin, self.upstream, self.routes, self.clusters, target)
        staged = self.path + ".new"
        with open(staged, "w") as f:
            f.write(text)
        os.rename(staged, self.path)

    def reload(self, target):
        self.write(target)
        started = time.perf_counter()
        body = post(f"http://127.0.0.1:{self.admin}/reload")
        wall = time.perf_counter() - started
        m = re.search(r"in (\d+) us", body)
        if not m:
            sys.exit(f"reload failed: {body}")
        return int(m.group(1)), wall * 1e6

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.dir.cleanup()


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def propagation(workers, upstream):
    print("## Propagation (POST /reload changing one route's target, 100 reloads)\n")
    print("| routes | clusters | propagation p50 | p99 | whole reload p50 | p99 |")
    print("|---|---|---|---|---|---|")
    for routes, clusters in [(10, 2), (10_000, 1_000)]:
        proxy = Proxy(workers, routes, clusters, upstream)
        try:
            samples = [proxy.reload((i + 1) % 2) for i in range(100)]
        finally:
            proxy.stop()
        prop = [s[0] for s in samples]
        wall = [s[1] for s in samples]
        print(
            f"| {routes} | {clusters} | {pct(prop, 0.5)} us | {pct(prop, 0.99)} us "
            f"| {pct(wall, 0.5) / 1000:.1f} ms | {pct(wall, 0.99) / 1000:.1f} ms |"
        )
    print()


def h2load(port, seconds, rps, clients):
    out = subprocess.run(
        [
            "h2load", "--h1", "-c", str(clients), "--rps", str(rps),
            "-D", str(seconds), f"http://127.0.0.1:{port}/",
        ],
        capture_output=True, text=True, timeout=seconds + 60,
    ).stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", out)
    lat = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", out)
    return {
        "done": int(done.group(1)) if done else 0,
        "failed": int(done.group(3)) if done else -1,
        "mean": lat.group(3) if lat else "?",
        "max": lat.group(2) if lat else "?",
    }


def storm(workers, upstream, seconds=10, rps=500, clients=8):
    print(f"## Reload storm: {clients} HTTP/1.1 clients x {rps} req/s for {seconds} s\n")
    print("| reloads | requests | failed | proxy CPU | CPU per 100k requests | latency mean | max |")
    print("|---|---|---|---|---|---|---|")
    proxy = Proxy(workers, 10, 2, upstream)
    try:
        for storm_on in (False, True):
            import threading

            stop = threading.Event()
            reloads = [0]

            def reloader():
                target = 0
                while not stop.wait(1.0):
                    target ^= 1
                    proxy.reload(target)
                    reloads[0] += 1

            cpu0 = cpu_seconds(proxy.proc.pid)
            thread = threading.Thread(target=reloader) if storm_on else None
            if thread:
                thread.start()
            r = h2load(proxy.port, seconds, rps, clients)
            stop.set()
            if thread:
                thread.join()
            cpu = cpu_seconds(proxy.proc.pid) - cpu0
            per = cpu / max(r["done"], 1) * 100_000
            print(
                f"| {reloads[0]} | {r['done']} | {r['failed']} | {cpu:.2f} s | {per:.2f} s "
                f"| {r['mean']} | {r['max']} |"
            )
    finally:
        proxy.stop()
    print()


def memory(workers, upstream, n=1000):
    print(f"## Memory across {n} reloads\n")
    proxy = Proxy(workers, 10, 2, upstream)
    try:
        for i in range(20):
            proxy.reload(i % 2)
        before = rss_kib(proxy.proc.pid)
        for i in range(n):
            proxy.reload(i % 2)
        after = rss_kib(proxy.proc.pid)
    finally:
        proxy.stop()
    print(f"resident after 20 reloads: {before} KiB; after {n} more: {after} KiB\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    for binary in (LEGATE, NOOP):
        if not os.path.exists(binary):
            sys.exit(f"{binary} missing: cargo build --release -p legate -p testbed")
    up_port = free_port()
    upstream = subprocess.Popen(
        [NOOP, "--listen", f"127.0.0.1:{up_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(up_port)
        upstream_addr = f"127.0.0.1:{up_port}"
        propagation(args.workers, upstream_addr)
        storm(args.workers, upstream_addr)
        memory(args.workers, upstream_addr)
    finally:
        upstream.send_signal(signal.SIGTERM)
        try:
            upstream.wait(timeout=10)
        except subprocess.TimeoutExpired:
            upstream.kill()


if __name__ == "__main__":
    main()
