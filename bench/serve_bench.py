#!/usr/bin/env python3
"""Streaming load on an OpenAI-compatible server: aggregate generated tokens/s, p50/p99 time to first token
and inter-token latency at several client counts (one command; stdlib only).

  python3 bench/serve_bench.py --server build/release/examples/kiln-server \\
      --model ~/.cache/kiln/models/SmolLM2-135M-Instruct.Q4_1.gguf --slots 4 --clients 1,2,4,8,16
  python3 bench/serve_bench.py --url http://127.0.0.1:8080 ...      # a running server (e.g. llama-server)
  python3 bench/serve_bench.py --report results.jsonl               # medians of earlier --json-out runs

Each client sends the same chat requests one after another (a different question each, greedy, --tokens
max tokens, the stop token ignored where the server supports "ignore_eos": kiln-server and llama-server
do) for --seconds, streaming; a started server (kiln-server or llama-server: the same flags) runs on
127.0.0.1 with -np slots, -c = slots x --slot-ctx and -t threads. Inter-token latency is the time between
SSE events that carry text (a server may merge tokens into one event when the client lags; the token
count comes from the usage chunk). The client shares the machine's cores with the server: on a 2-core
machine, compare servers under the same client, not with a server measured alone.

For a server this script started, each level also gives the server's CPU time per generated token (all its
threads; /proc/PID/task/*/schedstat): with -t 1 a figure the machine's load hardly moves, unlike tokens/s
(with more threads it includes the pool's spin-waits between jobs, which a loaded machine lengthens).

Optional measurements of a started server (--json-out keeps every figure as a JSON line):
  --single-prompt TEXT  one client, /v1/completions with TEXT (greedy, --tokens): time to first token (the
                        first request: nothing cached) and decode tokens/s (median of --single-reps), for
                        comparing with kiln-generate
  --turn2 N             N two-turn conversations: the second turn's time to first token with the first turn
                        in the slot's cache, against the same second-turn prompt with its first message
                        changed (nothing cached but the template's first tokens), and against a fresh
                        completion prompt of as many tokens as the second turn's new (uncached) ones (token
                        ids no slot holds): what "counts only its new tokens" means. For a server this
                        script started, each figure also comes as the server's CPU time from the request to
                        its first token (all its threads, /proc/PID/task/*/schedstat): unlike wall time, it
                        does not grow when other processes take the cores
  --fill N              after the rest: one request per slot at once, each a completion of an N-token prompt
                        (token ids no other slot starts with) generating to 8 positions short of the slot's
                        context (ignore_eos): every slot's KV cache full, the peak RSS at full context
  the server's peak RSS (VmHWM) after the run (after --clients and before --fill too, where --fill is given).
"""
import argparse
import http.client
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

QUESTIONS = ["Tell me a story about a {}.", "Describe a {} in detail.", "Write a poem about a {}.",
             "Explain how a {} works."]
THINGS = ["dragon", "lighthouse", "robot", "garden", "river", "violin", "castle", "comet", "bakery", "glacier",
          "submarine", "library", "volcano", "forest", "clock", "train"]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


SERVER_PID = None  # set when this script started the server: stream() then also measures its CPU time


def server_cpu_s():
    """CPU seconds the server's threads have run so far (nanosecond schedstat), or None."""
    if SERVER_PID is None:
        return None
    total = 0
    for t in os.listdir(f"/proc/{SERVER_PID}/task"):
        try:
            total += int(open(f"/proc/{SERVER_PID}/task/{t}/schedstat").read().split()[0])
        except OSError:  # a thread that ended meanwhile
            pass
    return total / 1e9


def stream(host, port, path, body, cpu=None):
    """Sends one streamed request; returns (ttft s, [text event times], completion tokens, prompt tokens,
    cached prompt tokens or None, the concatenated text). cpu: a list that gets the server's CPU seconds
    from the request to its first text event (None where unknown)."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    c = http.client.HTTPConnection(host, port, timeout=600)
    cpu0 = server_cpu_s() if cpu is not None else None
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    times, n_tok, n_prompt, cached, text = [], 0, 0, None, []
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
                u = j["usage"]
                n_tok, n_prompt = u.get("completion_tokens", 0), u.get("prompt_tokens", 0)
                cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
            if "timings" in j and cached is None:  # llama-server: prompt tokens taken from its cache
                cached = j["timings"].get("cache_n")
            ch = j.get("choices") or [{}]
            piece = (ch[0].get("delta") or {}).get("content") if "delta" in ch[0] else ch[0].get("text")
            if piece:
                times.append(time.perf_counter())
                if cpu is not None and len(times) == 1:
                    cpu.append(None if cpu0 is None else server_cpu_s() - cpu0)
                text.append(piece)
    c.close()
    first = times[0] if times else time.perf_counter()
    return first - t0, times, n_tok or len(times), n_prompt, cached, "".join(text)


def chat_body(i, tokens):
    q = QUESTIONS[i % len(QUESTIONS)].format(THINGS[i % len(THINGS)])
    return {"messages": [{"role": "user", "content": q}], "max_tokens": tokens, "temperature": 0, "ignore_eos": True}


def run_threads(fns, errors, what):
    """Runs each function on its own thread and waits for all; raises with the first of the errors they kept."""
    ths = [threading.Thread(target=f) for f in fns]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} {what} failed: {errors[0]}")


def run_level(host, port, clients, tokens, seconds):
    stats = {"ttft": [], "itl": [], "tokens": 0, "requests": 0}
    lock = threading.Lock()
    end = time.perf_counter() + seconds
    counter = iter(range(1 << 30))
    errors = []

    def client():
        try:
            while time.perf_counter() < end:
                with lock:
                    i = next(counter)
                ttft, times, n_tok, _, _, _ = stream(host, port, "/v1/chat/completions", chat_body(i, tokens))
                with lock:
                    stats["ttft"].append(ttft)
                    stats["itl"] += [b - a for a, b in zip(times, times[1:])]
                    stats["tokens"] += n_tok
                    stats["requests"] += 1
        except Exception as e:  # reported after the level; the other clients finish
            errors.append(e)

    t0 = time.perf_counter()
    cpu0 = server_cpu_s()
    run_threads([client] * clients, errors, "clients")
    stats["cpu_s"] = None if cpu0 is None else server_cpu_s() - cpu0
    return stats, time.perf_counter() - t0


def single(host, port, prompt, tokens, reps):
    """One client, a completion of `prompt`: the first request's TTFT (ms; the later ones find the prompt
    in the slot's cache) and the median decode tokens/s (after the first token) of `reps` requests."""
    ttft0, rates, n, cached = None, [], 0, None
    for _ in range(reps):
        ttft, times, n, _, c, _ = stream(host, port, "/v1/completions",
                                         {"prompt": prompt, "max_tokens": tokens, "temperature": 0})
        if ttft0 is None:
            ttft0, cached = 1000 * ttft, c
        if len(times) > 1:  # events, not tokens: a merged event still counts its tokens in n
            rates.append((n - 1) / (times[-1] - times[0]))
    return {"ttft_ms": ttft0, "cached": cached, "decode_tok_s": statistics.median(rates) if rates else None,
            "tokens": n}


def turn2(host, port, n, tokens):
    """Second-turn TTFT with the first turn cached vs the same prompt with its first message changed, and vs a
    fresh prompt of as many tokens as the second turn computes (its uncached ones); with the server's CPU
    time to the first token where known."""
    warm, cold, fresh, rows = [], [], [], []
    cpu_w, cpu_c, cpu_f = [], [], []
    for i in range(n):
        first = chat_body(100 + i, tokens)
        del first["ignore_eos"]  # the answer as the model ends it, so that its tokens are what the slot holds
        _, _, _, _, _, answer = stream(host, port, "/v1/chat/completions", first)
        msgs = first["messages"] + [{"role": "assistant", "content": answer},
                                    {"role": "user", "content": "Now say it again in fewer words."}]
        body = {"messages": msgs, "max_tokens": 8, "temperature": 0}
        t_w, _, _, p_w, c_w, _ = stream(host, port, "/v1/chat/completions", body, cpu_w)
        changed = [dict(msgs[0], content="Please. " + msgs[0]["content"])] + msgs[1:]
        t_c, _, _, p_c, c_c, _ = stream(host, port, "/v1/chat/completions", dict(body, messages=changed), cpu_c)
        new = max(1, p_w - (c_w or 0))
        ids = [1000 + (7919 * (i * 64 + j)) % 20000 for j in range(new)]  # no slot starts with these
        t_f, _, _, p_f, c_f, _ = stream(host, port, "/v1/completions",
                                        {"prompt": ids, "max_tokens": 8, "temperature": 0}, cpu_f)
        warm.append(1000 * t_w)
        cold.append(1000 * t_c)
        fresh.append(1000 * t_f)
        rows.append({"prompt": p_w, "cached": c_w, "cold_prompt": p_c, "cold_cached": c_c, "fresh_prompt": p_f,
                     "fresh_cached": c_f})
    ms = lambda xs: 1000 * statistics.median(xs) if xs and None not in xs else None  # noqa: E731
    return {"warm_ttft_ms": statistics.median(warm), "cold_ttft_ms": statistics.median(cold),
            "fresh_ttft_ms": statistics.median(fresh), "warm_cpu_ms": ms(cpu_w), "cold_cpu_ms": ms(cpu_c),
            "fresh_cpu_ms": ms(cpu_f), "detail": rows}


def fill(host, port, slots, slot_ctx, prompt_tokens):
    """One completion per slot at once: a prompt of prompt_tokens token ids (different from the first id on, so
    that no slot shares another's prefix) and generation to 8 positions short of the slot's context."""
    tokens = slot_ctx - prompt_tokens - 8
    if tokens < 1:
        sys.exit(f"serve_bench: --fill {prompt_tokens} leaves no room to generate in a {slot_ctx}-position slot")
    results, errors = [], []

    def one(k):
        ids = [1000 + (7919 * (k * 4096 + j)) % 20000 for j in range(prompt_tokens)]
        try:
            _, _, n, p, _, _ = stream(host, port, "/v1/completions",
                                      {"prompt": ids, "max_tokens": tokens, "temperature": 0, "ignore_eos": True})
            results.append((p, n))
        except Exception as e:  # reported below
            errors.append(e)

    run_threads([lambda k=k: one(k) for k in range(slots)], errors, "--fill requests")
    return {"requests": len(results), "prompt_tokens": [p for p, _ in results],
            "completion_tokens": [n for _, n in results]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(a):
    """The server on 127.0.0.1 (a free port), up when /health answers 200; (process, url, log lines)."""
    port = free_port()
    cmd = [a.server, "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "-np", str(a.slots), "-c",
           str(a.slots * a.slot_ctx), "-t", str(a.threads)] + a.extra.split()
    log = []
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, errors="replace")
    threading.Thread(target=lambda: [log.append(x) for x in proc.stderr], daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    end = time.time() + 600
    while time.time() < end and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, url, cmd
        except Exception:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"serve_bench: the server did not start: {' '.join(cmd)}\n{''.join(log)[-2000:]}")


def peak_rss_mib(pid):
    try:
        m = re.search(r"^VmHWM:\s+(\d+) kB", open(f"/proc/{pid}/status").read(), re.M)
        return int(m.group(1)) / 1024 if m else None
    except OSError:
        return None


def report(paths):
    """Markdown tables: the median of each figure over the runs in the JSON lines files."""
    rows = [json.loads(line) for p in paths for line in open(p) if line.strip()]
    by = {}
    for r in rows:
        by.setdefault((r["model"], r["kind"], r.get("what", "level"), r.get("clients", 0)), []).append(r)
    med = lambda rs, k: statistics.median([r[k] for r in rs if r.get(k) is not None]) if any(  # noqa: E731
        r.get(k) is not None for r in rs) else float("nan")
    for model in sorted({k[0] for k in by}):
        print(f"\n{model}\n")
        print("| clients | server | runs | gen tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | "
              "server CPU ms/token |")
        print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        levels = sorted({k[3] for k in by if k[0] == model and k[2] == "level"})
        for n in levels:
            for kind in ("kiln-server", "llama-server"):
                rs = by.get((model, kind, "level", n))
                if rs:
                    print(f"| {n} | {kind} | {len(rs)} | {med(rs, 'tok_s'):.1f} | {med(rs, 'ttft_p50'):.1f} | "
                          f"{med(rs, 'ttft_p99'):.1f} | {med(rs, 'itl_p50'):.2f} | {med(rs, 'itl_p99'):.2f} | "
                          f"{med(rs, 'cpu_ms_per_token'):.2f} |")
        for kind in ("kiln-server", "llama-server", "kiln-generate"):
            rs = by.get((model, kind, "single", 1))
            if rs:
                print(f"\none client, {kind}: TTFT {med(rs, 'ttft_ms'):.1f} ms, decode {med(rs, 'decode_tok_s'):.1f} "
                      f"tok/s ({len(rs)} runs, {rs[0].get('tokens')} tokens)")
        for kind in ("kiln-server", "llama-server"):
            rs = by.get((model, kind, "turn2", 0))
            if rs:
                d = rs[-1]["detail"][0]
                print(f"\nsecond turn, {kind}: TTFT {med(rs, 'warm_ttft_ms'):.1f} ms with the first turn cached "
                      f"({d['cached']} of {d['prompt']} prompt tokens), {med(rs, 'cold_ttft_ms'):.1f} ms without "
                      f"({d['cold_cached']} of {d['cold_prompt']})")
                if d.get("fresh_prompt") is not None:
                    print(f"second turn, {kind}: a fresh prompt of its {d['prompt'] - (d['cached'] or 0)} new tokens: "
                          f"TTFT {med(rs, 'fresh_ttft_ms'):.1f} ms")
                if any(r.get("warm_cpu_ms") is not None for r in rs):
                    print(f"second turn, {kind}: server CPU ms to the first token: cached {med(rs, 'warm_cpu_ms'):.1f}, "
                          f"not cached {med(rs, 'cold_cpu_ms'):.1f}, fresh prompt of the new tokens "
                          f"{med(rs, 'fresh_cpu_ms'):.1f}")
        mem = by.get((model, "kiln-generate", "memory", 0))
        budget = f" (the model file {mem[0]['model_mib']:.1f} + KV cache {mem[0]['kv_mib']:.1f} MiB of " \
                 f"{mem[0]['slots']} x {mem[0]['slot_ctx']} positions = " \
                 f"{mem[0]['model_mib'] + mem[0]['kv_mib']:.1f} MiB)" if mem else ""
        for kind in ("kiln-server", "llama-server"):
            rs = by.get((model, kind, "rss", 0))
            if rs:
                print(f"\npeak RSS, {kind}: {med(rs, 'peak_rss_mib'):.1f} MiB{budget if kind == 'kiln-server' else ''}")
            rs = by.get((model, kind, "rss_full", 0))
            if rs:
                print(f"\npeak RSS with every slot full, {kind}: {med(rs, 'peak_rss_mib'):.1f} MiB")


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
    ap.add_argument("--single-prompt", help="also: one client, a completion of this prompt")
    ap.add_argument("--single-reps", type=int, default=3)
    ap.add_argument("--turn2", type=int, default=0, help="also: N second turns of a conversation")
    ap.add_argument("--fill", type=int, default=0,
                    help="last: one N-token prompt per slot at once, generated to the slot's end (peak RSS at full context)")
    ap.add_argument("--json-out", help="append every figure as a JSON line to this file")
    ap.add_argument("--report", nargs="+", help="print medians of these --json-out files as markdown, and exit")
    a = ap.parse_args()
    if a.report:
        return report(a.report)
    proc = None
    kind = "server"
    global SERVER_PID
    if a.url:
        url = a.url
    else:
        proc, url, cmd = start(a)
        SERVER_PID = proc.pid
        kind = "llama-server" if "llama-server" in os.path.basename(a.server) else "kiln-server"
    host, port = url.split("//")[1].split(":")
    port = int(port)
    model = os.path.basename(a.model or "?")
    out = open(a.json_out, "a") if a.json_out else None

    def keep(**kw):
        if out:
            out.write(json.dumps(dict(kw, model=model, kind=kind, slots=a.slots, slot_ctx=a.slot_ctx,
                                      threads=a.threads, tokens=a.tokens, time=time.time())) + "\n")
            out.flush()

    stream(host, port, "/v1/chat/completions", chat_body(0, 8))  # warm-up
    print(f"{kind} {model}: {'clients':>7} {'requests':>8} {'gen tok/s':>10} {'TTFT p50 ms':>12} "
          f"{'TTFT p99 ms':>12} {'ITL p50 ms':>11} {'ITL p99 ms':>11}"
          f"{'' if SERVER_PID is None else ' CPU ms/token'}", flush=True)
    try:
        for n in [int(x) for x in a.clients.split(",") if x]:
            s, wall = run_level(host, port, n, a.tokens, a.seconds)
            row = {"tok_s": s["tokens"] / wall, "ttft_p50": 1000 * pct(s["ttft"], 50),
                   "ttft_p99": 1000 * pct(s["ttft"], 99), "itl_p50": 1000 * pct(s["itl"], 50),
                   "itl_p99": 1000 * pct(s["itl"], 99), "requests": s["requests"],
                   "cpu_ms_per_token": None if s["cpu_s"] is None else 1000 * s["cpu_s"] / max(1, s["tokens"])}
            keep(what="level", clients=n, **row)
            cpu = "" if row["cpu_ms_per_token"] is None else f" {row['cpu_ms_per_token']:>12.2f}"
            print(f"{kind} {model}: {n:>7} {s['requests']:>8} {row['tok_s']:>10.1f} {row['ttft_p50']:>12.1f} "
                  f"{row['ttft_p99']:>12.1f} {row['itl_p50']:>11.2f} {row['itl_p99']:>11.2f}{cpu}", flush=True)
        if a.single_prompt:
            r = single(host, port, a.single_prompt, a.tokens, a.single_reps)
            keep(what="single", clients=1, **r)
            print(f"{kind} {model}: one client: {r}", flush=True)
        if a.turn2:
            r = turn2(host, port, a.turn2, a.tokens)
            keep(what="turn2", **r)
            print(f"{kind} {model}: second turn: {r}", flush=True)
        if proc:
            rss = peak_rss_mib(proc.pid)
            keep(what="rss", peak_rss_mib=rss, command=" ".join(cmd))
            print(f"{kind} {model}: peak RSS {rss} MiB", flush=True)
        if a.fill:
            r = fill(host, port, a.slots, a.slot_ctx, a.fill)
            print(f"{kind} {model}: every slot full: {r}", flush=True)
            if proc:
                rss = peak_rss_mib(proc.pid)
                keep(what="rss_full", peak_rss_mib=rss, command=" ".join(cmd), **r)
                print(f"{kind} {model}: peak RSS with every slot full {rss} MiB", flush=True)
    finally:
        if proc:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
