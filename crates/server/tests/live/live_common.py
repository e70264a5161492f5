"""What the live suites of `met serve` share: the server's address and key, the reference
answers, raw HTTP (stdlib `http.client`) for what the official `openai` client would hide
(malformed bodies, methods, status codes, SSE framing, /metrics), and `LiveTest`, the base of
every test class, with its shared assertions.

`cargo xtask test` starts the server, runs each `test_*.py` beside this file in a virtualenv
holding `requirements.txt`, one after the other, then stops the server with SIGTERM. By hand,
against a running server, one suite at a time:

    MET_BASE_URL=http://127.0.0.1:8888 MET_API_KEY=KEY python test_openai.py [-k NAME]

The model is SmolLM2-135M-Instruct (`met`'s embedded default). Expected texts and ids come
from `../fixtures/smollm2/reference.json` (transformers' greedy decoding of the same model,
see the README beside it): greedy answers are deterministic, so the tests compare exact text.
Generation is slow in a debug build on two cores, so every request asks for few tokens.

Each test module calls `connect()` from its own `setUpModule` and keeps the model's name in
a `MODEL` of its own, which its test bodies read; `LiveTest` reads the one here.
"""

import http.client
import json
import os
import re
import time
import unittest
import urllib.parse
from pathlib import Path

from openai import OpenAI

BASE_URL = os.environ.get("MET_BASE_URL", "").rstrip("/")
API_KEY = os.environ.get("MET_API_KEY") or None
# Loopback traffic must not go through a proxy from the environment.
os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1", "localhost"]))
os.environ["no_proxy"] = os.environ["NO_PROXY"]

TIMEOUT = 120.0

REFERENCE = json.loads((Path(__file__).parent.parent / "fixtures/smollm2/reference.json").read_text())
CASE = next(c for c in REFERENCE["chat"] if c["name"] == "user_capital")
QUESTION = CASE["messages"]
ANSWER = CASE["generated_text"]  # "The capital of France is Paris."
RENDERED = CASE["rendered"]  # the chat template's output for QUESTION
PROMPT_IDS = CASE["prompt_ids"]  # 37 ids
EOS_ID = REFERENCE["special"]["eos_token_id"]
ANSWER_IDS = [t for t in CASE["generated_ids"] if t != EOS_ID]
STORY = [{"role": "user", "content": "Write a long story about a brave dragon and a little girl."}]

MODEL = None  # set by connect() from GET /v1/models


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



def connect():
    """Waits until the server answers /health, then names the model it serves: sets `MODEL`
    here, which `LiveTest` reads, and returns it for the test module's own `MODEL`."""
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
    return MODEL


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


# --- raw sockets, and the server's process --------------------------------------------


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
