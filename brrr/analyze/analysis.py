"""The result of `brrr.analyze`: measured op records turned into regimes and advice, with the outputs.

`Analysis.from_measurements` is the pure tail of the pipeline (regimes -> advise) over numbers already
measured, so it runs the same on real captures and on synthetic records in tests. Rendering (terminal,
JSON, PNG, HTML) lives in report.py.
"""

import json
from dataclasses import dataclass, field

from brrr.analyze import advise as advise_mod
from brrr.analyze import predict as predict_mod
from brrr.analyze import regimes as regimes_mod


@dataclass
class Analysis:
    device: str
    kind: str                    # "cuda" | "cpu"
    train: bool
    ops: list                    # OpRecord, in execution order
    ceilings: object             # brrr.cost.device.Ceilings
    wall_time_s: float
    busy_time_s: float
    regimes: dict                # {"compute", "bandwidth", "overhead"}: seconds, summing to wall_time_s
    regime: str                  # the run's dominant regime
    op_classes: dict             # class -> {"ops", "flops", "time_s", "flops_pct", "time_pct"}
    modules: dict                # module path -> {"ops", "flops", "bytes", "time_s", "seconds", "regime"}
    advice: list = field(default_factory=list)
    timeline: list = None        # the traced run's slices (track, start_ns, end_ns, op index, name); trace.py
    predictions: dict = field(default_factory=dict)  # remedy kind -> predict.Prediction (uncalibrated)
    verify: dict | None = None   # verify.verify's measurements of the remedies, when run
    structure: object = None     # graphs.GraphStructure: the step's Dynamo graphs, where they could be counted

    @classmethod
    def from_measurements(cls, records, ceilings, wall_time_s, busy_time_s=None, train=False, tf32_enabled=None,
                          timeline=None, structure=None, modes=None):
        """Classify measured records and advise; `records` get their roofline floor and regime filled in."""
        regimes_mod.place_ops(records, ceilings)
        if busy_time_s is None:
            busy_time_s = sum(r.time_s for r in records)
        split = regimes_mod.run_split(records, wall_time_s, busy_time_s)
        predictions = predict_mod.predict_steps(records, ceilings, split, wall_time_s, busy_time_s, train, tf32_enabled,
                                                structure, modes, timeline)
        advice = advise_mod.advise(records, ceilings, split, wall_time_s, busy_time_s, tf32_enabled, predictions)
        return cls(
            device=ceilings.device, kind=ceilings.kind, train=train, ops=records, ceilings=ceilings,
            wall_time_s=wall_time_s, busy_time_s=busy_time_s, regimes=split,
            regime=regimes_mod.dominant_regime(split), op_classes=regimes_mod.op_class_table(records),
            modules=regimes_mod.module_regimes(records), advice=advice, timeline=timeline,
            predictions=predictions, structure=structure,
        )

    def to_dict(self):
        from brrr.analyze.report import analysis_dict

        return analysis_dict(self)

    def to_json(self, indent=2):
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def save_json(self, path):
        with open(path, "w") as f:
            f.write(self.to_json())

    def save_trace(self, path):
        """A Chrome/Perfetto trace of the analyzed step (trace.py)."""
        from brrr.analyze.trace import save_trace

        save_trace(self, path)

    def save_png(self, path):
        from brrr.analyze.report import save_roofline_png

        save_roofline_png(self, path)

    def save_html(self, path):
        from brrr.analyze.report import html_report

        with open(path, "w") as f:
            f.write(html_report(self))

    def print(self, console=None, top=15):
        from rich.console import Console

        from brrr.analyze.report import print_report

        print_report(self, console or Console(), top=top)
