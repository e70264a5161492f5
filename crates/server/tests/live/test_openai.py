"""Live tests of the OpenAI API of `met serve`, with the official `openai` client: the
server's own endpoints (/health, /v1/models, /metrics, /tokenize), then chat and text
completions, streamed or not, with `n`, seeds, stop strings and logprobs, whose greedy answers
are compared with transformers' exact text (`live_common.py` says where it comes from).

    MET_BASE_URL=http://127.0.0.1:8888 MET_API_KEY=KEY python test_openai.py [-k NAME]
"""

import json
import unittest

import live_common
from live_common import (
    ANSWER,
    ANSWER_IDS,
    PROMPT_IDS,
    QUESTION,
    RENDERED,
    STORY,
    LiveTest,
    metrics,
    raw,
    sse_events,
)

MODEL = None  # set by setUpModule


def setUpModule():
    global MODEL
    MODEL = live_common.connect()


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


if __name__ == "__main__":
    unittest.main(verbosity=2)
