"""FILE.py:FUNC loading and the CLI's one-line errors for bad targets."""

import subprocess
import sys

import pytest
import torch

from brrr.cli import main
from brrr.errors import BrrrError
from brrr.target import load_target, parse_device, parse_dtype


def write(tmp_path, text, name="model.py"):
    path = tmp_path / name
    path.write_text(text)
    return path


GOOD = """
import torch
def get():
    return torch.nn.Linear(4, 3), (torch.randn(2, 4),)
def single():
    return torch.nn.Linear(4, 3), torch.randn(2, 4)
def wrong_shape():
    return torch.nn.Linear(4, 3)
def not_callable():
    return 3, (torch.randn(2),)
def raises():
    raise ValueError("boom")
NOT_A_FUNC = 5
"""


def test_load_good_target(tmp_path):
    path = write(tmp_path, GOOD)
    model, inputs, device, dtype = load_target(f"{path}:get", device="cpu", dtype="bf16")
    assert device == torch.device("cpu") and dtype == torch.bfloat16
    assert model.weight.dtype == torch.bfloat16 and inputs[0].dtype == torch.bfloat16
    _, inputs, _, _ = load_target(f"{path}:single", device="cpu")
    assert isinstance(inputs, tuple) and inputs[0].shape == (2, 4)


@pytest.mark.parametrize("spec_suffix,message", [
    (":missing", "has no function 'missing'"),
    (":wrong_shape", "must return (model_or_callable, example_inputs)"),
    (":not_callable", "not callable"),
    (":raises", "raised ValueError: boom"),
    (":NOT_A_FUNC", "is not callable"),
    ("", "expected FILE.py:FUNC"),
])
def test_bad_targets_give_clear_errors(tmp_path, spec_suffix, message):
    path = write(tmp_path, GOOD)
    with pytest.raises(BrrrError, match=None) as err:
        load_target(f"{path}{spec_suffix}", device="cpu")
    assert message in str(err.value)


def test_missing_file_and_non_python_file(tmp_path):
    with pytest.raises(BrrrError, match="no such file"):
        load_target(f"{tmp_path}/nope.py:get", device="cpu")
    data = write(tmp_path, "not a model", name="weights.bin")
    with pytest.raises(BrrrError, match="not a Python file"):
        load_target(f"{data}:get", device="cpu")
    broken = write(tmp_path, "this is not python(", name="broken.py")
    with pytest.raises(BrrrError, match="importing .* failed: SyntaxError"):
        load_target(f"{broken}:get", device="cpu")


def test_device_and_dtype_validation():
    with pytest.raises(BrrrError, match="unknown dtype"):
        parse_dtype("int7")
    with pytest.raises(BrrrError, match="unknown device"):
        parse_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(BrrrError, match="no CUDA GPU"):
            parse_device("cuda")
    with pytest.raises(BrrrError, match="unknown example"):
        load_target(example="resnet9000", device="cpu")


def test_cli_prints_one_line_error_and_exits_2(tmp_path, capsys):
    assert main(["analyze", f"{tmp_path}/nope.py:get", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"brrr: error: no such file: {tmp_path}/nope.py"]


def test_cli_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "brrr.cli", "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("analyze", "ceilings", "experiment", "explain", "bench"):
        assert command in out
