"""What the user points brrr at: `FILE.py:FUNC` or `--example NAME`, placed on a device and dtype.

Shared by every command (analyze, explain, bench, experiment). FUNC takes no arguments and returns
`(model_or_callable, example_inputs)`; example_inputs is a tensor or a tuple/list of them.
Every problem with the target is a BrrrError with a one-line message.
"""

import importlib.util
import sys
from pathlib import Path

import torch

from brrr.errors import BrrrError

DTYPES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp64": torch.float64, "float64": torch.float64,
}


def parse_dtype(name):
    if name is None or isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise BrrrError(f"unknown dtype {name!r}; choose one of: fp32, fp16, bf16, fp64") from None


def parse_device(name):
    """The device to run on: 'cuda' when there is one and nothing was asked for, else what was asked."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise BrrrError(f"unknown device {name!r}; use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BrrrError(f"device {name!r} asked for, but this torch sees no CUDA GPU")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise BrrrError(f"device {name!r} asked for, but only {torch.cuda.device_count()} GPU(s) exist")
    elif device.type != "cpu":
        raise BrrrError(f"device type {device.type!r} is not supported; use cpu or cuda")
    return device


def load_function(spec):
    """Import FILE.py and return its FUNC, from 'FILE.py:FUNC'."""
    path_str, sep, func_name = spec.rpartition(":")
    if not sep or not path_str or not func_name:
        raise BrrrError(f"expected FILE.py:FUNC, got {spec!r}")
    path = Path(path_str)
    if not path.is_file():
        raise BrrrError(f"no such file: {path}")
    if path.suffix != ".py":
        raise BrrrError(f"{path} is not a Python file (expected FILE.py:FUNC)")
    module_name = f"brrr_target_{abs(hash(str(path.resolve())))}"
    try:
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise BrrrError(f"importing {path} failed: {type(e).__name__}: {e}") from e
    func = getattr(module, func_name, None)
    if func is None:
        raise BrrrError(f"{path} has no function {func_name!r}")
    if not callable(func):
        raise BrrrError(f"{path}:{func_name} is not callable")
    return func


def check_target(result, where):
    """Validate FUNC's return value: (model_or_callable, inputs) -> (model, tuple_of_inputs)."""
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise BrrrError(f"{where} must return (model_or_callable, example_inputs), got {type(result).__name__}")
    model, inputs = result
    if not callable(model):
        raise BrrrError(f"{where} returned a model that is not callable ({type(model).__name__})")
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, dict):
        raise BrrrError(f"{where}: pass example_inputs as a tuple of positional arguments, not a dict")
    elif not isinstance(inputs, (tuple, list)):
        raise BrrrError(f"{where} returned example_inputs of type {type(inputs).__name__}; expected a tensor or tuple")
    return model, tuple(inputs)


def _move(value, device, dtype):
    if isinstance(value, torch.Tensor):
        if dtype is not None and value.is_floating_point():
            value = value.to(dtype)
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_move(v, device, dtype) for v in value)
    return value


def place(model, inputs, device, dtype=None):
    """Move the model and inputs to `device`, casting floating tensors/params to `dtype` when given."""
    if isinstance(model, torch.nn.Module):
        model = model.to(device=device)
        if dtype is not None:
            model = model.to(dtype=dtype)
    return model, tuple(_move(x, device, dtype) for x in inputs)


def load_target(spec=None, example=None, device=None, dtype=None, batch=None):
    """Resolve a CLI target to `(model, inputs, device, dtype)` ready to run; `batch` sizes an example."""
    device = parse_device(device)
    dtype = parse_dtype(dtype)
    if example is not None:
        from brrr.examples import build_example

        sizes = {} if batch is None else {"batch": batch}
        model, inputs = build_example(example, device=device, dtype=dtype or torch.float32, **sizes)
        return model, tuple(inputs), device, dtype
    if spec is None:
        raise BrrrError("give a target FILE.py:FUNC or --example NAME")
    if batch is not None:
        raise BrrrError("--batch sizes a built-in --example; size your own model inside FUNC")
    func = load_function(spec)
    try:
        result = func()
    except Exception as e:
        raise BrrrError(f"{spec} raised {type(e).__name__}: {e}") from e
    model, inputs = check_target(result, spec)
    model, inputs = place(model, inputs, device, dtype)
    return model, inputs, device, dtype
