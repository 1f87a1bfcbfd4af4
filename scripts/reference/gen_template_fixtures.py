#!/usr/bin/env python3
"""Regenerates enclave/testdata/chat_template_fixtures.json with Python jinja2.

Renders every chat template in the llama.cpp reference set
(`$VEIL_LLAMACPP_REF/templates`, default `../shared/llamacpp-reference/templates`
beside the workspace) for three conversations (`CONVERSATIONS`), in the environment and
context that Hugging Face transformers' `apply_chat_template` sets up
(`utils/chat_template_utils.py`), and stores, per template: its file name, the
sha256 of its bytes and, per conversation, the context given and jinja2's
text or jinja2's error.
The Rust test (`enclave/tests/all/templates.rs`) renders the same templates
with minijinja and compares byte for byte. CI does not run this; the JSON is
committed, the templates are not.

The environment, as HF builds it:
- `ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`,
  extensions `loopcontrols` and HF's `{% generation %}` tag (which renders its
  body unchanged unless assistant masks are asked for; they are not here);
- filter `tojson` = `json.dumps(x, ensure_ascii=False, indent=None,
  separators=None, sort_keys=False)`, each overridable by keyword;
- globals `raise_exception(msg)` (raises `TemplateError`) and
  `strftime_now(fmt)`, here on the fixed clock `NOW` so the text is stable.
Context: `messages` (dicts with `role` and `content`, and for the tool round
trip `tool_calls`, `tool_call_id` and `name`), `tools` (None, or the tool
definitions for the tool round trip),
`documents=None`, `add_generation_prompt=True`, and `bos_token` / `eos_token`
strings chosen per family from the file name (`FAMILY_TOKENS`, else
`<s>` / `</s>`). HF also passes the tokenizer's other special tokens; no
template here needs them for these conversations.

    python3 -m pip install jinja2==3.1.6   # the version the JSON was made with
    python3 scripts/reference/gen_template_fixtures.py
"""
import datetime
import hashlib
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "enclave", "testdata", "chat_template_fixtures.json")

# The fixed clock `strftime_now` reads (the Rust test passes the same instant).
NOW = datetime.datetime(2025, 1, 15, 10, 30, 45)

# The conversations, each rendered with add_generation_prompt=True.
# "standard": system, user, assistant, user. Its last message holds non-ASCII
# text, quotes, `<`, `&` and a newline, so that a template that passes content
# through `tojson` shows HF's escaping. "no_system": the same without the
# system message (some templates refuse a system role, others add their own).
STANDARD = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello! What is 2 + 2?"},
    {"role": "assistant", "content": "2 + 2 = 4."},
    {"role": "user", "content": 'Merci — and is "3 < 4 & 5"?\nAnswer briefly.'},
]
# "tools": a tool round trip as an OpenAI client sends it after the call
# (system, user, the assistant's call, the tool's result), with `tools` in
# the context; arguments as an object, as HF expects (the gateway parses
# OpenAI's JSON string into one), and the call's `content` an empty string
# (OpenAI's null: absent or None breaks many of these templates under
# jinja2, "" breaks none). The call id is nine alphanumerics, which
# Mistral's templates require.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name."},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]
TOOL_ROUND_TRIP = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call0abc1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call0abc1", "name": "get_weather", "content": '{"temperature": 18, "sky": "clear"}'},
]
CONVERSATIONS = [("standard", STANDARD, None), ("no_system", STANDARD[1:], None), ("tools", TOOL_ROUND_TRIP, TOOLS)]

# (file-name prefix, bos_token, eos_token): the strings each family's HF
# tokenizer config names; the first matching prefix wins.
FAMILY_TOKENS = [
    ("meta-llama-Llama-3", "<|begin_of_text|>", "<|eot_id|>"),
    ("fireworks-ai-llama-3", "<|begin_of_text|>", "<|eot_id|>"),
    ("NousResearch-Hermes-2-Pro-Llama-3", "<|begin_of_text|>", "<|im_end|>"),
    ("NousResearch-Hermes-3-Llama-3.1", "<|begin_of_text|>", "<|im_end|>"),
    ("meetkai-functionary", "<|begin_of_text|>", "<|eot_id|>"),
    ("deepseek-ai", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("llama-cpp-deepseek-r1", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    ("Qwen", "<|endoftext|>", "<|im_end|>"),
    ("google-gemma", "<bos>", "<eos>"),
    ("microsoft-Phi-3", "<s>", "<|endoftext|>"),
    ("CohereForAI", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    ("Cohere2", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    ("ibm-granite", "<|end_of_text|>", "<|end_of_text|>"),
    ("LFM2", "<|startoftext|>", "<|im_end|>"),
    ("openai-gpt-oss", "<|startoftext|>", "<|return|>"),
]
DEFAULT_TOKENS = ("<s>", "</s>")


def family_tokens(name):
    for prefix, bos, eos in FAMILY_TOKENS:
        if name.startswith(prefix):
            return bos, eos
    return DEFAULT_TOKENS


class GenerationTag(jinja2.ext.Extension):
    """HF's `{% generation %}...{% endgeneration %}`, without mask tracking."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return NOW.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    ref = os.environ.get("VEIL_LLAMACPP_REF") or os.path.join(ROOT, "..", "shared", "llamacpp-reference")
    tdir = os.path.join(ref, "templates")
    names = sorted(n for n in os.listdir(tdir) if n.endswith(".jinja"))
    if not names:
        sys.exit(f"no templates under {tdir}")
    env = environment()
    out = []
    for name in names:
        with open(os.path.join(tdir, name), "rb") as f:
            raw = f.read()
        bos, eos = family_tokens(name)
        cases = []
        for conversation, messages, tools in CONVERSATIONS:
            context = {
                "messages": messages,
                "tools": tools,
                "documents": None,
                "add_generation_prompt": True,
                "bos_token": bos,
                "eos_token": eos,
            }
            case = {"conversation": conversation, "context": context}
            try:
                case["rendered"] = env.from_string(raw.decode("utf-8")).render(**context)
            except Exception as e:  # noqa: BLE001 - every jinja2 failure is recorded the same way
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
        out.append({"template": name, "sha256": hashlib.sha256(raw).hexdigest(), "cases": cases})
    doc = {
        "generator": "scripts/reference/gen_template_fixtures.py",
        "jinja2": jinja2.__version__,
        "now": NOW.isoformat(),
        "templates": out,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    for conversation, _, _ in CONVERSATIONS:
        failed = [e["template"] for e in out for c in e["cases"] if c["conversation"] == conversation and "error" in c]
        print(f"{conversation}: {len(out)} templates, {len(failed)} jinja2 errors: {failed}")


if __name__ == "__main__":
    main()
