#!/usr/bin/env python3
"""Scale-out: two kiln-server replicas behind nginx (least connections), on 127.0.0.1 only.

  test_scaleout.py --server BUILD/examples/kiln-server --venv REPO/.venv --shared ../shared [--nginx PATH]

Starts two replicas (the tiny stories260K with the chatml template; --port 0, the printed ports) and nginx
(Debian's, scripts/install_deps.sh) with a config generated from examples/deploy/kiln-nginx.conf (the file
docs/serving.md shows: the test checks the two agree): its upstream and listen addresses replaced by the
replicas' and a free port, wrapped in a main context with `daemon off`, pid, logs and temp paths in a
temporary folder. Then, with the `openai` client through nginx: chat and streamed chat give the text a
replica gives directly (greedy), concurrent streams reach both replicas; one replica is killed (SIGKILL)
and every new request still succeeds (nginx's passive failover, proxy_next_upstream), the error log shows
the dead replica was tried. Everything it started is stopped in `finally`; the whole run is bounded by an
alarm. A missing nginx, venv or `openai` package fails the test (never a skip).
"""
import argparse
import concurrent.futures as cf
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (Server, check, reexec_in_venv, metric)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY_CONF = os.path.join(REPO, "examples", "deploy", "kiln-nginx.conf")
DOC = os.path.join(REPO, "docs", "serving.md")

MAIN_CONF = """daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {tmp}/access.log;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    include {tmp}/kiln.conf;
}}
"""


class Timeout(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except Exception:
        return 0


def site_conf(replica_ports, listen_port):
    """examples/deploy/kiln-nginx.conf with the replicas' and nginx's addresses of this run."""
    text = open(DEPLOY_CONF).read()
    servers = re.findall(r"^\s*server 127\.0\.0\.1:(\d+) ", text, re.M)
    ts.check(len(servers) == 2, f"{DEPLOY_CONF}: two upstream servers ({servers})")
    for old, new in zip(servers, replica_ports):
        text = text.replace(f"server 127.0.0.1:{old} ", f"server 127.0.0.1:{new} ")
    text, n = re.subn(r"listen 127\.0\.0\.1:\d+;", f"listen 127.0.0.1:{listen_port};", text)
    ts.check(n == 1, f"{DEPLOY_CONF}: one listen 127.0.0.1:PORT line")
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--shared", required=True, help="the shared fixtures folder (stories260K)")
    ap.add_argument("--nginx", default=None, help="nginx executable (default: nginx on PATH, or /usr/sbin/nginx)")
    a = ap.parse_args()
    ts.reexec_in_venv(a.venv)

    nginx = a.nginx or shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
    if not nginx or not os.access(nginx, os.X_OK):
        sys.exit("test_scaleout.py: FAIL: nginx not found (Debian package nginx: scripts/install_deps.sh)")
    model = os.path.join(a.shared, "models", "stories260K.gguf")
    if not os.path.exists(model):
        sys.exit(f"test_scaleout.py: FAIL: missing {model}")
    deploy = open(DEPLOY_CONF).read().strip()
    ts.check(deploy in open(DOC).read(), f"docs/serving.md shows {DEPLOY_CONF} as it is")

    def on_alarm(*_):
        raise Timeout()
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(240)
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="kiln-scaleout-")
    os.chmod(tmp, 0o755)  # nginx's workers (user nobody when started as root) reach their temp folders
    replicas, procs = [], {}
    try:
        scenario(a, nginx, model, tmp, replicas, procs)
    except Timeout:
        ts.check(False, "the test ran past its 240 s bound")
    finally:
        signal.alarm(0)
        ngx = procs.get("nginx")
        if ngx is not None and ngx.poll() is None:
            ngx.send_signal(signal.SIGQUIT)  # graceful shutdown
            try:
                ngx.wait(15)
            except subprocess.TimeoutExpired:
                ngx.kill()
                ngx.wait(5)
        for r in replicas:
            if r.proc.poll() is None:
                rc = r.stop()
                ts.check(rc == 0, f"replica exit status after SIGTERM: {rc}")
        if ts.FAILURES:
            print(log(tmp)[-3000:])
            for r in replicas:
                print("".join(r.log)[-2000:])
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"test_scaleout.py: {len(ts.FAILURES)} failures in {time.time() - t0:.1f} s")
    sys.exit(1 if ts.FAILURES else 0)


def scenario(a, nginx, model, tmp, replicas, procs):
    from openai import OpenAI

    args = ["-m", model, "--chat-template", "chatml", "-np", "2", "-c", "1024", "-t", "1"]
    for _ in range(2):
        replicas.append(ts.Server(a.server, args))
    ports = [int(r.url.rsplit(":", 1)[1]) for r in replicas]
    port = free_port()
    with open(os.path.join(tmp, "kiln.conf"), "w") as f:
        f.write(site_conf(ports, port))
    with open(os.path.join(tmp, "nginx.conf"), "w") as f:
        f.write(MAIN_CONF.format(tmp=tmp))
    conf = os.path.join(tmp, "nginx.conf")
    test = subprocess.run([nginx, "-t", "-p", tmp + "/", "-e", os.path.join(tmp, "error.log"), "-c", conf],
                          capture_output=True, text=True, timeout=30)
    if not ts.check(test.returncode == 0, f"nginx -t accepts the generated config: {test.stderr}"):
        return
    ngx = procs["nginx"] = subprocess.Popen(
        [nginx, "-p", tmp + "/", "-e", os.path.join(tmp, "error.log"), "-c", conf],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # its log: error.log
    url = f"http://127.0.0.1:{port}"
    end = time.time() + 30
    while time.time() < end and ngx.poll() is None and http_status(url + "/health") != 200:
        time.sleep(0.1)
    if not ts.check(http_status(url + "/health") == 200, f"nginx up on {url}: {ngx.poll()} {log(tmp)}"):
        return

    direct = OpenAI(base_url=replicas[0].url + "/v1", api_key="unused", max_retries=0, timeout=60)
    proxied = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    prompts = [f"Once upon a time, {w}" for w in ["a cat", "a boy", "the sun", "a dog", "a tree", "Lily"]]

    def chat(client, p, **kw):
        return client.chat.completions.create(model="x", messages=[{"role": "user", "content": p}], max_tokens=48,
                                              temperature=0, **kw)

    def text_of(client, p):
        return chat(client, p).choices[0].message.content

    def streamed(client, p):
        chunks = list(chat(client, p, stream=True))
        return chunks, "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    want = {p: text_of(direct, p) for p in prompts}
    ts.check(all(want.values()), f"the replica answers: {want}")

    # Through nginx: JSON and streamed chat == the replica's own answer.
    for p in prompts[:2]:
        ts.check(text_of(proxied, p) == want[p], f"chat through nginx == direct for {p!r}")
        chunks, text = streamed(proxied, p)
        ts.check(text == want[p], f"streamed through nginx {text!r} == direct {want[p]!r}")
        # (The tiny model may generate all 48 tokens before the first event is written: they come merged.)
        fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        first_role = chunks[0].choices[0].delta.role
        ts.check(first_role == "assistant" and len(fin) == 1 and fin[0] in ("stop", "length"),
                 f"events through nginx: the role first, one finish_reason ({fin})")

    # Concurrent streams through nginx reach both replicas (least connections).
    before = [ts.metric(r.url, "kiln_requests_total") for r in replicas]
    with cf.ThreadPoolExecutor(8) as ex:
        got = list(ex.map(lambda p: streamed(proxied, p)[1], prompts + prompts[:2]))
    ts.check(got == [want[p] for p in prompts + prompts[:2]], "8 concurrent streams through nginx == direct")
    after = [ts.metric(r.url, "kiln_requests_total") for r in replicas]
    spread = [y - x for x, y in zip(before, after)]
    ts.check(sum(spread) == 8 and min(spread) > 0, f"requests per replica {spread}: both serve")

    # One replica dies: every new request still succeeds (on the other one).
    victim = replicas[1]
    victim.proc.kill()
    victim.proc.wait(30)
    served0 = ts.metric(replicas[0].url, "kiln_requests_total")
    for i, p in enumerate(prompts):
        try:
            text = streamed(proxied, p)[1] if i % 2 else text_of(proxied, p)
            ts.check(text == want[p], f"after the kill: {text!r} == {want[p]!r}")
        except Exception as e:  # the client's error: counted as a failure, the other requests still run
            ts.check(False, f"after the kill, request {i} failed: {type(e).__name__}: {e}")
    served = ts.metric(replicas[0].url, "kiln_requests_total") - served0
    ts.check(served == len(prompts), f"the live replica served all {len(prompts)} requests ({served})")
    ts.check(re.search(rf"connect\(\) failed \(111: Connection refused\).*127\.0\.0\.1:{ports[1]}", log(tmp))
             is not None, f"nginx tried the dead replica and moved on: {log(tmp)[-1500:]}")


def log(tmp):
    try:
        return open(os.path.join(tmp, "error.log")).read()
    except OSError:
        return ""


if __name__ == "__main__":
    main()
