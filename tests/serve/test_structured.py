#!/usr/bin/env python3
"""kiln-server's structured outputs (response_format json_object / json_schema, llama-server's `grammar` field
with a GBNF grammar) and forced tool calls (tool_choice "required" / a named function) against independent
references, on 127.0.0.1 only.

  test_structured.py --server BUILD/examples/kiln-server --venv REPO/.venv --shared REPO/../shared --mode tiny|model

tiny  (stories260K, a model that knows no JSON: fast under ASan): every reply under a schema parses with
      json.loads and validates with the jsonschema package, greedy and sampled, streamed and not, chat and
      completions; forced calls on the SmolLM2 tools template come back as calls whose arguments validate;
      the refusals (400 naming the field and the unsupported keyword); replies under GBNF grammars match
      Python regular expressions of the same languages (the openai client's extra_body={"grammar": ...}),
      streamed and not, chat and completions; a malformed grammar is a 400 naming its line and column. (json_object is unbounded: a model
      that never closes its object runs to max_tokens, so it is checked on SmolLM2 only.)
model (SmolLM2-135M-Instruct from $KILN_MODEL_DIR, examples/templates/smollm2-tools.jinja): the same with the
      `openai` client on a real model: several schemas greedy and sampled, streamed and not; tool_choice
      required and named give a call to the right function whose arguments validate.

It fails (never skips) when the venv, jsonschema, the `openai` package or a model is missing.
"""
import argparse
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from test_server import FAILURES, Server, check, curl, error_of, reexec_in_venv  # noqa: E402

SMOLLM2_TOOLS = os.path.join(ROOT, "examples", "templates", "smollm2-tools.jinja")

# Bounded schemas (strings with maxLength, arrays with maxItems): every reply ends within max_tokens even when
# sampled, since the language is finite.
SCHEMAS = {
    "person": {"type": "object",
               "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"},
                              "languages": {"type": "array", "items": {"type": "string", "maxLength": 16},
                                            "maxItems": 3}},
               "required": ["name", "age", "languages"], "additionalProperties": False},
    "enum": {"type": "object",
             "properties": {"answer": {"enum": ["yes", "no", "maybe"]}, "confidence": {"type": "number"},
                            "unit": {"const": "percent"}},
             "required": ["answer", "confidence", "unit"], "additionalProperties": False},
    "nested": {"type": "object",
               "properties": {"city": {"type": "string", "maxLength": 20},
                              "weather": {"anyOf": [{"type": "null"},
                                                    {"$ref": "#/$defs/w"}]},
                              "ok": {"type": "boolean"}},
               "required": ["city", "weather", "ok"], "additionalProperties": False,
               "$defs": {"w": {"type": "object",
                               "properties": {"sky": {"enum": ["clear", "rain", "snow"]},
                                              "temp": {"type": ["integer", "null"]}},
                               "required": ["sky", "temp"], "additionalProperties": False}}},
}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]


def post(url, path, body):
    status, _, text = curl(url + path, body=json.dumps(body))
    return status, text


def valid(schema, text, what):
    import jsonschema
    try:
        v = json.loads(text)
    except ValueError as e:
        return check(False, f"{what}: not JSON ({e}): {text!r}")
    try:
        jsonschema.validate(v, schema)
    except jsonschema.ValidationError as e:
        return check(False, f"{what}: does not validate ({e.message}): {text!r}")
    return True


def rf(schema, name="s"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def warm(create, args):
    """Puts the prompt into a slot's cache before the replies that are compared. A cached prompt is reused up to its
    last token, which then runs alone through the decode path, whose logits differ from the whole prompt's pass
    within the `fast` precision's error (~1e-3 of a logit here); a sampled reply can therefore differ between a
    fresh and a cached prompt. Streamed and non-streamed replies are compared with the prompt cached for both."""
    create(**(args | dict(max_tokens=1)))


def check_schemas(client, url, prompts, max_tokens, sampled_seeds, json_object):
    """Every schema: greedy and sampled, non-streamed and streamed (same text), chat and completions."""
    n = 0
    for name, schema in SCHEMAS.items():
        for seed in [None] + list(sampled_seeds):
            args = dict(model="m", messages=[{"role": "user", "content": prompts[name]}], max_tokens=max_tokens,
                        response_format=rf(schema, name))
            args |= dict(temperature=0) if seed is None else dict(temperature=1.0, seed=seed)
            what = f"{name} {'greedy' if seed is None else f'seed {seed}'}"
            warm(client.chat.completions.create, args)
            r = client.chat.completions.create(**args)
            c = r.choices[0]
            check(c.finish_reason == "stop", f"{what}: finish_reason {c.finish_reason!r}: {c.message.content!r}")
            n += valid(schema, c.message.content, what)
            text = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(**args, stream=True)
                           if ch.choices)
            check(text == c.message.content, f"{what}: streamed {text!r} != {c.message.content!r}")
        # completions: the same constraint on a plain prompt
        status, body = post(url, "/v1/completions", {"prompt": prompts[name] + "\nJSON:", "max_tokens": max_tokens,
                                                      "temperature": 0, "response_format": rf(schema)})
        if check(status == 200, f"{name} completions: status {status} {body[:200]}"):
            n += valid(schema, json.loads(body)["choices"][0]["text"], f"{name} completions")
    # json_object: any object (unbounded: only a model that closes its objects ends within max_tokens)
    if not json_object:
        return n
    r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": prompts["json_object"]}],
                                       max_tokens=max_tokens, temperature=0, response_format={"type": "json_object"})
    if check(r.choices[0].finish_reason == "stop", f"json_object: {r.choices[0]}"):
        n += valid({"type": "object"}, r.choices[0].message.content, "json_object")
    return n


def check_forced_calls(client, url, seeds):
    """tool_choice required (either tool) and named (that tool): a call whose arguments validate."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    n = 0
    for choice in ["required", {"type": "function", "function": {"name": "add"}},
                   {"type": "function", "function": {"name": "get_weather"}}]:
        for seed in [None] + list(seeds):
            args = dict(model="m", messages=[{"role": "user", "content": "What is the weather in Paris? And 2 + 3?"}],
                        tools=TOOLS, tool_choice=choice, max_tokens=120)
            args |= dict(temperature=0) if seed is None else dict(temperature=1.0, seed=seed)
            what = f"tool_choice {choice if isinstance(choice, str) else choice['function']['name']} seed {seed}"
            warm(client.chat.completions.create, args)
            r = client.chat.completions.create(**args)
            c = r.choices[0]
            calls = c.message.tool_calls or []
            if not check(c.finish_reason == "tool_calls" and len(calls) == 1, f"{what}: {c}"):
                continue
            name = calls[0].function.name
            want = schemas.keys() if choice == "required" else [choice["function"]["name"]]
            check(name in want, f"{what}: called {name!r}")
            n += valid(schemas.get(name, {}), calls[0].function.arguments, what)
            # streamed: the client's accumulator rebuilds the same call
            with client.chat.completions.stream(**args) as s:
                final = s.get_final_completion()
            fc = final.choices[0].message.tool_calls or []
            check(len(fc) == 1 and fc[0].function.name == name and
                  json.loads(fc[0].function.arguments) == json.loads(calls[0].function.arguments),
                  f"{what}: streamed {final.choices[0]}")
    return n


GPT_OSS = os.path.join(ROOT, "tests", "fixtures", "text", "templates", "openai-gpt-oss-120b.jinja")
GPT_OSS_MODEL = os.path.join(ROOT, "tests", "fixtures", "models", "gpt-oss", "model.gguf")
GPT_OSS_VOCAB = os.path.join(ROOT, "tests", "fixtures", "text", "gpt_oss_tiny_vocab.gguf")


def join_gguf(model, vocab, out):
    """The tiny random gpt-oss checkpoint with the harmony vocabulary's tokenizer (gguf-py), as
    tests/generate/test_gpt_oss_chat.cpp joins them: the markers are control tokens there."""
    import gguf
    m, v = gguf.GGUFReader(model), gguf.GGUFReader(vocab)
    w = gguf.GGUFWriter(out, m.fields["general.architecture"].contents())
    for r, keep in ((m, lambda k: not k.startswith("tokenizer.") and k != "general.alignment"),
                    (v, lambda k: k.startswith("tokenizer."))):
        for k, f in r.fields.items():
            if not k.startswith("GGUF.") and k != "general.architecture" and keep(k):
                sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
                w.add_key_value(k, f.contents(), f.types[0], sub)
    for t in m.tensors:
        plain = t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape if plain else None, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def harmony_forced_reference(raw):
    """llama-server's forced gpt-oss reply (common/chat.cpp), read here from its definition: analysis or
    commentary messages each followed by <|start|>assistant, then one call message whose body is the
    arguments (the reply ends at the <|call|> stop token, or with its text where the vocabulary lacks it).
    (reasoning, preambles, name, arguments) or None."""
    import re
    body = r"(?:(?!<\|end\|>).)*"
    msg = (rf"(?:(?:<\|channel\|>commentary(?: to=assistant)?)?<\|channel\|>analysis<\|message\|>{body}<\|end\|>"
           rf"|<\|channel\|>commentary<\|message\|>{body}<\|end\|>)<\|start\|>assistant")
    ch = r"<\|channel\|>(?:commentary|analysis)"
    call = (rf"(?:{ch} to=functions\.(?P<n1>[A-Za-z_]+)| to=functions\.(?P<n2>[A-Za-z_]+){ch})"
            r"(?: <\|constrain\|>[A-Za-z0-9_-]{1,16}| [A-Za-z0-9_-]{1,16}|<\|constrain\|>[A-Za-z0-9_-]{1,16})?"
            r"<\|message\|>(?P<args>\{.*\})(?:<\|call\|>)?")  # (<|call|>: text in a vocabulary without it)
    m = re.fullmatch(rf"(?P<pre>(?:{msg})*){call}", raw, re.S)
    if not m:
        return None
    pre = m.group("pre")
    reasoning = "".join(re.findall(rf"<\|channel\|>analysis<\|message\|>({body})<\|end\|>", pre, re.S))
    preambles = "".join(re.findall(rf"<\|channel\|>commentary<\|message\|>({body})<\|end\|>", pre, re.S))
    return reasoning, preambles, m.group("n1") or m.group("n2"), m.group("args")


def check_harmony_forced(exe, models, seeds, max_tokens):
    """gpt-oss's template (harmony): tool_choice required and named on a vocabulary with the markers as control
    tokens (the tiny gpt-oss) and one without (stories260K: the markers are text). Each reply that ends in a call
    is llama-server's forced form (harmony_forced_reference on the raw reply, reasoning_format none), its call and
    reasoning are that reading, its arguments validate, and the stream rebuilds the same call; one that runs to
    max_tokens (the analysis channel is unbounded, as in llama-server) has no call. Some replies must call."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    from openai import OpenAI
    n, before = 0, 0
    for model in models:
        srv = Server(exe, ["-m", model, "-np", "1", "-c", "2048", "-t", "1", "--chat-template", GPT_OSS])
        try:
            client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=600)
            for choice in ["required", {"type": "function", "function": {"name": "get_weather"}}]:
                for seed in seeds:
                    args = dict(model="m", messages=[{"role": "user", "content": "What is the weather in Paris?"}],
                                tools=TOOLS, tool_choice=choice, max_tokens=max_tokens, temperature=1.0, seed=seed)
                    what = (f"{os.path.basename(model)} tool_choice "
                            f"{choice if isinstance(choice, str) else choice['function']['name']} seed {seed}")
                    warm(client.chat.completions.create, args)
                    raw = client.chat.completions.create(**args, extra_body={"reasoning_format": "none"})
                    r = client.chat.completions.create(**args)
                    c = r.choices[0]
                    calls = c.message.tool_calls or []
                    ref = harmony_forced_reference(raw.choices[0].message.content)
                    if c.finish_reason == "length":
                        check(not calls and ref is None, f"{what}: cut by max_tokens, yet {c.message} / {ref}")
                        continue
                    if not check(c.finish_reason == "tool_calls" and len(calls) == 1 and ref is not None,
                                 f"{what}: {c} raw {raw.choices[0].message.content!r}"):
                        continue
                    reasoning, preambles, name, arguments = ref
                    before += bool(reasoning or preambles)
                    want = schemas.keys() if choice == "required" else [choice["function"]["name"]]
                    check(name in want and calls[0].function.name == name, f"{what}: called {calls[0].function.name!r}")
                    check(json.loads(calls[0].function.arguments) == json.loads(arguments), f"{what}: {calls[0]}")
                    check((c.message.model_extra or {}).get("reasoning_content", "") == reasoning and
                          (c.message.content or "") == preambles, f"{what}: reasoning/content {c.message}")
                    n += valid(schemas[name], calls[0].function.arguments, what)
                    with client.chat.completions.stream(**args) as s:
                        final = s.get_final_completion()
                    fc = final.choices[0].message.tool_calls or []
                    check(len(fc) == 1 and fc[0].function.name == name and
                          json.loads(fc[0].function.arguments) == json.loads(arguments),
                          f"{what}: streamed {final.choices[0]}")
        finally:
            check(srv.stop() == 0, f"{os.path.basename(model)}: kiln-server exit status")
    check(n > 0, "gpt-oss: no forced reply ended in a call")
    print(f"gpt-oss: {n} forced calls, {before} after analysis or commentary messages", flush=True)
    return n


# GBNF grammars (bounded: sampled replies end within max_tokens) and Python regular expressions of the same
# languages (re.fullmatch), written independently of kiln's grammar.
GRAMMARS = {
    "yesno": (r'''root ::= ("yes" | "no") ", because " [a-z ]{1,30} "."''', r"(yes|no), because [a-z ]{1,30}\."),
    "list": ("root ::= item{1,3}\n# items without line breaks\nitem ::= \"- \" [^\\r\\n\\x0b\\x0c\\x85\\u2028\\u2029]{1,20} \"\\n\"",
             "(- [^\r\n\x0b\x0c\x85\u2028\u2029]{1,20}\n){1,3}"),
    "sum": ("root ::= num (ws [-+*/] ws num){0,3} ws \"=\" ws num\nnum ::= [1-9] [0-9]{0,2} | \"0\"\nws ::= \" \"?",
            r"(?:[1-9][0-9]{0,2}|0)(?: ?[-+*/] ?(?:[1-9][0-9]{0,2}|0)){0,3} ?= ?(?:[1-9][0-9]{0,2}|0)"),
}
UNICODE_GRAMMARS = {  # (a vocabulary with every byte: SmolLM2's)
    "kana": ("root ::= [ぁ-ゟ]{1,6} \"。\"", "[ぁ-ゟ]{1,6}。"),
    "any": ("root ::= \"«\" [^»\\n]{1,12} \"»\"", "«[^»\n]{1,12}»"),
}


def check_grammars(client, grammars, seeds, max_tokens):
    """Each grammar: greedy and sampled, chat and completions, streamed (same text) and not: the reply matches."""
    import re
    n = 0
    for name, (gbnf, pattern) in grammars.items():
        for seed in [None] + list(seeds):
            sampling = dict(temperature=0) if seed is None else dict(temperature=1.0, seed=seed)
            what = f"grammar {name} {'greedy' if seed is None else f'seed {seed}'}"
            args = dict(model="m", messages=[{"role": "user", "content": f"Answer ({name})."}], max_tokens=max_tokens,
                        extra_body={"grammar": gbnf}, **sampling)
            warm(client.chat.completions.create, args)
            c = client.chat.completions.create(**args).choices[0]
            text = c.message.content
            check(c.finish_reason == "stop", f"{what}: finish_reason {c.finish_reason!r}: {text!r}")
            n += check(re.fullmatch(pattern, text) is not None, f"{what}: {text!r} does not match {pattern!r}")
            streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(**args, stream=True)
                               if ch.choices)
            check(streamed == text, f"{what}: streamed {streamed!r} != {text!r}")
            args = dict(model="m", prompt=f"Answer ({name}):", max_tokens=max_tokens, extra_body={"grammar": gbnf},
                        **sampling)
            warm(client.completions.create, args)
            c = client.completions.create(**args).choices[0]
            check(c.finish_reason == "stop", f"{what} completions: finish_reason {c.finish_reason!r}: {c.text!r}")
            n += check(re.fullmatch(pattern, c.text) is not None, f"{what} completions: {c.text!r} does not match")
            streamed = "".join(ch.choices[0].text for ch in client.completions.create(**args, stream=True) if ch.choices)
            check(streamed == c.text, f"{what} completions: streamed {streamed!r} != {c.text!r}")
    return n


def check_grammar_refusals(url):
    user = [{"role": "user", "content": "hi"}]
    status, _, models = curl(url + "/v1/models")
    n_vocab = json.loads(models)["data"][0]["meta"]["n_vocab"] if status == 200 else 0
    check(n_vocab > 0, f"/v1/models: {status} {models[:200]}")
    cases = [
        ({"grammar": 'root ::= "a" b'}, "grammar", "line 1, column 14: rule 'b' is used but never defined"),
        ({"grammar": 'root ::= "a'}, "grammar", "line 1, column 10: unterminated literal"),
        ({"grammar": 'x ::= "a"'}, "grammar", "no 'root' rule"),
        ({"grammar": 'root ::= root "a" | "b"'}, "grammar", "left-recursive"),
        ({"grammar": f'root ::= "a" <[{n_vocab}]>'}, "grammar",
         f"line 1, column 14: token id {n_vocab} is beyond the vocabulary's {n_vocab}"),
        ({"grammar": 'root ::= <|nope|>'}, "grammar", "'<|nope|>' is not one token of the vocabulary"),
        ({"grammar": 42}, "grammar", "must be a string"),
        ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar", "'response_format'"),
    ]
    for extra, param, text in cases:
        for path, body in (("/v1/chat/completions", {"messages": user}), ("/v1/completions", {"prompt": "hi"})):
            status, resp = post(url, path, body | extra)
            error_of(status, resp, 400, param, text, what=f"{path} {extra}")
    status, resp = post(url, "/v1/chat/completions", {"messages": user, "tools": TOOLS, "grammar": 'root ::= "a"'})
    error_of(status, resp, 400, "grammar", "'tools'", what="grammar with tools")
    # tool_choice none: the tools are not offered, so a grammar applies (as llama-server)
    status, resp = post(url, "/v1/chat/completions", {"messages": user, "tools": TOOLS, "tool_choice": "none",
                                                       "grammar": 'root ::= "ok"', "max_tokens": 8})
    if check(status == 200, f"grammar with tool_choice none: {status} {resp[:200]}"):
        check(json.loads(resp)["choices"][0]["message"]["content"] == "ok", f"grammar with tool_choice none: {resp}")
    # token references: <[id]> is that token, whole (its text from /detokenize); !<[id]> any token but it
    status, resp = post(url, "/tokenize", {"content": "Once upon a time"})
    ids = json.loads(resp)["tokens"] if status == 200 else []
    if check(len(ids) >= 2, f"/tokenize: {status} {resp[:200]}"):
        texts = []
        for t in ids[:2]:
            status, resp = post(url, "/detokenize", {"tokens": [t]})
            texts.append(json.loads(resp)["content"] if status == 200 else None)
        for grammar, want in ((f'root ::= <[{ids[0]}]> <[{ids[1]}]> "."', texts[0] + texts[1] + "."),
                              (f'root ::= !<[{ids[0]}]> "."', None)):
            status, resp = post(url, "/v1/completions", {"prompt": "hi", "grammar": grammar, "max_tokens": 8,
                                                         "temperature": 0})
            if not check(status == 200, f"grammar {grammar}: {status} {resp[:200]}"):
                continue
            r = json.loads(resp)
            text, n = r["choices"][0]["text"], r["usage"]["completion_tokens"]
            if want is not None:
                check(text == want and n == 3, f"grammar {grammar}: {text!r} in {n} tokens")
            else:  # one token (not ids[0]) then "." (one token in this vocabulary)
                check(n == 2 and text.endswith(".") and text != texts[0] + ".",
                      f"grammar {grammar}: {text!r} in {n} tokens")


def check_refusals(url):
    user = [{"role": "user", "content": "hi"}]
    cases = [
        ({"response_format": "json"}, "response_format", "must be an object"),
        ({"response_format": {"type": "xml"}}, "response_format.type", "\"json_schema\""),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "must be an object"),
        ({"response_format": rf({"type": "string", "pattern": "^a"})}, "response_format.json_schema.schema",
         "'pattern'"),
        ({"response_format": rf({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}})},
         "response_format.json_schema.schema", "'minimum'"),
        ({"response_format": rf({"oneOf": [{"type": "string"}]})}, "response_format.json_schema.schema", "'oneOf'"),
        ({"response_format": rf({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]})},
         "response_format.json_schema.schema", "\"b\""),
        ({"response_format": rf({"$ref": "#/$defs/nope"})}, "response_format.json_schema.schema", "$ref"),
        ({"response_format": rf({"type": "string", "format": "email"})}, "response_format.json_schema.schema",
         "'format'"),
    ]
    for extra, param, text in cases:
        for path, body in (("/v1/chat/completions", {"messages": user}), ("/v1/completions", {"prompt": "hi"})):
            status, resp = post(url, path, body | extra)
            error_of(status, resp, 400, param, text, what=f"{path} {extra}")
    tool_cases = [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "'nope'"),
        ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "tool_choice", "\"required\""),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "\"required\""),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}}}}], "tool_choice": "required"},
         "tools[0].function.parameters", "'pattern'"),
    ]
    for extra, param, text in tool_cases:
        status, resp = post(url, "/v1/chat/completions", {"messages": user} | extra)
        error_of(status, resp, 400, param, text, what=f"tools {extra.get('tool_choice')}")


PROMPTS = {"person": "Describe a programmer as JSON with name, age and languages.",
           "enum": "Is the sky blue? Answer as JSON.",
           "nested": "What is the weather in Oslo? Answer as JSON.",
           "json_object": "Give the capital of France as a JSON object with a key \"capital\"."}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--shared", required=True)
    ap.add_argument("--mode", choices=["tiny", "model"], required=True)
    a = ap.parse_args()
    reexec_in_venv(a.venv)
    try:
        import jsonschema  # noqa: F401
    except ImportError:
        sys.exit(f"test_structured.py: FAIL: the `jsonschema` package is not in {a.venv}: run scripts/python_env.sh")
    from openai import OpenAI
    if a.mode == "tiny":
        model = os.path.join(a.shared, "models", "stories260K.gguf")
        threads, max_tokens, seeds = "1", 400, range(1, 4)
    else:
        d = os.environ.get("KILN_MODEL_DIR") or os.path.expanduser("~/.cache/kiln/models")
        model = os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")
        threads, max_tokens, seeds = "2", 300, range(1, 3)
    if not os.path.exists(model):
        sys.exit(f"test_structured.py: FAIL: missing {model}: run scripts/fetch_models.sh")
    srv = Server(a.server, ["-m", model, "-np", "2", "-c", "4096", "-t", threads, "--chat-template", SMOLLM2_TOOLS])
    try:
        client = OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=600)
        n = check_schemas(client, srv.url, PROMPTS, max_tokens, seeds, json_object=a.mode == "model")
        print(f"{a.mode}: {n} schema replies validated", flush=True)
        n = check_forced_calls(client, srv.url, seeds)
        print(f"{a.mode}: {n} forced calls validated", flush=True)
        grammars = GRAMMARS | (UNICODE_GRAMMARS if a.mode == "model" else {})
        n = check_grammars(client, grammars, seeds, max_tokens)
        print(f"{a.mode}: {n} replies under GBNF grammars matched", flush=True)
        check_refusals(srv.url)
        check_grammar_refusals(srv.url)
        status, _, _ = curl(srv.url + "/health")
        check(status == 200, f"health after the refusals: {status}")
    finally:
        check(srv.stop() == 0, "kiln-server exit status")
    if a.mode == "tiny":
        with tempfile.TemporaryDirectory() as tmp:
            joined = os.path.join(tmp, "gpt-oss-tiny.gguf")
            join_gguf(GPT_OSS_MODEL, GPT_OSS_VOCAB, joined)
            n = check_harmony_forced(a.server, [joined, model], range(1, 7), 200)
            print(f"{a.mode}: {n} forced gpt-oss calls validated", flush=True)
    print(f"test_structured.py --mode {a.mode}: {len(FAILURES)} failures")
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
