"""JupyterLab as people use it: a real headless Chromium opens the notebooks in JupyterLab, runs all cells and reads
the page. Screenshots go to runs/browser/.

Needs Chromium and its chromedriver (Debian: `apt-get install chromium chromium-driver`; .ci/run installs them);
skipped with that reason where they are absent. JupyterLab listens on a free port of 127.0.0.1 only, serves copies
of the notebooks from a temporary folder (autosave never touches notebooks/), and is stopped in all cases.
"""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "runs" / "browser"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
DRIVER = shutil.which("chromedriver")
HAVE_SELENIUM = importlib.util.find_spec("selenium") is not None

if not (CHROMIUM and DRIVER and HAVE_SELENIUM):
    pytest.skip("no browser here: needs Chromium and chromedriver (Debian: apt-get install chromium chromium-driver) "
                "and selenium (the dev extra)" + f" [chromium={CHROMIUM}, chromedriver={DRIVER}, "
                f"selenium={HAVE_SELENIUM}]", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

PROGRESS_CELL = """from kvlab.sim.tiering import make_tiers, simulate
from kvlab.sim.traces import synthetic_agent_trace

result = simulate(synthetic_agent_trace(seed=0), make_tiers("qwen3-8b", hbm_gb=20, dram_gb=100), "lfu", progress=True)
print(f"{result.requests} requests simulated")"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """(base URL with token, notebook folder): JupyterLab on 127.0.0.1 with a `kvlab` kernel of this interpreter."""
    tmp = tmp_path_factory.mktemp("lab")
    books = tmp / "notebooks"
    books.mkdir()
    for name in ("01_kv_bytes_per_token.ipynb", "02_deepseek_890_bytes.ipynb"):
        shutil.copy(ROOT / "notebooks" / name, books / name)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(PROGRESS_CELL)])
    nb.metadata["kernelspec"] = {"name": "kvlab", "display_name": "kvlab (Python)", "language": "python"}
    nbformat.write(nb, str(books / "progress.ipynb"))
    kernel = tmp / "jupyter" / "kernels" / "kvlab"
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "kvlab (Python)", "language": "python"}))
    settings = tmp / "settings" / "@jupyterlab" / "notebook-extension"
    settings.mkdir(parents=True)  # every cell in the DOM (no windowing), so the page can be read whole
    (settings / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    news = tmp / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)  # no "official Jupyter news?" prompt over the page
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    port, token = _free_port(), secrets.token_hex(16)
    env = os.environ | {"JUPYTER_PATH": str(tmp / "jupyter"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
                        "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
                            p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)}
    log = open(tmp / "lab.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
         "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={books}",
         f"--LabApp.user_settings_dir={tmp / 'settings'}", f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.extension_manager=readonly", *(["--allow-root"] if os.geteuid() == 0 else [])],
        cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"JupyterLab did not start:\n{(tmp / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield base, token, books
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the kernels it started
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1500,1500", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        opts.add_argument(arg)
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium never fetches a driver: the system's is given
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def _wait(driver, what, check, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / "timeout.png"))
    raise AssertionError(f"timed out waiting for {what} (screenshot: {SHOTS / 'timeout.png'})")


def _click_menu(driver, menu: str, item: str):
    bar = driver.find_element(By.XPATH, f"//li[contains(@class,'lm-MenuBar-item')][.//div[text()='{menu}']]")
    bar.click()
    entry = _wait(driver, f"menu item {item}", lambda: [e for e in driver.find_elements(
        By.XPATH, f"//li[contains(@class,'lm-Menu-item')][.//div[text()='{item}']]") if e.is_displayed()], 10)
    entry[0].click()


def _kernel_idle(base, token, name) -> bool:
    """The notebook's own kernel exists and is idle (the server's sessions API, as JupyterLab itself polls it)."""
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=5) as r:
        sessions = [s for s in json.load(r) if s.get("path") == name and s.get("kernel")]
    return bool(sessions) and all(s["kernel"]["execution_state"] == "idle" for s in sessions)


def run_all(driver, base, token, books, name, shows: str = "") -> dict:
    """Open a notebook in JupyterLab, run all its cells through the Run menu; returns what the page shows.

    The screenshot has the output showing `shows` at its top (else the first figure)."""
    cells = sum(c.cell_type == "code" for c in nbformat.read(str(books / name), as_version=4).cells)
    driver.get(f"{base}/lab/tree/{name}?reset&token={token}")  # reset: only this notebook open
    prompts = "return [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell " \
              ".jp-InputPrompt')].map(e => e.textContent.trim())"
    _wait(driver, f"{name} to open", lambda: len(driver.execute_script(prompts)) == cells, 60)
    _wait(driver, "the kernel", lambda: _kernel_idle(base, token, name), 90)
    _click_menu(driver, "Run", "Run All Cells")
    _wait(driver, f"{name} to run", lambda: all(p[1:-2].isdigit() for p in driver.execute_script(prompts))
          and _kernel_idle(base, token, name), 150)
    page = driver.execute_script("""
        const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
        const imgs = [...panel.querySelectorAll('.jp-OutputArea-output img')];
        return {
          outputs: [...panel.querySelectorAll('.jp-OutputArea-output')].map(e => e.textContent).join('\\n'),
          figures: imgs.filter(i => i.complete && i.naturalWidth > 100 && i.naturalHeight > 100).length,
          errors: [...panel.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                    .map(e => e.textContent.slice(0, 300)),
          widgets: [...panel.querySelectorAll('.jp-OutputArea-output .widget-hprogress')].length,
          widget_text: [...panel.querySelectorAll('.jp-OutputArea-output .jupyter-widgets')]
                    .map(e => e.textContent).join(' '),
        };""")
    SHOTS.mkdir(parents=True, exist_ok=True)
    stem = Path(name).stem
    # <stem>.png: the cell whose output shows `shows` (else the first widget); <stem>-figure.png: the first figure
    for suffix, selector in (("", ".jp-OutputArea-output"), ("-figure", ".jp-OutputArea-output img")):
        found = driver.execute_script("""
            const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
            const [selector, text] = arguments;
            const el = [...panel.querySelectorAll(selector)].find(e => text ? e.textContent.includes(text)
                         : e.tagName === 'IMG' ? e.naturalWidth > 0 : e.querySelector('.widget-hprogress'));
            if (el) el.closest('.jp-Cell').scrollIntoView({block: 'start'});
            return !!el;""", selector, shows if not suffix else "")
        if found or not suffix:
            time.sleep(0.5)  # let the scroll settle before the picture
            driver.save_screenshot(str(SHOTS / f"{stem}{suffix}.png"))
    shot = SHOTS / f"{stem}.png"
    page["screenshot"] = shot
    return page


@pytest.mark.parametrize("name, shows", [("01_kv_bytes_per_token.ipynb", "bytes_per_token = 147,456 B/token"),
                                         ("02_deepseek_890_bytes.ipynb", "bytes_per_token = 890 B/token")])
def test_notebook_runs_in_jupyterlab(lab, browser, name, shows):
    page = run_all(browser, *lab, name, shows)
    assert page["errors"] == [], f"error output in the page: {page['errors']}"
    assert shows in page["outputs"]
    assert page["figures"] >= 1, "no rendered figure"
    assert page["screenshot"].stat().st_size > 10_000


def test_progress_bars_are_widgets(lab, browser):
    page = run_all(browser, *lab, "progress.ipynb")
    assert page["errors"] == [], f"progress written as text (or an error): {page['errors']}"
    assert page["widgets"] >= 1, "no ipywidgets progress bar in the page"
    assert "simulate" in page["widget_text"] and "100%" in page["widget_text"]
    assert "requests simulated" in page["outputs"]
