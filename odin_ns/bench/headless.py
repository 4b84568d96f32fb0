"""A headless Chromium driven over the DevTools protocol (viewer tests, viewer_overhead bench).

Uses the system's Chromium (Debian's ``/usr/bin/chromium``) and the ``websockets`` package;
it never downloads a browser. Only what the viewer checks need: open a page, evaluate
JavaScript, poll for a condition, take a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "/usr/bin/chromium")

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


def find_chromium() -> str | None:
    """Path of a Chromium binary on PATH, or None."""
    for name in CHROMIUM_CANDIDATES:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


@dataclass
class ChromiumOptions:
    """How the browser is started."""

    binary: str | None = None  # None: find_chromium()
    width: int = 1400
    height: int = 1100
    start_timeout_s: float = 30.0
    call_timeout_s: float = 30.0


class HeadlessChromium:
    """One headless Chromium process with one page, driven over the DevTools protocol.

    Use as a context manager; ``close()`` ends the browser's process group.
    """

    def __init__(self, url: str, options: ChromiumOptions | None = None):
        from websockets.sync.client import connect

        self.options = options or ChromiumOptions()
        binary = self.options.binary or find_chromium()
        if binary is None:
            raise FileNotFoundError("no Chromium binary found (install Debian's 'chromium')")
        self._profile = tempfile.mkdtemp(prefix="odin-chromium-")
        args = [
            binary,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={self._profile}",
            "--remote-debugging-port=0",  # Chromium picks a free port, writes DevToolsActivePort
            f"--window-size={self.options.width},{self.options.height}",
            url,
        ]
        # A new session so close() can end the wrapper script and all its children.
        self._proc = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._ids = itertools.count(1)
        self._events: list[dict] = []
        self._stack = contextlib.ExitStack()
        try:
            port = self._wait_for_port()
            ws_url = self._page_ws_url(port)
            self._ws = self._stack.enter_context(
                connect(ws_url, max_size=None, open_timeout=self.options.start_timeout_s)
            )
            self.call("Runtime.enable")  # report page exceptions and console calls
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ startup
    def _wait_for_port(self) -> int:
        marker = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.options.start_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"chromium exited early with code {self._proc.returncode}")
            if marker.exists():
                lines = marker.read_text().split()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            time.sleep(0.05)
        raise TimeoutError(
            f"chromium did not open its DevTools port in {self.options.start_timeout_s} s"
        )

    def _page_ws_url(self, port: int) -> str:
        deadline = time.monotonic() + self.options.start_timeout_s
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=5) as resp:
                targets = json.loads(resp.read())
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                return pages[0]["webSocketDebuggerUrl"]
            time.sleep(0.05)
        raise TimeoutError("chromium has no page target")

    @property
    def pid(self) -> int:
        """Process id of the browser (the leader of its process group)."""
        return self._proc.pid

    # ------------------------------------------------------------------ protocol
    def call(self, method: str, **params: Any) -> dict:
        """Send one DevTools command and return its result (events are skipped)."""
        msg_id = next(self._ids)
        self._ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + self.options.call_timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"DevTools call {method} got no answer")
            reply = json.loads(self._ws.recv(timeout=left))
            if reply.get("id") != msg_id:
                if reply.get("method") in ("Runtime.exceptionThrown", "Runtime.consoleAPICalled"):
                    self._events.append(reply)
                    del self._events[:-100]  # keep the latest only
                continue
            if "error" in reply:
                raise RuntimeError(f"DevTools {method} failed: {reply['error']}")
            return reply.get("result", {})

    def evaluate(self, expression: str) -> Any:
        """Value of a JavaScript expression in the page (JSON-serialisable values only)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript error: {result['exceptionDetails'].get('text')}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 20.0, poll_s: float = 0.1) -> Any:
        """Poll ``expression`` until it is truthy; return its value."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError:  # e.g. the page is still loading: treat as "not yet"
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                errors = "; ".join(e.splitlines()[0][:120] for e in self.page_errors()[-3:])
                raise TimeoutError(
                    f"page condition not met in {timeout_s} s: {expression[:80]}"
                    + (f" (page errors: {errors})" if errors else "")
                )
            time.sleep(poll_s)

    def page_errors(self) -> list[str]:
        """Uncaught exceptions and console.error messages seen so far (for diagnostics)."""
        out = []
        for event in self._events:
            params = event.get("params", {})
            if event["method"] == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                out.append(
                    details.get("exception", {}).get("description") or details.get("text", "")
                )
            elif params.get("type") == "error":
                out.append(
                    " ".join(
                        str(a.get("value", a.get("description", "")))
                        for a in params.get("args", [])
                    )
                )
        return out

    def text(self) -> str:
        """The page's visible text."""
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def press_key(self, key: str, code: str, key_code: int) -> None:
        """Press and release one key in the focused element (e.g. "ArrowRight", 39)."""
        for kind in ("rawKeyDown", "keyUp"):
            self.call(
                "Input.dispatchKeyEvent",
                type=kind,
                key=key,
                code=code,
                windowsVirtualKeyCode=key_code,
                nativeVirtualKeyCode=key_code,
            )

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def screenshot(self, path: str | Path, clip: dict | None = None) -> Path:
        """Save a PNG of the viewport, or of ``clip`` = {x, y, width, height} (CSS px)."""
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params["clip"] = {
                **{k: float(clip[k]) for k in ("x", "y", "width", "height")},
                "scale": 1,
            }
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", **params)["data"]
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        try:
            self._stack.close()
        except Exception:
            pass
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)  # our own process group only
                self._proc.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self._proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._proc.wait(timeout=5)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> HeadlessChromium:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["CHROMIUM_FLAGS", "ChromiumOptions", "HeadlessChromium", "find_chromium"]
