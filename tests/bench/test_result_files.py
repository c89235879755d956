import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("result_files", ROOT / "benchmarks" / "result_files.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_result_names_carry_date_gpu_and_commit(tmp_path):
    names = _load()
    assert names.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert names.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert names.gpu_slug("cpu (x86_64, 16 threads)") == "cpu"
    assert names.gpu_slug("NVIDIA GeForce RTX 4090") == "nvidia-geforce-rtx-4090"
    stem = names.result_stem(tmp_path / "suite", "NVIDIA H200", commit="abc1234", date="2026-11-22")
    assert stem == tmp_path / "suite" / "2026-11-22-h200-abc1234" and stem.parent.is_dir()
    commit = names.git_commit(cwd=tmp_path)  # not a repository
    assert commit == "nogit" or len(commit) >= 7


def test_the_commit_can_be_named_where_the_checkout_cannot_tell(monkeypatch, tmp_path):
    names = _load()
    monkeypatch.setenv("BRRR_COMMIT", "abc1234")
    assert names.git_commit(cwd=tmp_path) == "abc1234"
    monkeypatch.delenv("BRRR_COMMIT")
    assert names.git_commit(cwd=tmp_path) != "abc1234"


def test_a_result_name_reads_back_as_date_gpu_commit_and_what():
    names = _load()
    assert names.parse_result_name("2026-11-22-h100-0c36c91-493c2bb.json") == \
        names.ResultName("2026-11-22", "h100", "0c36c91", "493c2bb", "json")
    assert names.parse_result_name("2026-11-25-h100-9f0863e-bert-infer.trace.json").ext == "trace.json"
    assert names.parse_result_name("2026-01-01-nvidia-geforce-rtx-4090-nogit.md") == \
        names.ResultName("2026-01-01", "nvidia-geforce-rtx-4090", "nogit", "", "md")
    assert names.parse_result_name("INDEX.md") is None
