"""Live tests of `met serve` under load: many clients at once, clients that leave mid-stream
(their KV blocks return to the pool), and a soak of many requests with cancels after which
the server's memory and descriptors have not grown.

The soak measures the server's memory and descriptors through /proc: it finds the process
holding the listening socket, or takes `MET_SERVER_PID`, and skips for a server it cannot see.

    MET_BASE_URL=http://127.0.0.1:8888 MET_API_KEY=KEY python test_load.py [-k NAME]
"""

import json
import os
import re
import socket
import threading
import time
import unittest
from pathlib import Path

import live_common
from live_common import (
    ANSWER,
    BASE_URL,
    QUESTION,
    RENDERED,
    STORY,
    TIMEOUT,
    LiveTest,
    _host_port,
    auth_headers,
    metrics,
    new_client,
    raw,
    raw_head,
    server_pid,
    sse_events,
    wait_for_metric,
)

MODEL = None  # set by setUpModule


def setUpModule():
    global MODEL
    MODEL = live_common.connect()


# --- many clients, and clients that leave ---------------------------------------------


class TestConcurrency(LiveTest):
    def test_16_concurrent_requests(self):
        results, errors = [None] * 16, []
        start = threading.Barrier(16)

        def worker(i):
            try:
                start.wait()
                if i % 2:
                    out = self.chat(max_tokens=10)
                    results[i] = out.choices[0].message.content
                else:
                    out = self.complete(max_tokens=10)
                    results[i] = out.choices[0].text
            except Exception as e:  # reported below, with the thread's number
                errors.append((i, repr(e)))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        self.assertFalse(any(t.is_alive() for t in threads), "a request did not complete")
        self.assertEqual(errors, [])
        # Batched or not, greedy decoding gives the same answer.
        self.assertEqual(results, [ANSWER] * 16)
        self.assertEqual(wait_for_metric("met_kv_blocks_used", lambda v: v == 0), 0)

    def test_disconnect_mid_stream_frees_kv_blocks(self):
        self.assertEqual(wait_for_metric("met_kv_blocks_used", lambda v: v == 0), 0, "blocks in use before")
        client = new_client()
        stream = client.chat.completions.create(
            model=MODEL, messages=STORY, temperature=0, max_tokens=2000, stream=True
        )
        received = 0
        for chunk in stream:
            received += sum(1 for c in chunk.choices if c.delta.content)
            if received >= 3:
                break
        self.assertEqual(received, 3, "the stream ended early")
        self.assertGreater(metrics()["met_kv_blocks_used"], 0, "a running sequence holds blocks")
        stream.close()
        client.close()
        self.assertEqual(
            wait_for_metric("met_kv_blocks_used", lambda v: v == 0),
            0,
            "the cancelled sequence's KV blocks did not return to the pool",
        )
        self.assertEqual(wait_for_metric("met_requests_running", lambda v: v == 0), 0)
        self.assert_serving()

    def test_abrupt_socket_close_mid_stream(self):
        body = json.dumps({"model": MODEL, "messages": STORY, "max_tokens": 2000, "stream": True}).encode()
        sock = socket.create_connection(_host_port(), timeout=TIMEOUT)
        head = [
            "POST /v1/chat/completions HTTP/1.1",
            f"Host: {BASE_URL.split('//')[1]}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ] + [f"{k}: {v}" for k, v in auth_headers().items()]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        got = b""
        while got.count(b"data:") < 3:
            data = sock.recv(65536)
            self.assertTrue(data, f"the server closed the stream: {got!r}")
            got += data
        self.assertTrue(got.startswith(b"HTTP/1.1 200"), got)
        sock.close()
        self.assertEqual(wait_for_metric("met_kv_blocks_used", lambda v: v == 0), 0)
        self.assert_serving()



# --- a soak: many requests with cancels leave nothing behind (issue 17) ---------------

SOAK_REQUESTS = int(os.environ.get("MET_SOAK_REQUESTS", "500"))
SOAK_WARMUP = 60
SOAK_CLIENTS = 8
# What the soak may add to the server's resident memory and open descriptors. Allocator
# arenas, thread stacks and tokio's blocking pool move RSS by a few MiB; a leak of a request's
# state (tokenized prompt, KV tables, response buffers, a connection) would grow it by far
# more over 500 requests, and leaks one descriptor per connection.
SOAK_RSS_GROWTH_MIB = 32
SOAK_FD_GROWTH = 4
# A fixed set of prompts, each already run by the warm-up: KV blocks are handed out from
# never-used ones first (the prefix cache keeps freed full blocks), so ever-new prompts would
# touch fresh pages of the KV pool and grow RSS without any leak.
SOAK_CHATS = [QUESTION, STORY] + [[{"role": "user", "content": f"Count to {k}."}] for k in range(3, 7)]
SOAK_TEXTS = [RENDERED, "Once upon a time", "The three primary colors are", "def fibonacci(n):"]



def process_usage(pid):
    """(resident MiB, open file descriptors) of process `pid`."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss_kib = int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1))
    return rss_kib / 1024, len(os.listdir(f"/proc/{pid}/fd"))


def soak_request(i):
    """Request `i` of the soak, one of five kinds; returns an error text, or None. Kinds 0
    and 4 cancel: a stream closed after its first token, and one closed before any."""
    kind = i % 5
    chat = SOAK_CHATS[i % len(SOAK_CHATS)]
    text = SOAK_TEXTS[i % len(SOAK_TEXTS)]
    if kind in (0, 4):
        body = json.dumps({"model": MODEL, "messages": chat, "temperature": 0, "max_tokens": 16, "stream": True})
        head = ["POST /v1/chat/completions HTTP/1.1", "Content-Type: application/json",
                f"Content-Length: {len(body)}"]
        sock = socket.create_connection(_host_port(), timeout=TIMEOUT)
        try:
            sock.sendall(raw_head(head) + body.encode())
            got = sock.recv(65536)
            # Kind 0 waits for a token (the role chunk's content is empty); kind 4 has the head.
            while kind == 0 and b'"content":"' not in got.replace(b'"content":""', b""):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                got += chunk
            return None if got.startswith(b"HTTP/1.1 200") else f"cancelled stream: {got[:300]!r}"
        finally:
            sock.close()
    if kind == 1:
        body = {"model": MODEL, "prompt": text, "temperature": 0, "max_tokens": 3, "stream": True}
        resp = raw("POST", "/v1/completions", body)
        events = sse_events(resp.body) if resp.status == 200 else []
        return None if events[-1:] == ["[DONE]"] and '"error"' not in resp.text else f"stream: {resp}"
    if kind == 2:
        body = {"model": MODEL, "messages": chat, "temperature": 0, "max_tokens": 3}
        resp = raw("POST", "/v1/chat/completions", body)
        if resp.status != 200:
            return f"chat: {resp}"
        # Greedy: the question's answer is always the start of the reference one.
        answer = resp.json()["choices"][0]["message"]["content"]
        return None if chat is not QUESTION or ANSWER.startswith(answer) else f"chat answered {answer!r}"
    body = {"model": MODEL, "prompt": text, "temperature": 0, "max_tokens": 2, "n": 2}
    resp = raw("POST", "/v1/completions", body)
    return None if resp.status == 200 and len(resp.json()["choices"]) == 2 else f"completion: {resp}"


def soak(count):
    """Runs requests 0..count from SOAK_CLIENTS threads; the errors, with their numbers."""
    next_index, errors, lock = iter(range(count)), [], threading.Lock()

    def client():
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            try:
                error = soak_request(i)
            except Exception as e:  # reported below, with the request's number
                error = repr(e)
            if error:
                with lock:
                    errors.append((i, error))

    threads = [threading.Thread(target=client) for _ in range(SOAK_CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def cancelled_requests():
    """`met_requests_finished_total{reason="cancelled"}`."""
    resp = raw("GET", "/metrics")
    m = re.search(r'^met_requests_finished_total\{reason="cancelled"\} (\S+)$', resp.text, re.M)
    return float(m.group(1)) if m else 0.0


class TestSoak(LiveTest):
    def settled_usage(self, pid):
        """The server's usage once nothing runs and its connections have closed: the open
        descriptors have not changed for a second (lingering closes take up to 2 s)."""
        self.assertEqual(wait_for_metric("met_requests_running", lambda v: v == 0), 0)
        self.assertEqual(wait_for_metric("met_kv_blocks_used", lambda v: v == 0), 0)
        usage, deadline = process_usage(pid), time.monotonic() + 20
        while time.monotonic() < deadline:
            time.sleep(1.0)
            now = process_usage(pid)
            if now[1] == usage[1]:
                return now
            usage = now
        return usage

    def test_soak_keeps_rss_and_fds_flat(self):
        """500 requests, a fifth of them cancelled mid-stream and a fifth before their first
        token, from 8 clients at once: after a warm-up, the server's resident memory and open
        descriptors stay flat, and every request that was not cancelled is answered."""
        pid = server_pid()
        if pid is None:
            self.skipTest("the server's process is not visible here (set MET_SERVER_PID)")
        self.assertEqual(soak(SOAK_WARMUP), [], "warm-up")
        rss_before, fds_before = self.settled_usage(pid)
        cancelled_before, started = cancelled_requests(), time.monotonic()
        errors = soak(SOAK_REQUESTS)
        took = time.monotonic() - started
        rss_after, fds_after = self.settled_usage(pid)
        cancelled = cancelled_requests() - cancelled_before
        print(f"\nsoak: {SOAK_REQUESTS} requests ({cancelled:.0f} cancelled) in {took:.1f} s; "
              f"server pid {pid}: RSS {rss_before:.1f} -> {rss_after:.1f} MiB ({rss_after - rss_before:+.1f}, "
              f"bound {SOAK_RSS_GROWTH_MIB}), fds {fds_before} -> {fds_after} ({fds_after - fds_before:+d}, "
              f"bound {SOAK_FD_GROWTH})", flush=True)
        self.assertEqual(errors, [])
        # Most of the two fifths that hang up are still running when they do (a stream
        # closed after the first of its 16 tokens nearly always is).
        self.assertGreaterEqual(cancelled, SOAK_REQUESTS // 5, "the soak's clients did not cancel")
        self.assertLess(rss_after - rss_before, SOAK_RSS_GROWTH_MIB, "resident memory grew")
        self.assertLessEqual(fds_after - fds_before, SOAK_FD_GROWTH, "open descriptors grew")
        self.assert_serving()


if __name__ == "__main__":
    unittest.main(verbosity=2)
