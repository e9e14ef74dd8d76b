"""``benchmarks/gdn_adopt_run.py``: a ``bench_gdn.py`` run's tables written into ``routing.py`` and the page.

* a run made of the committed tables changes nothing (the committed files are one run's output, whole);
* a run with other cells rewrites exactly the literal blocks, the four target bullets and the tables, and
  leaves the page's prose and routing.py's code as they were; ``--check`` reports and writes nothing;
* a run or a file without the pieces it replaces is refused, naming the file and the piece, nothing written.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def adopt_mod(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gdn_adopt_run

    return gdn_adopt_run


def _committed_run(mod, run: Path) -> None:
    """A run directory holding what bench_gdn.py would have written for the committed tables."""
    routing = (ROOT / mod.ROUTING).read_text()
    wins = "".join(mod._block(routing, name, "routing.py").group(0) for name in mod.NAMES).rstrip("\n")
    doc = (ROOT / mod.DOC).read_text()
    targets = doc[doc.index(mod.TARGETS_HEAD):].splitlines()  # (the history sections hold older runs' bullets)
    bullets = [next(ln for ln in targets if ln.startswith(h)) for h in mod.BULLETS]
    tables = doc[doc.index(mod.TABLES_START) + 1:]
    run.mkdir()
    (run / "routing_wins.txt").write_text(wins + "\n")
    (run / "bench_gdn.md").write_text(
        "device: test\n\n## Targets (graph replay)\n\n" + "\n".join(bullets) + "\n\n" + tables + "\n"
        + mod.RUN_ROUTING_HEAD + " (sndr.kernels.gdn.routing.WINS, CUDA, CUDA_SHAPES)\n\n```\n" + wins + "\n```\n")


def _tree(mod, tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for rel in (mod.ROUTING, mod.DOC):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    return root


def test_the_committed_tables_are_one_runs_output(adopt_mod, tmp_path):
    run = tmp_path / "run"
    _committed_run(adopt_mod, run)
    root = _tree(adopt_mod, tmp_path)
    assert adopt_mod.adopt(run, root) == []
    for rel in (adopt_mod.ROUTING, adopt_mod.DOC):
        assert (root / rel).read_text() == (ROOT / rel).read_text()


def test_another_run_rewrites_the_tables_and_nothing_else(adopt_mod, tmp_path):
    run = tmp_path / "run"
    _committed_run(adopt_mod, run)
    wins = (run / "routing_wins.txt").read_text()
    label = re.search(r'1: \{1: "([^"]+)"', wins).group(1)  # float32, T = 1, batch 1
    (run / "routing_wins.txt").write_text(wins.replace(f'1: {{1: "{label}"', '1: {1: "64x8x4t128m4"', 1))
    md = (run / "bench_gdn.md").read_text()
    md = re.sub(r"(- \*\*<= 0\.97x[^:]*\*\*: )\d+ of 40", r"\g<1>40 of 40", md, count=1)
    md = md.replace("| 1 | 1 |", "| 1 | 1 | changed", 1)
    (run / "bench_gdn.md").write_text(md)
    root = _tree(adopt_mod, tmp_path)
    before = {rel: (root / rel).read_text() for rel in (adopt_mod.ROUTING, adopt_mod.DOC)}
    assert adopt_mod.main([str(run), "--check"]) == 1  # (the repository's own files: compared, not written)
    assert adopt_mod.adopt(run, root, check=True) == [adopt_mod.ROUTING, adopt_mod.DOC]
    assert {rel: (root / rel).read_text() for rel in before} == before  # --check writes nothing
    assert adopt_mod.adopt(run, root) == [adopt_mod.ROUTING, adopt_mod.DOC]
    routing, doc = (root / adopt_mod.ROUTING).read_text(), (root / adopt_mod.DOC).read_text()
    assert '1: {1: "64x8x4t128m4"' in routing
    # outside the literal blocks routing.py is the committed file
    strip = re.compile(r"^(WINS|CUDA|CUDA_SHAPES): .*?^\}\n", re.S | re.M)
    assert strip.sub("", routing) == strip.sub("", before[adopt_mod.ROUTING])
    assert "40 of 40 hit" in doc and "| 1 | 1 | changed" in doc
    old_doc = before[adopt_mod.DOC]
    head = old_doc[:old_doc.index("```\n", old_doc.index(adopt_mod.ROUTING_HEAD))]
    assert doc.startswith(head)  # the header, the history sections and the routing prose: untouched
    prose = old_doc[old_doc.index("- Against the tables"):old_doc.index(adopt_mod.TABLES_START)]
    assert prose in doc  # the targets section's own bullets after the four: untouched
    assert adopt_mod.adopt(run, root) == []  # adopting the same run again changes nothing


def test_missing_pieces_are_refused_by_name(adopt_mod, tmp_path):
    run = tmp_path / "run"
    _committed_run(adopt_mod, run)
    root = _tree(adopt_mod, tmp_path)
    wins = (run / "routing_wins.txt").read_text()
    (run / "routing_wins.txt").write_text(adopt_mod._block(wins, "WINS", "x").group(0))
    with pytest.raises(adopt_mod.AdoptError, match=r"routing_wins\.txt: no `CUDA: "):
        adopt_mod.adopt(run, root)
    _committed_run(adopt_mod, tmp_path / "run2")
    md = (tmp_path / "run2" / "bench_gdn.md").read_text()
    (tmp_path / "run2" / "bench_gdn.md").write_text(re.sub(r"(?m)^- \*\*>= 1\.15x.*\n", "", md))
    wins2 = (tmp_path / "run2" / "routing_wins.txt").read_text()
    (tmp_path / "run2" / "routing_wins.txt").write_text(wins2.replace("(1, 8, 32, 64, 256)", "(1, 8)", 1))
    with pytest.raises(adopt_mod.AdoptError, match=r"bench_gdn\.md: 0 lines start with '- \*\*>= 1\.15x'"):
        adopt_mod.adopt(tmp_path / "run2", root)
    # routing.py would have changed, but the page could not: neither file is written
    assert (root / adopt_mod.ROUTING).read_text() == (ROOT / adopt_mod.ROUTING).read_text()
    assert adopt_mod.main([str(tmp_path / "nowhere")]) == 2
