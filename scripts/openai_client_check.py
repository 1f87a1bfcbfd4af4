#!/usr/bin/env python3
"""The official `openai` Python package, unmodified, against `veil proxy`.

    python3 scripts/openai_client_check.py http://127.0.0.1:8000/v1

Chat completion (plain and streamed), completion (text and token ids),
models.list and models.retrieve, a 404 for another model's name, the
parameters a chat app sends (defaults accepted, an out-of-range penalty a
400), log-probabilities, logit bias, penalties, n = 3 seeded choices and
structured outputs (50 prompts, each answer validated by `jsonschema`).
Prints one JSON line with what it saw; exits non-zero on any failure. Used
by the Rust test `openai_python_client_through_veil_proxy`.
"""
import json
import sys

import jsonschema
import openai
from openai import OpenAI

# Structured outputs: a schema the model was not trained on, and prompts
# that do not ask for JSON at all.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z ]{1,24}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z]{1,12}$"}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
SUBJECTS = ["a baker", "a pilot", "a child", "a robot", "a queen", "a sailor", "a judge", "a farmer", "a poet", "a nurse"]
PROMPTS = [f"Describe {s}." for s in SUBJECTS] + [f"Tell me a story about {s}." for s in SUBJECTS]
PROMPTS += [f"Who is {s} in your town?" for s in SUBJECTS] + [f"Invent {s} from the future." for s in SUBJECTS]
PROMPTS += [f"What does {s} eat for breakfast?" for s in SUBJECTS]


def main(base_url: str) -> None:
    client = OpenAI(base_url=base_url, api_key="unused-by-veil")
    models = client.models.list()
    model = models.data[0].id
    assert client.models.retrieve(model).id == model
    try:
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "Hi"}], max_tokens=1)
        raise AssertionError("an unknown model name was served")
    except openai.NotFoundError:
        pass
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    text = chat.choices[0].message.content
    assert chat.usage.completion_tokens > 0, chat
    streamed = ""
    for chunk in client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
        stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            streamed += chunk.choices[0].delta.content
    assert streamed == text, (streamed, text)
    # What a chat app sends alongside: defaults pass, an unserved penalty is a 400.
    app = client.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=8,
        temperature=0.7,
        top_p=0.9,
        seed=1,
        stop=["\n\n"],
        presence_penalty=0,
        frequency_penalty=0,
        user="chat-app-user",
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = [c.usage for c in app if c.usage]
    assert usage and usage[0].completion_tokens > 0, usage
    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, presence_penalty=2.5
        )
        raise AssertionError("a presence_penalty out of range was accepted")
    except openai.BadRequestError:
        pass
    # Log-probabilities: one per token, the token's text adding up to the
    # answer, the greedy token the most likely, top alternatives as asked.
    lp = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = lp.choices[0].logprobs.content
    assert "".join(t.token for t in content) == lp.choices[0].message.content == text, (content, text)
    for t in content:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0, t
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-6, t
    # A bias of +100 on one token makes it the answer's first (ids from the
    # token-id prompt below: 4649 is " France"); penalties and n = 3 seeded
    # choices repeat.
    forced = client.completions.create(
        model=model, prompt="The capital of France is", max_tokens=3, temperature=0, logit_bias={"4649": 100}
    )
    assert forced.choices[0].text.startswith(" France"), forced
    three = [
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Tell me a colour."}],
            max_tokens=6,
            temperature=1.0,
            seed=42,
            n=3,
            presence_penalty=0.5,
            frequency_penalty=0.5,
        )
        for _ in range(2)
    ]
    texts = [[c.message.content for c in r.choices] for r in three]
    assert len(texts[0]) == 3 and texts[0] == texts[1], texts
    # 50 prompts, each answer parsed and validated: greedy, sampled, and
    # speculating (Veil's `speculate` extension), all under the schema.
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
    modes = [{"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 0, "extra_body": {"speculate": True}}]
    valid = 0
    for i, prompt in enumerate(PROMPTS):
        answer = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=96,
            response_format=fmt,
            **modes[i % 3],
        )
        content = answer.choices[0].message.content
        assert answer.choices[0].finish_reason == "stop", (prompt, content)
        jsonschema.validate(json.loads(content), PERSON)
        valid += 1
    for bad in [
        {"type": "json_schema", "json_schema": {"name": "x"}},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}},
    ]:
        try:
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, response_format=bad
            )
            raise AssertionError(f"an unusable response_format was accepted: {bad}")
        except openai.BadRequestError as e:
            assert e.status_code == 400 and "schema" in str(e), e
    completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    by_ids = client.completions.create(model=model, prompt=[504, 3575, 282, 4649, 314], max_tokens=8, temperature=0)
    assert completion.choices[0].text == by_ids.choices[0].text, (completion, by_ids)
    # Scoring a text as lm-evaluation-harness does (`loglikelihood`): echo, logprobs, max_tokens 0.
    scored = client.completions.create(
        model=model, prompt=[504, 3575, 282, 4649, 314], max_tokens=0, echo=True, logprobs=1, temperature=0
    )
    lps = scored.choices[0].logprobs
    assert scored.choices[0].text.endswith("France is") and scored.usage.completion_tokens == 0, scored
    assert lps.token_logprobs[0] is None and len(lps.token_logprobs) == 5, lps
    assert all(lp <= 0 for lp in lps.token_logprobs[1:]) and lps.top_logprobs[0] is None, lps
    assert all(len(t) == 1 for t in lps.top_logprobs[1:]), lps
    assert lps.text_offset[0] == 0 and lps.text_offset == sorted(lps.text_offset), lps
    print(json.dumps({"model": model, "chat": text, "completion": completion.choices[0].text, "choices": texts[0], "valid": valid}))


if __name__ == "__main__":
    main(sys.argv[1])
