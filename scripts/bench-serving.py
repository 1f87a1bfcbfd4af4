"""Serving throughput, Veil against llama.cpp's own server, in one run.

Closed-loop users: each of N users sends a streamed greedy chat, reads it to
its end, and sends the next, for --seconds. Both servers get the same
requests through the official ``openai`` client (AsyncOpenAI): llama-server
at its OpenAI endpoint, Veil through ``veil.async_openai`` (the route
verified first; every request sealed to the attested entry in this process).
For each N: aggregate completion tokens per second (the usage each answer
reports, answers that ended inside the window) and time to first token
(p50/p99, to the first content delta), then the ratio Veil / llama.cpp.

    python bench-serving.py --veil URL --policy FILE --llama URL
        [--users 1,8,32] [--seconds 60] [--max-tokens 64]

Run by scripts/bench-serving.sh, which starts both servers on the same model.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import openai

# The prompts veil-soak uses too, one a line.
PROMPTS = [
    line
    for line in (Path(__file__).resolve().parent.parent / "tests" / "data" / "chat-prompts.txt").read_text().splitlines()
    if line
]


async def one(client: Any, model: str, prompt: str, max_tokens: int) -> Tuple[float, int]:
    """One streamed chat: (time to first content, completion tokens)."""
    started = time.perf_counter()
    ttft = float("nan")
    tokens = 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and ttft != ttft:
            ttft = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return ttft, tokens


async def load(client: Any, model: str, users: int, seconds: float, max_tokens: int) -> Dict[str, float]:
    prompts = itertools.cycle(PROMPTS)
    end = time.perf_counter() + seconds
    ttfts: List[float] = []
    tokens = 0
    failures = 0
    started = time.perf_counter()

    async def user() -> None:
        nonlocal tokens, failures
        while time.perf_counter() < end:
            try:
                ttft, n = await one(client, model, next(prompts), max_tokens)
            except Exception as e:  # a failure is counted, and the user goes on
                failures += 1
                print(f"  failure: {type(e).__name__}: {str(e)[:120]}")
                continue
            if time.perf_counter() <= end:
                tokens += n
                ttfts.append(ttft)

    await asyncio.gather(*(user() for _ in range(users)))
    window = min(time.perf_counter(), end) - started
    ttfts.sort()

    def q(p: float) -> float:
        return ttfts[min(len(ttfts) - 1, max(0, int(p * len(ttfts) + 0.999999) - 1))] * 1e3 if ttfts else float("nan")

    return {
        "answers": len(ttfts),
        "tokens_per_s": tokens / window,
        "ttft_p50_ms": q(0.5),
        "ttft_p99_ms": q(0.99),
        "failures": failures,
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--veil", required=True)
    ap.add_argument("--policy", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--users", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    import veil

    targets = {
        # openai's default retries (2) for llama.cpp: its HTTP server closes
        # a keep-alive connection after a few requests, and a request that
        # raced the close is re-sent, as any openai app would. (Veil's client
        # does not retry a dropped connection: the request may be running.)
        "llama.cpp": openai.AsyncOpenAI(base_url=f"{args.llama}/v1", api_key="none", max_retries=2, timeout=600),
        "Veil": veil.async_openai(args.veil, policy=args.policy),
    }
    models = {}
    for name, client in targets.items():
        models[name] = (await client.models.list()).data[0].id
        # One warm-up answer each.
        await one(client, models[name], PROMPTS[0], 8)
    rows = []
    for users in [int(u) for u in args.users.split(",")]:
        got = {}
        for name, client in targets.items():
            print(f"{name}: {users} user(s), {args.seconds:.0f} s ...", flush=True)
            got[name] = await load(client, models[name], users, args.seconds, args.max_tokens)
        rows.append((users, got))
    print()
    print(f"max_tokens {args.max_tokens}, greedy, streamed; {args.seconds:.0f} s per cell; closed-loop users")
    print("| users | llama.cpp tok/s | Veil tok/s | Veil / llama.cpp | llama.cpp TTFT p50 / p99 ms | Veil TTFT p50 / p99 ms | answers (llama.cpp, Veil) | failures |")
    print("|---|---|---|---|---|---|---|---|")
    for users, got in rows:
        l, v = got["llama.cpp"], got["Veil"]
        ratio = v["tokens_per_s"] / l["tokens_per_s"] if l["tokens_per_s"] else float("nan")
        print(
            f"| {users} | {l['tokens_per_s']:.1f} | {v['tokens_per_s']:.1f} | {ratio:.2f}× | "
            f"{l['ttft_p50_ms']:.0f} / {l['ttft_p99_ms']:.0f} | {v['ttft_p50_ms']:.0f} / {v['ttft_p99_ms']:.0f} | "
            f"{l['answers']}, {v['answers']} | {l['failures']}, {v['failures']} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
