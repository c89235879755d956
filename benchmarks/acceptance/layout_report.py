"""The layout patterns' Markdown and the issue's sweep criterion: is brrr at or below Inductor's better mode on
NCHW convolution graphs as users create them?

Each pattern's configurations take the verdict every pattern script gives (pattern_report.py: brrr's `do_bench`
median at most 3% over eager's and over the better of Inductor's two modes). The sweep's convolution nets
(pattern `sweep`) are judged together, as the issue asks: the geometric mean of brrr's speed over Inductor's
better mode at least `GEOMEAN_GOAL`, no configuration more than `BEHIND_LIMIT` slower than that mode, none more
than 3% slower than eager, and brrr ok (not failed, not wrong) on every one. Configurations the runner found not to
be convolution nets (`NOT_CONV_NET` in their error) are left out and named. brrr's layout decisions
(`layout_decisions`, from brrr.compile.passes.layouts) get a section of their own.
"""

import pattern_report as report
import sweep_report as sweep

SWEEP = "sweep"                          # the pattern of the sweep's configurations
NOT_CONV_NET = "not a convolution net"   # what a configuration left out of the sweep's criterion says
GEOMEAN_GOAL = 1.15                      # brrr's speed over Inductor's better mode, geometric mean
BEHIND_LIMIT = 1.10                      # brrr's time over that mode's, at most, on every configuration
LAYOUT_LOG = "layout_decisions"


def sweep_criterion(results):
    """The sweep criterion over the convolution nets measured: {configurations, measured, not_conv_nets, not_run,
    geomean_over_best_inductor, behind_best_inductor (more than BEHIND_LIMIT), slower_than_eager, brrr_not_ok,
    pass}; None where no sweep configuration was selected. `pass` is None without an Inductor time."""
    entries = {n: e for n, e in results["configs"].items() if e.get("pattern") == SWEEP}
    if not entries:
        return None
    left_out = sorted(n for n, e in entries.items() if NOT_CONV_NET in (e.get("error") or ""))
    measured = sweep.ran({"configs": entries})
    speed = {n: sweep.ratios(e) for n, e in measured.items()}
    geomean = sweep.geomean([r.get("best_inductor") for r in speed.values()])
    behind = sorted(n for n, r in speed.items() if r.get("best_inductor", 2) < 1 / BEHIND_LIMIT)
    slower = sorted(n for n, r in speed.items() if r.get("eager", 2) < 1 / report.SLACK)
    failed = sorted(n for n, e in measured.items() if e["rows"].get("brrr", {}).get("status") != "ok")
    return {"configurations": len(entries), "measured": len(measured), "not_conv_nets": left_out,
            "not_run": len(entries) - len(measured) - len(left_out), "geomean_over_best_inductor": geomean,
            "behind_best_inductor": behind, "slower_than_eager": slower, "brrr_not_ok": failed,
            "pass": None if geomean is None else geomean >= GEOMEAN_GOAL and not (behind or slower or failed)}


def _names(names):
    return f"{len(names)}" + (f" ({', '.join(names)})" if names else "")


def criterion_lines(c):
    return [f"The sweep's convolution nets: {c['measured']} measured of {c['configurations']} selected "
            f"({c['not_run']} not run; not convolution nets, left out: {_names(c['not_conv_nets'])}).", "",
            f"- brrr over Inductor's better mode, geometric mean: {report.ratio_text(c['geomean_over_best_inductor'])}"
            f" (goal {GEOMEAN_GOAL:.2f}x)",
            f"- more than {BEHIND_LIMIT - 1:.0%} behind Inductor's better mode: {_names(c['behind_best_inductor'])}",
            f"- more than {report.SLACK - 1:.0%} slower than eager: {_names(c['slower_than_eager'])}",
            f"- brrr failed or wrong: {_names(c['brrr_not_ok'])}",
            f"- criterion met: {report.yes_text(c['pass'])}", ""]


def markdown(results):
    criteria = (report.criteria() + f" The sweep's convolution nets (pattern `{SWEEP}`), together: brrr's speed over "
                f"Inductor's better mode at least {GEOMEAN_GOAL:.2f}x in geometric mean, none more than "
                f"{BEHIND_LIMIT - 1:.0%} behind it, none more than {report.SLACK - 1:.0%} slower than eager.")
    lines = report.header(results, "Layout patterns: brrr at or below Inductor's better mode on NCHW as created",
                          criteria)
    c = sweep_criterion(results)
    lines += criterion_lines(c) if c else []
    shown = [n for n, e in results["configs"].items() if NOT_CONV_NET not in (e.get("error") or "")]
    lines += report.table(results, shown) + report.top_kernels(results)
    lines += report.logged(results, "Layout decisions", (LAYOUT_LOG,), count=20, width=400)
    lines += report.logged(results, "What brrr logged", report.LOGS)
    return "\n".join(lines) + "\n"
