"""Opens N keep-alive connections to HOST:PORT (HTTP/1.1, or h2c with H2=1), makes one request on
each, leaves them idle 3 s and prints the growth of PID's resident memory per connection.
Usage: idle_client.py HOST PORT N PID"""
import asyncio, sys, os
host, port, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])*1024
H2 = os.environ.get("H2") == "1"
async def one(conns):
    r, w = await asyncio.open_connection(host, port)
    if H2:
        block = bytes([0x82, 0x84, 0x86, 0x41, 0x01, 0x78])
        w.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0,0,0,4,0,0,0,0,0]) + bytes([0,0,len(block),1,5,0,0,0,1]) + block)
        await w.drain()
        data = b""
        while len(data) < 150:
            data += await r.read(4096)
        w.write(bytes([0,0,0,4,1,0,0,0,0]))
        conns.append((r, w))
        return
    w.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    await w.drain()
    data = b""
    while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n",1)[1]) < 100:
        data += await r.read(4096)
    conns.append((r, w))
async def main():
    conns = []
    before = rss()
    sem = asyncio.Semaphore(200)
    async def guarded():
        async with sem: await one(conns)
    await asyncio.gather(*[guarded() for _ in range(n)])
    await asyncio.sleep(3)
    after = rss()
    print(f"conns {len(conns)} before {before} after {after} per conn {(after-before)/len(conns):.0f}", flush=True)
    await asyncio.sleep(float(os.environ.get("HOLD", "0")))
asyncio.run(main())
