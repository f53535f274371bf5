#!/usr/bin/env python3
"""kiln-server's chat page (GET /) in a real browser: headless Chromium (Debian chromium + chromium-driver)
driven by Selenium (the tools venv).

  test_page.py --server BUILD/examples/kiln-server --venv REPO/.venv --out DIR

Loads the page from a kiln-server on 127.0.0.1 (SmolLM2-135M-Instruct from $KILN_MODEL_DIR), types a message, waits (bounded) for the streamed reply and its statistics line (tokens/s), saves a
screenshot to DIR/kiln-chat-page.png and checks it is not blank, stops a long reply with the Stop button,
and clears the conversation with New conversation. Fails (never skips) when Chromium, chromedriver, the
venv or selenium is missing.
"""
import argparse
import os
import shutil
import struct
import sys
import time
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_server as ts  # noqa: E402  (Server, check, reexec_in_venv)


def png_distinct_bytes(png):
    """Distinct byte values of the decompressed image rows (a blank page gives a handful)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    i, idat = 8, b""
    while i < len(png):
        n, kind = struct.unpack(">I4s", png[i:i + 8])
        if kind == b"IDAT":
            idat += png[i + 8:i + 8 + n]
        i += 12 + n
    return len(set(zlib.decompress(idat)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--venv", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ts.reexec_in_venv(a.venv)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        sys.exit("test_page.py: FAIL: selenium is not in the venv: run scripts/python_env.sh")
    chromium, driver_exe = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_exe:
        sys.exit("test_page.py: FAIL: chromium and chromium-driver are needed: run scripts/install_deps.sh")

    model_dir = os.environ.get("KILN_MODEL_DIR") or os.path.expanduser("~/.cache/kiln/models")
    model = os.path.join(model_dir, "SmolLM2-135M-Instruct.Q4_1.gguf")
    if not os.path.exists(model):
        sys.exit(f"test_page.py: FAIL: missing model {model}: run scripts/fetch_models.sh")
    srv = ts.Server(a.server, ["-m", model, "-c", "2048", "-np", "2", "-t", "2"])
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1000,800"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_exe), options=opts)
    driver.set_page_load_timeout(60)
    try:
        driver.get(srv.url + "/")
        wait = WebDriverWait(driver, 60)
        wait.until(lambda d: d.find_element(By.ID, "model").text.endswith(".gguf"))
        temp = driver.find_element(By.ID, "temp")
        temp.clear()
        temp.send_keys("0")
        mt = driver.find_element(By.ID, "maxtok")
        mt.clear()
        mt.send_keys("32")
        box = driver.find_element(By.ID, "input")
        box.send_keys("What is the capital of France?")
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_elements(By.ID, "stats-1") and d.find_element(By.ID, "stats-1").text)
        reply = driver.find_element(By.ID, "reply-1").text
        stats = driver.find_element(By.ID, "stats-1").text
        ts.check("Paris" in reply, f"the streamed reply names Paris: {reply!r}")
        ts.check("tokens/s" in stats or "tokens," in stats, f"the statistics line: {stats!r}")
        users = driver.find_elements(By.CSS_SELECTOR, ".msg.user")
        ts.check(len(users) == 1 and users[0].text == "What is the capital of France?", "the user's message is shown")
        os.makedirs(a.out, exist_ok=True)
        shot = os.path.join(a.out, "kiln-chat-page.png")
        png = driver.get_screenshot_as_png()
        with open(shot, "wb") as f:
            f.write(png)
        ts.check(png_distinct_bytes(png) > 16, f"the screenshot {shot} is not blank")

        # Stop: a long reply (400 tokens: seconds) is aborted after its first text; the server frees the slot.
        mt.clear()
        mt.send_keys("400")
        box.send_keys("Write a long story about a dragon.")  # greedy: 400 tokens, no end token before
        driver.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_element(By.ID, "reply-3").text)
        driver.find_element(By.ID, "stop").click()
        wait.until(lambda d: d.find_elements(By.ID, "stats-3"))
        stats = driver.find_element(By.ID, "stats-3").text
        ts.check("(stopped)" in stats or stats == "stopped", f"the reply was stopped: {stats!r}")
        ts.check(not driver.find_element(By.ID, "send").get_attribute("disabled"), "Send is enabled after Stop")
        ts.check(ts.wait_idle(srv.url, 30), "the stopped request freed its slot")

        driver.find_element(By.ID, "new").click()
        ts.check(driver.find_elements(By.CSS_SELECTOR, ".msg") == [], "New conversation clears the log")
        ts.check(srv.stop() == 0, "kiln-server exits 0")
    finally:
        driver.quit()
        if srv.proc.poll() is None:
            srv.proc.kill()
        if ts.FAILURES:
            print("".join(srv.log)[-3000:])
    print(f"test_page.py: {len(ts.FAILURES)} failures")
    sys.exit(1 if ts.FAILURES else 0)


if __name__ == "__main__":
    main()
