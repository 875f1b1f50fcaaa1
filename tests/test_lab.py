"""JupyterLab from the environment (`make lab`): it starts headless, serves a text notebook as a
notebook (jupytext), its kernel imports this checkout's synclib, and a double-click in its file
browser opens ``notebooks/*.md`` as a notebook (the default viewer the repository sets)."""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from jupyter_client import BlockingKernelClient

from conftest import stop
from devtools import CHROMIUM, Browser

ROOT = Path(__file__).resolve().parents[1]
JUPYTER = Path(sys.executable).with_name("jupyter")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """``make lab``, headless, on a free port: ``(base URL, token, its folder)``."""
    if not JUPYTER.is_file():
        pytest.fail(f"{JUPYTER} is missing: `make venv` installs JupyterLab (the book extra)")
    tmp_path = tmp_path_factory.mktemp("lab")
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt")}
    env.pop("JUPYTER_CONFIG_PATH", None)
    # the README's command, `make lab`, with this environment (-o: the environment is set up, do not reinstall)
    venv = Path(sys.executable).parent.parent
    cmd = ["make", "-s", "-o", str(venv / ".synclib-installed"), "lab", f"VENV={venv}",
           f"LAB_ARGS=--no-browser --port={port} --ip=127.0.0.1 --IdentityProvider.token={token}"]
    log = open(tmp_path / "lab.log", "w")  # a file, not a pipe: a full pipe would block the server's logging
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                if httpx.get(f"{base}/api/status", headers={"Authorization": f"token {token}"}, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, f"jupyter lab exited:\n{(tmp_path / 'lab.log').read_text()[-3000:]}"
            assert time.time() < deadline, "jupyter lab did not answer within 90 s"
            time.sleep(0.5)
        yield base, token, tmp_path
        headers = {"Authorization": f"token {token}"}  # kernels a test or the browser started: the server then stops at once
        for k in httpx.get(f"{base}/api/kernels", headers=headers, timeout=10).json():
            httpx.delete(f"{base}/api/kernels/{k['id']}", headers=headers, timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # make and the lab it started
        try:  # the server says it stops, but under pytest's capture an extension may keep it waiting
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stop(proc)
        log.close()


@pytest.mark.slow
def test_jupyter_lab_serves_a_text_notebook_with_a_kernel_that_imports_synclib(lab):
    base, token, tmp_path = lab
    headers = {"Authorization": f"token {token}"}
    printed: list[str] = []
    assert httpx.get(f"{base}/lab", headers=headers, timeout=10).status_code == 200  # the application
    # it serves the repository, opened at notebooks/: the results and the book's pages can be opened too
    root = httpx.get(f"{base}/api/contents/", headers=headers, timeout=10).json()
    assert {"notebooks", "book", "synclib"} <= {c["name"] for c in root["content"]}
    assert httpx.get(f"{base}/api/contents/book/method.md", headers=headers, timeout=10).status_code == 200
    page = httpx.get(f"{base}/", params={"token": token}, follow_redirects=True, timeout=10)
    assert page.status_code == 200 and str(page.url).split("?")[0].endswith("/lab/tree/notebooks")
    r = httpx.get(f"{base}/api/contents/notebooks/fig02_heatmaps.md",
                  params={"type": "notebook", "content": 1}, headers=headers, timeout=30)
    assert r.status_code == 200, r.text[:500]
    nb = r.json()
    assert nb["type"] == "notebook"
    code = [c for c in nb["content"]["cells"] if c["cell_type"] == "code"]
    assert "parameters" in code[0]["metadata"].get("tags", [])
    assert any("notebook.setup(results_dir" in "".join(c["source"]) for c in code)
    # a kernel the lab starts (as it does for an opened notebook) imports this checkout's synclib
    kid = httpx.post(f"{base}/api/kernels", json={"name": "python3"}, headers=headers, timeout=60).json()["id"]
    kc = BlockingKernelClient(connection_file=str(tmp_path / "rt" / f"kernel-{kid}.json"))
    kc.load_connection_file()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        reply = kc.execute_interactive("import synclib; print(synclib.__file__)", timeout=60,
                                       output_hook=lambda m: printed.append(m["content"].get("text", "")))
    finally:
        kc.stop_channels()
    assert reply["content"]["status"] == "ok"
    path = Path("".join(printed).strip())
    assert path.is_relative_to(ROOT), f"the lab's kernel imports {path}, not this checkout's synclib"


#: the file browser's entry of a file: its centre, where a double-click lands
ENTRY = """(() => {
  const item = Array.from(document.querySelectorAll('.jp-DirListing-item'))
    .find(e => e.querySelector('.jp-DirListing-itemText')?.textContent.trim() === %s);
  if (!item) return null;
  const r = item.querySelector('.jp-DirListing-itemText').getBoundingClientRect();
  return [r.left + r.width / 2, r.top + r.height / 2];
})()"""
#: what the main area shows for the current tab: a notebook with cells, or a text editor
OPENED = """(() => {
  const tab = document.querySelector('.jp-MainAreaWidget:not(.lm-mod-hidden)');
  if (!tab) return null;
  return {notebook: !!tab.querySelector('.jp-Notebook'), cells: tab.querySelectorAll('.jp-Cell').length,
          editor: !!tab.classList.contains('jp-FileEditor') || !!tab.querySelector('.jp-FileEditor'),
          title: document.querySelector('.lm-DockPanel .lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel')?.textContent};
})()"""


@pytest.mark.slow
def test_a_double_click_opens_a_text_notebook_as_a_notebook(lab):
    """In the browser, as a student does: `make lab` opens at notebooks/, and a double-click on
    fig02_heatmaps.md opens it as a notebook (cells), not as Markdown text in the editor."""
    if CHROMIUM is None:
        pytest.fail("Chromium is not installed: `apt-get install chromium` (make test does it)")
    base, token, tmp_path = lab
    browser = Browser(tmp_path / "chromium")
    try:
        browser.load(f"{base}/lab/tree/notebooks?token={token}&reset")
        x, y = browser.wait_for(ENTRY % '"fig02_heatmaps.md"', timeout=120)
        browser.double_click(x, y)
        opened = browser.wait_for(f"(() => {{ const o = {OPENED}; return o && (o.cells > 0 || o.editor) ? o : null; }})()",
                                  timeout=120)
    finally:
        browser.close()
    assert opened["notebook"] and not opened["editor"], opened
    assert opened["title"] == "fig02_heatmaps.md", opened
