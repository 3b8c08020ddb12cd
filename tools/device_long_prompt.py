#!/usr/bin/env python3
"""Send one completion of N random words (about N tokens), max_tokens 1, and print its usage and wall time.

Used by tools/device_long_prompt.sh: a long prompt arriving while streams decode (#18's chunked-prefill check).
"""
import json, random, sys, time, urllib.request

URL = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:8000"
words = "alpha beta gamma delta river stone cloud paper engine signal harbor lantern copper meadow violet".split()
rnd = random.Random(11)
text = " ".join(rnd.choice(words) for _ in range(int(sys.argv[1])))
model = json.loads(urllib.request.urlopen(URL + "/v1/models", timeout=60).read())["data"][0]["id"]
body = json.dumps({"model": model, "prompt": text, "max_tokens": 1, "temperature": 0}).encode()
req = urllib.request.Request(URL + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
t0 = time.perf_counter()
resp = json.loads(urllib.request.urlopen(req, timeout=600).read())
print(f"long prompt: {resp['usage']} in {time.perf_counter() - t0:.2f} s")
