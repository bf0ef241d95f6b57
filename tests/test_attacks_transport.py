"""Attacks on the transports (issue 17): each test reproduces one way a client could get two
answers to one request, hold connections it does not use, or make the server hold memory or
time it should not. Loopback only, every loop bounded, no timing assertions: behaviour is
proven by status codes and by which connections the server closes."""

from __future__ import annotations

import json

import pytest
from conftest import Http, assert_alive, encode_request

import openinfer


# ---- one request, one response: Upgrade and CONNECT ----------------------------------------


@pytest.mark.parametrize("method, path", [("GET", "/v2/health/live"), ("POST", "/v2/models/nope/infer")])
def test_upgrade_request_gets_one_answer_then_close(server: openinfer.Server, method: str, path: str) -> None:
    """Connection: Upgrade is refused: the request gets its normal answer, the connection is
    closed (what follows it would be another protocol), and no second response appears."""
    conn = Http(server.http_port)
    try:
        req = encode_request(method, path, b"{}" if method == "POST" else b"",
                             {"Connection": "Upgrade", "Upgrade": "foo"})
        # A pipelining client sends its next request at once; it must not get a stray answer.
        conn.send(req + encode_request("GET", "/v2/health/ready"))
        status, headers, _ = conn.read_response()
        assert status == (200 if method == "GET" else 404)
        assert headers["connection"] == "close"
        assert conn.closed_by_peer()
        assert conn.buf == b"", f"a second response followed: {conn.buf!r}"
    finally:
        conn.close()
    assert_alive(server.http_port)


def test_connect_gets_one_answer_then_close(server: openinfer.Server) -> None:
    conn = Http(server.http_port)
    try:
        conn.send(b"CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\n\r\n"
                  + encode_request("GET", "/v2/health/live"))
        status, headers, body = conn.read_response()
        assert status == 405 and "CONNECT" in json.loads(body)["error"]
        assert headers["connection"] == "close"
        assert conn.closed_by_peer()
        assert conn.buf == b"", f"a second response followed: {conn.buf!r}"
    finally:
        conn.close()
    assert_alive(server.http_port)
