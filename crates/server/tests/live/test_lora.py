"""Live tests of LoRA adapters on `met serve` (started with `--enable-lora --max-loras 2`),
with the official `openai` client: an adapter loaded at run time is listed under the base
model, answers differently from it and deterministically at temperature 0, streamed or not,
keeps a running stream unchanged when it is unloaded, takes new weights under its name with
`load_inplace`, and every bad load or unload is an OpenAI-shaped 400 or 404 naming what is
wrong.

The adapters are written here, in PEFT's format (`adapter_config.json` and
`adapter_model.safetensors`, the safetensors file by hand: a length, a JSON header, raw
little-endian floats), with seeded random weights for SmolLM2-135M's shapes. Every test
unloads what it loaded, so the suites after this one see the base model alone.

    MET_BASE_URL=http://127.0.0.1:8888 MET_API_KEY=KEY python test_lora.py [-k NAME]
"""

import json
import random
import struct
import sys
import tempfile
import unittest
from array import array
from pathlib import Path

import openai

import live_common
from live_common import ANSWER, LiveTest, metrics, raw

MODEL = None  # set by setUpModule

# SmolLM2-135M: 30 layers, hidden size 576, 9 query and 3 key-value heads of 64.
LAYERS, HIDDEN, KV = 30, 576, 3 * 64
# The projections an adapter adapts, with their (in, out) sizes.
SHAPES = {"q_proj": (HIDDEN, HIDDEN), "v_proj": (HIDDEN, KV)}


def setUpModule():
    global MODEL
    MODEL = live_common.connect()


def write_safetensors(path, tensors):
    """`tensors` ({name: (shape, floats)}) as a safetensors file of F32 tensors."""
    header, blobs, offset = {}, [], 0
    for name, (shape, values) in tensors.items():
        data = array("f", values)
        if sys.byteorder != "little":
            data.byteswap()
        blob = data.tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def write_adapter(directory, seed, rank=8, layers=LAYERS, weights=True):
    """A PEFT LoRA adapter on q_proj and v_proj of the first `layers` layers, with weights
    drawn from `seed` (B non-zero, so it changes the model); no weights file unless
    `weights`."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(SHAPES)}
    (directory / "adapter_config.json").write_text(json.dumps(config))
    if not weights:
        return directory
    rng = random.Random(seed)
    tensors = {}
    for layer in range(layers):
        for module, (inputs, outputs) in SHAPES.items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = [rng.uniform(-0.08, 0.08) for _ in range(rank * inputs)]
            b = [rng.uniform(-0.08, 0.08) for _ in range(outputs * rank)]
            tensors[f"{prefix}.lora_A.weight"] = ((rank, inputs), a)
            tensors[f"{prefix}.lora_B.weight"] = ((outputs, rank), b)
    write_safetensors(directory / "adapter_model.safetensors", tensors)
    return directory


class LoraTest(LiveTest):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.TemporaryDirectory(prefix="met-live-lora-")
        cls.dir = Path(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        super().tearDownClass()

    def load(self, name, path):
        return raw("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})

    def unload(self, name):
        return raw("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def loaded(self, name, path):
        """Loads `path` as `name`, to be unloaded when the test ends."""
        resp = self.load(name, path)
        self.assertEqual(resp.status, 200, resp)
        self.addCleanup(self.unload, name)
        return resp

    def answer(self, model, **kw):
        return self.chat(model=model, max_tokens=12, **kw).choices[0].message.content


class TestAdapters(LoraTest):
    def test_load_use_list_unload(self):
        path = write_adapter(self.dir / "style", seed=1)
        resp = self.loaded("style", path)
        self.assertEqual(resp.text, "Success: LoRA adapter 'style' added successfully.")
        self.assertEqual(metrics().get("met_lora_adapters_loaded"), 1)

        models = self.client.models.list().data
        self.assertEqual(models[0].id, MODEL, "the base model comes first")
        card = next(m for m in models if m.id == "style")
        self.assertEqual((card.parent, card.root), (MODEL, str(path)))

        out = self.chat(model="style", max_tokens=12)
        self.assertEqual(out.model, "style")
        text = out.choices[0].message.content
        self.assertFalse(ANSWER.startswith(text), f"the adapter changes the answer: {text!r}")
        self.assertEqual(self.answer("style"), text, "greedy answers through an adapter repeat")
        stream = self.chat(model="style", max_tokens=12, stream=True)
        streamed, finish, _, _ = self.collect_chat_stream(stream)
        self.assertEqual(streamed[0], text)
        self.assert_serving()

        resp = self.unload("style")
        self.assertEqual((resp.status, resp.text), (200, "Success: LoRA adapter 'style' removed successfully."))
        self.assertEqual(metrics().get("met_lora_adapters_loaded"), 0)
        with self.assertRaises(openai.NotFoundError):
            self.chat(model="style", max_tokens=2)
        self.assertNotIn("style", [m.id for m in self.client.models.list().data])

    def test_two_adapters_answer_apart(self):
        self.loaded("one", write_adapter(self.dir / "one", seed=2))
        self.loaded("two", write_adapter(self.dir / "two", seed=3))
        one, two = self.answer("one"), self.answer("two")
        self.assertNotEqual(one, two, "different weights, different answers")
        self.assertEqual(self.complete(model="one", max_tokens=4).model, "one")
        self.assert_serving()

    def test_unloading_leaves_a_running_stream_unchanged(self):
        path = write_adapter(self.dir / "story", seed=4)
        self.loaded("story", path)
        want = self.chat(model="story", max_tokens=24).choices[0].message.content
        stream = self.chat(model="story", max_tokens=24, stream=True)
        chunks = iter(stream)
        text = ""
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                break
        self.assertEqual(self.unload("story").status, 200)
        for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        self.assertEqual(text, want)

    def test_load_inplace_swaps_the_weights_behind_a_name(self):
        first, second = write_adapter(self.dir / "v1", seed=2), write_adapter(self.dir / "v2", seed=3)
        self.loaded("policy", first)
        before = self.answer("policy")
        self.loaded("fresh", second)
        want = self.answer("fresh")
        self.assertNotEqual(before, want, "the two weights answer apart")
        body = {"lora_name": "policy", "lora_path": str(second), "load_inplace": True}
        resp = raw("POST", "/v1/load_lora_adapter", body)
        self.assertEqual(resp.status, 200, resp)
        self.assertEqual(self.answer("policy"), want, "the name now answers with the new weights")
        self.assertEqual(metrics().get("met_lora_adapters_loaded"), 2, "replaced, not added")
        self.assert_serving()


class TestAdapterErrors(LoraTest):
    def test_bad_adapters_are_400s_naming_the_fault(self):
        resp = self.load("gone", self.dir / "nowhere")
        self.assert_error(resp, 400, "adapter_config.json")
        no_weights = write_adapter(self.dir / "no-weights", seed=5, weights=False)
        self.assert_error(self.load("half", no_weights), 400, "adapter_model.safetensors")
        big = write_adapter(self.dir / "big", seed=6, rank=32, layers=1)
        self.assert_error(self.load("big", big), 400, "rank 32", "--max-lora-rank 16")
        self.assert_error(raw("POST", "/v1/load_lora_adapter", {"lora_path": str(big)}), 400, "lora_name")
        self.assertEqual(metrics().get("met_lora_adapters_loaded"), 0, "nothing was loaded")
        self.assert_serving()

    def test_duplicate_unknown_and_over_the_limit(self):
        path = write_adapter(self.dir / "dup", seed=7, layers=2)
        self.loaded("dup", path)
        self.assert_error(self.load("dup", path), 400, "`dup` is already loaded")
        self.assert_error(self.load(MODEL, path), 400, "base model")
        self.loaded("dup2", path)
        self.assert_error(self.load("dup3", path), 400, "--max-loras")
        self.assert_error(self.unload("never-loaded"), 404, "never-loaded")
        with self.assertRaises(openai.NotFoundError):
            self.chat(model="dup3", max_tokens=2)
        self.assert_serving()


if __name__ == "__main__":
    unittest.main()
