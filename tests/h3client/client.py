#!/usr/bin/env python3
"""HTTP/3 requests from aioquic's client, for tests/http3.rs.

Opens one QUIC connection to HOST:PORT, sends every request of the JSON list given on
standard input on it at once, and prints one JSON object per request (in the same order):

  in:  [{"method": "GET", "path": "/", "headers": [["x-a", "1"]], "body_bytes": 0,
         "trailers": [["x-t", "1"]], "delay_ms": 0}]
  out: [{"status": 200, "headers": [[name, value]], "body_bytes": N, "body_sha256": "...",
         "sent_sha256": "...", "trailers": [...], "error": null, "goaway": false}]

`raw_hex` sends those bytes on the request's stream instead of HTTP/3 frames (malformed
requests); `delay_ms` holds a request back that long after the connection is up; `rebind` sends it, and
all after it, from a new UDP port (the connection's address changes); `goaway` says whether
the server sent GOAWAY on the connection: by the time the exchanges ended or, with
`--linger SECONDS`, the server closed the connection or that long after; `max_streams` is
the server's stream credit when the connection was up (its initial_max_streams_bidi).

A request body is sent in 64 KiB pieces, each different (`sent_sha256` is its digest); aioquic
queues what flow control does not yet let through. `--server-name` is the SNI and `:authority`;
the certificate is not verified (the test makes its own). Exits non-zero if the connection
cannot be made; a stream the proxy resets, or one not finished within `--timeout`, is reported
in that request's `error`.
"""

import argparse
import asyncio
import hashlib
import json
import socket
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, StreamReset

PIECE = 64 * 1024
GOAWAY = 0x7


BLOCK = bytes(i * 7 % 251 for i in range(PIECE))


def body_piece(index, length):
    """Piece `index` of a request body: each begins with its own number, so pieces out of
    order or repeated change the digest."""
    return (index.to_bytes(8, "big") + BLOCK[8:])[:length]


class WatchedH3(H3Connection):
    """aioquic's HTTP/3 connection, noting a GOAWAY from the server (aioquic skips it)."""

    goaway = False

    def _check_control_frame_type(self, frame_type):
        if frame_type == GOAWAY:
            self.goaway = True
        super()._check_control_frame_type(frame_type)


class Exchange:
    def __init__(self):
        self.status = None
        self.headers = []
        self.trailers = []
        self.sha = hashlib.sha256()
        self.length = 0
        self.sent_sha = hashlib.sha256()
        self.error = None
        self.done = asyncio.get_running_loop().create_future()

    def finish(self, error=None):
        if self.done.done():
            return
        self.error = error
        self.done.set_result(None)

    def report(self, goaway):
        return {
            "goaway": goaway,
            "status": self.status,
            "headers": self.headers,
            "body_bytes": self.length,
            "body_sha256": self.sha.hexdigest(),
            "sent_sha256": self.sent_sha.hexdigest(),
            "trailers": self.trailers,
            "error": self.error,
        }


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = WatchedH3(self._quic)
        self.exchanges = {}
        self.terminated = None

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            self.terminated = "connection closed %d" % event.error_code
            for exchange in self.exchanges.values():
                exchange.finish(self.terminated)
        if isinstance(event, StreamReset):
            exchange = self.exchanges.get(event.stream_id)
            if exchange is not None:
                exchange.finish("reset %d" % event.error_code)
        for h3_event in self.h3.handle_event(event):
            exchange = self.exchanges.get(getattr(h3_event, "stream_id", None))
            if exchange is None:
                continue
            if isinstance(h3_event, HeadersReceived):
                fields = [[k.decode(), v.decode()] for k, v in h3_event.headers]
                if exchange.status is None:
                    status = [v for k, v in fields if k == ":status"]
                    if status and status[0].startswith("1"):
                        continue
                    exchange.status = int(status[0]) if status else None
                    exchange.headers = [f for f in fields if not f[0].startswith(":")]
                else:
                    exchange.trailers = fields
            elif isinstance(h3_event, DataReceived):
                exchange.sha.update(h3_event.data)
                exchange.length += len(h3_event.data)
            if getattr(h3_event, "stream_ended", False):
                exchange.finish()

    async def rebind(self):
        """Sends from a new UDP port from now on, as a client behind a NAT that rebinds."""
        loop = asyncio.get_running_loop()
        old = self._transport
        # As aioquic's own: IPv6 with IPv4 mapped, which the peer's address is written in.
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(("::", 0))
        await loop.create_datagram_endpoint(lambda: self, sock=sock)
        old.close()

    async def send(self, request, authority):
        await asyncio.sleep(request.get("delay_ms", 0) / 1000)
        if request.get("rebind"):
            await self.rebind()
        if self.terminated:
            exchange = Exchange()
            exchange.finish(self.terminated)
            return exchange
        stream_id = self._quic.get_next_available_stream_id()
        exchange = Exchange()
        self.exchanges[stream_id] = exchange
        size = request.get("body_bytes", 0)
        trailers = [(k.encode(), v.encode()) for k, v in request.get("trailers", [])]
        headers = [
            (b":method", request["method"].encode()),
            (b":scheme", b"https"),
            (b":authority", authority.encode()),
            (b":path", request["path"].encode()),
        ] + [(k.encode(), v.encode()) for k, v in request.get("headers", [])]
        if "raw_hex" in request:
            # Bytes as they are, not HTTP/3 framing: a malformed request.
            raw = bytes.fromhex(request["raw_hex"])
            self._quic.send_stream_data(stream_id, raw, end_stream=True)
            self.transmit()
            await exchange.done
            return exchange
        self.h3.send_headers(stream_id, headers, end_stream=size == 0 and not trailers)
        self.transmit()
        offset = 0
        index = 0
        while offset < size:
            piece = body_piece(index, min(PIECE, size - offset))
            index += 1
            offset += len(piece)
            exchange.sent_sha.update(piece)
            last = offset == size and not trailers
            self.h3.send_data(stream_id, piece, end_stream=last)
            self.transmit()
            # Other streams and the connection's packets go out between pieces.
            await asyncio.sleep(0)
        if trailers:
            self.h3.send_headers(stream_id, trailers, end_stream=True)
            self.transmit()
        await exchange.done
        return exchange


def server_certificate_names(client):
    """The DNS names of the certificate the server sent."""
    from cryptography import x509

    cert = client._quic.tls._peer_certificate
    if cert is None:
        return []
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return san.value.get_values_for_type(x509.DNSName)


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("address", help="HOST:PORT")
    parser.add_argument("--server-name", default="legate.test")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--linger", type=float, default=0.0)
    args = parser.parse_args()
    host, port = args.address.rsplit(":", 1)
    requests = json.load(sys.stdin)
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.verify_mode = ssl.CERT_NONE
    config.server_name = args.server_name
    async with connect(
        host, int(port), configuration=config, create_protocol=Client, wait_connected=True
    ) as client:
        # The server's stream credit as the handshake gave it (initial_max_streams_bidi).
        max_streams = client._quic._remote_max_streams_bidi
        sent = [asyncio.ensure_future(client.send(r, args.server_name)) for r in requests]
        await asyncio.wait(sent, timeout=args.timeout)
        for exchange in client.exchanges.values():
            exchange.finish("timed out")
        exchanges = [await s for s in sent]
        if args.linger > 0:
            try:
                await asyncio.wait_for(client.wait_closed(), args.linger)
            except asyncio.TimeoutError:
                pass
        names = server_certificate_names(client)
        reports = [
            dict(e.report(client.h3.goaway), max_streams=max_streams, server_cert_names=names)
            for e in exchanges
        ]
    json.dump(reports, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
