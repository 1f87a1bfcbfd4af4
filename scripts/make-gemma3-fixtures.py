#!/usr/bin/env python3
"""Writes enclave/testdata/gemma3/tokenize.json: llama.cpp's token ids for a
set of texts on the real Gemma 3 vocabulary, and a chat rendered with the
Gemma 3 chat template. `enclave/tests/all/gemma3.rs` checks Veil against it.

Tokens: each text through llama-cpp-python's `Llama.tokenize` (vocab only,
no weights), with and without special-token parsing and BOS as the case
says. The texts are the ones sentencepiece vocabularies with whitespace
tokens get wrong: runs of 1..8 spaces, tabs and newlines, leading and
trailing spaces, code, digits, non-Latin scripts, HTML tags (user-defined
tokens in Gemma 3), special-token text, and ten everyday sentences.

Chat: the GGUF (Gemma 3 270M, a base model) has no `tokenizer.chat_template`,
so the template is the Gemma chat template llama.cpp tests with
(`google-gemma-2-2b-it.jinja` among llama.cpp's reference templates:
`$VEIL_LLAMACPP_REF/templates`, else `../shared/llamacpp-reference/templates`;
not kept in this repository), which writes Gemma 3's turn format with the same
control tokens. Each chat is rendered as transformers'
`apply_chat_template` renders it (jinja2, `trim_blocks`, `lstrip_blocks`,
`add_generation_prompt=True`, `bos_token`/`eos_token` from the GGUF), and
checked against llama.cpp's own Gemma format (`llama_chat_apply_template`,
which writes no BOS); the prompt's ids are llama.cpp's tokenization of the
rendered text with special tokens parsed and no BOS added (the text has it).

    pip install llama-cpp-python==0.3.36 jinja2
Answers: for each chat, llama.cpp's greedy continuation of the prompt's ids
(GREEDY tokens; the model's weights loaded, logits of every step kept) with
the gap between its top two logits at each step, so the test can tell a
near-tie from a different answer.

    python3 scripts/make-gemma3-fixtures.py "$(scripts/fetch-gemma3.sh)"
"""
import ctypes
import hashlib
import json
import sys
from pathlib import Path

import jinja2
import jinja2.ext
import llama_cpp
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "enclave" / "testdata" / "gemma3"
TEMPLATE = "google-gemma-2-2b-it.jinja"
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GREEDY = 32

EVERYDAY = [
    "Hello, world!",
    "What is the capital of France?",
    "The quick brown fox jumps over the lazy dog.",
    "Can you summarize this article in three sentences?",
    "I'd like two coffees, please.  Thanks!",
    "Meet me at 10:30 a.m. on Friday, 14 March 2025.",
    "Email jane.doe@example.com or call +1 (555) 010-2030.",
    "Price: $19.99 (20% off) — today only!",
    "Dear team,\n\nPlease find the report attached.\n\nBest,\nAna",
    "It's a beautiful day, isn't it?",
]

TEXTS = [
    *(f"a{' ' * n}b" for n in range(1, 9)),
    " ",
    "        ",
    " leading space",
    "   three leading spaces",
    "trailing space ",
    "two trailing spaces  ",
    "tab\tseparated\t\tvalues",
    "\t\tindented with tabs",
    "line one\nline two",
    "three\n\n\nnewlines",
    "windows\r\nline end",
    " \n \t mixed \t\n ",
    "def f(x):\n    return x  # two spaces\n",
    "fn main() {\n\tprintln!(\"{}\", 1 + 2);\n}",
    "1234567890 3.14159 -42 1e10",
    "naïve café, Grüße, ½ cup",
    "日本語のテキストと中文",
    "Привет, мир! 🎉🙂",
    "<table><tr><td>cell</td></tr></table>",
    "<start_of_turn>user\nHi<end_of_turn>",
    "</s> and <eos> as text",
    *EVERYDAY,
]

# Texts tokenized with special-token parsing too (template text).
SPECIAL = [
    "<start_of_turn>user\nHi<end_of_turn>",
    "</s> and <eos> as text",
    "<bos><start_of_turn>model\n  indented<end_of_turn>\n",
]

CHATS = [
    [
        {"role": "user", "content": "  What is 2 + 2?\tAnswer  in one word.  "},
    ],
    [
        {"role": "user", "content": "Write a haiku about\n\nthe sea."},
        {"role": "assistant", "content": "Waves fold into foam  \n   salt wind carries gull voices"},
    ],
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def jinja_env() -> ImmutableSandboxedEnvironment:
    """transformers' `apply_chat_template` environment."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env


def llama_cpp_chat(template: str, messages: list) -> str:
    """llama.cpp's rendering (`llama_chat_apply_template`): the template
    text only picks the built-in format (Gemma's, by `<start_of_turn>`)."""
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *(llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in messages)
    )
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages), True, buf, size)
    if n < 0 or n > size:
        sys.exit(f"llama_chat_apply_template failed ({n})")
    return buf.raw[:n].decode()


def answer(model: Path, chats: list) -> None:
    """Adds llama.cpp's greedy answer and its top-2 gaps to each chat."""
    import numpy as np

    llm = llama_cpp.Llama(model_path=str(model), n_ctx=512, n_batch=512, n_threads=2, logits_all=True, verbose=False)
    for chat in chats:
        llm.reset()
        llm.eval(chat["ids"])
        gen, gaps = [], []
        for _ in range(GREEDY):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            order = np.argsort(-logits, kind="stable")
            gen.append(int(order[0]))
            gaps.append(float(logits[order[0]] - logits[order[1]]))
            llm.eval([gen[-1]])
        chat["greedy_ids"] = gen
        chat["top2_gaps"] = gaps
        text = llm.detokenize(gen).decode(errors="replace")
        print(f"answer {text!r}, near-ties {sum(g < 0.5 for g in gaps)}")
    del llm


def main(model: Path) -> None:
    digest = sha256(model)
    if digest != MODEL_SHA256:
        sys.exit(f"{model}: SHA-256 {digest}, expected {MODEL_SHA256} (scripts/fetch-gemma3.sh)")
    llm = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    meta = llm.metadata
    if "tokenizer.chat_template" in meta:
        sys.exit("the GGUF has a chat template now: compare with it instead")

    def ids(text: str, add_bos: bool, special: bool) -> list:
        return llm.tokenize(text.encode(), add_bos=add_bos, special=special)

    cases = [{"text": t, "add_bos": False, "special": False, "ids": ids(t, False, False)} for t in TEXTS]
    cases += [{"text": t, "add_bos": False, "special": True, "ids": ids(t, False, True)} for t in SPECIAL]
    cases.append({"text": EVERYDAY[0], "add_bos": True, "special": False, "ids": ids(EVERYDAY[0], True, False)})

    import os

    ref = Path(os.environ.get("VEIL_LLAMACPP_REF", ROOT.parent / "shared" / "llamacpp-reference"))
    template = (ref / "templates" / TEMPLATE).read_text()
    bos = llm.detokenize([llm.token_bos()], special=True).decode()
    eos = llm.detokenize([llm.token_eos()], special=True).decode()
    env = jinja_env()
    chats = []
    for messages in CHATS:
        prompt = env.from_string(template).render(
            messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos, tools=None, documents=None
        )
        native = llama_cpp_chat(template, messages)
        if prompt != bos + native:
            sys.exit(f"jinja2 and llama.cpp render differently:\n{prompt!r}\n{bos + native!r}")
        chats.append({"messages": messages, "prompt": prompt, "ids": ids(prompt, False, True)})
    answer(model, chats)

    fixture = {
        "generated_by": "scripts/make-gemma3-fixtures.py",
        "llama_cpp_python": llama_cpp.__version__,
        "model": model.name,
        "model_sha256": digest,
        "bos_token": bos,
        "eos_token": eos,
        "cases": cases,
        "chat_template": TEMPLATE,
        "chats": chats,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "tokenize.json").open("w") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {OUT / 'tokenize.json'}: {len(cases)} cases, {len(chats)} chats")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    main(Path(sys.argv[1]))
