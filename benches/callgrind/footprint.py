"""The distinct cache lines (64 bytes) and pages (4 KiB) a proxy touches per request.

Reads, on stdin, the log of valgrind's lackey run with --trace-mem=yes --trace-sched=yes
--trace-syscalls=yes: every instruction fetch and data access, which thread runs, and every
system call, in order. A request is what the thread serving it does from one successful read
of the client's connection (the latest one accepted) to the next: with one client sending one
request at a time, the requests' work, their wake-ups included. Counted between the files
START and STOP appearing (the measured phase), and only for the thread that reads the client.

At partial load a core goes idle or runs the kernel's work between requests, and each request
finds much of what it touches gone from the caches: these counts are what it must fetch back.

    footprint.py START STOP MAPS_FILE < lackey.log
"""

import collections
import os
import re
import sys

LINE, PAGE = 6, 12
SCHED = re.compile(rb"SCHED\[(\d+)\]:\s+acquired lock")
CALL = re.compile(rb"^SYSCALL\[\d+,(\d+)\]\((\d+)\) (sys_\w+ \( (\d+)?|\.\.\.)")
RESULT = re.compile(rb"--> Success\(0x([0-9a-f]+)\)")
# System call numbers, x86_64's.
READS = {0, 17, 19, 45, 47, 295, 299}  # read, pread64, readv, recvfrom, recvmsg, preadv, recvmmsg
ACCEPTS = {43, 288}  # accept, accept4


def regions(maps_file):
    """(start, end, label) of each mapping: its file, or what an anonymous one looks like."""
    spans = []
    rows = []
    for row in open(maps_file):
        parts = row.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        rows.append((lo, hi, parts[1], parts[5] if len(parts) > 5 else ""))
    for i, (lo, hi, perms, name) in enumerate(rows):
        if name:
            label = os.path.basename(name)
        elif hi - lo == 2 << 20 and i > 0 and rows[i - 1][2] == "---p" and rows[i - 1][1] == lo:
            # A spawned thread's stack as Rust makes it (2 MiB below a guard page).
            label = "a thread's stack"
        else:
            # Under valgrind the heap (brk, and malloc's per-thread arenas) and the main
            # thread's stack are anonymous mappings alike.
            label = "anonymous (heap, main stack)"
        spans.append((lo, hi, label))
    return spans


def touch(lines, raw):
    """Adds the lines an access (`I  ADDR,SIZE` or ` L ADDR,SIZE`) spans: one, or two."""
    address, size = raw[3:].split(b",")
    lo = int(address, 16)
    lines.add(lo >> LINE)
    hi = (lo + int(size) - 1) >> LINE
    if hi != lo >> LINE:
        lines.add(hi)


def label_of(spans, address):
    for lo, hi, label in spans:
        if lo <= address < hi:
            return label
    return "other"


def main():
    start, stop, maps_file = sys.argv[1:4]
    tid = 0
    measuring = False
    checked = 0
    client = {}  # thread -> the latest fd it accepted (the client's connection)
    pending = {}  # thread -> (syscall number, fd) awaiting its result
    data, code = set(), set()
    server = None  # the thread that reads the client
    requests = 0
    totals = collections.Counter()
    by_region = collections.Counter()
    spans = None
    partial = True  # the request under way when measuring starts is only in part within it

    def boundary():
        nonlocal requests, partial
        if measuring and partial:
            partial = False
        elif measuring and (data or code):
            requests += 1
            totals["data lines"] += len(data)
            totals["code lines"] += len(code)
            totals["data pages"] += len({line >> (PAGE - LINE) for line in data})
            totals["code pages"] += len({line >> (PAGE - LINE) for line in code})
            for line in data:
                by_region[label_of(spans, line << LINE)] += 1
        data.clear()
        code.clear()

    for raw in sys.stdin.buffer:
        checked += 1
        if checked >= 100000:
            checked = 0
            if not measuring and os.path.exists(start):
                measuring = True
                spans = regions(maps_file)
                data.clear()
                code.clear()
            if measuring and os.path.exists(stop):
                break
        first = raw[:1]
        if first == b"I":
            if tid == server:
                touch(code, raw)
            continue
        if first == b" " and raw[1:2] in (b"L", b"S", b"M") and raw[2:3] == b" ":
            if tid == server:
                touch(data, raw)
            continue
        if first == b"-":
            m = SCHED.search(raw)
            if m:
                tid = int(m.group(1))
            continue
        if first != b"S":
            continue
        m = CALL.match(raw)
        if not m:
            continue
        thread, number = int(m.group(1)), int(m.group(2))
        if m.group(3) != b"...":
            # A call starts: followed if its first argument is a number (an fd), and it ends
            # on this line ("[sync] --> ...") or on a later one ("... [async] --> ...").
            first_argument = m.group(4)
            if first_argument is None:
                pending.pop(thread, None)
                continue
            pending[thread] = (number, int(first_argument))
        if b"Success(" not in raw and b"Failure(" not in raw:
            continue
        called, fd = pending.pop(thread, (None, None))
        result = RESULT.search(raw)
        if result is None or called != number:
            continue
        value = int(result.group(1), 16)
        if number in ACCEPTS:
            client[thread] = value
        elif number in READS and value > 0 and client.get(thread) == fd:
            server = thread
            boundary()
    if requests < 2:
        sys.exit("footprint: fewer than two requests were measured")
    print("requests measured: %d" % requests)
    for key in ("data lines", "code lines", "data pages", "code pages"):
        print("%-11s per request: %7.1f" % (key, totals[key] / requests))
    print("data lines per request, by mapping:")
    for label, count in by_region.most_common(8):
        print("  %7.1f  %s" % (count / requests, label))


if __name__ == "__main__":
    main()
