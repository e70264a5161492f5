"""Live tests of bad input to `met serve`: every malformed, mistyped, out-of-range or
unauthorised request gets an OpenAI-shaped JSON error and leaves the server serving, and the
HTTP layer holds against hostile clients (bytes after the body, oversized heads and bodies,
cross-origin browsers, stalled connections).

    MET_BASE_URL=http://127.0.0.1:8888 MET_API_KEY=KEY python test_errors.py [-k NAME]
"""

import http.client
import json
import os
import socket
import threading
import time
import unittest

import openai
from openai import OpenAI

import live_common
from live_common import (
    ANSWER,
    API_KEY,
    BASE_URL,
    QUESTION,
    TIMEOUT,
    LiveTest,
    Response,
    _host_port,
    auth_headers,
    new_client,
    raw,
    raw_head,
    read_all,
)

# A body over the server's limit (`--max-body-bytes`, 4 MiB by default).
OVERSIZED_BODY = 16 << 20

MODEL = None  # set by setUpModule


def setUpModule():
    global MODEL
    MODEL = live_common.connect()


# --- bad input: an OpenAI-shaped error, then business as usual ------------------------


class TestErrors(LiveTest):
    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"

    def context_length(self):
        """The model's context, from /v1/models or /tokenize where the server reports it."""
        card = raw("GET", "/v1/models").json()["data"][0]
        for key in ("max_model_len", "context_length", "context_window"):
            if isinstance(card.get(key), int):
                return card[key]
        return self.tokenize(prompt="x").get("max_model_len")

    def test_malformed_json(self):
        for path in (self.CHAT, self.COMPLETIONS):
            for body in (b'{"model": "m", "messages": [', b"not json", b"", b"\xff\xfe{}"):
                with self.subTest(path=path, body=body):
                    self.assert_error(raw("POST", path, body), 400)
        self.assert_serving()

    def test_wrong_types(self):
        # `max_tokens` is small so that a request wrongly accepted ends quickly.
        chat = {"model": MODEL, "messages": QUESTION, "max_tokens": 2}
        cases = [
            (self.CHAT, [chat], None),
            (self.CHAT, dict(chat, messages="hello"), "messages"),
            (self.CHAT, dict(chat, messages=[{"role": "user", "content": 5}]), "content"),
            (self.CHAT, dict(chat, messages=[{"content": "hi"}]), "role"),
            (self.CHAT, dict(chat, max_tokens="ten"), "max_tokens"),
            (self.CHAT, dict(chat, temperature="hot"), "temperature"),
            (self.CHAT, dict(chat, n=1.5), "n"),
            (self.CHAT, dict(chat, stream="yes"), "stream"),
            (self.CHAT, dict(chat, stop=5), "stop"),
            (self.CHAT, {"model": MODEL, "max_tokens": 2}, "messages"),
            (self.COMPLETIONS, {"model": MODEL, "prompt": {"text": "hi"}, "max_tokens": 2}, "prompt"),
            (self.COMPLETIONS, {"model": MODEL, "prompt": "hi", "seed": "x", "max_tokens": 2}, "seed"),
        ]
        for path, body, field in cases:
            with self.subTest(path=path, body=body):
                self.assert_error(raw("POST", path, body, timeout=30), 400, *([field] if field else []))
        self.assert_serving()

    def test_empty_messages(self):
        self.assert_error(raw("POST", self.CHAT, {"model": MODEL, "messages": []}), 400, "messages")
        with self.assertRaises(openai.BadRequestError):
            self.chat(messages=[])
        self.assert_serving()

    def test_unknown_model(self):
        for path, body in (
            (self.CHAT, {"model": "no-such-model", "messages": QUESTION, "max_tokens": 2}),
            (self.CHAT, {"model": "no-such-model", "messages": QUESTION, "max_tokens": 2, "stream": True}),
            (self.COMPLETIONS, {"model": "no-such-model", "prompt": "hi", "max_tokens": 2}),
        ):
            with self.subTest(body=body):
                self.assert_error(raw("POST", path, body), 404, "no-such-model")
        with self.assertRaises(openai.NotFoundError):
            self.chat(model="no-such-model")
        self.assert_serving()

    def test_prompt_longer_than_the_context(self):
        context = self.context_length() or 8192
        length = context + 100
        # Token ids: an exact length.
        err = self.assert_error(raw("POST", self.COMPLETIONS, {"model": MODEL, "prompt": [28] * length}), 400)
        self.assertIn(str(length), err["message"])
        self.assertIn(str(context), err["message"])
        # Chat: the rendered prompt's length, as /tokenize counts it.
        messages = [{"role": "user", "content": "hello " * length}]
        rendered_length = self.tokenize(messages=messages)["count"]
        err = self.assert_error(raw("POST", self.CHAT, {"model": MODEL, "messages": messages}), 400)
        self.assertIn(str(rendered_length), err["message"])
        self.assertIn(str(context), err["message"])
        with self.assertRaises(openai.BadRequestError):
            self.chat(messages=messages, stream=True)
        self.assert_serving()

    def test_n_out_of_range(self):
        for path, base in ((self.CHAT, {"messages": QUESTION}), (self.COMPLETIONS, {"prompt": "hi"})):
            base["max_tokens"] = 2
            for n in (0, -1, 1_000_000):
                with self.subTest(path=path, n=n):
                    self.assert_error(raw("POST", path, dict(base, model=MODEL, n=n)), 400, "n")
        self.assert_serving()

    def test_max_tokens_out_of_range(self):
        for path, base in ((self.CHAT, {"messages": QUESTION}), (self.COMPLETIONS, {"prompt": "hi"})):
            for max_tokens in (0, -1, 1_000_000_000):
                with self.subTest(path=path, max_tokens=max_tokens):
                    body = dict(base, model=MODEL, max_tokens=max_tokens)
                    self.assert_error(raw("POST", path, body), 400, "max_tokens")
        self.assert_serving()

    def test_sampling_out_of_range(self):
        for field, value in (("temperature", -1), ("top_p", 1.5), ("top_logprobs", 21), ("presence_penalty", 3)):
            with self.subTest(field=field):
                body = {"model": MODEL, "messages": QUESTION, "logprobs": True, "max_tokens": 2, field: value}
                self.assert_error(raw("POST", self.CHAT, body), 400, field)
        self.assert_serving()

    def test_body_over_the_limit(self):
        """413 for a body over the limit; the body is sent from a second thread while this
        one reads, so a server that answers before reading it all cannot deadlock us."""
        prefix = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": ""}]})[:-3].encode()
        body = prefix + b"a" * (OVERSIZED_BODY - len(prefix) - 3) + b'"}]}'
        head = [
            "POST /v1/chat/completions HTTP/1.1",
            f"Host: {BASE_URL.split('//')[1]}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
            "Connection: close",
        ] + [f"{k}: {v}" for k, v in auth_headers().items()]
        sock = socket.create_connection(_host_port(), timeout=60)

        def send():
            try:
                sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            except OSError:
                pass  # the server may stop reading once it has answered

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        out = Response(resp.status, resp.getheaders(), resp.read())
        sock.close()
        sender.join(60)
        self.assert_error(out, 413)
        self.assert_serving()

    def test_wrong_method(self):
        for method, path in (
            ("GET", self.CHAT),
            ("GET", self.COMPLETIONS),
            ("PUT", self.CHAT),
            ("DELETE", self.COMPLETIONS),
            ("POST", "/v1/models"),
        ):
            with self.subTest(method=method, path=path):
                self.assert_error(raw(method, path, None if method == "GET" else {}), 405)
        self.assert_serving()

    def test_unknown_path(self):
        self.assertEqual(raw("GET", "/v1/nothing-here").status, 404)
        self.assertEqual(raw("POST", "/v2/chat/completions", {}).status, 404)
        self.assert_serving()

    @unittest.skipUnless(API_KEY, "MET_API_KEY is not set: the server runs without a key")
    def test_missing_or_wrong_api_key(self):
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 1}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
            for method, path in (("POST", self.CHAT), ("POST", self.COMPLETIONS), ("GET", "/v1/models")):
                with self.subTest(headers=headers, path=path):
                    resp = raw(method, path, body if method == "POST" else None, headers=headers, auth=False)
                    self.assert_error(resp, 401)
        bad = OpenAI(base_url=BASE_URL + "/v1", api_key="wrong", max_retries=0, timeout=TIMEOUT)
        with self.assertRaises(openai.AuthenticationError):
            bad.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=1)
        bad.close()
        # Only health stays open for probes; /metrics needs --metrics-without-auth.
        self.assertEqual(raw("GET", "/health", auth=False).status, 200)
        self.assert_error(raw("GET", "/metrics", auth=False), 401)
        for path, body in (("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [1]})):
            with self.subTest(path=path):
                self.assert_error(raw("POST", path, body, auth=False), 401)
        self.assert_serving()

    def test_errors_do_not_disturb_a_running_stream(self):
        result = {}

        def stream():
            texts, finish, _, _ = self.collect_chat_stream(new_client().chat.completions.create(
                model=MODEL, messages=QUESTION, temperature=0, max_tokens=16, stream=True
            ))
            result.update(texts=texts, finish=finish)

        t = threading.Thread(target=stream)
        t.start()
        for body in (b"{", b"[]", {"model": MODEL, "messages": []}, {"model": MODEL, "messages": QUESTION, "n": 0}):
            self.assertEqual(raw("POST", self.CHAT, body).status, 400)
        t.join(TIMEOUT)
        self.assertEqual(result, {"texts": {0: ANSWER}, "finish": {0: "stop"}})



# --- the HTTP layer under hostile clients (issue 17) ----------------------------------

# `--http-read-timeout-secs` and `--max-tokens-default` of the server under test (met's defaults).
READ_TIMEOUT = float(os.environ.get("MET_HTTP_READ_TIMEOUT", "30"))
MAX_TOKENS_DEFAULT = int(os.environ.get("MET_MAX_TOKENS_DEFAULT", "4096"))



class TestHardening(LiveTest):
    CHAT = "/v1/chat/completions"

    def test_bytes_after_the_json_body(self):
        body = json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": 1})
        for tail in (" xyz", " {}", "\n[1]"):
            with self.subTest(tail=tail):
                self.assert_error(raw("POST", self.CHAT, body + tail), 400, "after the JSON")
        self.assert_serving()

    def test_declared_length_over_the_limit_is_413_without_100_continue(self):
        """The head alone gets the 413: no `100 Continue`, no waiting for the body, and the
        server closes the connection cleanly after it."""
        sock = socket.create_connection(_host_port(), timeout=30)
        try:
            sock.sendall(raw_head([
                f"POST {self.CHAT} HTTP/1.1",
                "Content-Type: application/json",
                f"Content-Length: {OVERSIZED_BODY}",
                "Expect: 100-continue",
            ]))
            data = read_all(sock, 30)
        finally:
            sock.close()
        self.assertTrue(data.startswith(b"HTTP/1.1 413"), data[:200])
        self.assertNotIn(b"100 Continue", data)
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertIn(b"connection: close", head.lower())
        self.assertEqual(json.loads(body)["error"]["code"], "payload_too_large")
        self.assert_serving()

    def test_heads_over_the_limits_get_json_414_and_431(self):
        self.assert_error(raw("GET", "/v1/models?q=" + "a" * 10000), 414)
        many = {f"X-Filler-{i}": "v" for i in range(150)}
        self.assert_error(raw("GET", "/v1/models", headers=many), 431)
        self.assert_serving()

    def test_browsers_are_kept_out_by_default(self):
        """No `--allowed-origins`: a cross-origin preflight and request are 403, and a
        `text/plain` body (which browsers send without a preflight) is 415."""
        preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
        resp = raw("OPTIONS", self.CHAT, headers=preflight, auth=False)
        self.assert_error(resp, 403, "evil.example")
        self.assertNotIn("access-control-allow-origin", resp.headers)
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 1}
        self.assert_error(raw("POST", self.CHAT, body, headers={"Origin": "http://evil.example"}), 403)
        self.assert_error(raw("POST", self.CHAT, json.dumps(body), headers={"Content-Type": "text/plain"}), 415)
        self.assert_serving()

    def test_stalled_clients_do_not_hold_the_server(self):
        """Slowloris: connections that send half a head (or half a body) and stall neither
        delay a normal request nor stay open past the read timeout."""
        stalled = []
        try:
            for i in range(40):
                sock = socket.create_connection(_host_port(), timeout=10)
                if i % 2:
                    sock.sendall(f"POST {self.CHAT} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode())
                else:
                    sock.sendall(raw_head([f"POST {self.CHAT} HTTP/1.1", "Content-Type: application/json",
                                           "Content-Length: 1000"]) + b'{"model": ')
                stalled.append(sock)
            started = time.monotonic()
            self.assert_serving()
            self.assertLess(time.monotonic() - started, 20.0)
            # Every stalled connection is closed (a 408 at most) within the read timeout.
            deadline = time.monotonic() + READ_TIMEOUT + 10
            for sock in stalled:
                data = read_all(sock, max(1.0, deadline - time.monotonic()))
                self.assertTrue(data == b"" or data.startswith(b"HTTP/1.1 408"), data[:200])
        finally:
            for sock in stalled:
                sock.close()
        self.assert_serving()

    def test_max_tokens_above_the_default_cap_is_400(self):
        """`--max-tokens-default` is also the most a request may ask for."""
        for path, base in ((self.CHAT, {"messages": QUESTION}), ("/v1/completions", {"prompt": "hi"})):
            with self.subTest(path=path):
                body = dict(base, model=MODEL, max_tokens=MAX_TOKENS_DEFAULT + 1)
                self.assert_error(raw("POST", path, body), 400, "max_tokens", "--max-tokens-default")
        body = {"model": MODEL, "messages": QUESTION, "max_completion_tokens": MAX_TOKENS_DEFAULT + 1}
        self.assert_error(raw("POST", self.CHAT, body), 400, "max_completion_tokens")
        self.assert_serving()


if __name__ == "__main__":
    unittest.main(verbosity=2)
