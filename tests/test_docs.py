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


FIGURE = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:x|%)(?![\w])")
RESULTS_LINK = re.compile(r"\]\(benchmarks/RESULTS\.md#([\w-]+)\)")


def results_sections(text):
    """RESULTS.md's anchored sections: {anchor: the text from `<a id="anchor"></a>` to the next heading of level
    2 or 3 after the section's own heading}."""
    sections = {}
    for match in re.finditer(r'<a id="([\w-]+)"></a>', text):
        rest = text[match.end():]
        own = re.search(r"^#{2,4} ", rest, re.M)
        start = own.end() if own else 0
        end = re.search(r"^#{2,3} ", rest[start:], re.M)
        sections[match.group(1)] = rest[:start + end.start()] if end else rest
    return sections


def unbacked_figures(readme, results):
    """README lines whose ratios and percentages ("13.4x", "32%") are not backed by RESULTS.md: a line with a figure
    must link an anchored RESULTS.md section (benchmarks/RESULTS.md#anchor), and each of its figures must appear in
    one of the sections it links, as written."""
    sections = results_sections(results)
    problems = []
    for number, line in enumerate(readme.splitlines(), 1):
        figures = FIGURE.findall(line)
        if not figures:
            continue
        anchors = RESULTS_LINK.findall(line)
        if not anchors:
            problems.append(f"README.md:{number}: {figures} link no RESULTS.md section")
            continue
        missing = [a for a in anchors if a not in sections]
        if missing:
            problems.append(f"README.md:{number}: no RESULTS.md section anchored {missing}")
            continue
        text = "\n".join(sections[a] for a in anchors)
        for figure in figures:
            if not re.search(r"(?<![\w.])" + re.escape(figure) + r"(?![\w])", text):
                problems.append(f"README.md:{number}: {figure} is not in RESULTS.md#{', #'.join(anchors)}")
    return problems


def test_every_readme_figure_is_a_results_entry():
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    results = open(os.path.join(ROOT, "benchmarks", "RESULTS.md"), encoding="utf-8").read()
    assert unbacked_figures(readme, results) == []


def test_the_figure_check_catches_an_unbacked_figure():
    results = '## Runs\n<a id="link"></a>\n### Link run\n| ternary | 13.4x |\n### Next\n| topk | 32.8x |\n'
    assert unbacked_figures("ternary: 13.4x faster ([RESULTS](benchmarks/RESULTS.md#link))", results) == []
    assert unbacked_figures("top-k: 32.8x faster ([RESULTS](benchmarks/RESULTS.md#link))", results) == [
        "README.md:1: 32.8x is not in RESULTS.md#link"]
    assert unbacked_figures("fp16: 1.9x faster", results) == ["README.md:1: ['1.9x'] link no RESULTS.md section"]
    assert unbacked_figures("x ([R](benchmarks/RESULTS.md#gone)) 5%", results) == [
        "README.md:1: no RESULTS.md section anchored ['gone']"]


def test_the_project_never_cites_the_shared_notes():
    """What a maintainer needs is in docs/ and the code: no tracked file points outside the repository to the
    shared planning notes (a path into the parent folder's shared/)."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    citing = []
    for name in files:
        try:
            text = open(os.path.join(ROOT, name), encoding="utf-8").read()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue
        if "../" + "shared/" in text:
            citing.append(name)
    assert citing == [], citing
