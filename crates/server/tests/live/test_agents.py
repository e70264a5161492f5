"""Live tests of what agents send `met serve`, with the official clients: structured output
(`response_format` json_schema, whose output must parse and validate on 20 varied prompts),
and, as they land, tool calls, reasoning, the Responses API and Anthropic Messages.

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


if __name__ == "__main__":
    unittest.main(verbosity=2)
