#!/usr/bin/env python3
"""Device check of the API paths the selftest cannot reach (run against `mxtune serve --device cuda`,
URL as the argument): forced and strict tool calls, json_schema output, n choices sharing the
prefill (prefix-cache hits), stop_token_ids, choice and regex answers, a list of prompts,
/tokenize against usage, echo with logprobs (the prompt scored). Prints one line per check and a
summary."""
import json, sys, urllib.request
URL = sys.argv[1]
def post(path, body):
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")
def metric(name):
    m = urllib.request.urlopen(URL + "/metrics").read().decode()
    return sum(float(l.split()[-1]) for l in m.splitlines() if l.startswith(name))
MODEL = json.loads(urllib.request.urlopen(URL + "/v1/models").read())["data"][0]["id"]
schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 30}}, "required": ["city", "days"], "additionalProperties": False}
tool = {"type": "function", "function": {"name": "forecast", "parameters": schema, "strict": True}}
def ok_args(a):
    try:
        v = json.loads(a)
    except ValueError:
        return False
    return set(v) == {"city", "days"} and isinstance(v["city"], str) and isinstance(v["days"], int)
msgs = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
fails = 0
for choice in ["required", {"type": "function", "function": {"name": "forecast"}}]:
    s, j = post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "tools": [tool], "tool_choice": choice, "max_tokens": 400, "seed": 1})
    c0 = (j.get("choices") or [{}])[0]
    tc = c0.get("message", {}).get("tool_calls") or []
    cut = c0.get("finish_reason") == "length"
    good = s == 200 and len(tc) == 1 and (cut or ok_args(tc[0]["function"]["arguments"]))
    fails += not good
    print(f"forced tool call ({choice if isinstance(choice, str) else 'named'}): status {s}, finish {c0.get('finish_reason')}, calls {len(tc)}, ok {good}", str(tc[:1])[:160])
n_calls = 0
for seed in range(6):
    s, j = post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "tools": [tool], "tool_choice": "auto", "max_tokens": 120, "seed": seed, "temperature": 1.0})
    tc = j["choices"][0]["message"].get("tool_calls") or []
    cut = j["choices"][0]["finish_reason"] == "length"
    bad = [c for c in tc if not (cut or ok_args(c["function"]["arguments"]))]
    n_calls += len(tc); fails += s != 200 or bool(bad)
print(f"auto + strict, 6 seeds: {n_calls} calls, all args valid: {fails == 0}")
s, j = post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 400, "response_format": {"type": "json_schema", "json_schema": {"name": "f", "schema": schema, "strict": True}}})
c = j["choices"][0]
good = s == 200 and (c["finish_reason"] == "length" or ok_args(c["message"]["content"]))
fails += not good
print(f"json_schema: status {s}, finish {c['finish_reason']}, valid {good}: {c['message']['content'][:80]}")
prompt = "Once upon a time " * 30
h0 = metric("vllm:prefix_cache_hits_total")
s, j = post("/v1/completions", {"model": MODEL, "prompt": prompt, "n": 3, "max_tokens": 12, "temperature": 0.7, "seed": 3, "return_token_ids": True})
h1 = metric("vllm:prefix_cache_hits_total")
pt = j["usage"]["prompt_tokens"]
good = s == 200 and len(j["choices"]) == 3 and h1 - h0 >= 2 * (pt - 1)
fails += not good
print(f"n=3: status {s}, prompt {pt} tokens, prefix hits +{h1 - h0:.0f} (2 x {pt - 1} expected from the forks), ok {good}")
# The reference twice: the second finds the prompt cached, as the stop request will (on CUDA a
# cached prompt's last token runs the decode path, which may change a near-tied greedy choice).
for _ in range(2):
    s, j = post("/v1/completions", {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, "return_token_ids": True})
    ids = j["choices"][0]["token_ids"]
    print("reference ids", ids)
s2, j2 = post("/v1/completions", {"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, "return_token_ids": True, "stop_token_ids": [ids[5]]})
c2 = j2["choices"][0]
k = ids.index(ids[5])
good = s2 == 200 and c2["finish_reason"] == "stop" and c2["token_ids"] == ids[:k + 1]
fails += not good
print(f"stop_token_ids: finish {c2['finish_reason']}, {len(c2['token_ids'])} ids (want {k + 1}), ok {good}", c2["token_ids"])
import re
colors = ["red", "green", "blue"]
for seed, t in [(0, 0.0), (1, 1.0)]:
    s, j = post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 40, "seed": seed, "temperature": t, "guided_choice": colors})
    c = j["choices"][0]
    good = s == 200 and c["message"]["content"] in colors and c["finish_reason"] == "stop"
    fails += not good
    print(f"guided_choice chat (T={t}): status {s}, {c['message']['content']!r}, ok {good}")
s, j = post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 40, "seed": 2, "temperature": 1.0, "structured_outputs": {"regex": "[0-9]{2}-[a-z]{3}"}})
c = j["choices"][0]
good = s == 200 and re.fullmatch("[0-9]{2}-[a-z]{3}", c["message"]["content"]) is not None
fails += not good
print(f"regex chat: status {s}, {c['message']['content']!r}, ok {good}")
prompts = ["The sky is", "Grass is", "Snow is"]
s, j = post("/v1/completions", {"model": MODEL, "prompt": prompts, "max_tokens": 8, "n": 2, "temperature": 0.8, "seed": 5, "guided_choice": colors})
texts = [c["text"] for c in j.get("choices", [])]
good = s == 200 and [c["index"] for c in j["choices"]] == list(range(6)) and all(t in colors for t in texts)
# Each lone request twice, the second finding its prompt cached as the list's will (see the
# stop_token_ids reference above).
lone = [[post("/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": 8, "temperature": 0})[1]["choices"][0]["text"] for _ in range(2)][1] for p in prompts]
s3, j3 = post("/v1/completions", {"model": MODEL, "prompt": prompts, "max_tokens": 8, "temperature": 0})
good = good and s3 == 200 and [c["text"] for c in j3["choices"]] == lone
fails += not good
print(f"list of prompts: status {s}/{s3}, choice texts {texts}, greedy = lone requests {good}")
s, t = post("/tokenize", {"model": MODEL, "messages": msgs})
s2, j = post("/v1/chat/completions", {"model": MODEL, "messages": msgs, "max_tokens": 1})
good = s == 200 and s2 == 200 and t["count"] == j["usage"]["prompt_tokens"]
fails += not good
print(f"/tokenize of the chat: {t.get('count')} tokens, usage says {j['usage']['prompt_tokens']}, ok {good}")
# echo with logprobs scores the prompt (on CUDA each scored row takes the host-logits path).
# A one-token prompt's greedy continuation runs the decode step only, as scoring does, so
# scored as a prompt each of its tokens must be the top choice at its position (gap 0).
s2, g = post("/v1/completions", {"model": MODEL, "prompt": [1000], "max_tokens": 8, "temperature": 0, "return_token_ids": True, "ignore_eos": True})
full = [1000] + g["choices"][0]["token_ids"]
s3, sc = post("/v1/completions", {"model": MODEL, "prompt": full, "max_tokens": 0, "echo": True, "logprobs": 2})
lp = sc["choices"][0]["logprobs"] if s3 == 200 else {"tokens": [], "token_logprobs": [None], "top_logprobs": []}
gaps = [max(lp["top_logprobs"][k].values()) - lp["token_logprobs"][k] for k in range(1, len(full))] if len(lp["tokens"]) == len(full) else [99]
good = s3 == 200 and lp["token_logprobs"][0] is None and all(x <= 0 for x in lp["token_logprobs"][1:]) and max(gaps) < 1e-3
fails += not good
print(f"echo + logprobs: status {s3}, {len(lp['tokens'])} scored of {len(full)}, each greedy token's gap to the top {[round(x, 4) for x in gaps]}, ok {good}")
print("API CUDA CHECKS:", "all passed" if fails == 0 else f"{fails} failed")
