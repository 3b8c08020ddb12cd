#!/usr/bin/env python3
"""TTFT of a 4k-token chat's second turn (prefix cache) against its first turn and a fresh prompt."""
import json, sys, time, random, urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"

def get(path):
    with urllib.request.urlopen(URL + path, timeout=60) as r:
        return json.loads(r.read())

def stream(messages, max_tokens=4):
    body = json.dumps({"model": MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}, "temperature": 0}).encode()
    req = urllib.request.Request(URL + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter(); first = None; text = ""; usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ch = json.loads(line[6:])
            if ch.get("usage"):
                usage = ch["usage"]
            for c in ch.get("choices", []):
                d = c.get("delta", {})
                piece = (d.get("content") or "") + (d.get("reasoning_content") or "")
                if first is None and (piece or d.get("role") is None):
                    first = time.perf_counter() - t0
                text += piece
    return first * 1e3, text, usage

MODEL = get("/v1/models")["data"][0]["id"]
rnd = random.Random(7)
words = "alpha beta gamma delta river stone cloud paper engine signal harbor lantern copper meadow violet".split()
def essay(n, seed):
    r = random.Random(seed)
    return " ".join(r.choice(words) for _ in range(n))
stream([{"role": "user", "content": "warm up " + essay(200, 1)}])
long = essay(4100, 2)
turn1 = [{"role": "user", "content": "Read this and answer briefly. " + long}]
t1, reply, u1 = stream(turn1)
turn2 = turn1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Now list three of the words above that repeat most often, and say why repetition matters to a reader of long notes."}]
t2, _, u2 = stream(turn2)
fresh = [{"role": "user", "content": "Read this and answer briefly. " + essay(4100 + 40, 3)}]
t3, _, u3 = stream(fresh)
print(f"model {MODEL}")
print(f"turn1 (fresh) TTFT {t1:.1f} ms, usage {u1}")
print(f"turn2 (cached prefix) TTFT {t2:.1f} ms, usage {u2}")
print(f"fresh prompt of turn2's length TTFT {t3:.1f} ms, usage {u3}")
print(f"speed-up turn2 vs turn1 {t1 / t2:.2f}x, vs fresh {t3 / t2:.2f}x")
