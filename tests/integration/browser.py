"""Headless Chromium for tests that look at a page as a person would: Debian's ``chromium``
driven over the DevTools protocol (aiohttp, which ray[default] brings), nothing installed here.

``with Browser(tmp_path) as b: page = b.open(url, cookies=..., until=JS)`` loads a page, waits
until the JavaScript expression ``until`` is true (pages drawn by script after the load event),
and returns what it saw: the value of ``until``, console and page errors, and a screenshot.
Without chromium on PATH the test is skipped, saying how to get it.
"""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest


@dataclass
class Page:
    url: str
    value: object = None                            # the last value of ``until`` / ``evaluate``
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads
    screenshot: Path | None = None


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    pytest.skip("no chromium on PATH: install it with `apt-get install -y chromium` "
                "(.ci/run does)")


class Browser:
    def __init__(self, workdir: Path, width: int = 1400, height: int = 1000):
        self.workdir, self.size = Path(workdir), (width, height)
        self._proc: subprocess.Popen | None = None
        self._ws_url = ""

    def __enter__(self) -> Browser:
        self._proc = subprocess.Popen(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-port=0", f"--user-data-dir={self.workdir / 'chromium'}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for line in self._proc.stderr:
            if "DevTools listening on " in line:
                self._ws_url = line.split("DevTools listening on ", 1)[1].strip()
                return self
        raise AssertionError("chromium exited without a DevTools endpoint")

    def __exit__(self, *exc) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=30)

    def open(self, url: str, *, cookies: dict[str, str] | None = None, until: str = "true",
             timeout_s: float = 60, screenshot: str | None = None) -> Page:
        """Load ``url`` (with ``cookies`` set for its host first), wait for ``until``."""
        page = Page(url)
        asyncio.run(self._open(page, cookies or {}, until, timeout_s, screenshot))
        return page

    async def _open(self, page: Page, cookies: dict, until: str, timeout_s: float,
                    screenshot: str | None) -> None:
        import aiohttp

        http = self._ws_url.replace("ws://", "http://").split("/devtools/")[0]
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{http}/json/list") as resp:
                targets = [t for t in await resp.json() if t["type"] == "page"]
            async with session.ws_connect(targets[0]["webSocketDebuggerUrl"],
                                          max_msg_size=0) as ws:
                ids = iter(range(1, 10**6))

                async def call(method: str, check: bool = True, **params) -> dict:
                    my_id = next(ids)
                    await ws.send_json({"id": my_id, "method": method, "params": params})
                    while True:
                        msg = await ws.receive_json(timeout=60)
                        _collect(msg, page.errors)
                        if msg.get("id") == my_id:
                            assert not check or "error" not in msg, msg
                            return msg.get("result", {})

                for domain in ("Page", "Runtime", "Log", "Network"):
                    await call(f"{domain}.enable")
                width, height = self.size
                await call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                           deviceScaleFactor=1, mobile=False)
                for name, value in cookies.items():
                    await call("Network.setCookie", name=name, value=value, url=page.url)
                page.errors.clear()  # Log.enable replays what an earlier page logged
                await call("Page.navigate", url=page.url)
                while True:
                    msg = await ws.receive_json(timeout=timeout_s)
                    _collect(msg, page.errors)
                    if msg.get("method") == "Page.loadEventFired":
                        break
                deadline = time.monotonic() + timeout_s
                while True:
                    # while the page is being replaced the old context may answer, or none
                    result = await call("Runtime.evaluate", check=False, expression=until,
                                        returnByValue=True)
                    page.value = result.get("result", {}).get("value")
                    if page.value or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.5)
                if screenshot:
                    shot = await call("Page.captureScreenshot", format="png",
                                      captureBeyondViewport=True)
                    page.screenshot = self.workdir / screenshot
                    page.screenshot.write_bytes(base64.b64decode(shot["data"]))


def _collect(msg: dict, errors: list[str]) -> None:
    method, params = msg.get("method"), msg.get("params", {})
    if method == "Runtime.exceptionThrown":
        errors.append(str(params["exceptionDetails"]))
    elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
        errors.append(str(params.get("args")))
    elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
        errors.append(f"{params['entry'].get('url')}: {params['entry']['text']}")
