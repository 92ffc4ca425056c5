"""Hostile clients against a real `specscale serve` (the bundled toy models, default limits): how long slow
clients hold a connection, what aborted uploads write to the log, and what malformed bodies get.

    python benchmarks/server_hostile_clients.py [--slow-clients 120]

Prints one line per measurement.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import h11

ROOT = Path(__file__).resolve().parent.parent


def start_server(log: Path) -> tuple[subprocess.Popen, str, int]:
    command = [sys.executable, "-m", "specscale.cli", "serve", "--port", "0", "--threads", "1"]
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        found = re.search(r"at http://([\d.]+):(\d+)", log.read_text())
        if found:
            return process, found.group(1), int(found.group(2))
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server did not start:\n{log.read_text()}")


def held_seconds(host: str, port: int, sent: bytes, results: list, index: int) -> None:
    """Seconds until the server closes a connection that sent only `sent`, and what it answered."""
    started = time.monotonic()
    with socket.create_connection((host, port), timeout=120) as sock:
        sock.sendall(sent)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    results[index] = (time.monotonic() - started, answer.split(b"\r\n", 1)[0].decode())


def slow_clients(host: str, port: int, count: int) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
    kinds = {"partial headers": b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n",
             "headers + partial body": head + b'{"messages": ['}
    for name, sent in kinds.items():
        results: list = [None] * (count // 2)
        threads = [threading.Thread(target=held_seconds, args=(host, port, sent, results, i))
                   for i in range(len(results))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        held = sorted(seconds for seconds, _ in results)
        answers = sorted({answer for _, answer in results})
        print(f"{len(results)} clients sending {name}: held {held[0]:.1f}-{held[-1]:.1f} s, answered {answers}")


def aborted_uploads(host: str, port: int, log: Path, count: int = 5) -> None:
    before = len(log.read_text().splitlines())
    for _ in range(count):
        with socket.create_connection((host, port)) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
                         + b'{"messages": [' + b" " * 100)
            time.sleep(0.05)
    time.sleep(1.0)
    print(f"{count} aborted uploads: {len(log.read_text().splitlines()) - before} log lines")


def malformed_bodies(host: str, port: int) -> None:
    bodies = {"lone surrogate": json.dumps({"messages": [{"role": "user", "content": "hi \ud800"}]}).encode(),
              "nested 5,000 deep": b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
              "prompt with a surrogate": b'{"prompt": "2 + 2 = ?\\udfff"}'}
    with socket.create_connection((host, port), timeout=60) as sock:
        conn = h11.Connection(h11.CLIENT)
        for name, body in bodies.items():
            path = "/v1/completions" if "prompt" in name else "/v1/chat/completions"
            status = exchange(sock, conn, path, body)
            try:
                health = exchange(sock, conn, "/health", None)
            except (h11.RemoteProtocolError, OSError) as error:
                print(f"{name}: {status}; the next request on the same connection failed: {error!r}")
                return
            print(f"{name}: {status}; the next request on the same connection: {health}")


def exchange(sock: socket.socket, conn: h11.Connection, path: str, body: bytes | None) -> int:
    method = "GET" if body is None else "POST"
    headers = [("Host", "x"), ("Content-Length", str(len(body or b"")))]
    sock.sendall(conn.send(h11.Request(method=method, target=path, headers=headers)))
    sock.sendall(conn.send(h11.Data(data=body or b"")) + conn.send(h11.EndOfMessage()))
    status = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.EndOfMessage):
            conn.start_next_cycle()
            return status


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow-clients", type=int, default=120)
    args = parser.parse_args()
    log = Path(tempfile.mkdtemp()) / "server.log"
    process, host, port = start_server(log)
    try:
        malformed_bodies(host, port)
        aborted_uploads(host, port, log)
        if args.slow_clients:
            slow_clients(host, port, args.slow_clients)
    finally:
        process.terminate()
        process.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
