"""Headless Chromium driven over the DevTools protocol (a pipe, standard library only), for the
tests of the book's pages and of JupyterLab."""
from __future__ import annotations

import json
import os
import select
import shutil
import time
from pathlib import Path

import pytest

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
#: a laptop's browser viewport
LAPTOP = (1280, 800)


class Browser:
    """Headless Chromium over ``--remote-debugging-pipe``: the browser reads commands on its
    fd 3 and writes replies and events on its fd 4, each message JSON ended by a NUL byte."""

    def __init__(self, profile: Path, proxy_port: int | None = None, size=LAPTOP):
        if CHROMIUM is None:
            pytest.fail("Chromium is not installed: `apt-get install chromium` (make test does it)")
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-default-apps",
               "--disable-extensions", "--disable-features=NetworkTimeServiceQuerying,MediaRouter,"
               "OptimizationHints,Translate", "--disable-domain-reliability", "--no-pings",
               "--disable-client-side-phishing-detection", "--disable-breakpad", "--metrics-recording-only",
               f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}",
               "--remote-debugging-pipe", "about:blank"]
        if proxy_port is not None:  # every request, loopback's too, to a proxy that records it
            cmd[-2:-2] = [f"--proxy-server=127.0.0.1:{proxy_port}", "--proxy-bypass-list=<-loopback>"]
        actions = [(os.POSIX_SPAWN_DUP2, to_child, 3), (os.POSIX_SPAWN_DUP2, from_child, 4),
                   (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                   (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                   (os.POSIX_SPAWN_OPEN, 2, os.devnull, os.O_WRONLY, 0)]
        self.pid = os.posix_spawn(cmd[0], cmd, dict(os.environ), file_actions=actions)
        os.close(to_child)
        os.close(from_child)
        self._buf, self._id, self.session, self.events = b"", 0, None, []
        try:
            page = next(t for t in self.call("Target.getTargets")["targetInfos"] if t["type"] == "page")
            self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
            for domain in ("Runtime", "Log", "Page"):
                self.call(f"{domain}.enable")
        except BaseException:
            self.close()
            raise

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("no message from Chromium")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, timeout: float = 60, **params):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session:
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._read(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def evaluate(self, expression: str, timeout: float = 60):
        r = self.call("Runtime.evaluate", timeout=timeout, expression=expression, returnByValue=True,
                      awaitPromise=True)
        assert "exceptionDetails" not in r, f"the probe failed: {r['exceptionDetails']}"
        return r["result"].get("value")

    def load(self, url: str, timeout: float = 90) -> None:
        """Navigate to ``url`` and wait for its load event."""
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._read(deadline))

    def wait_for(self, expression: str, timeout: float = 60):
        """Evaluate ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while not (value := self.evaluate(expression)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"never true: {expression}")
            self.drain(0.25)
        return value

    def double_click(self, x: float, y: float) -> None:
        """A real double-click (two presses, the second with clickCount 2) at the page's ``(x, y)``."""
        for count in (1, 2):
            for kind in ("mousePressed", "mouseReleased"):
                self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=count)

    def drain(self, seconds: float) -> None:
        """Collect the events of the next ``seconds``."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read(deadline))
        except TimeoutError:
            pass

    def console_errors(self) -> list[str]:
        """What the page logged as an error: uncaught exceptions, ``console.error`` and
        ``console.assert`` calls, the browser's own error entries (a failed load)."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append((d.get("exception") or {}).get("description") or d.get("text", "exception"))
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"{p['entry'].get('text')} ({p['entry'].get('url', '')})")
        return out

    def close(self) -> None:
        try:
            self.session = None
            self.call("Browser.close", timeout=10)
        except Exception:
            pass
        for _ in range(100):
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                break
            time.sleep(0.1)
        else:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        os.close(self._r)
        os.close(self._w)
