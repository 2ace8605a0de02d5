"""The distinct cache lines (64 bytes) and pages (4 KiB) a proxy touches per request.

Reads, on stdin, the log of valgrind's lackey run with --trace-mem=yes --trace-sched=yes
--trace-syscalls=yes: every instruction fetch and data access, which thread runs, and every
system call, in order. A request is what the thread serving it does from one successful read
of the client's connection (the latest one accepted) to the next: with one client sending one
request at a time, the requests' work, their wake-ups included. Counted between the files
START and STOP appearing (the measured phase), and only for the thread that reads the client.

At partial load a core goes idle or runs the kernel's work between requests, and each request
finds much of what it touches gone from the caches: these counts are what it must fetch back.
Each stack line a request touches is also charged to the function (its frame's owner, inlined
code counted in the function it is inlined into) whose instruction touched it first.

    footprint.py START STOP MAPS_FILE < lackey.log
"""

import collections
import os
import re
import shutil
import struct
import subprocess
import sys

LINE, PAGE = 6, 12
SCHED = re.compile(rb"SCHED\[(\d+)\]:\s+acquired lock")
CALL = re.compile(rb"^SYSCALL\[\d+,(\d+)\]\((\d+)\) (sys_\w+ \( (\d+)?|\.\.\.)")
RESULT = re.compile(rb"--> Success\(0x([0-9a-f]+)\)")
# System call numbers, x86_64's.
READS = {0, 17, 19, 45, 47, 295, 299}  # read, pread64, readv, recvfrom, recvmsg, preadv, recvmmsg
ACCEPTS = {43, 288}  # accept, accept4


STACK = "a thread's stack"


def mappings(maps_file):
    """(start, end, permissions, file offset, path) of each mapping."""
    rows = []
    for row in open(maps_file):
        parts = row.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        rows.append((lo, hi, parts[1], int(parts[2], 16), parts[5] if len(parts) > 5 else ""))
    return rows


def regions(maps_file):
    """(start, end, label) of each mapping: its file, or what an anonymous one looks like."""
    spans = []
    rows = [(lo, hi, perms, name) for lo, hi, perms, _, name in mappings(maps_file)]
    for i, (lo, hi, perms, name) in enumerate(rows):
        if name:
            label = os.path.basename(name)
        elif hi - lo == 2 << 20 and i > 0 and rows[i - 1][2] == "---p" and rows[i - 1][1] == lo:
            # A spawned thread's stack as Rust makes it (2 MiB below a guard page).
            label = STACK
        else:
            # Under valgrind the heap (brk, and malloc's per-thread arenas) and the main
            # thread's stack are anonymous mappings alike.
            label = "anonymous (heap, main stack)"
        spans.append((lo, hi, label))
    return spans


def span(raw):
    """An access's (`I  ADDR,SIZE` or ` L ADDR,SIZE`) address, and the first and last lines it
    spans (the same one, or two)."""
    address, size = raw[3:].split(b",")
    lo = int(address, 16)
    return lo, lo >> LINE, (lo + int(size) - 1) >> LINE


def load_bias(path):
    """vaddr - file offset for each PT_LOAD of an ELF file: [(offset, size, bias)]."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return []
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    loads = []
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if kind == 1:
            loads.append((offset, filesz, vaddr - offset))
    return loads


RUST_ESCAPES = [("$LT$", "<"), ("$GT$", ">"), ("$RF$", "&"), ("$BP$", "*"), ("$C$", ","),
                ("$SP$", "@"), ("$LP$", "("), ("$RP$", ")"), ("$u20$", " "), ("$u27$", "'"),
                ("$u5b$", "["), ("$u5d$", "]"), ("$u7b$", "{"), ("$u7d$", "}"), ("$u7e$", "~"),
                ("..", "::")]


def readable(name):
    """A Rust symbol as the symbolizer left it (`a..b..c$LT$..$GT$::h0123`) made readable."""
    name = re.sub(r"::h[0-9a-f]{16}$", "", name)
    for escape, char in RUST_ESCAPES:
        name = name.replace(escape, char)
    # A segment that starts with neither a letter nor `_` is mangled with a `_` before it.
    return re.sub(r"(^|::)_(?=[<{])", r"\1", name)


def owners_by_function(owners, maps_file):
    """The counts in `owners` (instruction address -> count) summed by the function each
    instruction belongs to (llvm-symbolizer, without inlined frames)."""
    symbolizer = shutil.which("llvm-symbolizer")
    by_file = collections.defaultdict(list)
    named = collections.Counter()
    rows = mappings(maps_file)
    for address, count in owners.items():
        for lo, hi, _, offset, path in rows:
            if lo <= address < hi and path.startswith("/"):
                by_file[path].append((address - lo + offset, count))
                break
        else:
            named["(no file)"] += count
    for path, hits in by_file.items():
        loads = load_bias(path)
        vaddrs = []
        for file_offset, _ in hits:
            bias = next((b for o, n, b in loads if o <= file_offset < o + n), 0)
            vaddrs.append("0x%x" % (file_offset + bias))
        if symbolizer is None:
            for vaddr, (_, count) in zip(vaddrs, hits):
                named["%s %s" % (os.path.basename(path), vaddr)] += count
            continue
        out = subprocess.run(
            [symbolizer, "--obj=" + path, "--no-inlines", "--functions=linkage", "--demangle"],
            input="\n".join(vaddrs), capture_output=True, text=True).stdout
        names = [block.split("\n")[0] for block in out.strip().split("\n\n")]
        for name, (_, count) in zip(names, hits):
            named[readable(name)] += count
    return named


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
    data, code = {}, set()  # data: line -> the instruction that touched it first
    ip = 0
    owners = collections.Counter()
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
            for line, first in data.items():
                label = label_of(spans, line << LINE)
                by_region[label] += 1
                if label == STACK:
                    owners[first] += 1
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
                ip, lo, hi = span(raw)
                code.add(lo)
                code.add(hi)
            continue
        if first == b" " and raw[1:2] in (b"L", b"S", b"M") and raw[2:3] == b" ":
            if tid == server:
                _, lo, hi = span(raw)
                data.setdefault(lo, ip)
                data.setdefault(hi, ip)
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
    if owners:
        print("stack lines per request, by the function that touched each first:")
        for name, count in owners_by_function(owners, maps_file).most_common(10):
            print("  %7.1f  %s" % (count / requests, name[:110]))


if __name__ == "__main__":
    main()
