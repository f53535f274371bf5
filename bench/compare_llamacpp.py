#!/usr/bin/env python3
"""Side-by-side end-to-end benchmark of kiln and llama.cpp on the same GGUF files.

Run with the llama.cpp venv (scripts/llamacpp_env.sh: llama-cpp-python built from source with -march=native,
gguf-py); bench/compare.sh does everything in one command. For each model, load mode and thread count it
alternates processes kiln / llama.cpp (llama.cpp first in odd rounds), so each engine's peak RSS is its own
and slow drifts of a shared machine hit both alike. Both get the same prompt token ids (random, fixed seed),
the same context size and batch (512), and run the same protocol:

  warm-up: prompt of P_min ids + 8 greedy tokens (its prompt time is reported as the cold TTFT)
  per repetition, for each prompt size P: fresh sequence, eval the P ids in one call (pp tok/s = P / time;
  TTFT = that time: prompt in, first token id out by argmax), and after the smallest P, n_gen decode steps
  of one token each, greedy by argmax over the logits (tg tok/s).

kiln: bench/kiln_e2e.cpp (kiln-bench-e2e). llama.cpp: this file with --llama-child, through the C API of
llama-cpp-python (ctypes: llama_batch / llama_decode / llama_get_logits_ith on token ids; no tokenizer, no
sampler objects). The Python cost per decode step is measured in the same child (the same loop with a
trivial C call instead of llama_decode) and llama.cpp's own timers (llama_perf_context) are reported next
to the wall-clock figures, so the overhead of driving llama.cpp from Python is visible.

Weights "read" = loaded into memory (kiln --load read, llama.cpp load_mode NONE = use_mmap false): the main
table. "map" = memory-mapped for both (llama.cpp load_mode MMAP): the second table. llama.cpp keeps its
defaults otherwise (weight repacking for this CPU, flash attention auto).

Another CPU level: --kiln-target AVX2 runs kiln's AVX2 kernels, and --llama-lib DIR loads an AVX2-only
llama.cpp build of the same version (scripts/llamacpp_cpu.sh), so both engines run as on a CPU without
AVX-512 (the engines line of the report shows each one's SIMD target / system info).

Roofline: kiln-bench-e2e --read-bandwidth (the STREAM-like loop of kiln-bench's BM_memory_read: 512 MiB,
1 and 4 streams per thread, best) at each thread count, measured in the same run before each model and
again just before every engine process (--no-bw-each-run: not), since a VM's bandwidth can change between
runs (2 threads: 31-35 or 55-64 GB/s within minutes on the Zen 4 dev VM); each decode's share is of the
bandwidth measured just before it. The effective read bandwidth of generation = bytes of weights read per
token (every tensor but the token embedding, of which one row is read; all of it when the output matrix is
tied to it) x tg tok/s.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------------------
# llama.cpp child: one process per (model, load mode, threads); prints JSON lines like kiln-bench-e2e.
# ----------------------------------------------------------------------------------------------------------

def status_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return float(line.split()[1]) / 1024.0
    return -1.0


def llama_child(a: argparse.Namespace) -> int:
    # numpy's OpenBLAS would start a thread per core at import; this process needs none of them
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import numpy as np

    rss0 = status_mib("VmRSS")
    import llama_cpp as L

    def emit(**kw):
        kw = {"engine": "llama.cpp", **kw}
        if a.label:
            kw["label"] = a.label
        print(json.dumps(kw), flush=True)

    ids = [int(x) for x in Path(a.ids).read_text().replace(",", " ").split()]
    prompts = [int(x) for x in a.prompts.split(",")]
    p_min, p_max = min(prompts), max(prompts)
    if len(ids) < p_max:
        sys.exit(f"llama child: {a.ids} has {len(ids)} ids, the largest prompt needs {p_max}")

    L.llama_backend_init()
    rss_imported = status_mib("VmRSS")
    t0 = time.perf_counter()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.load_mode = 1 if a.load == "map" else 0  # LLAMA_LOAD_MODE_MMAP / LLAMA_LOAD_MODE_NONE (use_mmap=false)
    model = L.llama_model_load_from_file(a.model.encode(), mp)
    if not model:
        sys.exit(f"llama child: llama.cpp could not load {a.model}")
    load_s = time.perf_counter() - t0
    rss_model = status_mib("VmRSS")
    t0 = time.perf_counter()
    cp = L.llama_context_default_params()
    cp.n_ctx = a.ctx
    cp.n_batch = a.batch
    cp.n_ubatch = a.batch
    cp.n_seq_max = 1
    cp.n_threads = a.threads
    cp.n_threads_batch = a.threads
    cp.no_perf = False
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        sys.exit("llama child: llama_init_from_model failed")
    session_s = time.perf_counter() - t0
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    mem = L.llama_get_memory(ctx)
    batch = L.llama_batch_init(max(a.batch, 1), 0, 1)

    def fill(tokens, pos0):
        for i, t in enumerate(tokens):
            batch.token[i] = t
            batch.pos[i] = pos0 + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = 0
        batch.logits[len(tokens) - 1] = 1
        batch.n_tokens = len(tokens)

    def argmax_last():
        ptr = L.llama_get_logits_ith(ctx, -1)
        return int(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).argmax())

    def eval_prompt(tokens):  # batch already filled by the caller, outside the timer; <= a.batch tokens
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            sys.exit(f"llama child: llama_decode returned {rc}")
        return argmax_last()

    def step(tok, pos):
        batch.token[0] = tok
        batch.pos[0] = pos
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = 1
        batch.n_tokens = 1
        rc = L.llama_decode(ctx, batch)
        if rc != 0:
            sys.exit(f"llama child: llama_decode returned {rc}")
        return argmax_last()

    def noop_step(tok, pos):  # the same Python work as step() with a trivial C call instead of llama_decode
        batch.token[0] = tok
        batch.pos[0] = pos
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = 1
        batch.n_tokens = 1
        L.llama_n_ctx(ctx)
        return argmax_last()

    if max(prompts) > a.batch:
        sys.exit("llama child: prompts longer than the batch are not supported here")

    system_info = L.llama_print_system_info().decode().strip()
    emit(test="load", model=a.model, load_mode=a.load, threads=a.threads, ctx=a.ctx, batch=a.batch, vocab=n_vocab,
         load_s=load_s, session_s=session_s, rss_before_mib=rss0, rss_after_import_mib=rss_imported,
         rss_after_load_mib=rss_model, model_size=L.llama_model_size(model), n_params=L.llama_model_n_params(model),
         flash_attn_type=cp.flash_attn_type, use_extra_bufts=bool(mp.use_extra_bufts),
         llama_cpp_python=L.__version__, system_info=system_info)

    # warm-up
    L.llama_memory_clear(mem, True)
    fill(ids[:p_min], 0)
    t0 = time.perf_counter()
    tok = eval_prompt(ids[:p_min])
    ttft = time.perf_counter() - t0
    n_warm = min(8, a.ctx - p_min)
    t0 = time.perf_counter()
    for i in range(n_warm):
        tok = step(tok, p_min + i)
    emit(test="warmup", n_prompt=p_min, ttft_s=ttft, n_gen=n_warm, tg_s=time.perf_counter() - t0)

    for rep in range(a.reps):
        for p in prompts:
            L.llama_memory_clear(mem, True)
            fill(ids[:p], 0)
            L.llama_perf_context_reset(ctx)
            t0 = time.perf_counter()
            tok = eval_prompt(ids[:p])
            pp_s = time.perf_counter() - t0
            perf = L.llama_perf_context(ctx)
            emit(test="pp", n_prompt=p, threads=a.threads, rep=rep, s=pp_s, tok_s=p / pp_s, ttft_s=pp_s,
                 first_token=tok, llama_t_p_eval_s=perf.t_p_eval_ms / 1e3, llama_n_p_eval=perf.n_p_eval)
            if p != p_min or a.n_gen == 0:
                continue
            gen = []
            L.llama_perf_context_reset(ctx)
            t0 = time.perf_counter()
            for i in range(a.n_gen):
                tok = step(tok, p + i)
                gen.append(tok)
            tg_s = time.perf_counter() - t0
            perf = L.llama_perf_context(ctx)
            # the same loop without llama_decode: what Python adds per step
            t0 = time.perf_counter()
            for i in range(a.n_gen):
                noop_step(tok, p + i)
            noop_s = time.perf_counter() - t0
            emit(test="tg", n_gen=a.n_gen, depth=p, threads=a.threads, rep=rep, s=tg_s, tok_s=a.n_gen / tg_s,
                 ms_per_tok=1e3 * tg_s / a.n_gen, tokens_head=gen[:8], tokens=gen,
                 llama_t_eval_s=perf.t_eval_ms / 1e3, llama_n_eval=perf.n_eval,
                 py_noop_us_per_tok=1e6 * noop_s / a.n_gen)
    emit(test="peak", peak_rss_mib=status_mib("VmHWM"))
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)
    return 0


# ----------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------

def log(*a):
    print(*a, file=sys.stderr, flush=True)


def run_lines(cmd: list[str], what: str, timeout: float, env: dict | None = None) -> tuple[list[dict], str | None]:
    """Runs cmd (with env added to this process's environment), returns (its JSON lines, an error or None)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **env} if env else None)
    except subprocess.TimeoutExpired:
        return [], f"{what}: timed out after {timeout:.0f} s"
    lines = []
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    if r.returncode != 0:
        err = [l for l in r.stderr.strip().splitlines() if l.strip()]
        return lines, f"{what}: exit {r.returncode}: " + (err[-1] if err else "(no message)")
    return lines, None


def weight_bytes_per_token(path: str) -> tuple[int | None, str]:
    try:
        import gguf
    except ImportError:
        return None, "gguf-py missing: no effective bandwidth"
    try:
        r = gguf.GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - report and go on
        return None, f"gguf-py cannot read it ({e})"
    sizes = {t.name: int(t.n_bytes) for t in r.tensors}
    total = sum(sizes.values())
    emb = sizes.get("token_embd.weight", 0)
    tied = "output.weight" not in sizes
    return (total if tied else total - emb), ("output tied to token_embd" if tied else "")


def find_kiln_bin(explicit: str | None) -> str:
    if explicit:
        return explicit
    for d in ("release", "bench"):
        p = ROOT / "build" / d / "bench" / "kiln-bench-e2e"
        if p.exists():
            return str(p)
    sys.exit("compare_llamacpp: kiln-bench-e2e not found; build it (scripts/build.sh release --target kiln-bench-e2e) "
             "or pass --kiln-bin")


def med(xs):
    return statistics.median(xs) if xs else None


def collect(results, model, mode, threads, engine):
    return [x for x in results if x.get("_model") == model and x.get("_mode") == mode and x.get("_threads") == threads
            and x.get("engine") == engine]


def run_shares(results, model, mode, threads, engine, wb):
    """Per decode of `engine`: its effective read bandwidth / the bandwidth measured just before its process
    (--bw-each-run; best of 1 and 4 streams), and those bandwidths. Empty when the run has none (older runs)."""
    shares, bws = [], []
    for x in collect(results, model, mode, threads, engine):
        if x.get("test") != "tg":
            continue
        bw = [y["gb_s_best"] for y in results if y.get("test") == "read_bw" and y.get("_model") == model
              and y.get("_mode") == mode and y.get("_threads") == threads and y.get("_round") == x.get("_round")
              and y.get("_before") == engine]
        if bw:
            shares.append(wb * x["tok_s"] / 1e9 / max(bw))
            bws.append(max(bw))
    return shares, bws


def summarize(lines, p_min):
    """metric -> list of samples."""
    m: dict[str, list[float]] = {}

    def add(k, v):
        m.setdefault(k, []).append(v)

    for x in lines:
        t = x.get("test")
        if t == "pp":
            add(f"pp{x['n_prompt']}", x["tok_s"])
            if x["n_prompt"] == p_min:
                add("ttft_ms", 1e3 * x["ttft_s"])
            if "llama_t_p_eval_s" in x and x["llama_t_p_eval_s"] > 0:
                add(f"pp{x['n_prompt']}_internal", x["n_prompt"] / x["llama_t_p_eval_s"])
        elif t == "tg":
            add("tg", x["tok_s"])
            if "llama_t_eval_s" in x and x["llama_t_eval_s"] > 0:
                add("tg_internal", x["llama_n_eval"] / x["llama_t_eval_s"])
                add("py_overhead_us", 1e6 * (x["s"] - x["llama_t_eval_s"]) / x["n_gen"])
                add("py_noop_us", x["py_noop_us_per_tok"])
        elif t == "load":
            add("load_ms", 1e3 * (x["load_s"] + x["session_s"]))
            add("rss_before_mib", x["rss_before_mib"])
        elif t == "warmup":
            add("cold_ttft_ms", 1e3 * x["ttft_s"])
        elif t == "peak":
            add("peak_rss_mib", x["peak_rss_mib"])
    # load + first prompt, pairing each process's load line with its warm-up line
    loads = [x for x in lines if x.get("test") == "load"]
    warms = [x for x in lines if x.get("test") == "warmup"]
    for l, w in zip(loads, warms):
        add("load_cold_ttft_ms", 1e3 * (l["load_s"] + l["session_s"] + w["ttft_s"]))
    return m


def fmt(v, digits=None):
    if v is None:
        return "-"
    if digits is None:
        digits = 0 if abs(v) >= 100 else (1 if abs(v) >= 10 else 2)
    return f"{v:,.{digits}f}"


def cell(samples):
    if not samples:
        return "-"
    m = med(samples)
    if len(samples) == 1:
        return fmt(m)
    return f"{fmt(m)} ({fmt(min(samples))}-{fmt(max(samples))})"


def ratio(a, b):
    if not a or not b:
        return "-"
    mb = med(b)
    return f"{med(a) / mb:.2f}x" if mb else "-"


def metrics(prompts, n_gen):
    """(key, label) rows of the main tables."""
    return ([(f"pp{p}", f"pp{p} tok/s") for p in prompts] + [
        ("tg", f"tg{n_gen} tok/s"),
        ("ttft_ms", f"TTFT ms (prompt {min(prompts)})"),
        ("peak_rss_mib", "peak RSS MiB"),
        ("load_ms", "load ms (file + context)"),
        ("cold_ttft_ms", "cold TTFT ms (first prompt after load)"),
    ])


CACHE_BYTES = 64 << 20  # weights smaller than this stay in cache: no memory roofline


def markdown(results, meta, models, modes, threads_list, prompts, n_gen) -> str:
    p_min = min(prompts)
    out = []
    for mode in modes:
        title = ("weights read into memory (kiln --load read, llama.cpp use_mmap=false)" if mode == "read"
                 else "weights memory-mapped (both)")
        out.append(f"### {title}\n")
        bw_line = []
        for t in threads_list:
            bws = [x["gb_s_best"] for x in results if x.get("test") == "read_bw" and x.get("threads") == t]
            if bws:
                bw_line.append(f"{fmt(med(bws))} GB/s at {t} thread{'s' if t > 1 else ''} (range {fmt(min(bws))}-{fmt(max(bws))})")
        if bw_line:
            out.append("Read bandwidth measured in the same run (kiln-bench-e2e --read-bandwidth, best of 1/4 streams): "
                       + "; ".join(bw_line) + ".\n")
        head = "| model | metric |"
        sep = "| --- | --- |"
        for t in threads_list:
            head += f" kiln t={t} | llama.cpp t={t} | kiln / llama.cpp |"
            sep += " --- | --- | --- |"
        out += [head, sep]
        for model in models:
            name = Path(model).name
            wb = meta.get(model, {}).get("weight_bytes")
            per_t = {}
            for t in threads_list:
                k = collect(results, model, mode, t, "kiln")
                l = collect(results, model, mode, t, "llama.cpp")
                per_t[t] = (summarize(k, p_min), summarize(l, p_min))
            errors = sorted({x["error"] for x in results if x.get("_model") == model and x.get("_mode") == mode
                             and x.get("test") == "error"})
            if not errors and not any(a or b for a, b in per_t.values()):
                continue  # this model was not run in this mode
            rows = []
            for key, label in metrics(prompts, n_gen):
                row = f"| {name} | {label} |"
                for t in threads_list:
                    ks, ls = per_t[t]
                    row += f" {cell(ks.get(key))} | {cell(ls.get(key))} | {ratio(ks.get(key), ls.get(key))} |"
                rows.append(row)
            if wb:
                per_run = any(x.get("test") == "read_bw" and x.get("_before") and x.get("_model") == model
                              for x in results)
                label = ("median share of the read bw measured before each run, of GB/s" if per_run
                         else "of read bw")
                row = f"| {name} | tg effective read GB/s ({label}) |"
                for t in threads_list:
                    ks, ls = per_t[t]
                    bws = [x["gb_s_best"] for x in results if x.get("test") == "read_bw" and x.get("threads") == t
                           and x.get("_model") == model]
                    bw = med(bws)
                    cells = []
                    for eng, s in (("kiln", ks.get("tg")), ("llama.cpp", ls.get("tg"))):
                        if s:
                            eff = wb * med(s) / 1e9
                            shares, run_bws = run_shares(results, model, mode, t, eng, wb) if per_run else ([], [])
                            if wb < CACHE_BYTES:
                                cells.append(f"{eff:.1f} (weights fit in cache)")
                            elif shares:  # each decode against the bandwidth measured just before its process
                                cells.append(f"{eff:.1f} ({100 * med(shares):.0f}% of {med(run_bws):.1f})")
                            else:
                                cells.append(f"{eff:.1f} ({100 * eff / bw:.0f}%)" if bw else f"{eff:.1f}")
                        else:
                            cells.append("-")
                    row += f" {cells[0]} | {cells[1]} | {ratio(ks.get('tg'), ls.get('tg'))} |"
                rows.append(row)
            out += rows
            for e in errors:
                out.append(f"| {name} | error | {e} |" + " |" * (3 * len(threads_list) - 1))
        out.append("")
        out.append("Cells: median (min-max) over all repetitions of all rounds. kiln / llama.cpp > 1 means kiln is "
                   "faster for tok/s and slower (or larger) for ms and MiB rows.\n")
    # Python overhead and llama.cpp's own timers
    out.append("### llama.cpp driven from Python: overhead check\n")
    out.append("Python's share is the last column (the same loop, batch filling, ctypes calls and numpy argmax, with a "
               "trivial C call instead of llama_decode); wall - llama.cpp's own t_eval also holds the parts of "
               "llama_decode its timer leaves out (graph build, output copy).\n")
    out.append("| model | mode | threads | tg tok/s (wall, Python loop) | tg tok/s (llama.cpp's own timer) | "
               "wall - t_eval per token | Python loop alone per token |")
    out.append("| --- | --- | --- | --- | --- | --- | --- |")
    for model in models:
        for mode in modes:
            for t in threads_list:
                ls = summarize(collect(results, model, mode, t, "llama.cpp"), p_min)
                if not ls.get("tg"):
                    continue
                out.append(f"| {Path(model).name} | {mode} | {t} | {cell(ls.get('tg'))} | {cell(ls.get('tg_internal'))} | "
                           f"{fmt(med(ls.get('py_overhead_us')), 1)} us | {fmt(med(ls.get('py_noop_us')), 1)} us |")
    out.append("")
    # greedy agreement
    out.append("### Greedy tokens: do both engines compute the same model?\n")
    out.append("Random prompt ids are out-of-distribution input: near-ties in the logits amplify rounding differences "
               "(8-bit activations, f16 vs f32 K/V), so random-weight models diverge after a few tokens.\n")
    out.append("| model | mode | threads | first token (pp) kiln / llama.cpp | leading generated tokens equal |")
    out.append("| --- | --- | --- | --- | --- |")
    for model in models:
        for mode in modes:
            for t in threads_list:
                k = [x for x in collect(results, model, mode, t, "kiln") if x.get("test") == "tg"]
                l = [x for x in collect(results, model, mode, t, "llama.cpp") if x.get("test") == "tg"]
                kp = [x for x in collect(results, model, mode, t, "kiln") if x.get("test") == "pp" and x["n_prompt"] == p_min]
                lp = [x for x in collect(results, model, mode, t, "llama.cpp") if x.get("test") == "pp" and x["n_prompt"] == p_min]
                if not (k and l and kp and lp):
                    continue
                kt, lt = k[0].get("tokens") or k[0]["tokens_head"], l[0].get("tokens") or l[0]["tokens_head"]
                n = min(len(kt), len(lt))
                eq = next((i for i in range(n) if kt[i] != lt[i]), n)
                out.append(f"| {Path(model).name} | {mode} | {t} | {kp[0]['first_token']} / {lp[0]['first_token']} | "
                           f"{eq} of {n} compared |")
    out.append("")
    return "\n".join(out)


def engines_line(results) -> str:
    env = []
    try:
        import llama_cpp as L
        env.append(f"llama-cpp-python {L.__version__}")
    except ImportError:
        pass
    kl = next((x for x in results if x.get("engine") == "kiln" and x.get("test") == "load"), None)
    ll = next((x for x in results if x.get("engine") == "llama.cpp" and x.get("test") == "load"), None)
    if kl:
        env.append(f"kiln SIMD target {kl['simd']}, precision {kl['precision']}")
    if ll:
        env.append(f"llama.cpp flash_attn_type {ll['flash_attn_type']} (-1 auto), weight repacking "
                   f"{'on' if ll['use_extra_bufts'] else 'off'}; {ll['system_info']}")
    return "Engines: " + "; ".join(env) + "."


def weights_lines(models, meta) -> list[str]:
    out = []
    for m in models:
        if meta[m]["weight_bytes"]:
            out.append(f"- {Path(m).name}: {meta[m]['weight_bytes'] / 1e6:.1f} MB of weights read per token"
                       f"{(' (' + meta[m]['note'] + ')') if meta[m]['note'] else ''}")
    return out


def report(files, markdown_out) -> int:
    results = []
    for f in files:
        results += [json.loads(l) for l in Path(f).read_text().splitlines() if l.strip()]
    models = list(dict.fromkeys(x["_model"] for x in results if "_mode" in x))
    modes = [m for m in ("read", "map") if any(x.get("_mode") == m for x in results)]
    threads_list = sorted({x["_threads"] for x in results if "_mode" in x})
    prompts = sorted({x["n_prompt"] for x in results if x.get("test") == "pp"})
    n_gen = next((x["n_gen"] for x in results if x.get("test") == "tg"), 0)
    meta = {}
    for m in models:
        wb, note = weight_bytes_per_token(m) if Path(m).exists() else (None, "file not found")
        meta[m] = {"weight_bytes": wb, "note": note}
    rounds = {}
    for x in results:
        if "_round" in x:
            k = (x["_model"], x["_mode"], x["_threads"], x["engine"])
            rounds.setdefault(k, set()).add(x["_round"])
    n_rounds = sorted({len(v) for v in rounds.values()})
    header = [f"Rendered from {', '.join(Path(f).name for f in files)} (bench/compare_llamacpp.py --report); "
              f"{'/'.join(map(str, n_rounds))} processes per engine and configuration.", engines_line(results), ""]
    md = "\n".join(header + weights_lines(models, meta)) + "\n\n" + markdown(results, meta, models, modes, threads_list,
                                                                           prompts, n_gen)
    print(md)
    if markdown_out:
        Path(markdown_out).write_text(md)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="GGUF files")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompts", default="128,512")
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="processes per engine, alternating (default 3)")
    ap.add_argument("--reps", type=int, default=2, help="repetitions inside each process (default 2)")
    ap.add_argument("--modes", default="read,map", help="read (weights in memory), map (memory-mapped)")
    ap.add_argument("--ctx", type=int, default=0, help="context (default: max(largest prompt, smallest + n-gen))")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--kiln-bin")
    ap.add_argument("--kiln-precision", default="fast", choices=["fast", "fast8", "exact"],
                    help="kiln's path for quantized weights (default fast; fast8 = llama.cpp's 8-bit activations)")
    ap.add_argument("--kiln-target", default="",
                    help="run kiln's kernels of this SIMD target (kiln-bench-e2e --target, e.g. AVX2)")
    ap.add_argument("--llama-lib", default="",
                    help="directory of another libllama.so build for the llama.cpp children (LLAMA_CPP_LIB_PATH; "
                         "scripts/llamacpp_cpu.sh builds an AVX2-only one)")
    ap.add_argument("--bw-each-run", action=argparse.BooleanOptionalAction, default=True,
                    help="measure the read bandwidth again just before every engine process, so that each "
                         "decode's share of it is of the bandwidth at that time (default on)")
    ap.add_argument("--engines", default="kiln,llama.cpp")
    ap.add_argument("--json-out", help="write every JSON line (tagged) here")
    ap.add_argument("--markdown-out", help="write the markdown tables here too")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    ap.add_argument("--report", nargs="+", metavar="JSONL",
                    help="only render the tables from the JSON lines of earlier runs (--json-out), merged")
    # child mode
    ap.add_argument("--llama-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model")
    ap.add_argument("--load", default="read")
    ap.add_argument("--ids")
    ap.add_argument("--label", default="")
    a = ap.parse_args()

    if a.llama_child:
        a.threads = int(a.threads)
        return llama_child(a)
    if a.report:
        return report(a.report, a.markdown_out)

    if not a.models:
        ap.error("no model files given")
    for m in a.models:
        if not Path(m).is_file():
            sys.exit(f"compare_llamacpp: model file not found: {m}")
    threads_list = [int(x) for x in a.threads.split(",")]
    prompts = [int(x) for x in a.prompts.split(",")]
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in ("read", "map"):
            sys.exit(f"compare_llamacpp: unknown mode {m} (read, map)")
    engines = a.engines.split(",")
    ctx = a.ctx or max(max(prompts), min(prompts) + a.n_gen)
    kiln_bin = find_kiln_bin(a.kiln_bin)
    if a.llama_lib and not (Path(a.llama_lib) / "libllama.so").is_file():
        sys.exit(f"compare_llamacpp: --llama-lib {a.llama_lib}: no libllama.so there (scripts/llamacpp_cpu.sh)")
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        if "llama.cpp" in engines:
            sys.exit("compare_llamacpp: llama_cpp not importable: run with the venv of scripts/llamacpp_env.sh")

    results: list[dict] = []
    meta: dict[str, dict] = {}
    jf = open(a.json_out, "w") if a.json_out else None

    def record(lines, **tags):
        for x in lines:
            x.update({f"_{k}": v for k, v in tags.items()})
            results.append(x)
            if jf:
                jf.write(json.dumps(x) + "\n")
                jf.flush()

    tmp = tempfile.TemporaryDirectory(prefix="kiln-compare-")
    t_start = time.time()
    for model in a.models:
        wb, note = weight_bytes_per_token(model)
        meta[model] = {"weight_bytes": wb, "note": note}
        # vocabulary size for the random ids: from kiln's load line or gguf; simplest: gguf-py, else kiln
        n_vocab = None
        try:
            import gguf
            r = gguf.GGUFReader(model)
            emb = next(t for t in r.tensors if t.name == "token_embd.weight")
            n_vocab = int(emb.shape[-1]) if len(emb.shape) > 1 else None
        except Exception:  # noqa: BLE001
            pass
        if not n_vocab:
            lines, err = run_lines([kiln_bin, "-m", model, "-p", "1", "-n", "0", "-r", "1"], "kiln vocab probe", 600)
            n_vocab = next((x["vocab"] for x in lines if x.get("test") == "load"), None)
        if not n_vocab:
            sys.exit(f"compare_llamacpp: cannot find the vocabulary size of {model}")
        rng = random.Random(a.seed)
        ids = [rng.randrange(3, n_vocab) for _ in range(max(prompts))]  # skip the usual <unk> <s> </s>
        ids_file = Path(tmp.name) / (Path(model).stem + ".ids")
        ids_file.write_text(" ".join(map(str, ids)))
        log(f"== {model}: vocab {n_vocab}, weight bytes per token {wb} {note}")

        def read_bandwidth(t, **tags):
            lines, _ = run_lines([kiln_bin, "--read-bandwidth", "-t", str(t)], "read bandwidth", 600)
            record(lines, model=model, threads=t, **tags)
            return lines

        for t in threads_list:
            lines = read_bandwidth(t)
            log(f"   read bandwidth t={t}: " + ", ".join(f"{x['streams']} streams {x['gb_s_best']:.1f} GB/s" for x in lines))
        for mode in modes:
            for t in threads_list:
                for rnd in range(a.rounds):
                    order = engines if rnd % 2 == 0 else engines[::-1]
                    for eng in order:
                        if a.bw_each_run:
                            read_bandwidth(t, mode=mode, round=rnd, before=eng)
                        if eng == "kiln":
                            cmd = [kiln_bin, "-m", model, "-t", str(t), "-p", a.prompts, "-n", str(a.n_gen), "-r",
                                   str(a.reps), "-c", str(ctx), "-b", str(a.batch), "--load", mode, "--ids", str(ids_file),
                                   "--precision", a.kiln_precision] + (["--target", a.kiln_target] if a.kiln_target else [])
                            env = None
                        else:
                            cmd = [sys.executable, __file__, "--llama-child", "--model", model, "--threads", str(t),
                                   "--prompts", a.prompts, "--n-gen", str(a.n_gen), "--reps", str(a.reps), "--ctx",
                                   str(ctx), "--batch", str(a.batch), "--load", mode, "--ids", str(ids_file)]
                            env = {"LLAMA_CPP_LIB_PATH": a.llama_lib} if a.llama_lib else None
                        t0 = time.time()
                        lines, err = run_lines(cmd, eng, a.timeout, env)
                        record(lines, model=model, mode=mode, threads=t, round=rnd)
                        if err:
                            record([{"engine": eng, "test": "error", "error": err}], model=model, mode=mode, threads=t,
                                   round=rnd)
                            log(f"   {eng} {mode} t={t} round {rnd}: ERROR {err}")
                            continue
                        tg = [x["tok_s"] for x in lines if x.get("test") == "tg"]
                        pp = {x["n_prompt"]: x["tok_s"] for x in lines if x.get("test") == "pp"}
                        log(f"   {eng:9s} {mode} t={t} round {rnd}: pp " +
                            " ".join(f"{k}:{v:.1f}" for k, v in sorted(pp.items())) +
                            (f" tg {med(tg):.2f} tok/s" if tg else "") + f" ({time.time() - t0:.0f} s)")
    if jf:
        jf.close()

    load = os.getloadavg()
    header = [f"Command: `{' '.join([Path(sys.executable).name, 'bench/compare_llamacpp.py'] + sys.argv[1:])}`",
              f"Machine: {platform.node()}, {os.cpu_count()} CPUs, load average at the end "
              f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}; {time.time() - t_start:.0f} s in all.",
              f"Protocol: {a.rounds} processes per engine alternating x {a.reps} repetitions each; prompts "
              f"{a.prompts} (random ids, seed {a.seed}), {a.n_gen} greedy tokens after the {min(prompts)}-token prompt, "
              f"context {ctx}, batch {a.batch}.",
              engines_line(results), ""] + weights_lines(a.models, meta)
    md = "\n".join(header) + "\n\n" + markdown(results, meta, a.models, modes, threads_list, prompts, a.n_gen)
    print(md)
    if a.markdown_out:
        Path(a.markdown_out).write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
