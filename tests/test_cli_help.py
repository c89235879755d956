"""The CLI's help (brrr/cli.py): every command's --help says what it does in the user's terms (no reference to
the documents the project grew from) and fits an 80-column terminal."""

import pytest

from brrr.cli import build_parser


def _helps(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")   # argparse wraps to the terminal's width
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return {"brrr": parser.format_help(), **{name: p.format_help() for name, p in subparsers.choices.items()}}


def test_every_command_has_plain_help_that_fits_the_terminal(monkeypatch):
    helps = _helps(monkeypatch)
    assert set(helps) >= {"brrr", "analyze", "ceilings", "experiment", "explain", "bench"}
    for name, text in helps.items():
        assert "seed" not in text.lower(), (name, text)
        assert max(len(line) for line in text.splitlines()) <= 80, name


def test_experiment_help_names_what_each_experiment_measures(monkeypatch):
    text = _helps(monkeypatch)["experiment"]
    assert "bandwidth" in text and "compute" in text and "overhead" in text
