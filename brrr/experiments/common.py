"""What the experiments share: the device, software versions, measured ceilings and writing JSON."""

import json
import platform

import torch


def resolve_device(device):
    from brrr.target import parse_device

    return parse_device(device) if not isinstance(device, torch.device) else device


def device_name(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def versions():
    from brrr.bench.runner import versions as _versions

    return _versions()


def load_ceilings(device, ceilings=None, progress=False):
    """(Ceilings or None, note): the given ceilings, else get_ceilings(device); never raises."""
    if ceilings is not None:
        return ceilings, "given"
    try:
        from brrr.cost.device import get_ceilings

        return get_ceilings(device, progress=progress), "measured (brrr.cost.device.get_ceilings)"
    except Exception as e:  # the ceilings only draw lines; the experiment still stands without them
        return None, f"unavailable: {type(e).__name__}: {e}"


def ceilings_dict(ceilings):
    if ceilings is None:
        return None
    return ceilings.to_dict() if hasattr(ceilings, "to_dict") else dict(vars(ceilings))


def write_json(path, result):
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)


def console():
    from rich.console import Console

    return Console()


def report(result, print_result, plot, print_table=True, png=None, json_path=None):
    """An experiment's outputs: the rich table, the plot and the JSON, each when asked for."""
    if print_table:
        print_result(result, console())
    if png:
        plot(result, png)
    if json_path:
        write_json(json_path, result)
    return result
