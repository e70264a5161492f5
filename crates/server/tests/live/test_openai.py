"""Live tests of `met serve`: a running server on the default model, driven by the official
`openai` client, with raw HTTP (stdlib `http.client`) where the client would hide what is
checked (malformed bodies, methods, status codes, SSE framing, /metrics).

`cargo xtask test` starts the server, runs this file in a virtualenv holding
`requirements.txt`, then stops the server with SIGTERM. By hand, against a running server:

    MET_BASE_URL=http://127.0.0.1:8888 MET_API_KEY=KEY python test_openai.py [-k NAME]

The soak measures the server's memory and descriptors through /proc: it finds the process
holding the listening socket, or takes `MET_SERVER_PID`, and skips for a server it cannot see.
The engine-fault tests start servers of their own with the test-only fault hook
`MET_TEST_ENGINE_FAULT`, from the binary `MET_BIN` or else the one that server runs; they skip
when they know neither.

The model is SmolLM2-135M-Instruct (`met`'s embedded default). Expected texts and ids come
from `../fixtures/smollm2/reference.json` (transformers' greedy decoding of the same model,
see the README beside it): greedy answers are deterministic, so the tests compare exact text.
Generation is slow in a debug build on two cores, so every request asks for few tokens.
"""

import http.client
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
from pathlib import Path

import openai
from openai import OpenAI

BASE_URL = os.environ.get("MET_BASE_URL", "").rstrip("/")
API_KEY = os.environ.get("MET_API_KEY") or None
# Loopback traffic must not go through a proxy from the environment.
os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1", "localhost"]))
os.environ["no_proxy"] = os.environ["NO_PROXY"]

TIMEOUT = 120.0
# A body over the server's limit (`--max-body-bytes`, 4 MiB by default).
OVERSIZED_BODY = 16 << 20

REFERENCE = json.loads((Path(__file__).parent.parent / "fixtures/smollm2/reference.json").read_text())
CASE = next(c for c in REFERENCE["chat"] if c["name"] == "user_capital")
QUESTION = CASE["messages"]
ANSWER = CASE["generated_text"]  # "The capital of France is Paris."
RENDERED = CASE["rendered"]  # the chat template's output for QUESTION
PROMPT_IDS = CASE["prompt_ids"]  # 37 ids
EOS_ID = REFERENCE["special"]["eos_token_id"]
ANSWER_IDS = [t for t in CASE["generated_ids"] if t != EOS_ID]
STORY = [{"role": "user", "content": "Write a long story about a brave dragon and a little girl."}]

MODEL = None  # set by setUpModule from GET /v1/models


# --- raw HTTP -------------------------------------------------------------------------


class Response:
    def __init__(self, status, headers, body):
        self.status = status
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return f"HTTP {self.status} {self.text[:500]!r}"


def _host_port():
    url = urllib.parse.urlsplit(BASE_URL)
    return url.hostname, url.port or 80


def auth_headers(key=API_KEY):
    return {"Authorization": f"Bearer {key}"} if key else {}


def raw(method, path, body=None, headers=None, auth=True, timeout=TIMEOUT):
    """One HTTP request on a fresh connection; `body` is bytes, str, or JSON-able."""
    if body is not None and not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    hdrs = {"Content-Type": "application/json"} if body is not None else {}
    if auth:
        hdrs.update(auth_headers())
    hdrs.update(headers or {})
    conn = http.client.HTTPConnection(*_host_port(), timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return Response(resp.status, resp.getheaders(), resp.read())
    finally:
        conn.close()


def metrics():
    """GET /metrics as {name: value}, values of one name summed over its label sets."""
    resp = raw("GET", "/metrics")
    assert resp.status == 200, resp
    values = {}
    for line in resp.text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and not line.startswith("#"):
            values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(3))
    return values


def wait_for_metric(name, predicate, timeout=20.0):
    """Polls /metrics until `predicate(value)`; returns the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = metrics().get(name)
        if value is not None and predicate(value):
            return value
        if time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def sse_events(body):
    """The `data:` payloads of an SSE body, in order."""
    events = []
    for block in body.decode().replace("\r\n", "\n").split("\n\n"):
        data = [line[5:].lstrip(" ") for line in block.split("\n") if line.startswith("data:")]
        if data:
            events.append("\n".join(data))
    return events


def new_client(**kw):
    return OpenAI(base_url=BASE_URL + "/v1", api_key=API_KEY or "unused", max_retries=0, timeout=TIMEOUT, **kw)


def setUpModule():
    global MODEL
    if not BASE_URL:
        raise RuntimeError("MET_BASE_URL is not set (e.g. http://127.0.0.1:8888); `cargo xtask test` sets it")
    deadline = time.monotonic() + 60
    while True:
        try:
            if raw("GET", "/health", auth=False, timeout=5).status == 200:
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{BASE_URL}/health did not answer 200 within 60 s")
        time.sleep(0.25)
    MODEL = os.environ.get("MET_MODEL") or new_client().models.list().data[0].id


# --- shared assertions ----------------------------------------------------------------


class LiveTest(unittest.TestCase):
    maxDiff = 4000

    @classmethod
    def setUpClass(cls):
        cls.client = new_client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def chat(self, **kw):
        args = dict(model=MODEL, messages=QUESTION, temperature=0.0, max_tokens=16)
        args.update(kw)
        return self.client.chat.completions.create(**args)

    def complete(self, **kw):
        args = dict(model=MODEL, prompt=RENDERED, temperature=0.0, max_tokens=16)
        args.update(kw)
        return self.client.completions.create(**args)

    def tokenize(self, **body):
        resp = raw("POST", "/tokenize", dict(model=MODEL, **body))
        self.assertEqual(resp.status, 200, resp)
        out = resp.json()
        self.assertEqual(out["count"], len(out["tokens"]), out)
        return out

    def assert_error(self, resp, status, *mentions):
        """An OpenAI-shaped JSON error with this status whose message (or param) names
        each of `mentions`."""
        self.assertEqual(resp.status, status, resp)
        self.assertIn("application/json", resp.headers.get("content-type", ""), resp.headers)
        body = resp.json()
        self.assertIsInstance(body, dict, body)
        err = body.get("error")
        self.assertIsInstance(err, dict, body)
        for key in ("message", "type", "param", "code"):
            self.assertIn(key, err, body)
        self.assertIsInstance(err["message"], str, body)
        self.assertTrue(err["message"].strip(), body)
        self.assertIsInstance(err["type"], str, body)
        self.assertTrue(err["type"], body)
        said = f"{err['message']} {err['param']}"
        for m in mentions:
            self.assertIn(str(m), said, body)
        return err

    def assert_serving(self):
        """The server still answers a normal request correctly."""
        out = self.chat(max_tokens=2)
        self.assertEqual(out.choices[0].message.content, "The capital")
        self.assertEqual(out.choices[0].finish_reason, "length")

    def collect_chat_stream(self, stream):
        """Concatenated content and finish reason per choice index, the chunks and the
        usage of a chat stream."""
        texts, finish, chunks, usage = {}, {}, [], None
        for chunk in stream:
            chunks.append(chunk)
            self.assertEqual(chunk.object, "chat.completion.chunk")
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
                if choice.finish_reason is not None:
                    self.assertNotIn(choice.index, finish, "two finish reasons for one choice")
                    finish[choice.index] = choice.finish_reason
        self.assertTrue(chunks, "empty stream")
        self.assertEqual(len({c.id for c in chunks}), 1, "chunks of one stream carry one id")
        return texts, finish, chunks, usage


# --- the server's own endpoints -------------------------------------------------------


class TestEndpoints(LiveTest):
    def test_health(self):
        self.assertEqual(raw("GET", "/health", auth=False).status, 200)

    def test_models(self):
        models = self.client.models.list().data
        self.assertGreaterEqual(len(models), 1)
        self.assertEqual(models[0].object, "model")
        self.assertEqual(models[0].id, MODEL)

    def test_metrics_are_prometheus_text(self):
        resp = raw("GET", "/metrics")
        self.assertEqual(resp.status, 200, resp)
        self.assertIn("text/plain", resp.headers.get("content-type", ""))
        self.assertIn("# TYPE met_kv_blocks_used gauge", resp.text)
        values = metrics()
        self.assertGreater(values.get("met_kv_blocks_capacity", 0), 0, resp.text)
        self.assertEqual(values.get("met_kv_blocks_used"), 0, "no request is running")

    def test_tokenize_and_detokenize(self):
        self.assertEqual(self.tokenize(prompt=RENDERED)["tokens"], PROMPT_IDS)
        self.assertEqual(self.tokenize(messages=QUESTION)["tokens"], PROMPT_IDS)
        resp = raw("POST", "/detokenize", {"model": MODEL, "tokens": ANSWER_IDS})
        self.assertEqual(resp.status, 200, resp)
        self.assertEqual(resp.json()["prompt"], ANSWER)


# --- /v1/chat/completions -------------------------------------------------------------


class TestChat(LiveTest):
    def test_greedy_answer_and_usage(self):
        out = self.chat()
        self.assertTrue(out.id)
        self.assertEqual(out.object, "chat.completion")
        self.assertEqual(out.model, MODEL)
        self.assertIsInstance(out.created, int)
        self.assertEqual(len(out.choices), 1)
        choice = out.choices[0]
        self.assertEqual(choice.index, 0)
        self.assertEqual(choice.message.role, "assistant")
        self.assertEqual(choice.message.content, ANSWER)
        self.assertEqual(choice.finish_reason, "stop")
        # The rendered prompt, tokenized, as transformers counts it and as /tokenize does.
        self.assertEqual(out.usage.prompt_tokens, len(PROMPT_IDS))
        self.assertEqual(out.usage.prompt_tokens, self.tokenize(messages=QUESTION)["count"])
        # The answer's tokens, with or without the end-of-sequence token that ended it.
        self.assertIn(out.usage.completion_tokens, (len(ANSWER_IDS), len(ANSWER_IDS) + 1))
        self.assertEqual(out.usage.total_tokens, out.usage.prompt_tokens + out.usage.completion_tokens)

    def test_usage_counts_the_rendered_prompt(self):
        messages = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "Blue."},
            {"role": "user", "content": "Another one, please: not blue."},
        ]
        out = self.chat(messages=messages, max_tokens=3)
        self.assertEqual(out.usage.prompt_tokens, self.tokenize(messages=messages)["count"])
        self.assertGreaterEqual(out.usage.completion_tokens, 1)
        self.assertLessEqual(out.usage.completion_tokens, 3)

    def test_streaming_equals_non_streaming(self):
        whole = self.chat()
        stream = self.chat(stream=True, stream_options={"include_usage": True})
        texts, finish, chunks, usage = self.collect_chat_stream(stream)
        self.assertEqual(texts, {0: ANSWER})
        self.assertEqual(finish, {0: "stop"})
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        self.assertIsNotNone(usage, "stream_options.include_usage asks for a usage chunk")
        self.assertEqual(chunks[-1].choices, [], "the usage chunk comes last and has no choices")
        self.assertEqual(usage.prompt_tokens, whole.usage.prompt_tokens)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(usage.total_tokens, whole.usage.total_tokens)

    def test_sse_framing(self):
        body = {"model": MODEL, "messages": QUESTION, "max_tokens": 4, "temperature": 0, "stream": True}
        resp = raw("POST", "/v1/chat/completions", body)
        self.assertEqual(resp.status, 200, resp)
        self.assertIn("text/event-stream", resp.headers.get("content-type", ""))
        events = sse_events(resp.body)
        self.assertEqual(events[-1], "[DONE]", resp.text)
        chunks = [json.loads(e) for e in events[:-1]]
        self.assertTrue(chunks)
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        self.assertEqual(text, "The capital of France")
        self.assertEqual([c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1], "length")
        self.assertTrue(all(c["object"] == "chat.completion.chunk" for c in chunks), chunks)

    def test_max_tokens_1(self):
        out = self.chat(max_tokens=1)
        self.assertEqual(out.choices[0].message.content, "The")
        self.assertEqual(out.choices[0].finish_reason, "length")
        self.assertEqual(out.usage.completion_tokens, 1)
        texts, finish, _, usage = self.collect_chat_stream(
            self.chat(max_tokens=1, stream=True, stream_options={"include_usage": True})
        )
        self.assertEqual((texts, finish), ({0: "The"}, {0: "length"}))
        self.assertEqual(usage.completion_tokens, 1)

    def test_n2_greedy(self):
        one = self.chat()
        two = self.chat(n=2)
        self.assertEqual([c.index for c in two.choices], [0, 1])
        self.assertEqual([c.message.content for c in two.choices], [ANSWER, ANSWER])
        self.assertEqual(two.usage.prompt_tokens, one.usage.prompt_tokens)
        self.assertEqual(two.usage.completion_tokens, 2 * one.usage.completion_tokens)

    def test_n2_sampled_streaming(self):
        kw = dict(messages=STORY, n=2, temperature=1.0, seed=7, max_tokens=12)
        whole = self.chat(**kw)
        texts, finish, _, usage = self.collect_chat_stream(
            self.chat(stream=True, stream_options={"include_usage": True}, **kw)
        )
        self.assertEqual(sorted(texts), [0, 1])
        self.assertEqual(sorted(finish), [0, 1])
        self.assertNotEqual(texts[0], texts[1], "the two continuations must draw different tokens")
        # Seeded: the stream draws the same tokens as the non-streaming request.
        self.assertEqual(texts, {c.index: c.message.content for c in whole.choices})
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)

    def test_seed_reproducibility(self):
        def sample(seed):
            out = self.chat(messages=STORY, temperature=1.0, seed=seed, max_tokens=12)
            return out.choices[0].message.content

        first = sample(1234)
        self.assertEqual(sample(1234), first)
        others = {sample(1), sample(2)}
        self.assertTrue(others - {first}, "different seeds should give a different text")

    def test_stop_strings(self):
        out = self.chat(stop=["Paris"])
        self.assertEqual(out.choices[0].message.content, "The capital of France is ")
        self.assertEqual(out.choices[0].finish_reason, "stop")
        # The earliest match wins, whichever stop string it is.
        out = self.chat(stop=[".", " France"])
        self.assertEqual(out.choices[0].message.content, "The capital of")
        # A stop string that never appears changes nothing.
        self.assertEqual(self.chat(stop="xyzzy").choices[0].message.content, ANSWER)
        texts, finish, _, _ = self.collect_chat_stream(self.chat(stop=["Paris"], stream=True))
        self.assertEqual((texts, finish), ({0: "The capital of France is "}, {0: "stop"}))

    def test_logprobs(self):
        out = self.chat(logprobs=True, top_logprobs=3)
        choice = out.choices[0]
        self.assertEqual(choice.message.content, ANSWER)
        entries = choice.logprobs.content
        self.assertIn(len(entries), (len(ANSWER_IDS), len(ANSWER_IDS) + 1))
        self.assertTrue("".join(e.token for e in entries).startswith(ANSWER))
        for e in entries[: len(ANSWER_IDS)]:
            self.assertLessEqual(e.logprob, 0.0)
            self.assertEqual(len(e.top_logprobs), 3)
            tops = [t.logprob for t in e.top_logprobs]
            self.assertEqual(tops, sorted(tops, reverse=True))
            self.assertLessEqual(sum(2.718281828 ** t for t in tops), 1.0 + 1e-3)
            # Greedy: the chosen token is the most likely one.
            self.assertEqual(e.top_logprobs[0].token, e.token)
            self.assertAlmostEqual(e.top_logprobs[0].logprob, e.logprob, places=4)
            if e.bytes is not None:
                self.assertEqual(bytes(e.bytes), e.token.encode())
        self.assertIsNone(self.chat(max_tokens=2).choices[0].logprobs)


# --- /v1/completions ------------------------------------------------------------------


class TestCompletions(LiveTest):
    def test_text_prompt(self):
        out = self.complete()
        self.assertEqual(out.object, "text_completion")
        self.assertEqual(out.model, MODEL)
        self.assertEqual(out.choices[0].text, ANSWER)
        self.assertEqual(out.choices[0].finish_reason, "stop")
        self.assertEqual(out.usage.prompt_tokens, len(PROMPT_IDS))
        self.assertEqual(out.usage.prompt_tokens, self.tokenize(prompt=RENDERED)["count"])
        self.assertIn(out.usage.completion_tokens, (len(ANSWER_IDS), len(ANSWER_IDS) + 1))
        self.assertEqual(out.usage.total_tokens, out.usage.prompt_tokens + out.usage.completion_tokens)

    def test_token_id_prompt(self):
        out = self.complete(prompt=PROMPT_IDS)
        self.assertEqual(out.choices[0].text, ANSWER)
        self.assertEqual(out.usage.prompt_tokens, len(PROMPT_IDS))

    def test_streaming(self):
        stream = self.complete(stream=True, stream_options={"include_usage": True})
        text, finish, usage = "", None, None
        for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                text += c.text
                finish = c.finish_reason or finish
        self.assertEqual((text, finish), (ANSWER, "stop"))
        self.assertEqual(usage.prompt_tokens, len(PROMPT_IDS))

    def test_max_tokens_1(self):
        out = self.complete(max_tokens=1)
        self.assertEqual((out.choices[0].text, out.choices[0].finish_reason), ("The", "length"))
        self.assertEqual(out.usage.completion_tokens, 1)

    def test_n2_and_seed(self):
        kw = dict(prompt="Once upon a time", n=2, temperature=1.0, seed=99, max_tokens=10)
        a, b = self.complete(**kw), self.complete(**kw)
        self.assertEqual([c.index for c in a.choices], [0, 1])
        self.assertEqual([c.text for c in a.choices], [c.text for c in b.choices])
        self.assertNotEqual(a.choices[0].text, a.choices[1].text)
        self.assertEqual(a.usage.completion_tokens, 20)

    def test_stop_strings(self):
        out = self.complete(stop=[" France"])
        self.assertEqual((out.choices[0].text, out.choices[0].finish_reason), ("The capital of", "stop"))

    def test_logprobs(self):
        out = self.complete(logprobs=2, max_tokens=4)
        lp = out.choices[0].logprobs
        self.assertEqual(out.choices[0].text, "The capital of France")
        self.assertEqual(len(lp.tokens), 4)
        self.assertEqual("".join(lp.tokens), out.choices[0].text)
        self.assertEqual(len(lp.token_logprobs), 4)
        self.assertEqual(len(lp.top_logprobs), 4)
        # Offsets advance by each token's length (their origin may include the prompt).
        self.assertEqual([b - a for a, b in zip(lp.text_offset, lp.text_offset[1:])], [3, 8, 3])
        for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
            self.assertLessEqual(logprob, 0.0)
            self.assertIn(len(top), (2, 3))
            self.assertAlmostEqual(max(top.values()), logprob, places=4)
            self.assertEqual(max(top, key=top.get), token)


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


def raw_head(lines):
    """A request head as bytes, with the key."""
    lines = lines + [f"Host: {BASE_URL.split('//')[1]}"] + [f"{k}: {v}" for k, v in auth_headers().items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def read_all(sock, timeout):
    """Everything the server sends until it closes the connection (or `timeout`)."""
    sock.settimeout(timeout)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


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


def server_pid():
    """The server's process id: `MET_SERVER_PID`, else the process holding the listening
    socket of `MET_BASE_URL`'s port, found through /proc (Linux). None when the server is not
    a process visible here."""
    if os.environ.get("MET_SERVER_PID"):
        return int(os.environ["MET_SERVER_PID"])
    port = _host_port()[1]
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            # local address `HEX_IP:HEX_PORT`, state 0A is LISTEN, then the socket's inode.
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                sockets.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc") if sockets else []):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in sockets:
                    return int(pid)
            except OSError:
                pass
    return None


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



# --- engine faults end the server, never hang it (issue 17) ---------------------------

# The server's test-only fault hook: its model faults on every forward pass after the first N.
FAULT_VAR = "MET_TEST_ENGINE_FAULT"
# Passes before the fault: the stream's prefill is the first, then about a second of decode
# steps (40 ms each in a debug build on two cores) for the JSON request sent after the
# stream's first token to be running too when the fault comes.
FAULT_AFTER_STEPS = 25
# How long a faulted server may take to exit on its own.
FAULT_EXIT_TIMEOUT = 30.0


def met_binary():
    """The `met` binary under test: `MET_BIN`, else the one the suite's server runs (through
    /proc/PID/exe, which stays runnable even when cargo has replaced the file since). None
    when neither is known."""
    if os.environ.get("MET_BIN"):
        return os.environ["MET_BIN"]
    pid = server_pid()
    exe = f"/proc/{pid}/exe"
    return exe if pid is not None and os.access(exe, os.X_OK) else None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MetServe:
    """A `met serve` of a test's own on the default model and a free port, without an API
    key, `env` added to its environment and its output kept in a temporary file. `close`
    kills it if it has not exited by then."""

    def __init__(self, binary, env, *args):
        self.port = free_port()
        self.log = tempfile.TemporaryFile()
        environ = {k: v for k, v in os.environ.items() if k != "MET_API_KEY"}
        environ.update(MET_LOG="info", NO_COLOR="1", RUST_BACKTRACE="0")
        environ.update(env)
        # Exact CPU dots, as the suite's own server: answers are compared with transformers'.
        argv = [binary, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--cpu-dots", "exact", *args]
        self.proc = subprocess.Popen(argv, env=environ, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT)

    def output(self):
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")

    def exit_code(self, timeout):
        """The exit status once the process has ended on its own, or None after `timeout`."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def connect(self, timeout=60.0):
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)

    def http(self, timeout=60.0):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def health(self):
        """The status of GET /health, or None when nothing listens any more."""
        conn = self.http(timeout=5)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status
        except OSError:
            return None
        finally:
            conn.close()

    def wait_ready(self, timeout=60.0):
        deadline = time.monotonic() + timeout
        while self.health() != 200:
            if self.proc.poll() is not None:
                raise AssertionError(f"met serve exited during startup ({self.proc.returncode}):\n{self.output()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"met serve was not ready within {timeout} s:\n{self.output()}")
            time.sleep(0.05)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class TestEngineFaults(LiveTest):
    """An engine-level fault in the real binary, injected through its test-only hook
    (`MET_TEST_ENGINE_FAULT`): the requests running end with an error, a JSON one with an
    OpenAI-shaped 500 and a stream with an error event and `[DONE]`; the server refuses new
    work, turns /health 503, and exits 1 on its own, for a supervisor to restart it."""

    BODY = {"prompt": "Once upon a time", "temperature": 0, "max_tokens": 200, "ignore_eos": True}

    def serve(self, fault, *args):
        binary = met_binary()
        if binary is None:
            self.skipTest("the met binary is not known here (set MET_BIN)")
        server = MetServe(binary, {FAULT_VAR: fault}, *args)
        self.addCleanup(server.close)
        return server

    def run_showing_output(self, server, check):
        """Runs `check`; when it fails, prints what the server said first."""
        try:
            check()
        except BaseException:
            print(f"\nmet serve said:\n{server.output()}", file=sys.stderr, flush=True)
            raise

    def test_a_bad_fault_value_is_a_startup_error(self):
        server = self.serve("panic-after-steps=soon")

        def check():
            self.assertEqual(server.exit_code(FAULT_EXIT_TIMEOUT), 1)
            self.assertIn(f'{FAULT_VAR}="panic-after-steps=soon": expected', server.output())

        self.run_showing_output(server, check)

    def test_a_panic_in_a_step_ends_the_requests_and_the_server(self):
        self.check_fault("panic-after-steps", "the engine panicked: MET_TEST_ENGINE_FAULT: injected panic")

    def test_a_device_error_ends_the_requests_and_the_server(self):
        self.check_fault("error-after-steps", "device error: MET_TEST_ENGINE_FAULT: injected device error")

    def check_fault(self, mode, says):
        # A long drain timeout: the exit must come because the requests ended, not by the clock.
        server = self.serve(f"{mode}={FAULT_AFTER_STEPS}", "--kv-blocks", "64", "--drain-timeout-secs", "300")
        self.run_showing_output(server, lambda: self.expect_fault(server, says))

    def expect_fault(self, server, says):
        server.wait_ready()
        # A request still sending its body when the fault comes: it is answered afterwards.
        late = json.dumps(dict(self.BODY, max_tokens=1)).encode()
        uploading = server.connect()
        self.addCleanup(uploading.close)
        uploading.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          + f"Content-Length: {len(late)}\r\n\r\n".encode() + late[:10])
        # A stream, running once its first token (from the first forward pass) has arrived.
        streaming = server.http()
        self.addCleanup(streaming.close)
        streaming.request("POST", "/v1/completions", json.dumps(dict(self.BODY, stream=True)),
                          {"Content-Type": "application/json"})
        stream = streaming.getresponse()
        self.assertEqual(stream.status, 200)
        first = b""
        while not first.startswith(b"data:"):
            first = stream.readline()
            self.assertTrue(first, "the stream ended before its first event")
        # A JSON request, sent while the stream runs; both are running when the fault comes.
        answer = {}

        def post():
            conn = server.http()
            try:
                conn.request("POST", "/v1/completions", json.dumps(self.BODY), {"Content-Type": "application/json"})
                resp = conn.getresponse()
                answer["resp"] = Response(resp.status, resp.getheaders(), resp.read())
            finally:
                conn.close()

        thread = threading.Thread(target=post, daemon=True)
        thread.start()
        events = sse_events(first + stream.read())
        thread.join(60)
        self.assertIn("resp", answer, "the JSON request got no answer")
        error = self.assert_error(answer["resp"], 500, says)
        self.assertEqual(error["type"], "server_error", answer["resp"])
        # The stream: its first tokens, then one error event, then [DONE].
        self.assertEqual(events[-1], "[DONE]", events)
        self.assertIn("choices", json.loads(events[0]), events)
        last = json.loads(events[-2])
        self.assertIn(says, last.get("error", {}).get("message", ""), events)
        # The server refuses new work and is unhealthy: the request that was still uploading
        # gets a 503, and /health no longer answers 200. (The drain closes the listener at
        # once, so a new connection nearly always finds nothing; 503 is for the rare one that
        # comes between the fault and the drain.)
        uploading.sendall(late[10:])
        head, _, body = read_all(uploading, 30).partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 503"), head)
        self.assertIn("engine", json.loads(body)["error"]["message"], body)
        self.assertIn(server.health(), (503, None))
        # And it exits on its own, with an error and the fault in its last words.
        self.assertEqual(server.exit_code(FAULT_EXIT_TIMEOUT), 1, f"exit within {FAULT_EXIT_TIMEOUT} s")
        self.assertIn(f"error: the engine faulted: {says}", server.output())


if __name__ == "__main__":
    unittest.main(verbosity=2)
