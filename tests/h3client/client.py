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
the server's stream credit when the connection was up (its initial_max_streams_bidi);
`"report_body": true` adds the response body as text (`body_text`).

`--ticket FILE` resumes the session saved in FILE, if there is one, sending the requests at
once, before the handshake ends (0-RTT where the ticket allows it), and saves the ticket the
server gives in FILE; each report then tells `early_data_accepted` (the server took the
0-RTT data) and `ticket_max_early_data` (what the server's ticket allows, `null` if none).

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
import os
import pickle
import socket
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted, StreamReset

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
        self.text = None
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
            "body_text": None if self.text is None else self.text.decode(errors="replace"),
        }


class Client(QuicConnectionProtocol):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.h3 = WatchedH3(self._quic)
        self.exchanges = {}
        self.terminated = None
        self.early_data_accepted = None

    def quic_event_received(self, event):
        if isinstance(event, HandshakeCompleted):
            self.early_data_accepted = event.early_data_accepted
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
                if exchange.text is not None:
                    exchange.text += h3_event.data
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
        if request.get("report_body"):
            exchange.text = b""
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
    parser.add_argument("--ticket")
    args = parser.parse_args()
    host, port = args.address.rsplit(":", 1)
    requests = json.load(sys.stdin)
    config = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    config.verify_mode = ssl.CERT_NONE
    config.server_name = args.server_name
    tickets = []
    if args.ticket and os.path.exists(args.ticket):
        with open(args.ticket, "rb") as saved:
            config.session_ticket = pickle.load(saved)

    def keep_ticket(ticket):
        tickets.append(ticket)
        with open(args.ticket, "wb") as saved:
            pickle.dump(ticket, saved)

    async with connect(
        host,
        int(port),
        configuration=config,
        create_protocol=Client,
        session_ticket_handler=keep_ticket if args.ticket else None,
        # With a session to resume, the requests go before the handshake ends.
        wait_connected=config.session_ticket is None,
    ) as client:
        # The server's stream credit as the handshake gave it (initial_max_streams_bidi).
        max_streams = client._quic._remote_max_streams_bidi
        sent = [asyncio.ensure_future(client.send(r, args.server_name)) for r in requests]
        await asyncio.wait(sent, timeout=args.timeout)
        for exchange in client.exchanges.values():
            exchange.finish("timed out")
        exchanges = [await s for s in sent]
        # A first session's ticket comes once the handshake is done, perhaps after the answers.
        waited = 0.0
        resumed = config.session_ticket is not None
        while args.ticket and not resumed and not tickets and not client.terminated:
            if waited >= args.timeout:
                break
            await asyncio.sleep(0.01)
            waited += 0.01
        if args.linger > 0:
            try:
                await asyncio.wait_for(client.wait_closed(), args.linger)
            except asyncio.TimeoutError:
                pass
        names = server_certificate_names(client)
        ticket_max_early_data = tickets[-1].max_early_data_size if tickets else None
        reports = [
            dict(
                e.report(client.h3.goaway),
                max_streams=max_streams,
                server_cert_names=names,
                early_data_accepted=client.early_data_accepted,
                ticket_max_early_data=ticket_max_early_data,
            )
            for e in exchanges
        ]
    json.dump(reports, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
