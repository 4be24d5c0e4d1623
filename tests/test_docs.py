"""The documentation: docs/ builds with mkdocs in strict mode (a broken link or anchor, or a page left out of the
navigation, fails), and README.md stays a newcomer's five-minute read (at most 12 KB) whose links resolve."""
import os
import re
import subprocess
import sys

from hvdrun import ROOT


def test_docs_build_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "site" / "compressors" / "index.html").exists()


def test_readme_is_short_and_its_links_resolve():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    assert len(text.encode()) <= 12 * 1024
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert os.path.exists(os.path.join(ROOT, target)), target
