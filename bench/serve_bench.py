#!/usr/bin/env python3
"""Streaming load on an OpenAI-compatible server: aggregate generated tokens/s, p50/p99 time to first token
and inter-token latency at several client counts (one command; stdlib only).

  python3 bench/serve_bench.py --server build/release/examples/kiln-server \\
      --model ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf --slots 4 --clients 1,2,4,8,16
  python3 bench/serve_bench.py --url http://127.0.0.1:8080 ...      # a running server (e.g. llama-server)

Each client sends the same chat requests one after another (a different question each, greedy, --tokens
max tokens, the stop token ignored only where the server supports "ignore_eos") for --seconds, streaming;
the server runs on 127.0.0.1 with -np slots and -c = slots x --slot-ctx. Inter-token latency is the time
between SSE events that carry text (a server may merge tokens into one event when the client lags; the
token count comes from the usage chunk). The client shares the machine's cores with the server: on a
2-core machine, compare servers under the same client, not with a server measured alone.
"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import sys
import threading
import time

QUESTIONS = ["Tell me a story about a {}.", "Describe a {} in detail.", "Write a poem about a {}.",
             "Explain how a {} works."]
THINGS = ["dragon", "lighthouse", "robot", "garden", "river", "violin", "castle", "comet", "bakery", "glacier",
          "submarine", "library", "volcano", "forest", "clock", "train"]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def one_request(host, port, i, tokens, stats, lock):
    q = QUESTIONS[i % len(QUESTIONS)].format(THINGS[i % len(THINGS)])
    body = json.dumps({"messages": [{"role": "user", "content": q}], "max_tokens": tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True})
    c = http.client.HTTPConnection(host, port, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    first, last, gaps, n_tok = None, None, [], 0
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            j = json.loads(ev[6:])
            if j.get("usage"):
                n_tok = j["usage"]["completion_tokens"]
            if j.get("choices") and (j["choices"][0].get("delta") or {}).get("content"):
                now = time.perf_counter()
                if first is None:
                    first = now
                else:
                    gaps.append(now - last)
                last = now
    c.close()
    with lock:
        stats["ttft"].append((first or time.perf_counter()) - t0)
        stats["itl"] += gaps
        stats["tokens"] += n_tok
        stats["requests"] += 1


def run_level(host, port, clients, tokens, seconds):
    stats = {"ttft": [], "itl": [], "tokens": 0, "requests": 0}
    lock = threading.Lock()
    end = time.perf_counter() + seconds
    counter = iter(range(1 << 30))

    def client():
        while time.perf_counter() < end:
            with lock:
                i = next(counter)
            one_request(host, port, i, tokens, stats, lock)

    t0 = time.perf_counter()
    ths = [threading.Thread(target=client) for _ in range(clients)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    wall = time.perf_counter() - t0
    return stats, wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", help="kiln-server (or llama-server) executable to start")
    ap.add_argument("--model")
    ap.add_argument("--url", help="a running server instead")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--slot-ctx", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", default="1,2,4,8,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--extra", default="", help="extra server flags")
    a = ap.parse_args()
    proc = None
    if a.url:
        url = a.url
    else:
        cmd = [a.server, "-m", a.model, "--host", "127.0.0.1", "--port", "0", "-np", str(a.slots), "-c",
               str(a.slots * a.slot_ctx), "-t", str(a.threads)] + a.extra.split()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = None
        for line in proc.stderr:
            m = re.search(r"(http://127\.0\.0\.1:\d+)", line)
            if m:
                url = m.group(1)
                break
        if not url:
            sys.exit("serve_bench: the server did not start")
        threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    host, port = url.split("//")[1].split(":")
    port = int(port)
    one_request(host, port, 0, 8, {"ttft": [], "itl": [], "tokens": 0, "requests": 0}, threading.Lock())  # warm-up
    print(f"{'clients':>7} {'requests':>8} {'gen tok/s':>10} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12} "
          f"{'ITL p50 ms':>11} {'ITL p99 ms':>11}")
    try:
        for n in [int(x) for x in a.clients.split(",")]:
            s, wall = run_level(host, port, n, a.tokens, a.seconds)
            print(f"{n:>7} {s['requests']:>8} {s['tokens'] / wall:>10.1f} {1000 * pct(s['ttft'], 50):>12.1f} "
                  f"{1000 * pct(s['ttft'], 99):>12.1f} {1000 * pct(s['itl'], 50):>11.2f} {1000 * pct(s['itl'], 99):>11.2f}",
                  flush=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
