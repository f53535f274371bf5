#!/usr/bin/env python3
"""Loads kiln-quantize's outputs in llama.cpp (through llama-cpp-python) and generates greedily.

Needs a python with llama_cpp (scripts/llamacpp_env.sh makes one); scripts/python_checks.sh runs this
only when such a python exists, and says so when it does not.

    check_quantize_llamacpp.py REFERENCE.txt --exact Q8_0.gguf ... --prefix Q4_0.gguf ...

REFERENCE.txt is llama.cpp's own greedy text from the F32 model for the prompt "Once upon a time"
(../shared/models/stories260K.greedy100.llamacpp.txt, prompt included). Each output must load and
generate 32 tokens. Files after --exact (Q8_0) must give exactly the start of the reference: on this
model Q8_0 (weights and llama.cpp's 8-bit activations) keeps the greedy path of F32 (kiln's test measures
the same for kiln). Files after --prefix (4- and 5-bit) drift from it after a few words (they are a
slightly different, worse model), so only their first three words are compared.
"""
import sys

from llama_cpp import Llama

PROMPT = "Once upon a time"


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    ref = open(sys.argv[1], encoding="utf-8").read()
    if not ref.startswith(" " + PROMPT):
        raise SystemExit(f"{sys.argv[1]}: does not start with ' {PROMPT}'")
    ref = ref[len(PROMPT) + 1:]
    ok = True
    exact = None
    for path in sys.argv[2:]:
        if path in ("--exact", "--prefix"):
            exact = path == "--exact"
            continue
        if exact is None:
            raise SystemExit("name --exact or --prefix before the files")
        llm = Llama(model_path=path, n_ctx=128, n_threads=2, seed=0, verbose=False)
        out = llm.create_completion(PROMPT, max_tokens=32, temperature=0.0, top_k=1, top_p=1.0, min_p=0.0,
                                    repeat_penalty=1.0)
        text = out["choices"][0]["text"]
        n = out["usage"]["completion_tokens"]
        if exact:
            good = n == 32 and ref.startswith(text)
            what = "the exact start of llama.cpp's F32 greedy text"
        else:
            good = n >= 8 and text[:12] == ref[:12]
            what = f"starting like llama.cpp's F32 greedy text ({ref[:12]!r})"
        print(f"check_quantize_llamacpp: {path}: {n} tokens {text!r}: "
              f"{'OK' if good else 'FAILED'}, expected {what}")
        ok &= good
        del llm
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
