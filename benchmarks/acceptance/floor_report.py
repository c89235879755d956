"""The floor patterns' Markdown: is brrr at or below eager and Inductor's better mode on each?

The issue's two criteria are the verdict every pattern script gives each configuration (pattern_report.py:
brrr's `do_bench` median at most 3% over eager's and over the better of Inductor's two modes); a pattern passes
when every configuration of it does.
"""

import pattern_report as report


def markdown(results):
    lines = report.header(results, "Floor patterns: brrr at or below eager and Inductor's better mode",
                          report.criteria())
    lines += report.table(results) + report.top_kernels(results)
    lines += report.logged(results, "What brrr logged", report.LOGS)
    return "\n".join(lines) + "\n"
