"""Live tests of what agents send `met serve`, with the official clients: structured output
(`response_format` json_schema, whose output must parse and validate on 20 varied prompts),
tool calls, reasoning, the Responses API and Anthropic Messages (with the official
`anthropic` client).

`cargo xtask test` runs this file after `test_openai.py`, against the same server (the
default model, SmolLM2-135M-Instruct). By hand:

    MET_BASE_URL=http://127.0.0.1:8888 MET_API_KEY=KEY python test_agents.py [-k NAME]
"""

import json
import os
import time
import unittest
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import anthropic
import jsonschema
import openai
from openai import OpenAI
from pydantic import BaseModel, Field

BASE_URL = os.environ.get("MET_BASE_URL", "").rstrip("/")
API_KEY = os.environ.get("MET_API_KEY") or "unused"
os.environ["NO_PROXY"] = ",".join(filter(None, [os.environ.get("NO_PROXY"), "127.0.0.1", "localhost"]))
os.environ["no_proxy"] = os.environ["NO_PROXY"]
TIMEOUT = 300.0
MODEL = None


def setUpModule():
    global MODEL
    if not BASE_URL:
        raise RuntimeError("MET_BASE_URL is not set (e.g. http://127.0.0.1:8888); `cargo xtask test` sets it")
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(BASE_URL + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{BASE_URL}/health did not answer 200 within 60 s")
        time.sleep(0.25)
    MODEL = os.environ.get("MET_MODEL") or new_client().models.list().data[0].id


def new_client():
    return OpenAI(base_url=BASE_URL + "/v1", api_key=API_KEY, max_retries=0, timeout=TIMEOUT)


# --- structured output ------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {
        "location": {"type": "string", "maxLength": 30},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "temperature": {"type": "integer", "minimum": -60, "maximum": 60},
    },
    "required": ["location", "unit", "temperature"],
    "additionalProperties": False,
}
TODO = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 30},
        "items": {"type": "array", "items": {"type": "string", "maxLength": 24}, "minItems": 1, "maxItems": 3},
        "done": {"type": "boolean"},
    },
    "required": ["title", "items", "done"],
    "additionalProperties": False,
}
VERDICT = {
    "type": "object",
    "properties": {
        "answer": {"type": "boolean"},
        "confidence": {"enum": ["low", "medium", "high"]},
        "reason": {"type": "string", "maxLength": 60},
    },
    "required": ["answer", "confidence", "reason"],
    "additionalProperties": False,
}
BOOK = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "author": {"type": "string", "maxLength": 30},
        "year": {"type": "integer", "minimum": 1000, "maximum": 2100},
        "genres": {"type": "array", "items": {"enum": ["fiction", "science", "history", "poetry"]}, "maxItems": 2},
    },
    "required": ["title", "author", "year"],
    "additionalProperties": False,
}
CASES = [
    ("Describe a person called Alice who is 30 years old.", PERSON),
    ("Who is the oldest person you can imagine? Answer as JSON.", PERSON),
    ("Make up a character for a children's story.", PERSON),
    ("Tell me about Paris.", CITY),
    ("What is the capital of Japan and how many people live there?", CITY),
    ("Describe a small town in Canada.", CITY),
    ("Give me a random city in Africa.", CITY),
    ("What is the weather like in London today?", WEATHER),
    ("It is very hot in Phoenix. Report the weather.", WEATHER),
    ("Report a freezing winter day in Oslo in fahrenheit.", WEATHER),
    ("Plan my morning.", TODO),
    ("I need to buy milk, eggs and bread.", TODO),
    ("List the steps to bake a cake.", TODO),
    ("Is the sky blue?", VERDICT),
    ("Can fish climb trees?", VERDICT),
    ("Is 7 a prime number? Explain briefly.", VERDICT),
    ("Recommend a classic novel.", BOOK),
    ("Tell me about a history book.", BOOK),
    ("What is a good poetry collection?", BOOK),
    ("Invent a science fiction book published in 2050.", BOOK),
]


class Pet(BaseModel):
    name: str = Field(max_length=20)
    species: str = Field(max_length=12)
    legs: int = Field(ge=0, le=8)


class TestStructuredOutput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = new_client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def ask(self, prompt, schema, **kw):
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
        args = dict(model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=200, response_format=fmt)
        args.update(kw)
        return self.client.chat.completions.create(**args)

    def test_json_schema_output_parses_and_validates_on_20_prompts(self):
        self.assertEqual(len(CASES), 20)
        # Half greedy, half sampled; all at once, so the engine batches constrained rows.
        def run(i):
            prompt, schema = CASES[i]
            extra = {"temperature": 0.0} if i % 2 == 0 else {"temperature": 0.8, "seed": i}
            return self.ask(prompt, schema, **extra)

        with ThreadPoolExecutor(max_workers=10) as pool:
            answers = list(pool.map(run, range(len(CASES))))
        for (prompt, schema), out in zip(CASES, answers):
            choice = out.choices[0]
            self.assertEqual(choice.finish_reason, "stop", (prompt, choice.message.content))
            value = json.loads(choice.message.content)
            jsonschema.validate(value, schema)

    def test_streamed_json_schema_output_validates(self):
        stream = self.ask(CASES[3][0], CITY, temperature=0.0, stream=True)
        text, finish = "", None
        for chunk in stream:
            for c in chunk.choices:
                text += c.delta.content or ""
                finish = c.finish_reason or finish
        self.assertEqual(finish, "stop", text)
        jsonschema.validate(json.loads(text), CITY)
        # The same as the non-streamed answer.
        self.assertEqual(self.ask(CASES[3][0], CITY, temperature=0.0).choices[0].message.content, text)

    def test_the_clients_parse_helper_gets_its_model(self):
        out = self.client.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "Describe a spider."}],
            response_format=Pet,
            max_tokens=120,
            temperature=0.0,
        )
        pet = out.choices[0].message.parsed
        self.assertIsInstance(pet, Pet)
        self.assertLessEqual(pet.legs, 8)

    def test_json_object_and_vllm_structured_outputs(self):
        out = self.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Answer yes or no: is water wet?"}],
            max_tokens=10,
            temperature=0.0,
            extra_body={"structured_outputs": {"choice": ["yes", "no"]}},
        )
        self.assertIn(out.choices[0].message.content, ["yes", "no"])
        out = self.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Write a US phone number."}],
            max_tokens=20,
            temperature=0.0,
            extra_body={"structured_outputs": {"regex": r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"}},
        )
        self.assertRegex(out.choices[0].message.content, r"^\([0-9]{3}\) [0-9]{3}-[0-9]{4}$")

    def test_an_invalid_schema_is_a_400_naming_it(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            self.ask("hi", {"type": "object", "properties": {"a": {"type": "strnig"}}})
        error = caught.exception.body
        self.assertEqual(error["param"], "response_format.json_schema.schema", error)
        self.assertIn("strnig", error["message"], error)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"structured_outputs": {"regex": "(unclosed"}},
            )
        self.assertEqual(caught.exception.body["param"], "structured_outputs.regex")


# --- tool calls -------------------------------------------------------------------------

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 20}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris right now?"}]


class TestToolCalls(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = new_client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def create(self, **kw):
        args = dict(model=MODEL, messages=ASK_WEATHER, tools=[WEATHER_TOOL, TIME_TOOL], max_tokens=120, temperature=0.0)
        args.update(kw)
        return self.client.chat.completions.create(**args)

    def assert_valid_calls(self, calls):
        self.assertTrue(calls)
        for call in calls:
            self.assertEqual(call.type, "function")
            self.assertTrue(call.id.startswith("call_"), call.id)
            self.assertIn(call.function.name, SCHEMAS)
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])

    def test_a_named_choice_calls_it_with_arguments_matching_its_schema(self):
        out = self.create(tool_choice={"type": "function", "function": {"name": "get_weather"}})
        message = out.choices[0].message
        self.assertEqual(len(message.tool_calls), 1, message)
        self.assertEqual(message.tool_calls[0].function.name, "get_weather")
        self.assert_valid_calls(message.tool_calls)
        self.assertIsNone(message.content)

    def test_required_calls_parse_and_match_on_several_prompts(self):
        prompts = ["What time is it in Tokyo?", "Weather in Berlin, in fahrenheit?", "Hello!", "Tell me a joke."]

        def run(p):
            return self.create(messages=[{"role": "user", "content": p}], tool_choice="required", max_tokens=200)

        with ThreadPoolExecutor(max_workers=4) as pool:
            for out in pool.map(run, prompts):
                self.assertEqual(out.choices[0].finish_reason, "tool_calls", out)
                self.assert_valid_calls(out.choices[0].message.tool_calls)

    def test_streamed_tool_call_deltas_assemble_into_the_call(self):
        stream = self.create(tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
        calls, finish = {}, None
        for chunk in stream:
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for d in choice.delta.tool_calls or []:
                    entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                    entry["id"] = d.id or entry["id"]
                    if d.function and d.function.name:
                        entry["name"] = d.function.name
                    if d.function and d.function.arguments:
                        entry["arguments"] += d.function.arguments
        self.assertEqual(list(calls), [0])
        self.assertEqual(calls[0]["name"], "get_weather")
        self.assertTrue(calls[0]["id"].startswith("call_"))
        jsonschema.validate(json.loads(calls[0]["arguments"]), SCHEMAS["get_weather"])
        self.assertEqual(finish, "stop")
        # The same call as the JSON answer (greedy).
        out = self.create(tool_choice={"type": "function", "function": {"name": "get_weather"}})
        self.assertEqual(out.choices[0].message.tool_calls[0].function.arguments, calls[0]["arguments"])

    def test_auto_parses_a_hermes_call_out_of_the_text_streamed_or_not(self):
        # A grammar makes the small model answer in the Hermes format the parser reads.
        call = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,9}", "unit": "celsius"\}\}\n</tool_call>'
        extra = {"structured_outputs": {"regex": call}}
        out = self.create(extra_body=extra)
        self.assertEqual(out.choices[0].finish_reason, "tool_calls", out)
        self.assert_valid_calls(out.choices[0].message.tool_calls)
        names = []
        for chunk in self.create(extra_body=extra, stream=True):
            for choice in chunk.choices:
                names += [d.function.name for d in choice.delta.tool_calls or [] if d.function and d.function.name]
        self.assertEqual(names, ["get_weather"])

    def test_a_tool_result_round_trip_renders_and_answers(self):
        first = self.create(tool_choice={"type": "function", "function": {"name": "get_weather"}})
        call = first.choices[0].message.tool_calls[0]
        messages = ASK_WEATHER + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})},
        ]
        out = self.create(messages=messages, max_tokens=24)
        self.assertIsInstance(out.choices[0].message.content, str)
        self.assertTrue(out.choices[0].message.content)

    def test_bad_tool_requests_are_400s_naming_the_field(self):
        with self.assertRaises(openai.BadRequestError) as caught:
            self.create(tool_choice={"type": "function", "function": {"name": "missing"}})
        self.assertEqual(caught.exception.body["param"], "tool_choice")
        with self.assertRaises(openai.BadRequestError) as caught:
            self.create(tools=[{"type": "function", "function": {"name": "bad name"}}])
        self.assertEqual(caught.exception.body["param"], "tools[0].function.name")


# --- reasoning --------------------------------------------------------------------------


class TestReasoning(unittest.TestCase):
    """`cargo xtask test` serves with `--reasoning-parser qwen3`."""

    @classmethod
    def setUpClass(cls):
        cls.client = new_client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def test_think_blocks_become_reasoning_content_streamed_or_not(self):
        answer = r"<think>[a-z ]{5,30}</think>\n\nParis\."
        args = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "Capital of France?"}],
            max_tokens=60,
            temperature=0.0,
            extra_body={"structured_outputs": {"regex": answer}, "chat_template_kwargs": {"enable_thinking": True}},
        )
        # A first request fills the prefix cache, so that the two compared below compute
        # their prompts the same way: on a bf16 GPU a prefix hit rounds differently from a
        # full prefill, and a near tie between allowed tokens can then go the other way.
        self.client.chat.completions.create(**args)
        out = self.client.chat.completions.create(**args).choices[0].message
        reasoning = out.model_extra.get("reasoning_content")
        self.assertRegex(reasoning or "", r"^[a-z ]{5,30}$", out)
        self.assertEqual(out.content, "Paris.")
        streamed, content = "", ""
        for chunk in self.client.chat.completions.create(stream=True, **args):
            for choice in chunk.choices:
                streamed += (choice.delta.model_extra or {}).get("reasoning_content") or ""
                content += choice.delta.content or ""
        self.assertEqual((streamed, content), (reasoning, "Paris."))

    def test_plain_answers_keep_their_content(self):
        out = self.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "What is the capital of France?"}], max_tokens=8, temperature=0.0
        )
        self.assertTrue(out.choices[0].message.content.startswith("The capital"), out)
        self.assertIsNone((out.choices[0].message.model_extra or {}).get("reasoning_content"))


# --- the Responses API --------------------------------------------------------------------


class TestResponses(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = new_client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    QUESTION = "What is the capital of France?"

    def chat_answer(self, messages, max_tokens):
        out = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0.0)
        return out.choices[0].message.content

    def test_create_answers_as_chat_does(self):
        resp = self.client.responses.create(model=MODEL, input=self.QUESTION, max_output_tokens=12, temperature=0.0)
        self.assertEqual(resp.object, "response")
        self.assertTrue(resp.id.startswith("resp_"))
        self.assertEqual(resp.output_text, self.chat_answer([{"role": "user", "content": self.QUESTION}], 12))
        self.assertGreater(resp.usage.input_tokens, 0)
        self.assertGreater(resp.usage.output_tokens, 0)

    def test_streaming_events_add_up_to_the_answer(self):
        kinds, deltas, final = [], "", None
        with self.client.responses.create(
            model=MODEL, input=self.QUESTION, instructions="Answer in one sentence.", max_output_tokens=12,
            temperature=0.0, stream=True,
        ) as stream:
            for event in stream:
                kinds.append(event.type)
                if event.type == "response.output_text.delta":
                    deltas += event.delta
                if event.type == "response.completed":
                    final = event.response
        self.assertEqual(kinds[0], "response.created")
        self.assertEqual(kinds[-1], "response.completed")
        self.assertIn("response.output_item.added", kinds)
        self.assertEqual(final.output_text, deltas)
        want = self.chat_answer(
            [{"role": "system", "content": "Answer in one sentence."}, {"role": "user", "content": self.QUESTION}], 12)
        self.assertEqual(deltas, want)

    def test_function_calls_and_previous_response_id(self):
        tool = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
                "parameters": WEATHER_TOOL["function"]["parameters"]}
        first = self.client.responses.create(
            model=MODEL, input="What is the weather in Paris?", tools=[tool],
            tool_choice={"type": "function", "name": "get_weather"}, max_output_tokens=80, temperature=0.0,
        )
        calls = [item for item in first.output if item.type == "function_call"]
        self.assertEqual(len(calls), 1, first.output)
        self.assertEqual(calls[0].name, "get_weather")
        jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS["get_weather"])
        second = self.client.responses.create(
            model=MODEL, previous_response_id=first.id, tools=[tool], max_output_tokens=16, temperature=0.0,
            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees, clear"}],
        )
        self.assertTrue(second.output_text, second.output)
        with self.assertRaises(openai.NotFoundError) as caught:
            self.client.responses.create(model=MODEL, input="hi", previous_response_id="resp_missing")
        self.assertEqual(caught.exception.body["param"], "previous_response_id")

    def test_text_format_json_schema_validates(self):
        resp = self.client.responses.create(
            model=MODEL, input=CASES[3][0], max_output_tokens=200, temperature=0.0,
            text={"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}},
        )
        jsonschema.validate(json.loads(resp.output_text), CITY)
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.responses.create(
                model=MODEL, input="hi", text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}})
        self.assertEqual(caught.exception.body["param"], "text.format.schema")



# --- Anthropic Messages -------------------------------------------------------------------


# This client no longer takes `temperature`; greedy answers ask for it in the body.
GREEDY = {"temperature": 0.0}


class TestAnthropicMessages(unittest.TestCase):
    QUESTION = [{"role": "user", "content": "What is the capital of France?"}]

    @classmethod
    def setUpClass(cls):
        cls.client = anthropic.Anthropic(base_url=BASE_URL, api_key=API_KEY, max_retries=0, timeout=TIMEOUT)
        cls.openai = new_client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.openai.close()

    def chat_answer(self, max_tokens):
        out = self.openai.chat.completions.create(model=MODEL, messages=self.QUESTION, max_tokens=max_tokens, temperature=0.0)
        return out.choices[0].message.content, out.usage.prompt_tokens

    def test_create_answers_as_chat_does_and_counts_tokens(self):
        msg = self.client.messages.create(model=MODEL, max_tokens=12, messages=self.QUESTION, extra_body=GREEDY)
        self.assertEqual(msg.type, "message")
        self.assertEqual(msg.content[0].type, "text")
        want, prompt_tokens = self.chat_answer(12)
        self.assertEqual(msg.content[0].text, want)
        self.assertIn(msg.stop_reason, ("end_turn", "max_tokens"))
        self.assertEqual(msg.usage.input_tokens, prompt_tokens)
        counted = self.client.messages.count_tokens(model=MODEL, messages=self.QUESTION)
        self.assertEqual(counted.input_tokens, prompt_tokens)

    def test_streaming_adds_up_to_the_message(self):
        with self.client.messages.stream(model=MODEL, max_tokens=12, messages=self.QUESTION, extra_body=GREEDY) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        self.assertEqual(final.content[0].text, text)
        self.assertEqual(text, self.chat_answer(12)[0])
        self.assertIn(final.stop_reason, ("end_turn", "max_tokens"))

    def test_tool_use_and_tool_result(self):
        tool = {"name": "get_weather", "description": "Current weather in a city.",
                "input_schema": WEATHER_TOOL["function"]["parameters"]}
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        msg = self.client.messages.create(
            model=MODEL, max_tokens=80, messages=ask, tools=[tool], tool_choice={"type": "tool", "name": "get_weather"},
            extra_body=GREEDY,
        )
        uses = [b for b in msg.content if b.type == "tool_use"]
        self.assertEqual(len(uses), 1, msg.content)
        self.assertEqual(uses[0].name, "get_weather")
        jsonschema.validate(uses[0].input, SCHEMAS["get_weather"])
        self.assertEqual(msg.stop_reason, "tool_use")
        follow = ask + [
            {"role": "assistant", "content": [b.model_dump() for b in msg.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 degrees, clear"}]},
        ]
        out = self.client.messages.create(model=MODEL, max_tokens=16, messages=follow, tools=[tool], extra_body=GREEDY)
        self.assertTrue(any(b.type == "text" and b.text for b in out.content), out.content)

    def test_errors_are_anthropic_shaped(self):
        with self.assertRaises(anthropic.BadRequestError) as caught:
            self.client.messages.create(model=MODEL, max_tokens=0, messages=self.QUESTION)
        self.assertEqual(caught.exception.body["error"]["type"], "invalid_request_error")
        self.assertIn("max_tokens", caught.exception.body["error"]["message"])
        # Refused before the handler runs: still Anthropic's shape, which the client reads.
        wrong_key = anthropic.Anthropic(base_url=BASE_URL, api_key="not-the-key", max_retries=0, timeout=TIMEOUT)
        with self.assertRaises(anthropic.AuthenticationError) as caught:
            wrong_key.messages.create(model=MODEL, max_tokens=4, messages=self.QUESTION)
        wrong_key.close()
        self.assertEqual(caught.exception.body["error"]["type"], "authentication_error")

    def test_a_matched_stop_sequence_is_reported(self):
        text = self.client.messages.create(model=MODEL, max_tokens=24, messages=self.QUESTION, extra_body=GREEDY).content[0].text
        words = text.split()
        self.assertGreater(len(words), 2, text)
        stop = " " + words[2]
        cut = text[: text.find(stop)]
        msg = self.client.messages.create(
            model=MODEL, max_tokens=24, messages=self.QUESTION, stop_sequences=[stop], extra_body=GREEDY
        )
        self.assertEqual((msg.stop_reason, msg.stop_sequence), ("stop_sequence", stop))
        self.assertEqual(msg.content[0].text, cut)


if __name__ == "__main__":
    unittest.main(verbosity=2)
