#!/usr/bin/env python3
"""The tiny GGUFs of tests/fixtures/models/ (scripts/fixtures/make_tiny_models.py writes them with gguf-py,
mimicking llama.cpp's converter) against llama.cpp's own convert_hf_to_gguf.py run on the same checkpoints:
every metadata key but general.* and tokenizer.* (the converter gets the placeholder vocabulary, as
make_moe_models.py does: the random models have no tokenizer), every tensor name, shape and value.

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/l && tar xzf /tmp/l/*.tar.gz -C /tmp/l
    /work/refenv/bin/python scripts/check_tiny_models_converter.py /tmp/l/llama_cpp_python-0.3.36/vendor/llama.cpp \
        llama3 mistral granite gemma2 phi3 phi3-longrope
Needs torch (the converter's). Exits 1 on any difference. The first fixtures (llama: no key_length) predate it.
"""
import importlib.util, os, sys, shutil, tempfile
import numpy as np
LLAMA = sys.argv[1]
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TMP = tempfile.mkdtemp(prefix="kiln-convert-")
sys.path.insert(0, os.path.join(LLAMA, "gguf-py")); sys.path.insert(0, LLAMA)
spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", os.path.join(LLAMA, "convert_hf_to_gguf.py"))
conv = importlib.util.module_from_spec(spec); spec.loader.exec_module(conv)
import gguf
def placeholder_vocab(self):
    w = self.gguf_writer; n = self.hparams["vocab_size"]
    w.add_tokenizer_model("llama"); w.add_token_list([f"t{i}" for i in range(n)])
    w.add_token_scores([0.0] * n); w.add_token_types([int(gguf.TokenType.NORMAL)] * n)
    w.add_bos_token_id(1); w.add_eos_token_id(2)
orig = conv.get_model_class
conv.get_model_class = lambda *a, **k: (lambda c: type(c.__name__, (c,), {"set_vocab": placeholder_vocab, "model_arch": c.model_arch}))(orig(*a, **k))
def fields(path):
    r = gguf.GGUFReader(path); kv = {}
    for f in r.fields.values():
        if f.name.startswith(("general.", "tokenizer.", "GGUF.")): continue
        v = f.contents() if hasattr(f, "contents") else None
        kv[f.name] = v
    t = {x.name: np.array(x.data, dtype=np.float32).reshape(-1) for x in r.tensors}
    return kv, t
bad = 0
for name in sys.argv[2:]:
    d = os.path.join(ROOT, "tests", "fixtures", "models", name)
    tmpd = os.path.join(TMP, name); shutil.rmtree(tmpd, ignore_errors=True); shutil.copytree(d, tmpd)
    out = os.path.join(TMP, name + ".gguf")
    argv = sys.argv; sys.argv = ["convert_hf_to_gguf.py", tmpd, "--outfile", out, "--outtype", "f32"]
    try: conv.main()
    finally: sys.argv = argv
    kr, tr = fields(out); km, tm = fields(os.path.join(d, "model.gguf"))
    for k in sorted(set(kr) | set(km)):
        if kr.get(k) != km.get(k) and not (isinstance(kr.get(k), float) and isinstance(km.get(k), float) and abs(kr[k]-km[k]) < 1e-6 * abs(kr[k])):
            print(f"{name}: key {k}: converter {kr.get(k)!r} mimic {km.get(k)!r}"); bad += 1
    for t in sorted(set(tr) | set(tm)):
        if t not in tr or t not in tm: print(f"{name}: tensor {t} only in {'converter' if t in tr else 'mimic'}"); bad += 1; continue
        if tr[t].shape != tm[t].shape or not np.array_equal(tr[t], tm[t]):
            diff = np.abs(tr[t]-tm[t]).max() if tr[t].shape == tm[t].shape else "shape"
            print(f"{name}: tensor {t} differs ({diff})"); bad += 1
    print(f"{name}: {len(kr)} keys, {len(tr)} tensors compared")
shutil.rmtree(TMP, ignore_errors=True)
print("differences:", bad)
sys.exit(1 if bad else 0)
