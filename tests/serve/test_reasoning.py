#!/usr/bin/env python3
"""kiln-server's reasoning_content against independent references, on 127.0.0.1 only.

  test_reasoning.py --server BUILD/examples/kiln-server --venv REPO/.venv --shared REPO/../shared --mode tiny|model

tiny  (the tiny stories260K: fast under ASan) with real reasoning templates of llama.cpp's corpus (Qwen3,
      DeepSeek-R1 whose generation prompt opens <think>, gpt-oss's harmony): sampled replies (several seeds)
      asked three ways through the `openai` client: reasoning_format "none" (the raw reply), the default
      (message.reasoning_content and content) and streamed (delta.reasoning_content and delta.content
      concatenated). The split must equal this script's own reading of the raw reply (llama.cpp's deepseek
      format / harmony channels, written here from their definitions), the stream must equal the message, and
      usage must count every generated token (the same with and without the split). deepseek-legacy keeps the
      raw reply in content; --reasoning-format none on the command line; a bad reasoning_format is a 400
      naming the field; assistant messages sent back with reasoning_content render byte for byte as Python's
      jinja2 renders them in Hugging Face's environment (gpt-oss: as "thinking", as llama.cpp passes it).
model (SmolLM2-135M-Instruct from $KILN_MODEL_DIR, greedy, a ChatML template with <think> blocks whose
      one-shot example teaches them): the reply has reasoning and an answer, both split as above, streamed and
      not; a second turn sends the reasoning back.

It fails (never skips) when the venv, jinja2, the `openai` package or a model is missing.
"""
import argparse
import copy
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from test_server import FAILURES, Server, check, error_of, reexec_in_venv  # noqa: E402
from test_tools import gguf_token_texts, hf_env, post  # noqa: E402

TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "text", "templates")
QWEN3 = os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")
R1 = os.path.join(TEMPLATES, "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")
GPT_OSS = os.path.join(TEMPLATES, "openai-gpt-oss-120b.jinja")
WS = " \n\t\r"


def think_reference(raw, opened, open_tag="<think>", close_tag="</think>"):
    """llama.cpp's deepseek reading: a block that opens the reply (or that the prompt opened) is the
    reasoning, stripped; the content follows the close tag, leading whitespace dropped; unclosed: all
    reasoning."""
    rest = raw
    if not opened:
        if not raw.lstrip(WS).startswith(open_tag):
            return "", raw
        rest = raw.lstrip(WS)[len(open_tag):]
    reasoning, sep, content = rest.partition(close_tag)
    if not sep:
        return rest.strip(WS), ""
    return reasoning.strip(WS), content.lstrip(WS)


def harmony_reference(raw):
    """gpt-oss's harmony messages: header up to <|message|>, body up to <|end|> (or a new <|start|>);
    analysis -> reasoning, final and commentary without a recipient -> content, addressed messages dropped
    (no tools asked); text before any header is content."""
    import re
    reasoning, content = "", ""
    i = 0
    header_start = re.compile(r"(<\|start\|>|<\|channel\|>| to=|to=|<\|constrain\|>)")
    while i < len(raw):
        m = raw.find("<|message|>", i)
        if not header_start.match(raw, i) or m < 0 or m - i > 512:
            if header_start.match(raw, i) and m < 0 and len(raw) - i <= 512:
                break  # a header cut by the end: markup
            kind, body_at = "content", i
        else:
            h = raw[i:m]
            ch = re.search(r"<\|channel\|>([^\s<]*)", h)
            to = re.search(r"to=([^\s<]*)", h)
            kind = "drop" if to else ("reasoning" if ch and ch.group(1) == "analysis" else "content")
            body_at = m + len("<|message|>")
        ends = [(raw.find(mk, body_at), mk) for mk in ("<|end|>", "<|return|>", "<|call|>", "<|start|>")]
        ends = [(p, mk) for p, mk in ends if p >= 0]
        e, mk = min(ends) if ends else (len(raw), "")
        if kind == "reasoning":
            reasoning += raw[body_at:e]
        elif kind == "content":
            content += raw[body_at:e]
        i = e + (0 if mk in ("", "<|start|>") else len(mk))
    return reasoning, content


def stream_parts(client, args):
    """(reasoning, content, finish_reason, usage) of a streamed request, from the raw deltas."""
    reasoning, content, finish, usage = "", "", None, None
    for ch in client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}):
        if ch.usage:
            usage = ch.usage
        for c in ch.choices:
            d = c.delta
            extra = d.model_extra or {}
            reasoning += extra.get("reasoning_content") or ""
            content += d.content or ""
            finish = c.finish_reason or finish
    return reasoning, content, finish, usage


def check_split(client, what, messages, reference, n_seeds, max_tokens, extra=None):
    """The raw reply (reasoning_format none), the split and the stream of several seeds; returns how many
    replies had reasoning and how many had content."""
    had = [0, 0]
    for seed in range(n_seeds):
        args = dict(model="m", messages=messages, max_tokens=max_tokens, seed=seed, temperature=1.0, **(extra or {}))
        raw = client.chat.completions.create(**args, extra_body={"reasoning_format": "none"})
        r = client.chat.completions.create(**args)
        w = f"{what} seed {seed}"
        raw_text = raw.choices[0].message.content
        check((raw.choices[0].message.model_extra or {}).get("reasoning_content") is None, f"{w}: none has reasoning")
        want_r, want_c = reference(raw_text)
        msg = r.choices[0].message
        got_r = (msg.model_extra or {}).get("reasoning_content", "")
        if not check(got_r == want_r and msg.content == want_c, f"{w}: split differs from the reference"):
            print(f"  raw {raw_text!r}\n  got {got_r!r} / {msg.content!r}\n  want {want_r!r} / {want_c!r}", flush=True)
        check(r.usage.completion_tokens == raw.usage.completion_tokens and
              r.choices[0].finish_reason == raw.choices[0].finish_reason, f"{w}: usage {r.usage} vs {raw.usage}")
        sr, sc, sf, su = stream_parts(client, args)
        check(sr == got_r and sc == msg.content and sf == r.choices[0].finish_reason, f"{w}: stream {sr!r} {sc!r} {sf}")
        check(su is not None and su.completion_tokens == r.usage.completion_tokens, f"{w}: stream usage {su}")
        legacy = client.chat.completions.create(**args, extra_body={"reasoning_format": "deepseek-legacy"})
        lm = legacy.choices[0].message
        check(lm.content == raw_text and (lm.model_extra or {}).get("reasoning_content", "") == want_r,
              f"{w}: deepseek-legacy {lm}")
        had[0] += bool(want_r)
        had[1] += bool(want_c)
    return had


def check_sent_back(srv, template, env, bos, eos, harmony):
    """Assistant messages with reasoning_content, rendered as jinja2 renders them (gpt-oss: as thinking)."""
    src = open(template, encoding="utf-8").read()
    for conv in (
        [{"role": "user", "content": "What is 2+2?"},
         {"role": "assistant", "content": "4.", "reasoning_content": "Two and two make four."}],
        [{"role": "user", "content": "What is 2+2?"},
         {"role": "assistant", "content": "4.", "reasoning_content": "Two and two make four."},
         {"role": "user", "content": "And 3+3?"}],
    ):
        seen = copy.deepcopy(conv)
        if harmony:
            for m in seen:
                if "reasoning_content" in m:
                    m["thinking"] = m["reasoning_content"]
        status, text = post(srv.url, "/apply-template", {"messages": conv})
        try:
            want = env.from_string(src).render(messages=seen, tools=None, documents=None, add_generation_prompt=True,
                                               bos_token=bos, eos_token=eos)
        except Exception as e:  # noqa: BLE001 - jinja2 refuses: kiln-server must refuse too
            error_of(status, text, 400, what=f"{os.path.basename(template)}: sent-back reasoning (jinja2: {e})")
            continue
        got = json.loads(text).get("prompt") if status == 200 else None
        if not check(got == want, f"{os.path.basename(template)}: sent-back reasoning renders as jinja2 ({status})"):
            print(f"--- kiln\n{got!r}\n--- jinja2\n{want!r}", flush=True)
    # a message's reasoning is text: a control token's spelling in it is refused nowhere and stays text
    status, text = post(srv.url, "/apply-template", {"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "a", "reasoning_content": 5}]})
    error_of(status, text, 400, "messages[1].reasoning_content", "string", what="reasoning_content not a string")


def check_tiny(exe, model):
    from openai import OpenAI
    env = hf_env()
    bos, eos = gguf_token_texts(model)
    user = [{"role": "user", "content": "Once upon a time"}]
    for template, reference, harmony in (
        (QWEN3, lambda raw: think_reference(raw, False), False),
        (R1, lambda raw: think_reference(raw, True), False),
        (GPT_OSS, harmony_reference, True),
    ):
        name = os.path.basename(template)
        srv = Server(exe, ["-m", model, "-np", "2", "-c", "2048", "-t", "1", "--chat-template", template])
        try:
            client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
            had = check_split(client, name, user, reference, 4, 24)
            if template == R1:  # the prompt opened the block: every reply's text is reasoning until </think>
                check(had[0] == 4, f"{name}: replies with reasoning {had[0]} of 4")
            check_sent_back(srv, template, env, bos, eos, harmony)
            status, text = post(srv.url, "/v1/chat/completions", {"messages": user, "reasoning_format": "yes"})
            error_of(status, text, 400, "reasoning_format", "deepseek", what=f"{name}: bad reasoning_format")
        finally:
            check(srv.stop() == 0, f"{name}: kiln-server exit status")
    # --reasoning-format none: the raw reply, no reasoning_content
    srv = Server(exe, ["-m", model, "-np", "1", "-c", "1024", "-t", "1", "--chat-template", R1, "--reasoning-format",
                       "none"])
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        r = client.chat.completions.create(model="m", messages=user, max_tokens=8, seed=1)
        check("reasoning_content" not in (r.choices[0].message.model_extra or {}) and r.choices[0].message.content,
              f"--reasoning-format none: {r.choices[0].message}")
    finally:
        check(srv.stop() == 0, "--reasoning-format none: kiln-server exit status")


THINK_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "{{ '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def check_model(exe, model, tmpdir):
    from openai import OpenAI
    path = os.path.join(tmpdir, "think-chatml.jinja")
    with open(path, "w", encoding="utf-8") as f:
        f.write(THINK_CHATML)
    srv = Server(exe, ["-m", model, "-np", "2", "-c", "4096", "-t", "2", "--chat-template", path])
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
        messages = [
            {"role": "system", "content": "Think first inside <think> and </think>, then answer in one sentence."},
            {"role": "user", "content": "What is the capital of Italy?"},
            {"role": "assistant", "content": "The capital of Italy is Rome.",
             "reasoning_content": "The user asks for the capital of Italy. It is Rome."},
            {"role": "user", "content": "What is the capital of France?"}]
        args = dict(model="m", messages=messages, temperature=0, max_tokens=80)
        raw = client.chat.completions.create(**args, extra_body={"reasoning_format": "none"}).choices[0].message.content
        print(f"model: raw reply {raw!r}", flush=True)
        r = client.chat.completions.create(**args)
        msg = r.choices[0].message
        got_r = (msg.model_extra or {}).get("reasoning_content", "")
        want_r, want_c = think_reference(raw, False)
        check(got_r == want_r and msg.content == want_c, f"model: split {got_r!r} / {msg.content!r}")
        check(bool(got_r) and bool(msg.content), f"model: the reply lacks reasoning or an answer: {raw!r}")
        sr, sc, sf, _ = stream_parts(client, args)
        check(sr == got_r and sc == msg.content and sf == r.choices[0].finish_reason, f"model stream: {sr!r} {sc!r}")
        # the next turn sends the reasoning back: the template shows it, the prompt's cached tokens reused
        follow = messages + [{"role": "assistant", "content": msg.content, "reasoning_content": got_r},
                             {"role": "user", "content": "And of Spain?"}]
        status, text = post(srv.url, "/apply-template", {"messages": follow})
        check(status == 200 and f"<think>\n{got_r}\n</think>\n\n{msg.content}<|im_end|>" in json.loads(text)["prompt"],
              f"model: sent-back reasoning in the prompt: {status} {text[-300:]!r}")
        r2 = client.chat.completions.create(model="m", messages=follow, temperature=0, max_tokens=40)
        check(r2.usage.prompt_tokens_details.cached_tokens > 0, f"model follow-up: cached {r2.usage}")
    finally:
        check(srv.stop() == 0, "model: kiln-server exit status")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--mode", choices=["tiny", "model"], required=True)
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/tmp"))
    a = ap.parse_args()
    reexec_in_venv(a.venv)
    if a.mode == "tiny":
        tiny = os.path.join(a.shared, "models", "stories260K.gguf")
        if not os.path.exists(tiny):
            sys.exit(f"test_reasoning.py: FAIL: missing {tiny}")
        check_tiny(a.server, tiny)
    else:
        d = os.environ.get("KILN_MODEL_DIR") or os.path.expanduser("~/.cache/kiln/models")
        model = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            sys.exit(f"test_reasoning.py: FAIL: missing {model}: run scripts/fetch_models.sh")
        check_model(a.server, model, a.tmp)
    if FAILURES:
        print(f"test_reasoning.py --mode {a.mode}: {len(FAILURES)} FAILURES", flush=True)
        sys.exit(1)
    print(f"test_reasoning.py --mode {a.mode}: OK", flush=True)


if __name__ == "__main__":
    main()
