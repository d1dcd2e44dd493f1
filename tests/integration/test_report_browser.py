"""The HTML report of a real run, opened from disk in headless Chromium: every chart is drawn.

"A real run" here is a kept run directory under results/ (kv_budget: three arms, three passes,
real records with the tree sampler's memory samples) copied to the test's tmp dir; real sweeps
are run by test_sweep.py, and this test does not start another. It drives Chromium over the
DevTools protocol (aiohttp, which ray[default] brings) and installs nothing itself: without
Debian's chromium package it skips, saying how to get it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from omni_ray.report import write_report

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "results" / "kv_budget" / "20261202T113422Z"

# For every <img>: its decoded size and its laid-out size on the page.
_IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => {
  const r = i.getBoundingClientRect();
  return {alt: i.alt, complete: i.complete, natural: [i.naturalWidth, i.naturalHeight],
          box: [r.width, r.height]};
}))"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("no chromium on PATH: install it with `apt-get install -y chromium` "
                "(.ci/run does)")


def _devtools_url(proc: subprocess.Popen) -> str:
    for line in proc.stderr:
        if "DevTools listening on " in line:
            return line.split("DevTools listening on ", 1)[1].strip()
    raise AssertionError("chromium exited without a DevTools endpoint")


async def _inspect(browser_ws: str, url: str, screenshot: Path) -> tuple[list, list]:
    import aiohttp

    http = browser_ws.replace("ws://", "http://").split("/devtools/")[0]
    errors: list[str] = []
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{http}/json/list") as resp:
            pages = [t for t in await resp.json() if t["type"] == "page"]
        async with session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            ids = iter(range(1, 10**6))

            async def call(method: str, **params) -> dict:
                my_id = next(ids)
                await ws.send_json({"id": my_id, "method": method, "params": params})
                while True:
                    msg = await ws.receive_json(timeout=60)
                    _collect(msg, errors)
                    if msg.get("id") == my_id:
                        assert "error" not in msg, msg
                        return msg["result"]

            for domain in ("Page", "Runtime", "Log"):
                await call(f"{domain}.enable")
            await call("Emulation.setDeviceMetricsOverride", width=1400, height=1000,
                       deviceScaleFactor=1, mobile=False)
            await call("Page.navigate", url=url)
            while True:
                msg = await ws.receive_json(timeout=60)
                _collect(msg, errors)
                if msg.get("method") == "Page.loadEventFired":
                    break
            images = json.loads((await call("Runtime.evaluate", expression=_IMAGES_JS,
                                            returnByValue=True))["result"]["value"])
            shot = await call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
            screenshot.write_bytes(base64.b64decode(shot["data"]))
    return images, errors


def _collect(msg: dict, errors: list[str]) -> None:
    method, params = msg.get("method"), msg.get("params", {})
    if method == "Runtime.exceptionThrown":
        errors.append(str(params["exceptionDetails"]))
    elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        errors.append(str(params.get("args")))
    elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
        errors.append(f"{params['entry'].get('url')}: {params['entry']['text']}")


def test_report_of_a_real_run_draws_every_chart_in_chromium(tmp_path):
    chromium = _chromium()
    assert RUN.is_dir(), f"the kept run {RUN} is gone: point the test at another under results/"
    run = tmp_path / "kv_budget" / RUN.name
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("logs", "report.*"))
    report = write_report([run])
    proc = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--remote-debugging-port=0", f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        images, errors = asyncio.run(_inspect(_devtools_url(proc), report.as_uri(),
                                              tmp_path / "report.png"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert errors == []
    # 12 metrics by kv_cache_mib, the Pareto chart, memory over time for each of the 3 arms
    assert len(images) >= 12 + 1 + 3, [i["alt"] for i in images]
    undrawn = [i for i in images if not (i["complete"] and min(i["natural"]) > 0
                                          and min(i["box"]) > 0)]
    assert undrawn == []
    alts = {i["alt"] for i in images}
    assert {"throughput vs memory", "memory over time kv_cache_mib=64"} <= alts
    png = (tmp_path / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 50_000
