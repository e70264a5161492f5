"""The template fixtures of `scripts/smollm2_reference.py`: every conversation below rendered by
every *.jinja template of crates/server/tests/fixtures/templates/ with transformers'
`apply_chat_template`, written to the reference.json beside them.

A module the script imports, not a script: `python scripts/smollm2_reference.py --only templates`
writes this fixture alone. The inputs are fixed, so the fixture changes only with the templates,
the library versions and the date that `strftime_now` renders.
"""

from __future__ import annotations

import datetime

from fixture_json import FIXTURES, sorted_keys, versions

TEMPLATES_DIR = FIXTURES / "templates"
TEMPLATES_OUT = TEMPLATES_DIR / "reference.json"

# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------

# Templates: every conversation is rendered with every template.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city (°C or °F). Use when asked about <weather> & 'climate'.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert an amount between currencies.",
            "parameters": {
                "type": "object",
                "properties": {
                    "amount": {"type": "number", "minimum": 0.01, "default": 1},
                    "from": {"type": "string"},
                    "to": {"type": "string"},
                },
                "required": ["amount", "from", "to"],
            },
            "strict": True,
        },
    },
]

DATE_STRING = "26 Jul 2024"

TEMPLATE_CONVERSATIONS = [
    {
        "name": "system_user",
        "messages": [
            {"role": "system", "content": "  You are terse.\n"},
            {"role": "user", "content": "Hello there!  How are you?"},
        ],
        "add_generation_prompt": True,
        "kwargs": {"date_string": DATE_STRING},
    },
    {
        "name": "multi_turn",
        "messages": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": " It is 4. "},
            {"role": "user", "content": "/double that\nplease"},
        ],
        "add_generation_prompt": True,
        "kwargs": {"date_string": DATE_STRING},
    },
    {
        "name": "no_generation_prompt",
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Thanks!"},
            {"role": "assistant", "content": "You're welcome — ¡de nada! 😊"},
        ],
        "add_generation_prompt": False,
        "kwargs": {"date_string": DATE_STRING},
    },
    {
        "name": "with_tools",
        "messages": [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "Weather in Zürich?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}},
                    }
                ],
            },
            {"role": "tool", "content": '{"temp": 21.5, "sky": "clear <sunny>"}'},
        ],
        "tools": TOOLS,
        "add_generation_prompt": True,
        "kwargs": {"date_string": DATE_STRING},
    },
    {
        "name": "content_parts",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Answer briefly. "}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": " Second part."}],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "Noted."}]},
            {"role": "user", "content": [{"type": "text", "text": "  Now summarise.  "}]},
        ],
        "add_generation_prompt": True,
        "kwargs": {"date_string": DATE_STRING},
    },
    {
        "name": "assistant_prefill",
        "messages": [
            {"role": "user", "content": "Name a fruit."},
            {"role": "assistant", "content": "A good one is "},
        ],
        "add_generation_prompt": False,
        "continue_final_message": True,
        "kwargs": {"date_string": DATE_STRING},
    },
    {
        "name": "bad_role",
        "messages": [
            {"role": "user", "content": "Tell me a story."},
            {"role": "narrator", "content": "Once upon a time..."},
        ],
        "add_generation_prompt": True,
        "kwargs": {"date_string": DATE_STRING},
    },
    {
        "name": "date_from_strftime_now",
        "messages": [{"role": "user", "content": "What day is it?"}],
        "add_generation_prompt": True,
        "kwargs": {},
    },
]

TEMPLATE_NAMES = ["bracket_turns", "namespace_system", "json_tools", "parts_prefill"]
STRFTIME_FORMAT = "%d %b %Y"


# ---------------------------------------------------------------------------------------------------
# Template fixtures
# ---------------------------------------------------------------------------------------------------


def templates_reference(tok, command: str) -> dict:
    import jinja2

    templates = {}
    for name in TEMPLATE_NAMES:
        templates[name] = (TEMPLATES_DIR / f"{name}.jinja").read_text(encoding="utf-8")

    today = datetime.datetime.now()
    cases = []
    for conv in TEMPLATE_CONVERSATIONS:
        messages = sorted_keys(conv["messages"])
        tools = sorted_keys(conv.get("tools")) if conv.get("tools") is not None else None
        agp = conv.get("add_generation_prompt", False)
        cont = conv.get("continue_final_message", False)
        kwargs = conv.get("kwargs", {})
        renderings = {}
        for name, source in templates.items():
            before = datetime.datetime.now().strftime(STRFTIME_FORMAT)
            try:
                text = tok.apply_chat_template(
                    messages,
                    chat_template=source,
                    tools=tools,
                    tokenize=False,
                    add_generation_prompt=agp,
                    continue_final_message=cont,
                    **kwargs,
                )
                result = {"rendered": text}
                after = datetime.datetime.now().strftime(STRFTIME_FORMAT)
                if "date_string" not in kwargs and before in text:
                    if before != after:
                        raise RuntimeError("the date changed during rendering; run again")
                    result["strftime_now_date"] = before
            except jinja2.exceptions.TemplateError as err:
                result = {"error": {"type": type(err).__name__, "message": str(err)}}
            except ValueError as err:
                result = {"error": {"type": type(err).__name__, "message": str(err)}}
            renderings[name] = result
        cases.append(
            {
                "name": conv["name"],
                "messages": messages,
                "tools": tools,
                "add_generation_prompt": agp,
                "continue_final_message": cont,
                "extra_kwargs": kwargs,
                "renderings": renderings,
            }
        )
    special = tok.special_tokens_map
    return {
        "meta": {
            "generated_on": today.date().isoformat(),
            "command": command,
            "versions": versions(),
            "render": "tokenizer.apply_chat_template(messages, chat_template=TEMPLATE, tools=tools, tokenize=False, "
            "add_generation_prompt=..., continue_final_message=..., **extra_kwargs) with the SmolLM2 GGUF "
            "tokenizer; jinja2 ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)",
            "strftime_now_format": STRFTIME_FORMAT,
            "date_string": DATE_STRING,
        },
        "template_kwargs": {k: special[k] for k in sorted(special)},
        "templates": {name: f"{name}.jinja" for name in TEMPLATE_NAMES},
        "cases": cases,
    }
