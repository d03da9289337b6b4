"""Does speculation change what a request gets? The official ``openai`` client against the server
``sglang-hsd serve`` builds and against the same target without speculation.

The servers run one after the other (two 1.5B targets do not fit beside each other in 24 GB): the
HSD server exactly as ``serve_launch.build_launch`` builds it (adaptive lengths, draft catch-up,
seeds honoured, no ``--random-seed``), and the target alone with serve's CPU flags and
``--disable-overlap-schedule`` (SGLang's overlap scheduler applies penalties one token late, which
neither plain decoding nor HSD does). Every row is a chat completion on a code prompt (HumanEval)
and a chat prompt (MT-Bench):

* greedy rows (temperature 0), alone and with each penalty at the values a user sends
  (frequency 1.0, presence 1.5, repetition 1.3 and Qwen's own 1.1), logit_bias against the plain
  server's first token, a JSON schema, a regex, stop strings: the token ids must be identical;
  with logprobs, the greedy tokens' logprobs must agree within ``LOGPROB_TOL``;
* seeded rows (the model's own sampling defaults, ``seed`` 1234, twice on each server): HSD must
  repeat itself exactly; SGLang without speculation ignores the seed on CPU (reported).

    PYTHONPATH=. python benchmarks/check_client_exactness.py           # the cached Qwen pair
    PYTHONPATH=. python benchmarks/check_client_exactness.py --tiny    # a tiny random pair
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.common import RESULTS_DIR, start_run, write_results
from benchmarks.serving_harness import resolve_models

MAX_TOKENS = 40
LOGPROB_TOL = 2e-3
SEED = 1234
CHAT_PROMPT = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting "
               "cultural experiences and must-see attractions.")
CODE_PROMPT = ("Complete this Python function.\n\nfrom typing import List\n\n\ndef has_close_elements("
               "numbers: List[float], threshold: float) -> bool:\n    \"\"\" Check if in given list of "
               "numbers, are any two numbers closer to each other than\n    given threshold.\n    \"\"\"\n")
GREEDY = {
    "greedy": {},
    "frequency_penalty 1.0": {"frequency_penalty": 1.0},
    "presence_penalty 1.5": {"presence_penalty": 1.5},
    "repetition_penalty 1.3": {"extra_body": {"repetition_penalty": 1.3}},
    "repetition_penalty 1.1": {"extra_body": {"repetition_penalty": 1.1}},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "answer", "schema": {"type": "object", "properties": {"answer": {"type": "string"}},
                                     "required": ["answer"]}}}},
    "regex": {"extra_body": {"regex": "[A-Za-z ,.]{10,60}"}},
    "stop": {"stop": ["\n\n", "."]},
    "logprobs": {"logprobs": True, "top_logprobs": 3},
}


def _ask(client, prompt: str, **params) -> dict:
    extra = dict(params.pop("extra_body", {}))
    extra.update(return_token_ids=True)
    reply = client.chat.completions.create(model="default", messages=[{"role": "user", "content": prompt}],
                                           max_tokens=MAX_TOKENS, extra_body=extra, **params)
    choice = reply.choices[0]
    logprobs = None
    if choice.logprobs is not None and choice.logprobs.content:
        logprobs = [entry.logprob for entry in choice.logprobs.content]
    return {"text": choice.message.content, "ids": (choice.model_extra or {}).get("response_token_ids"),
            "logprobs": logprobs}


def collect(url: str, first_tokens: dict | None) -> dict:
    """Every row's replies from the server at ``url``; logit_bias rows need ``first_tokens``
    (the plain server's first greedy token per prompt)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", timeout=1800)
    got = {}
    for kind, prompt in (("code", CODE_PROMPT), ("chat", CHAT_PROMPT)):
        for name, params in GREEDY.items():
            got[f"{kind}: {name}"] = _ask(client, prompt, temperature=0.0, **json.loads(json.dumps(params)))
        first = (first_tokens or {}).get(kind, got[f"{kind}: greedy"]["ids"][0])
        got[f"{kind}: logit_bias"] = _ask(client, prompt, temperature=0.0, logit_bias={str(first): -100})
        got[f"{kind}: seeded"] = [_ask(client, prompt, seed=SEED) for _ in range(2)]
    return got


def compare(plain: dict, hsd: dict) -> list[dict]:
    rows = []
    for key, want in plain.items():
        have = hsd[key]
        if key.endswith("seeded"):
            rows.append({"row": key, "kind": "seeded", "hsd_repeats": have[0]["ids"] == have[1]["ids"],
                         "plain_repeats": want[0]["ids"] == want[1]["ids"],
                         "hsd_text": have[0]["text"]})
            continue
        same = want["ids"] == have["ids"]
        row = {"row": key, "kind": "greedy", "identical": same, "tokens": len(want["ids"] or []),
               "plain_text": want["text"], "hsd_text": have["text"]}
        if want["logprobs"] and have["logprobs"] and same:
            row["max_logprob_diff"] = max(abs(a - b) for a, b in zip(want["logprobs"], have["logprobs"]))
        rows.append(row)
    return rows


def markdown(rows: list[dict], meta: dict) -> str:
    lines = [f"# The openai client: {meta['target']} with HSD ({meta['draft']} drafting) vs without speculation",
             "", f"Greedy rows: {MAX_TOKENS} tokens, token ids compared; seeded rows: the model's own "
             f"sampling defaults with seed {SEED}, sent twice to each server.", "",
             "| row | result | detail |", "|---|---|---|"]
    for row in rows:
        if row["kind"] == "seeded":
            result = "HSD repeats" if row["hsd_repeats"] else "HSD DIFFERS between calls"
            detail = f"without speculation: {'repeats' if row['plain_repeats'] else 'seed ignored (differs)'}"
        else:
            result = "identical" if row["identical"] else "DIFFERENT"
            detail = f"{row['tokens']} tokens"
            if "max_logprob_diff" in row:
                detail += f"; logprobs within {row['max_logprob_diff']:.1e} (tolerance {LOGPROB_TOL})"
        lines.append(f"| {row['row']} | {result} | {detail} |")
    lines += ["", f"HSD server: `{meta['hsd_command']}`", "", f"Without speculation: `{meta['plain_command']}`"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--tiny", action="store_true", help="a tiny random pair (a smoke run)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "client_exactness")
    args = parser.parse_args(argv)
    run = start_run(__file__, argv)
    from sglang_hsd.sglang_plugin.cpu.cpu_server import free_port, running_server
    from sglang_hsd.sglang_plugin.serve_launch import ServeConfig, build_launch, resolve_models as serve_models

    workdir = Path(tempfile.mkdtemp(prefix="client_exactness_"))
    target, draft = resolve_models(args.target, args.draft, workdir, args.tiny)
    config = ServeConfig(target=str(target), draft=str(draft), device="cpu",
                         sglang_args=("--port", str(free_port())))
    launch = build_launch(config, serve_models(config, fetch=None), "cpu")
    env = {**os.environ, **launch.env}
    speculative = {"--speculative-algorithm", "--speculative-draft-model-path", "--hsd-draft-kind",
                   "--speculative-attention-mode", "--speculative-draft-attention-backend"}
    plain_cmd, words = [], iter(launch.command)
    for word in words:
        if word in speculative:
            next(words)
            continue
        plain_cmd.append(word)
    plain_cmd += ["--disable-overlap-schedule"]
    print("without speculation:", " ".join(plain_cmd[1:]), file=sys.stderr)
    with running_server(plain_cmd, env, str(workdir / "plain.log"), timeout=1800) as url:
        plain = collect(url, None)
    first = {kind: plain[f"{kind}: greedy"]["ids"][0] for kind in ("code", "chat")}
    print("HSD:", " ".join(launch.command[1:]), file=sys.stderr)
    with running_server(launch.command, env, str(workdir / "hsd.log"), timeout=1800) as url:
        hsd = collect(url, first)
    rows = compare(plain, hsd)
    meta = {"target": args.target if not args.tiny else "tiny", "draft": args.draft if not args.tiny else "tiny",
            "hsd_command": " ".join(launch.command[1:]).replace(str(Path.home()), "~"),
            "plain_command": " ".join(plain_cmd[1:]).replace(str(Path.home()), "~")}
    text = markdown(rows, meta)
    print(text)
    write_results(args.out, {"meta": meta, "rows": rows}, text, run)
    greedy_ok = all(r["identical"] and r.get("max_logprob_diff", 0.0) <= LOGPROB_TOL
                    for r in rows if r["kind"] == "greedy")
    seeded_ok = all(r["hsd_repeats"] for r in rows if r["kind"] == "seeded")
    return 0 if greedy_ok and seeded_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
