#!/usr/bin/env python3
"""Tool calls with the official `openai` Python package, unmodified, against
`veil proxy` in front of a model whose chat template has a tool section.

    python3 scripts/openai_tools_check.py http://127.0.0.1:8000/v1

A forced call (`tool_choice="required"`), plain and streamed (the client's
own delta accumulation), a named function sampled and greedy, the call's
result sent back as a `tool` message with the assistant's message as the
client returns it, `auto` and `none`; every call's arguments validated by
`jsonschema` against the tool's parameters. A tool without parameters and a
named function that is not in `tools` are 400s. Prints one JSON line with
what it saw; exits non-zero on any failure. Used by the Rust test
`tools::a_tools_round_trip_through_a_sealed_three_stage_cluster`.
"""
import json
import sys

import jsonschema
import openai
from openai import OpenAI

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
CLOCK = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 12}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time.", "parameters": CLOCK}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def check_call(name, arguments):
    assert name in SCHEMAS, name
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def main(base_url):
    client = OpenAI(base_url=base_url, api_key="unused-by-veil")
    model = client.models.list().data[0].id
    seen = {}

    forced = client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96
    )
    choice = forced.choices[0]
    assert choice.finish_reason == "tool_calls", forced
    assert choice.message.content is None, forced
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_"), call
    check_call(call.function.name, call.function.arguments)
    seen["forced"] = [call.function.name, call.function.arguments]

    # Streamed: the client's chunks put together give the same call.
    name, arguments, finish = None, "", None
    for chunk in client.chat.completions.create(
        model=model, messages=QUESTION, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96, stream=True
    ):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or []:
            assert tc.index == 0, tc
            name = tc.function.name or name
            arguments += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, arguments, finish) == (call.function.name, call.function.arguments, "tool_calls"), (name, arguments)

    # A named function is the one called, greedy and sampled.
    for temperature in (0, 1):
        named = client.chat.completions.create(
            model=model,
            messages=QUESTION,
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_time"}},
            temperature=temperature,
            seed=3,
            max_tokens=96,
        )
        (c,) = named.choices[0].message.tool_calls
        assert c.function.name == "get_time", named
        check_call(c.function.name, c.function.arguments)

    # The result goes back with the assistant's message as the client
    # returned it; the model answers (auto: text, or a well-formed call).
    messages = QUESTION + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18})},
    ]
    answer = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0, max_tokens=12)
    a = answer.choices[0]
    if a.finish_reason == "tool_calls":
        for c in a.message.tool_calls:
            check_call(c.function.name, c.function.arguments)
    else:
        assert a.finish_reason in ("stop", "length") and isinstance(a.message.content, str), answer
    seen["answer"] = a.finish_reason
    none = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=8
    )
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length"), none

    for bad in (
        dict(tools=[{"type": "function", "function": {"name": "f"}}]),
        dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "not_a_tool"}}),
    ):
        try:
            client.chat.completions.create(model=model, messages=QUESTION, max_tokens=4, **bad)
            raise AssertionError(f"accepted {bad}")
        except openai.BadRequestError as e:
            assert e.status_code == 400, e
    print(json.dumps(seen))


if __name__ == "__main__":
    main(sys.argv[1])
