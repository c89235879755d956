"""benchmarks/results_index.py: INDEX.md lists every recorded file with the date, GPU, commit and headline its name
and contents give, and the committed INDEX.md is what the script generates now."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import results_index as index  # noqa: E402


def _zoo_run():
    rows = [{"backend": b, "median_s": s, "status": "ok"} for b, s in (("eager", 2e-3), ("brrr", 1e-3),
                                                                          ("inductor", 1.5e-3))]
    return {"environment": {"backends": ["eager", "brrr", "inductor"], "commit": "abc1234"},
            "configs": {"mlp-train": {"name": "mlp-train", "train": True, "status": "ok", "result": {"rows": rows}}}}


def _results_tree(root):
    (root / "zoo").mkdir(parents=True)
    (root / "zoo" / "2026-01-02-h100-abc1234.json").write_text(json.dumps(_zoo_run()))
    (root / "zoo" / "2026-01-02-h100-abc1234.md").write_text("# brrr zoo: NVIDIA H100\n")
    (root / "probes").mkdir()
    (root / "probes" / "2026-01-03-h200-def5678-why-is-x-slow.log").write_text("┏━━┓\nX takes 3 ms\n")
    (root / "probes" / "2026-01-03-h200-def5678-why-is-y-slow.log").write_text("\n┃ 12 ┃\nY waits on the host\n")
    (root / "sweep").mkdir()    # a kind folder the hand-written lines do not name
    (root / "sweep" / "2026-01-04-cpu-1234567-grid.md").write_text("intro\n## Grid sweep: 12 points\n")
    (root / "headlines.json").write_text(json.dumps({
        "folders": {"zoo": "The zoo's runs.", "probes": "One-off probes."},
        "headlines": {"probes/2026-01-03-h200-def5678-why-is-x-slow.log": "X is slow because of Z"},
        "measured": {"probes/2026-01-03-h200-def5678-why-is-x-slow.log": "def5678, 9abcdef"}}))


def test_each_run_is_listed_with_its_names_fields_and_headline(tmp_path):
    _results_tree(tmp_path)
    runs = {run.files[0]: run for run in index.runs(tmp_path)}
    zoo = runs["zoo/2026-01-02-h100-abc1234.md"]
    assert (zoo.kind, zoo.date, zoo.gpu, zoo.commit, zoo.what) == ("zoo", "2026-01-02", "h100", "abc1234", "")
    assert zoo.files == ["zoo/2026-01-02-h100-abc1234.md", "zoo/2026-01-02-h100-abc1234.json"]
    assert zoo.headline == "pass 3/3; brrr over eager 2.00x train; brrr over inductor 1.50x train"
    noted = runs["probes/2026-01-03-h200-def5678-why-is-x-slow.log"]
    assert (noted.date, noted.gpu, noted.commit, noted.what) == ("2026-01-03", "h200", "def5678, 9abcdef",
                                                                 "why-is-x-slow")
    assert noted.headline == "X is slow because of Z"
    assert runs["probes/2026-01-03-h200-def5678-why-is-y-slow.log"].headline == "Y waits on the host"
    sweep = runs["sweep/2026-01-04-cpu-1234567-grid.md"]
    assert (sweep.kind, sweep.gpu, sweep.commit, sweep.headline) == ("sweep", "cpu", "1234567", "Grid sweep: 12 points")

    text = index.index_markdown(tmp_path)
    assert text.index("## zoo/") < text.index("## probes/") < text.index("## sweep/")
    assert "One-off probes." in text and "5 files in 4 runs." in text
    assert ("| 2026-01-04 | cpu | 1234567 | grid | [md](sweep/2026-01-04-cpu-1234567-grid.md) | Grid sweep: 12 points |"
            in text)


def test_check_fails_on_a_stale_index_or_a_headline_whose_file_is_gone(tmp_path):
    _results_tree(tmp_path)
    assert index.main(["--results", str(tmp_path), "--check"]) == 1        # no INDEX.md yet
    assert index.main(["--results", str(tmp_path)]) == 0
    assert index.main(["--results", str(tmp_path), "--check"]) == 0
    (tmp_path / "probes" / "2026-01-05-h100-fedcba9-new.log").write_text("a new run\n")
    assert index.main(["--results", str(tmp_path), "--check"]) == 1
    index.main(["--results", str(tmp_path)])
    (tmp_path / "probes" / "2026-01-03-h200-def5678-why-is-x-slow.log").rename(tmp_path / "probes" / "renamed.log")
    index.main(["--results", str(tmp_path)])
    assert index.main(["--results", str(tmp_path), "--check"]) == 1        # headlines.json names the old path


def test_the_committed_index_is_what_the_script_generates():
    assert index.main(["--check"]) == 0, "run: python3 benchmarks/results_index.py"
