#!/usr/bin/env python3
"""Expected harmony renderings of chat requests, from gpt-oss's own chat template.

Reads tests/fixtures/harmony/chat_template.jinja (the `chat_template.jinja` of the Hugging Face
repositories openai/gpt-oss-20b and openai/gpt-oss-120b, Apache-2.0) and writes
tests/fixtures/harmony/renderings.json: for each case the OpenAI-style request body the server
receives, the date the template's `strftime_now` returns, and the text the template renders.
`tests/harmony_template.rs` sends each request through mxtune's chat rendering and compares
token ids with the expected text.

The Jinja environment is set up as Hugging Face transformers sets it up for
`apply_chat_template`: trim_blocks, lstrip_blocks, the loop-controls extension, a `tojson`
that keeps key order and non-ASCII text (Python's json.dumps defaults otherwise), and
`raise_exception` / `strftime_now` globals. As vLLM does before applying a template, the
OpenAI `arguments` string of each tool call is parsed into an object first.

Run: pip install jinja2 && python3 tools/make_harmony_fixtures.py
"""

import copy
import json
import pathlib

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "harmony"
DATE = "2026-03-14"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country, e.g. Paris, France"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
                "days": {"type": "integer", "description": "Days of forecast", "default": 1},
            },
            "required": ["location"],
        },
    },
}

SEARCH = {
    "type": "function",
    "function": {
        "name": "search_docs",
        "description": "Search the documentation.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "scores": {"type": "array", "items": {"type": "number"}},
                "exact": {"type": "boolean"},
                "limit": {"type": "number", "default": 10},
                "filter": {
                    "type": "object",
                    "properties": {"lang": {"type": "string"}, "year": {"type": "integer"}},
                    "required": ["lang"],
                },
                "page": {"type": ["integer", "null"]},
                "cursor": {"type": "string", "nullable": True},
                "extra": {},
                "mode": {"oneOf": [{"type": "string", "description": "a name"}, {"type": "integer", "default": 3}]},
                "items": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
            },
            "required": ["query", "exact"],
        },
    },
}

NOW = {
    "type": "function",
    "function": {"name": "current_time", "description": "The current time.", "parameters": {"type": "object", "properties": {}}},
}

NOARGS = {
    "type": "function",
    "function": {"name": "ping", "description": "Check that the service answers."},
}


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


CASES = [
    {"name": "user_only", "request": {"messages": [{"role": "user", "content": "Hi"}]}},
    {
        "name": "system_history_high",
        "request": {
            "reasoning_effort": "high",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3+3? Ünïcödé 🌍"},
            ],
        },
    },
    {
        "name": "developer_low",
        "request": {
            "reasoning_effort": "low",
            "messages": [
                {"role": "developer", "content": "Answer in French.\nKeep it short."},
                {"role": "user", "content": "Hello"},
            ],
        },
    },
    {
        "name": "tools_only",
        "request": {"tools": [WEATHER], "messages": [{"role": "user", "content": "Weather in Paris?"}]},
    },
    {
        "name": "tools_with_developer",
        "request": {
            "tools": [WEATHER, SEARCH, NOW, NOARGS],
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Find docs about tools."},
            ],
        },
    },
    {
        "name": "tool_call_round_trip",
        "request": {
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call("call_1", "get_weather", {"location": "Paris, France", "days": 2})]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"sunny\"}"},
            ],
        },
    },
    {
        "name": "tool_call_then_answer_then_user",
        "request": {
            "reasoning_effort": "low",
            "tools": [WEATHER],
            "messages": [
                {"role": "developer", "content": "Use tools when useful."},
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "I should call get_weather.", "tool_calls": [call("c9", "get_weather", {"location": "Oslo", "unit": "celsius"})]},
                {"role": "tool", "tool_call_id": "c9", "content": "-3 and snow"},
                {"role": "assistant", "content": "It is -3 °C and snowing in Oslo."},
                {"role": "user", "content": "Thanks! And tomorrow?"},
            ],
        },
    },
    {
        "name": "tool_call_reasoning_kept",
        "request": {
            "tools": [WEATHER],
            "messages": [
                {"role": "user", "content": "Weather in Rome?"},
                {"role": "assistant", "content": "Let me look that up.", "tool_calls": [call("r1", "get_weather", {"location": "Rome"})]},
                {"role": "tool", "tool_call_id": "r1", "content": "warm"},
            ],
        },
    },
]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise RuntimeError(message)


def template_messages(messages):
    out = copy.deepcopy(messages)
    for m in out:
        # The template tests `"…" in message.content`, which fails on null: drop it.
        if m.get("content", "") is None:
            del m["content"]
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: DATE if fmt == "%Y-%m-%d" else raise_exception(fmt)
    template = env.from_string((FIXTURES / "chat_template.jinja").read_text())
    out = []
    for case in CASES:
        req = case["request"]
        kwargs = {"messages": template_messages(req["messages"]), "add_generation_prompt": True}
        if req.get("tools"):
            kwargs["tools"] = req["tools"]
        if "reasoning_effort" in req:
            kwargs["reasoning_effort"] = req["reasoning_effort"]
        out.append({"name": case["name"], "date": DATE, "request": req, "expected": template.render(**kwargs)})
    (FIXTURES / "renderings.json").write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(out)} renderings to {FIXTURES / 'renderings.json'}")


if __name__ == "__main__":
    main()
