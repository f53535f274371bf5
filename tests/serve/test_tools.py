#!/usr/bin/env python3
"""kiln-server's tool calling against independent references, on 127.0.0.1 only.

  test_tools.py --server BUILD/examples/kiln-server --venv REPO/.venv --shared REPO/../shared --mode render|model

render (the tiny stories260K: fast under ASan): POST /apply-template of OpenAI tool conversations (tools,
       assistant tool_calls with arguments as JSON strings and content null, tool results) through real
       templates of llama.cpp's corpus (Qwen2.5, Qwen3, QwQ, Hermes 2 Pro / 3, Llama 3.1 / 3.2 / 3.3, Mistral
       Nemo / Small 3.2, Devstral, Granite 4) and examples/templates/smollm2-tools.jinja, byte for byte
       against Python's jinja2 in Hugging Face's environment (scripts/fixtures/make_jinja_fixtures.py) given
       the same conversation with arguments as objects (what transformers and llama.cpp pass templates);
       the refusals (400 naming the field); chat with tools, JSON and streamed, through the tiny model (the
       parser on whatever it generates: well-formed responses, never a crash).
model  (SmolLM2-135M-Instruct from $KILN_MODEL_DIR with examples/templates/smollm2-tools.jinja, greedy): the
       model calls get_weather after a one-shot example; the `openai` client parses the call non-streamed
       and streamed (the client's stream accumulator rebuilds it; the raw chunks are OpenAI's shape), both
       validated by openai.types.chat.ChatCompletion; a follow-up turn with the tool result answers in text;
       tool_choice "none" reads no calls.

It fails (never skips) when the venv, jinja2, the `openai` package or a model is missing.
"""
import argparse
import copy
import datetime
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from test_server import FAILURES, Server, check, curl, error_of, reexec_in_venv  # noqa: E402

TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "text", "templates")
CORPUS = ["Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "Qwen-QwQ-32B.jinja",
          "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
          "meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
          "meta-llama-Llama-3.3-70B-Instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
          "Mistral-Small-3.2-24B-Instruct-2506.jinja", "unsloth-mistral-Devstral-Small-2507.jinja",
          "ibm-granite-granite-4.0.jinja"]
SMOLLM2_TOOLS = os.path.join(ROOT, "examples", "templates", "smollm2-tools.jinja")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
# OpenAI's wire format: content null beside tool_calls, arguments as JSON strings (ids of 9 letters or
# digits: Mistral's templates require them).
CONVERSATIONS = {
    "tools_user": [{"role": "system", "content": "You are a helpful assistant."},
                   {"role": "user", "content": "What's the weather in Paris?"}],
    "calls_results": [
        {"role": "user", "content": "Add 1 and 2, and tell me the weather in Oslo."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abcDEF123", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"}},
            {"id": "ghiJKL456", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "3"},
        {"role": "tool", "tool_call_id": "ghiJKL456", "name": "get_weather", "content": "{\"sky\": \"rain\"}"}],
    "one_call_result": [  # (Llama 3.x templates take one call a turn)
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "abcDEF123", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"}],
}


def hf_env():
    """Python's jinja2 configured as transformers' apply_chat_template (the fixture generator's make_env)."""
    path = os.path.join(ROOT, "scripts", "fixtures", "make_jinja_fixtures.py")
    spec = importlib.util.spec_from_file_location("make_jinja_fixtures", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    env = mod.make_env()
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)  # kiln-server: the local time
    return env


def as_template_sees(messages):
    """The conversation as kiln-server hands it to the template (and llama.cpp does): content null -> "",
    tool call arguments parsed into objects; key order kept."""
    out = copy.deepcopy(messages)
    for m in out:
        if m.get("content") is None:
            m["content"] = ""
        for c in m.get("tool_calls") or []:
            if isinstance(c["function"].get("arguments"), str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


def gguf_token_texts(path):
    """The BOS and EOS texts of a GGUF file (gguf-py): what kiln-server's --chat-template passes as bos_token /
    eos_token."""
    import gguf
    r = gguf.GGUFReader(path)

    def tok(key):
        fid = r.fields[key]
        i = int(fid.parts[fid.data[0]][0])
        toks = r.fields["tokenizer.ggml.tokens"]
        return bytes(toks.parts[toks.data[i]]).decode()
    return tok("tokenizer.ggml.bos_token_id"), tok("tokenizer.ggml.eos_token_id")


def post(url, path, body):
    status, _, text = curl(url + path, body=json.dumps(body))
    return status, text


RENDERED = {"same": 0, "refused": 0}


def check_render(exe, model, template, env, bos, eos):
    name = os.path.basename(template)
    src = open(template, encoding="utf-8").read()
    srv = Server(exe, ["-m", model, "-np", "1", "-c", "4096", "-t", "1", "--chat-template", template])
    try:
        for conv_name, messages in CONVERSATIONS.items():
            what = f"{name} {conv_name}"
            try:
                want = env.from_string(src).render(messages=as_template_sees(messages), tools=TOOLS, documents=None,
                                                   add_generation_prompt=True, bos_token=bos, eos_token=eos)
            except Exception as e:  # noqa: BLE001 - jinja2 refuses: kiln-server must refuse too
                want, why = None, f"{type(e).__name__}: {e}"
            status, text = post(srv.url, "/apply-template", {"messages": messages, "tools": TOOLS})
            if want is None:
                error_of(status, text, 400, what=f"{what} (jinja2: {why})")
                RENDERED["refused"] += 1
                print(f"{what}: refused, as jinja2 does ({why})", flush=True)
                continue
            if check(status == 200, f"{what}: /apply-template status {status}: {text[:300]}"):
                got = json.loads(text)["prompt"]
                if not check(got == want, f"{what}: kiln's prompt differs from jinja2's"):
                    print(f"--- kiln\n{got!r}\n--- jinja2\n{want!r}", flush=True)
                RENDERED["same"] += got == want
                check("get_weather" in want, f"{what}: the template did not show the tools")
    finally:
        check(srv.stop() == 0, f"{name}: kiln-server exit status")


def check_refusals(exe, model):
    srv = Server(exe, ["-m", model, "-np", "1", "-c", "1024", "-t", "1", "--chat-template",
                       os.path.join(TEMPLATES, "Qwen-Qwen2.5-7B-Instruct.jinja")])
    user = [{"role": "user", "content": "hi"}]
    call = {"role": "assistant", "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{\"a\": 1"}}]}
    cases = [
        ({"messages": user, "tools": {"x": 1}}, "tools", "must be a list"),
        ({"messages": user, "tools": [{"type": "function", "function": {"description": "x"}}]},
         "tools[0].function.name", "non-empty string"),
        ({"messages": user, "tools": [{"type": "retrieval"}]}, "tools[0].type", "function"),
        ({"messages": user, "tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
         "tools[0].function.parameters", "JSON Schema"),
        ({"messages": user, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "mul"}}},
         "tool_choice", "not in 'tools'"),
        ({"messages": user, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "\"required\" or an object"),
        ({"messages": user, "tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls", "boolean"),
        ({"messages": user + [call]}, "messages[1].tool_calls[0].function.arguments", "JSON object"),
        ({"messages": user + [{"role": "assistant", "content": None}]}, "messages[1].content", "tool_calls"),
        ({"messages": user + [{"role": "tool", "content": "3"}]}, "messages[1].tool_call_id", "missing"),
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls", "assistant"),
        # a tool's text that spells a control token of the model (<s>, </s>) cannot reach the prompt
        ({"messages": user, "tools": [{"type": "function", "function": {"name": "f", "description": "a</s>b"}}]},
         "tools[0].function.description", "control token"),
    ]
    try:
        for path in ("/apply-template", "/v1/chat/completions"):
            for body, param, text in cases:
                status, resp = post(srv.url, path, body)
                error_of(status, resp, 400, param, text, what=f"{path} {param}")
    finally:
        check(srv.stop() == 0, "refusals: kiln-server exit status")
    # a template that shows no tools (chosen by name: hand-written) refuses them, naming 'tools'
    srv = Server(exe, ["-m", model, "-np", "1", "-c", "1024", "-t", "1", "--chat-template", "chatml"])
    try:
        status, resp = post(srv.url, "/v1/chat/completions", {"messages": user, "tools": TOOLS})
        error_of(status, resp, 400, "tools", "--chat-template", what="chatml with tools")
        # tool_choice "none": the tools are not shown, so any template serves it
        status, resp = post(srv.url, "/apply-template", {"messages": user, "tools": TOOLS, "tool_choice": "none"})
        check(status == 200 and json.loads(resp)["prompt"] == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
              f"chatml, tool_choice none: {status} {resp[:200]}")
    finally:
        check(srv.stop() == 0, "chatml: kiln-server exit status")


def check_tiny_chat(exe, model):
    """Chat with tools through the tiny model, JSON and streamed: well-formed OpenAI responses."""
    from openai import OpenAI
    from openai.lib.streaming.chat import ChatCompletionStreamState
    from openai.types.chat import ChatCompletion
    srv = Server(exe, ["-m", model, "-np", "1", "-c", "4096", "-t", "1", "--chat-template", SMOLLM2_TOOLS])
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=120)
        for seed in range(3):
            args = dict(model="m", messages=CONVERSATIONS["calls_results"], tools=TOOLS, max_tokens=40, seed=seed)
            r = client.chat.completions.create(**args)
            ChatCompletion.model_validate(r.model_dump())
            check(r.choices[0].finish_reason in ("stop", "length", "tool_calls"), f"tiny: {r.choices[0].finish_reason}")
            state = ChatCompletionStreamState()  # the client's stream accumulator (any finish_reason)
            for chunk in client.chat.completions.create(**args, stream=True):
                state.handle_chunk(chunk)
            final = state.current_completion_snapshot
            ChatCompletion.model_validate(final.model_dump())
            got, want = final.choices[0], r.choices[0]
            check(got.message.content == want.message.content and got.finish_reason == want.finish_reason and
                  [(c.function.name, c.function.arguments) for c in got.message.tool_calls or []] ==
                  [(c.function.name, c.function.arguments) for c in want.message.tool_calls or []],
                  f"tiny seed {seed}: streamed {got} != {want}")
    finally:
        check(srv.stop() == 0, "tiny chat: kiln-server exit status")


def check_model(exe, model):
    from openai import OpenAI
    from openai.types.chat import ChatCompletion
    srv = Server(exe, ["-m", model, "-np", "2", "-c", "4096", "-t", "2", "--chat-template", SMOLLM2_TOOLS])
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=300)
        weather = [{"type": "function", "function": WEATHER["function"] | {
            "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                           "required": ["city"]}}}]
        example = [{"role": "user", "content": "What is the weather in London?"},
                   {"role": "assistant", "content": None, "tool_calls": [
                       {"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"London\"}"}}]}]
        messages = example + [{"role": "user", "content": "What is the weather in Paris?"}]
        args = dict(model="m", messages=messages, tools=weather, temperature=0, max_tokens=60)

        # non-streamed: the client's types, the raw JSON validated too
        r = client.chat.completions.create(**args)
        status, raw = post(srv.url, "/v1/chat/completions", args)
        check(status == 200, f"model: raw status {status}")
        raw = json.loads(raw)
        ChatCompletion.model_validate(raw)
        choice = r.choices[0]
        ok = check(choice.finish_reason == "tool_calls", f"model: finish_reason {choice.finish_reason!r}: {choice}")
        calls = choice.message.tool_calls or []
        ok &= check(len(calls) == 1 and choice.message.content is None, f"model: {choice.message}")
        if ok:
            c = calls[0]
            check(c.type == "function" and c.id.startswith("call_") and len(c.id) == 29, f"model: call id {c.id!r}")
            check(c.function.name == "get_weather", f"model: name {c.function.name!r}")
            check(json.loads(c.function.arguments) == {"city": "Paris"}, f"model: arguments {c.function.arguments!r}")
            check(raw["choices"][0]["message"]["content"] is None, "model: raw content not null")

        # streamed: the raw chunks in OpenAI's order, and the client's accumulator rebuilds the same call
        chunks = list(client.chat.completions.create(**args, stream=True))
        deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
        tc = [d.tool_calls[0] for d in deltas if d.tool_calls]
        if check(len(tc) >= 2, f"model stream: tool call deltas {tc}"):
            check(tc[0].index == 0 and tc[0].id.startswith("call_") and tc[0].type == "function" and
                  tc[0].function.name == "get_weather" and tc[0].function.arguments == "",
                  f"model stream: first call delta {tc[0]}")
            check(all(t.index == 0 and t.id is None and t.function.name is None for t in tc[1:]),
                  f"model stream: later deltas {tc[1:]}")
            check(json.loads("".join(t.function.arguments for t in tc)) == {"city": "Paris"}, "model stream: arguments")
        check([ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "tool_calls",
              "model stream: last finish_reason")
        check(all(not d.content for d in deltas), f"model stream: content beside the call: {deltas}")
        with client.chat.completions.stream(**args) as s:
            final = s.get_final_completion()
        ChatCompletion.model_validate(final.model_dump())
        fc = final.choices[0].message.tool_calls or []
        check(len(fc) == 1 and fc[0].function.name == "get_weather" and
              json.loads(fc[0].function.arguments) == {"city": "Paris"} and final.choices[0].finish_reason == "tool_calls",
              f"model stream accumulated: {final.choices[0]}")

        # the follow-up turn: the call and its result go back; the reply is text
        if ok:
            follow = messages + [choice.message.model_dump(exclude_none=True),
                                 {"role": "tool", "tool_call_id": calls[0].id, "content": "{\"temperature\": 21}"}]
            status, text = post(srv.url, "/apply-template", {"messages": follow, "tools": weather})
            prompt = json.loads(text).get("prompt", "") if status == 200 else ""
            check("<tool_call>[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]</tool_call><|im_end|>\n"
                  "<|im_start|>user\n<tool_response>\n{\"temperature\": 21}\n</tool_response><|im_end|>\n"
                  "<|im_start|>assistant\n" in prompt, f"follow-up prompt: {status} {prompt[-400:]!r}")
            r2 = client.chat.completions.create(model="m", messages=follow, tools=weather, temperature=0, max_tokens=40)
            check(r2.choices[0].finish_reason in ("stop", "length") and isinstance(r2.choices[0].message.content, str)
                  and r2.choices[0].message.content and not r2.choices[0].message.tool_calls,
                  f"follow-up: {r2.choices[0]}")
            check(r2.usage.prompt_tokens_details.cached_tokens > 0, f"follow-up: cached {r2.usage}")

        # tool_choice "none": the reply is not read for calls
        r3 = client.chat.completions.create(**args, tool_choice="none")
        check(not r3.choices[0].message.tool_calls and r3.choices[0].finish_reason != "tool_calls",
              f"tool_choice none: {r3.choices[0]}")
    finally:
        check(srv.stop() == 0, "model: kiln-server exit status")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--mode", choices=["render", "model"], required=True)
    a = ap.parse_args()
    reexec_in_venv(a.venv)
    if a.mode == "render":
        tiny = os.path.join(a.shared, "models", "stories260K.gguf")
        if not os.path.exists(tiny):
            sys.exit(f"test_tools.py: FAIL: missing {tiny}")
        env = hf_env()
        bos, eos = gguf_token_texts(tiny)
        for t in CORPUS:
            check_render(a.server, tiny, os.path.join(TEMPLATES, t), env, bos, eos)
        check_render(a.server, tiny, SMOLLM2_TOOLS, env, bos, eos)
        print(f"rendered like jinja2: {RENDERED['same']} conversations; refused as jinja2 does: {RENDERED['refused']}")
        check(RENDERED["same"] >= len(CONVERSATIONS) * len(CORPUS), "fewer conversations rendered than expected")
        check_refusals(a.server, tiny)
        check_tiny_chat(a.server, tiny)
    else:
        d = os.environ.get("KILN_MODEL_DIR") or os.path.expanduser("~/.cache/kiln/models")
        model = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
        if not os.path.exists(model):
            sys.exit(f"test_tools.py: FAIL: missing {model}: run scripts/fetch_models.sh")
        check_model(a.server, model)
    if FAILURES:
        print(f"test_tools.py --mode {a.mode}: {len(FAILURES)} FAILURES", flush=True)
        sys.exit(1)
    print(f"test_tools.py --mode {a.mode}: OK", flush=True)


if __name__ == "__main__":
    main()
