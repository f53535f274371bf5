#!/usr/bin/env python3
"""kiln-server against real clients: the `openai` Python package and curl, on 127.0.0.1 only.

  test_server.py --server BUILD/examples/kiln-server --venv REPO/.venv --mode api|fault

api   (SmolLM2-135M-Instruct from $KILN_MODEL_DIR): chat and completions, JSON and streamed, stop strings,
      usage with cached tokens, the error classes, 16 concurrent greedy requests on 4 slots equal to each
      request sent alone, disconnects mid-stream free their slots, a full queue answers 503 + Retry-After,
      the API key, SIGTERM during a stream (the stream completes, exit status 0).
fault (the tiny stories260K: fast under ASan): out-of-range and malformed numeric flags (each refused
      naming the flag, the value and the range --help states), clients that disconnect mid-stream,
      malformed, invalid and oversized bodies, 64 concurrent streams on 4 slots; the server answers /health after and exits 0 on
      SIGTERM (under ASan: no leaks, or the exit status says so).

Every request goes to a server this script started on 127.0.0.1 (a free port it picks, --port 0); request
counts and waits are bounded; the script stops its servers itself. It fails (never skips) when the venv or
the `openai` package is missing.
"""
import argparse
import concurrent.futures as cf
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAIL: {what}", flush=True)
    return cond


def reexec_in_venv(venv):
    """Runs this script with the tools venv's python (which has `openai`), or fails naming the fix."""
    py = os.path.join(venv, "bin", "python")
    if os.path.realpath(sys.executable) != os.path.realpath(py) and os.environ.get("KILN_SERVE_TEST_REEXEC") != "1":
        if not os.path.exists(py):
            sys.exit(f"test_server.py: FAIL: no tools venv at {venv}: run scripts/python_env.sh (scripts/test.sh does)")
        os.environ["KILN_SERVE_TEST_REEXEC"] = "1"
        os.execv(py, [py] + sys.argv)
    try:
        import openai  # noqa: F401
    except ImportError:
        sys.exit(f"test_server.py: FAIL: the `openai` package is not in {venv}: run scripts/python_env.sh "
                 "(it installs scripts/requirements-tools.txt)")


class Server:
    """kiln-server on 127.0.0.1, a free port; stderr collected (shown on failure)."""

    def __init__(self, exe, args):
        self.proc = subprocess.Popen([exe, "--host", "127.0.0.1", "--port", "0"] + args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.log = []
        self.url = None
        ready = threading.Event()

        def drain():
            for line in self.proc.stderr:
                self.log.append(line)
                m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
                if m:
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(120) or not self.url:
            self.proc.kill()
            sys.exit("test_server.py: FAIL: kiln-server did not start:\n" + "".join(self.log))

    def stop(self, sig=signal.SIGTERM, timeout=60):
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            check(False, f"kiln-server did not exit within {timeout} s of signal {sig}")
            return None


def curl(url, *args, body=None):
    """(status, headers text, body text) of one curl call."""
    cmd = ["curl", "-sS", "--max-time", "120", "-D", "-", url] + list(args)
    if body is not None:
        cmd += ["--data-binary", "@-", "-H", "Content-Type: application/json"]
        if isinstance(body, str):
            body = body.encode()
    out = subprocess.run(cmd, input=body, capture_output=True, timeout=180).stdout
    text = out.decode("utf-8", "replace")
    head, _, rest = text.partition("\r\n\r\n")
    while head.startswith("HTTP/1.1 100"):
        head, _, rest = rest.partition("\r\n\r\n")
    status = int(head.split()[1]) if head.startswith("HTTP/") else 0
    return status, head, rest


def error_of(status, body, want_status, want_param=None, want_in=None, what=""):
    ok = check(status == want_status, f"{what}: status {status}, want {want_status} ({body[:200]})")
    try:
        e = json.loads(body)["error"]
    except Exception:
        return check(False, f"{what}: not OpenAI error JSON: {body[:200]}")
    ok &= check(set(e) >= {"message", "type", "param", "code"}, f"{what}: error fields {sorted(e)}")
    if want_param is not None:
        ok &= check(e.get("param") == want_param, f"{what}: param {e.get('param')!r}, want {want_param!r}")
    if want_in is not None:
        ok &= check(want_in in e.get("message", ""), f"{what}: message {e.get('message')!r} lacks {want_in!r}")
    return ok


def metric(url, name):
    _, _, body = curl(url + "/metrics")
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", body, re.M)
    return float(m.group(1)) if m else None


def wait_idle(url, seconds=60):
    """Waits (bounded) until no slot is busy; returns whether that happened."""
    end = time.time() + seconds
    while time.time() < end:
        if metric(url, "kiln_slots_busy") == 0 and metric(url, "kiln_queue_depth") == 0:
            return True
        time.sleep(0.05)
    return False


def open_stream_and_drop(url, path, body, chunks=2):
    """Starts a streamed request on a raw socket, reads `chunks` events, then closes the connection."""
    host, port = url.split("//")[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    while got.count(b"data: ") < chunks:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    return got


# ---- api mode ------------------------------------------------------------------------------------------

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # SmolLM2 keeps counting: a stream that runs long


def api_tests(exe, model_dir):
    from openai import OpenAI
    import openai

    model = os.path.join(model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        sys.exit(f"test_server.py: FAIL: missing model {model}: run scripts/fetch_models.sh")
    srv = Server(exe, ["-m", model, "-c", "2048", "-np", "4", "-t", "2", "--max-body", "65536"])
    url = srv.url
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        # Models, health, tokenize round trip.
        models = client.models.list()
        check(len(models.data) == 1 and models.data[0].id == os.path.basename(model), f"/v1/models: {models}")
        st, _, body = curl(url + "/health")
        check(st == 200 and json.loads(body)["status"] == "ok", f"/health: {st} {body}")
        st, _, body = curl(url + "/tokenize", body='{"content": "Hello world"}')
        toks = json.loads(body)["tokens"]
        st, _, body = curl(url + "/detokenize", body=json.dumps({"tokens": toks}))
        check(json.loads(body)["content"] == "Hello world", f"/detokenize of /tokenize: {body}")

        # The chat page: one self-contained HTML file (nothing fetched from elsewhere).
        st, head, page = curl(url + "/")
        check(st == 200 and "text/html" in head, f"GET /: {st} {head}")
        for part in ('id="input"', 'id="stop"', 'id="new"', 'id="temp"', 'id="maxtok"', "/v1/chat/completions",
                     "tokens/s"):
            check(part in page, f"the chat page has {part}")
        check(not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|@import|url\(""", page),
              "the chat page loads nothing from elsewhere")

        # Chat, JSON: a greedy answer, usage consistent.
        msgs = [{"role": "user", "content": "What is the capital of France?"}]
        r = client.chat.completions.create(model="x", messages=msgs, max_tokens=30, temperature=0)
        answer = r.choices[0].message.content
        check("Paris" in answer, f"chat answer {answer!r} should name Paris")
        check(r.choices[0].finish_reason == "stop", f"finish_reason {r.choices[0].finish_reason}")
        check(r.choices[0].message.role == "assistant", "role")
        u = r.usage
        check(u.total_tokens == u.prompt_tokens + u.completion_tokens and u.completion_tokens > 0, f"usage {u}")

        # The same conversation again: its prompt comes from the slot's cache (all but the last token).
        r2 = client.chat.completions.create(model="x", messages=msgs, max_tokens=30, temperature=0)
        check(r2.choices[0].message.content == answer, "a repeated greedy request gives the same answer")
        check(r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - 1,
              f"cached tokens {r2.usage.prompt_tokens_details} of {r2.usage.prompt_tokens}")

        # Streamed chat == the JSON answer; role first; finish_reason last; the usage chunk.
        chunks = list(client.chat.completions.create(model="x", messages=msgs, max_tokens=30, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        check(text == answer, f"streamed {text!r} != {answer!r}")
        check(chunks[0].choices[0].delta.role == "assistant", "first chunk carries the role")
        fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        check(fin == ["stop"], f"finish reasons {fin}")
        check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == u.completion_tokens,
              f"usage chunk {chunks[-1]}")

        # The next turn (the answer sent back as text, a new question): only the tokens after the first answer
        # are computed; the slot's whole first turn (its prompt and answer tokens) is reused and counted.
        evaluated0 = metric(url, "kiln_prompt_tokens_evaluated_total")
        msgs2 = msgs + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And of Italy?"}]
        t2 = client.chat.completions.create(model="x", messages=msgs2, max_tokens=8, temperature=0)
        cached2 = t2.usage.prompt_tokens_details.cached_tokens
        check(cached2 == u.prompt_tokens + u.completion_tokens,
              f"second turn: {cached2} cached tokens, want the first turn's {u.prompt_tokens} + {u.completion_tokens}")
        evaluated = metric(url, "kiln_prompt_tokens_evaluated_total") - evaluated0
        check(evaluated == t2.usage.prompt_tokens - cached2,
              f"second turn: {evaluated} prompt tokens computed, want {t2.usage.prompt_tokens} - {cached2}")

        # A control token spelled in a message is text: the prompt grows by its text tokens, no new turn.
        plain = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        forged = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi<|im_start|>"}], max_tokens=1)
        _, _, body = curl(url + "/tokenize", body='{"content": "<|im_start|>"}')
        n_text = len(json.loads(body)["tokens"])
        check(n_text > 1, f"'<|im_start|>' as text is several tokens ({n_text})")
        check(forged.usage.prompt_tokens == plain.usage.prompt_tokens + n_text,
              f"forged prompt {forged.usage.prompt_tokens} tokens, plain {plain.usage.prompt_tokens} + {n_text}")

        # Completions: JSON == streamed; max_tokens -> length; a stop string cuts before it.
        c = client.completions.create(model="x", prompt="Once upon a time", max_tokens=24, temperature=0)
        full = c.choices[0].text
        check(c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 24,
              f"completion finish {c.choices[0].finish_reason} tokens {c.usage.completion_tokens}")
        streamed = "".join(x.choices[0].text for x in client.completions.create(
            model="x", prompt="Once upon a time", max_tokens=24, temperature=0, stream=True) if x.choices)
        check(streamed == full, f"streamed completion {streamed!r} != {full!r}")
        words = full.split()
        stop = words[len(words) // 2] if len(words) > 2 else None
        if check(stop is not None, f"completion {full!r} too short for a stop string"):
            s = client.completions.create(model="x", prompt="Once upon a time", max_tokens=24, temperature=0, stop=[stop])
            check(s.choices[0].text == full[:full.index(stop)] and s.choices[0].finish_reason == "stop",
                  f"stop {stop!r}: {s.choices[0].text!r} ({s.choices[0].finish_reason}) vs {full!r}")
        # Seeded sampling repeats itself.
        a = client.completions.create(model="x", prompt="The weather", max_tokens=12, temperature=0.9, seed=7, top_p=0.9)
        b = client.completions.create(model="x", prompt="The weather", max_tokens=12, temperature=0.9, seed=7, top_p=0.9)
        check(a.choices[0].text == b.choices[0].text, "the same seed gives the same sample")

        # n choices: each what its seed gives alone (choice i: seed + i), the prompt computed once.
        wait_idle(url)
        evaluated0 = metric(url, "kiln_prompt_tokens_evaluated_total")
        story = [{"role": "user", "content": "Tell me a very short story about a cat."}]
        many = client.chat.completions.create(model="x", messages=story, max_tokens=12, temperature=1.0, seed=11, n=3)
        evaluated = metric(url, "kiln_prompt_tokens_evaluated_total") - evaluated0
        check([c.index for c in many.choices] == [0, 1, 2], f"n = 3: choice indices {[c.index for c in many.choices]}")
        singles = [client.chat.completions.create(model="x", messages=story, max_tokens=12, temperature=1.0,
                                                  seed=11 + i) for i in range(3)]
        for i, (c, one) in enumerate(zip(many.choices, singles)):
            check(c.message.content == one.choices[0].message.content,
                  f"n = 3: choice {i} {c.message.content!r} != seed {11 + i} alone {one.choices[0].message.content!r}")
        check(many.usage.prompt_tokens == singles[0].usage.prompt_tokens, f"n = 3: prompt counted once: {many.usage}")
        check(many.usage.completion_tokens == sum(o.usage.completion_tokens for o in singles),
              f"n = 3: completion tokens {many.usage.completion_tokens}, the choices' sum "
              f"{sum(o.usage.completion_tokens for o in singles)}")
        want = many.usage.prompt_tokens - many.usage.prompt_tokens_details.cached_tokens + 2
        check(evaluated == want, f"n = 3: {evaluated} prompt tokens computed, want the prompt's uncached part + 2 = {want}")
        chunks = list(client.chat.completions.create(model="x", messages=story, max_tokens=12, temperature=1.0, seed=11,
                                                     n=3, stream=True, stream_options={"include_usage": True}))
        for i, c in enumerate(many.choices):
            text = "".join(x.choices[0].delta.content or "" for x in chunks if x.choices and x.choices[0].index == i)
            check(text == c.message.content, f"n = 3 streamed: choice {i} {text!r} != {c.message.content!r}")
        ends = sorted(x.choices[0].index for x in chunks if x.choices and x.choices[0].finish_reason)
        check(ends == [0, 1, 2], f"n = 3 streamed: one finish_reason per choice: {ends}")
        check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == many.usage.completion_tokens,
              f"n = 3 streamed: usage {chunks[-1].usage}")

        # Chat logprobs: one entry per token; the tokens' bytes make the content; greedy picks the top one.
        lp = client.chat.completions.create(model="x", messages=msgs, max_tokens=10, temperature=0, logprobs=True,
                                            top_logprobs=3)
        content = lp.choices[0].logprobs.content
        check(len(content) == lp.usage.completion_tokens, f"logprobs: {len(content)} entries, "
              f"{lp.usage.completion_tokens} tokens")
        check(bytes(b for e in content for b in e.bytes).decode("utf-8", "replace") == lp.choices[0].message.content,
              "logprobs: the tokens' bytes make the content")
        for e in content:
            tops = [t.logprob for t in e.top_logprobs]
            check(len(tops) == 3 and tops == sorted(tops, reverse=True) and e.logprob <= 0,
                  f"logprobs: top 3 sorted, <= 0: {e}")
            check(e.top_logprobs[0].token == e.token and abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6,
                  f"logprobs: greedy takes the most likely token: {e}")
            check(sum(math.exp(t) for t in tops) <= 1 + 1e-5, f"logprobs: probabilities sum over 1: {tops}")
        check(client.chat.completions.create(model="x", messages=msgs, max_tokens=2).choices[0].logprobs is None,
              "no logprobs unless asked")

        # Errors through the client (its exception classes) and curl.
        def bad(what, status, param, fn):
            try:
                fn()
                check(False, f"{what}: no error")
            except openai.APIStatusError as e:
                check(e.status_code == status, f"{what}: status {e.status_code}, want {status}")
                err = e.body if isinstance(e.body, dict) else {}
                check(err.get("param") == param, f"{what}: param {err.get('param')!r}, want {param!r} ({err})")
        bad("empty messages", 400, "messages", lambda: client.chat.completions.create(model="x", messages=[]))
        bad("temperature as a string", 400, "temperature",
            lambda: client.chat.completions.create(model="x", messages=msgs, temperature="hot"))
        bad("n = 17", 400, "n", lambda: client.chat.completions.create(model="x", messages=msgs, n=17))
        bad("top_logprobs without logprobs", 400, "top_logprobs",
            lambda: client.chat.completions.create(model="x", messages=msgs, top_logprobs=2))
        bad("top_logprobs = 21", 400, "top_logprobs",
            lambda: client.chat.completions.create(model="x", messages=msgs, logprobs=True, top_logprobs=21))
        bad("a role the template refuses", 400, "messages",
            lambda: client.chat.completions.create(model="x", messages=[{"role": "wizard", "content": "hi"}]))
        st, _, body = curl(url + "/v1/chat/completions", body='{"messages": [')
        error_of(st, body, 400, None, "malformed JSON", "malformed JSON")
        st, _, body = curl(url + "/v1/chat/completions", body='{"model": "x"}')
        error_of(st, body, 400, "messages", "missing", "missing messages")
        st, _, body = curl(url + "/v1/chat/completions", body=b'{"messages": [{"role": "user", "content": "\xff"}]}')
        error_of(st, body, 400, None, "UTF-8", "invalid UTF-8")
        st, _, body = curl(url + "/v1/completions", body=json.dumps({"prompt": "x" * 70000}).encode())
        error_of(st, body, 413, None, "65536", "body too large")
        st, _, body = curl(url + "/v1/completions", body=json.dumps({"prompt": "hello " * 600}).encode())
        error_of(st, body, 400, "prompt", "601 tokens", "prompt beyond the context")
        check("512" in json.loads(body)["error"]["message"], f"the context size is named: {body}")
        st, _, body = curl(url + "/v1/completions", body=json.dumps({"prompt": "hi", "stop": 5}).encode())
        error_of(st, body, 400, "stop", "'stop' must be", "stop of the wrong type")
        st, _, body = curl(url + "/v1/nothing")
        error_of(st, body, 404, None, "/v1/nothing", "unknown endpoint")
        st, head, body = curl(url + "/v1/completions", "-N", body=b'{"prompt": "Hi", "max_tokens": 3, "stream": true}')
        check(st == 200 and "text/event-stream" in head and body.rstrip().endswith("data: [DONE]"),
              f"curl SSE: {st} {head} {body[-200:]}")

        # 16 greedy requests at once on 4 slots == each alone.
        prompts = [f"Write one sentence about {w}." for w in
                   ["cats", "the sea", "bread", "winter", "trains", "music", "a forest", "the moon", "coffee", "rain",
                    "mountains", "a library", "bicycles", "the desert", "gardens", "clocks"]]

        def ask(p):
            r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": p}], max_tokens=24,
                                               temperature=0)
            return r.choices[0].message.content
        alone = [ask(p) for p in prompts]
        with cf.ThreadPoolExecutor(16) as ex:
            together = list(ex.map(ask, prompts))
        for p, a1, t1 in zip(prompts, alone, together):
            check(a1 == t1, f"concurrent != alone for {p!r}: {t1!r} vs {a1!r}")
        check(metric(url, "kiln_requests_finished_total{reason=\"error\"}") == 0, "no request ended in error")

        # Disconnects mid-stream: the slots come free, the cancellations are counted, the server still serves.
        cancelled0 = metric(url, 'kiln_requests_finished_total{reason="cancelled"}')
        for _ in range(4):
            got = open_stream_and_drop(url, "/v1/completions",
                                       {"prompt": COUNTING, "max_tokens": 400, "temperature": 0, "stream": True})
            check(got.count(b"data: ") >= 2, f"stream started: {got[:200]!r}")
        check(wait_idle(url), "slots free after the clients went away")
        cancelled = metric(url, 'kiln_requests_finished_total{reason="cancelled"}')
        check(cancelled - cancelled0 == 4, f"4 disconnected streams cancelled (counted {cancelled - cancelled0})")
        check(ask(prompts[0]) == alone[0], "served after the disconnects")

        # SIGTERM while a stream runs: the stream completes (within the 5 s grace), the exit status is 0.
        result = {}

        def late():
            chunks = list(client.completions.create(model="x", prompt="Once upon a time", max_tokens=40,
                                                    temperature=0, stream=True))
            result["text"] = "".join(c.choices[0].text for c in chunks if c.choices)
        th = threading.Thread(target=late)
        th.start()
        time.sleep(0.3)
        rc = srv.stop(signal.SIGTERM)
        th.join(60)
        check(rc == 0, f"exit status after SIGTERM: {rc}")
        text = result.get("text") or ""
        check(text.startswith(full) and len(text) > len(full),
              f"the running stream (40 tokens) finished before exit: {text!r}, greedy 24 tokens {full!r}")
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()

    # A second server: one slot, a queue of one, an API key.
    srv = Server(exe, ["-m", model, "-c", "1024", "-np", "1", "-t", "2", "--max-queue", "1", "--api-key", "sekret"])
    url = srv.url
    try:
        st, _, body = curl(url + "/v1/models")
        error_of(st, body, 401, None, "API key", "missing API key")
        try:
            OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
            check(False, "a wrong API key is accepted")
        except openai.AuthenticationError as e:
            check(e.status_code == 401, "401 for a wrong key")
        ok = OpenAI(base_url=url + "/v1", api_key="sekret", max_retries=0)
        check(ok.models.list().data[0].object == "model", "the right key works")
        st, _, _ = curl(url + "/health")
        check(st == 200, "/health needs no key")
        st, _, _ = curl(url + "/")
        check(st == 200, "the chat page needs no key (it asks for one)")
        # The slot and the queue taken by two long streams: the third request gets 503 + Retry-After.
        body = {"prompt": COUNTING, "max_tokens": 600, "temperature": 0, "stream": True}
        socks = []
        host, port = url.split("//")[1].split(":")
        for key in ("busy", "queued"):  # the first takes the slot, then the second waits in the queue
            s = socket.create_connection((host, int(port)), timeout=60)
            data = json.dumps(body).encode()
            s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
            socks.append(s)
            end = time.time() + 30
            while time.time() < end and not (metric_auth(url) or {}).get(key):
                time.sleep(0.05)
            check((metric_auth(url) or {}).get(key) == 1, f"{key}: {metric_auth(url)}")
        st, head, body3 = curl(url + "/v1/completions", "-H", "Authorization: Bearer sekret",
                               body=b'{"prompt": "hi", "max_tokens": 2}')
        error_of(st, body3, 503, None, "max_queue", "full queue")
        check(re.search(r"(?im)^retry-after: \d+", head) is not None, f"Retry-After header: {head}")
        for s in socks:
            s.close()
        end = time.time() + 60
        while time.time() < end and (metric_auth(url) or {}).get("busy", 1) != 0:
            time.sleep(0.05)
        check((metric_auth(url) or {}).get("busy") == 0, "the dropped streams freed the slot")
        check(srv.stop() == 0, "exit status 0")
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def metric_auth(url):
    out = subprocess.run(["curl", "-sS", "--max-time", "10", "-H", "Authorization: Bearer sekret", url + "/metrics"],
                         capture_output=True, text=True).stdout
    vals = dict(re.findall(r"^kiln_(slots_busy|queue_depth) (\S+)$", out, re.M))
    if not vals:
        return None
    return {"busy": float(vals.get("slots_busy", -1)), "queued": float(vals.get("queue_depth", 0))}


# ---- fault mode ----------------------------------------------------------------------------------------

def help_entries(exe):
    """kiln-server --help as {flag: (value name, description)}, continuation lines joined."""
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=30)
    check(out.returncode == 0, f"--help exits 0 ({out.returncode})")
    entries, cur = {}, None
    for line in out.stdout.splitlines():
        m = re.match(r"^\s{2,6}(?:(-\w+), )?(--[\w-]+)(?: (\w+))?\s+(.*)$", line)
        if m:
            cur = [m.group(3), m.group(4)]
            entries[m.group(2)] = cur
            if m.group(1):
                entries[m.group(1)] = cur
        elif cur is not None and line.startswith(" " * 20):
            cur[1] += " " + line.strip()
    return entries


def argument_tests(exe, model):
    """Every numeric flag (value N or S in --help) states a range there; a value outside it, a fraction or a
    word exits 2 before loading anything, naming the flag, the value and that range."""
    entries = help_entries(exe)
    numeric = {f: e for f, e in entries.items() if f.startswith("--") and e[0] in ("N", "S")}
    check(len(numeric) >= 9, f"numeric flags in --help: {sorted(numeric)}")
    for flag, (_, text) in sorted(numeric.items()):
        m = re.search(r"in \[(-?\d+), (-?\d+)\]", text)
        if not check(m is not None, f"--help states the range of {flag}: {text!r}"):
            continue
        lo, hi = int(m.group(1)), int(m.group(2))
        for v in (str(lo - 1), str(hi + 1), "1.5", "many"):
            cmd = [exe, "-m", model, "--host", "127.0.0.1", "--port", "0", flag, v]
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except subprocess.TimeoutExpired:
                check(False, f"{flag} {v}: accepted (the server ran)")
                continue
            named = flag in r.stderr and f"'{v}'" in r.stderr and f"[{lo}, {hi}]" in r.stderr
            check(r.returncode == 2 and named,
                  f"{flag} {v}: exit {r.returncode}, want 2 with flag, value and [{lo}, {hi}]: {r.stderr.strip()!r}")


def kv_flag_tests(exe, model):
    """--kv: a type outside auto/f32/f16/q8_0 exits 2 naming the flag and the value; q8_0 on a model whose head_dim
    is not a multiple of 32 (stories260K: 8) fails at start-up with an error naming head_dim, not a crash."""
    r = subprocess.run([exe, "-m", model, "--port", "0", "--kv", "q4_0"], capture_output=True, text=True, timeout=30)
    check(r.returncode == 2 and "--kv" in r.stderr and "'q4_0'" in r.stderr, f"--kv q4_0: {r.returncode} {r.stderr!r}")
    try:
        r = subprocess.run([exe, "-m", model, "--port", "0", "--kv", "q8_0"], capture_output=True, text=True,
                           timeout=60)
        check(r.returncode not in (0, 2) and r.returncode > 0 and "head_dim" in r.stderr,
              f"--kv q8_0 on head_dim 8: exit {r.returncode}, {r.stderr.strip()!r}")
    except subprocess.TimeoutExpired:
        check(False, "--kv q8_0 on head_dim 8: the server ran")


def kv_q8_0_tests(exe, model_dir):
    """--kv q8_0 on SmolLM2 (head_dim 64): the start-up memory line's KV caches are 34/64 of an f16 server's (Q8_0
    blocks: 34 bytes per 32 values), and greedy completions come back through the openai client."""
    from openai import OpenAI

    model = os.path.join(model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    kv = {}
    for t in ("f16", "q8_0"):
        srv = Server(exe, ["-m", model, "-c", "1024", "-np", "2", "-t", "2", "--kv", t])
        try:
            m = re.search(r"KV caches up to ([\d.]+) MiB", "".join(srv.log))
            kv[t] = float(m.group(1)) if m else None
            if t == "q8_0":
                client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
                r = client.completions.create(model="x", prompt="The capital of France is", max_tokens=8, temperature=0,
                                              extra_body={"ignore_eos": True})
                check(r.usage.completion_tokens == 8 and len(r.choices[0].text) > 0,
                      f"--kv q8_0 completion: {r.usage} {r.choices[0].text!r}")
        finally:
            srv.stop()
    check(kv.get("f16") and kv.get("q8_0") and abs(kv["q8_0"] / kv["f16"] - 34 / 64) < 0.01,
          f"KV caches MiB with --kv f16 / q8_0: {kv}")


def logprob_reference_tests(exe, model_dir):
    """Completions logprobs against Hugging Face transformers' (tests/fixtures/hf/smollm2_logprobs.json, made by
    scripts/fixtures/make_hf_logprobs.py), kiln-server on the exact path (f32 products with the dequantized
    weights, as transformers computes)."""
    from openai import OpenAI

    fx_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures", "hf", "smollm2_logprobs.json")
    fx = json.load(open(fx_path))
    model = os.path.join(model_dir, fx["model"])
    srv = Server(exe, ["-m", model, "-c", "256", "-np", "1", "-t", "2", "--precision", "exact"])
    client = OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    try:
        steps = fx["steps"]
        r = client.completions.create(model="x", prompt=fx["prompt_ids"], max_tokens=len(steps), temperature=0,
                                      logprobs=5, extra_body={"ignore_eos": True})
        got = r.choices[0].logprobs
        check(r.choices[0].text == fx["greedy_text"], f"exact greedy {r.choices[0].text!r} != HF {fx['greedy_text']!r}")
        check(len(got.token_logprobs) == len(steps), f"{len(got.token_logprobs)} logprobs for {len(steps)} tokens")
        for i, (st, lp, top) in enumerate(zip(steps, got.token_logprobs, got.top_logprobs)):
            # kiln's exact-path logits are within 1e-3 of the logit range of HF's (tests/model/test_hf_logits.cpp);
            # a log-softmax moves by at most twice the largest logit change.
            tol = 2 * 1e-3 * st["logit_range"]
            check(abs(lp - st["logprob"]) <= tol, f"step {i}: logprob {lp}, HF {st['logprob']} (tol {tol:.3g})")
            mine = sorted(top.values(), reverse=True)
            check(len(mine) == 5 and all(abs(a - b) <= tol for a, b in zip(mine, st["top_logprobs"])),
                  f"step {i}: top logprobs {mine}, HF {st['top_logprobs']} (tol {tol:.3g})")
            check(got.tokens[i] == st["text"], f"step {i}: token {got.tokens[i]!r}, HF {st['text']!r}")
        check(got.text_offset == [sum(len(t.encode()) for t in got.tokens[:i]) for i in range(len(got.tokens))],
              f"text offsets {got.text_offset}")
    finally:
        srv.stop()


def fault_tests(exe, shared):
    model = os.path.join(shared, "models", "stories260K.gguf")
    if not os.path.exists(model):
        sys.exit(f"test_server.py: FAIL: missing {model}")
    argument_tests(exe, model)
    kv_flag_tests(exe, model)
    srv = Server(exe, ["-m", model, "-c", "1024", "-np", "4", "-t", "2", "--max-body", "4096"])
    url = srv.url
    try:
        bodies = [b'{"prompt": ', b"\xff\xfe{}", b"[1, 2]", b'{"prompt": 5}', b'{"prompt": "a", "max_tokens": "many"}',
                  b'{"prompt": "a", "top_k": 1.5}', b'{"messages": "hi"}', b"x" * 10000, b"",
                  b'{"prompt": [1, 2, 99999]}', b'{"prompt": "a", "seed": 1e400}']
        for b in bodies:
            st, _, body = curl(url + "/v1/completions", body=b)
            check(st in (400, 413) and "error" in json.loads(body or "{}"), f"bad body {b[:30]!r}: {st} {body[:200]}")
        st, _, body = curl(url + "/v1/chat/completions", body=b'{"messages": [{"role": "user", "content": "hi"}]}')
        error_of(st, body, 400, "messages", "chat template", "a model without a chat template")

        # Disconnects: 8 streams dropped after their first events.
        for i in range(8):
            open_stream_and_drop(url, "/v1/completions",
                                 {"prompt": "Once upon a time", "max_tokens": 900, "temperature": 1.0, "seed": i,
                                  "stream": True}, chunks=1)
        check(wait_idle(url), "slots free after dropped streams")

        # 64 concurrent streams on 4 slots, each read to the end (bounded: 48 tokens each).
        def stream(i):
            st, _, body = curl(url + "/v1/completions", "-N",
                               body=json.dumps({"prompt": f"Tom had {i} apples and", "max_tokens": 48, "temperature": 0.8,
                                                "seed": i, "stream": True}).encode())
            return st == 200 and body.rstrip().endswith("data: [DONE]")
        with cf.ThreadPoolExecutor(64) as ex:
            oks = list(ex.map(stream, range(64)))
        check(all(oks), f"64 concurrent streams complete: {oks.count(False)} failed")
        st, _, _ = curl(url + "/health")
        check(st == 200, "/health after the load")
        check(wait_idle(url), "idle after the load")
        rc = srv.stop()
        check(rc == 0, f"exit status after SIGTERM: {rc} (under ASan: a leak or error report is in the log)")
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
        if FAILURES:
            print("".join(srv.log)[-4000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--shared", required=True, help="the shared fixtures folder (stories260K)")
    ap.add_argument("--mode", choices=["api", "fault"], required=True)
    a = ap.parse_args()
    reexec_in_venv(a.venv)
    model_dir = os.environ.get("KILN_MODEL_DIR") or os.path.expanduser("~/.cache/kiln/models")
    t0 = time.time()
    if a.mode == "api":
        api_tests(a.server, model_dir)
        logprob_reference_tests(a.server, model_dir)
        kv_q8_0_tests(a.server, model_dir)
    else:
        fault_tests(a.server, a.shared)
    print(f"test_server.py --mode {a.mode}: {len(FAILURES)} failures in {time.time() - t0:.1f} s")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
