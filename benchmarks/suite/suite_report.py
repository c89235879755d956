"""The suite's Markdown report: environment, then one table per section, from the results dict."""


def _ms(s):
    return "—" if s is None else f"{s * 1e3:.3f}"


def _num(v, fmt):
    return "—" if v is None else format(v, fmt)


def _status(row):
    return "ok" if row["status"] == "ok" else (row.get("reason") or row["status"]).replace("|", "/")


def _err(row, key, field):
    e = row.get(key)
    return "—" if not e else f"{e[field]:.1e}"


def bench_table(configs, extra=None):
    """Markdown rows for {config name: guarded bench dict}; `extra(row)` adds trailing cells."""
    head = ("| config | backend | result | median ms | p20–p80 ms | back-to-back ms | speedup | cold compile s | "
            "warm compile s | peak MiB | max abs err | max rel err | err vs fp64 |")
    lines = [head + (" GB/s | % of copy bw |" if extra else ""), "|" + "---|" * (13 + (2 if extra else 0))]
    for name, entry in configs.items():
        if entry["status"] != "ok":
            lines.append(f"| {name} | — | {entry['status'].upper()}: {entry.get('error', '')[:200]} |")
            continue
        for row in entry["data"]["rows"]:
            cells = [name, row["backend"], _status(row), _ms(row["median_s"]),
                     "—" if row["p20_s"] is None else f"{row['p20_s'] * 1e3:.3f}–{row['p80_s'] * 1e3:.3f}",
                     _ms(row["steady_s"]), _num(row["speedup"], ".2f"), _num(row["cold_compile_s"], ".1f"),
                     _num(row["warm_compile_s"], ".1f"),
                     "—" if row["peak_memory_bytes"] is None else f"{row['peak_memory_bytes'] / 2**20:.0f}",
                     _err(row, "error_vs_eager", "max_abs"), _err(row, "error_vs_eager", "max_rel"),
                     _err(row, "error_vs_reference", "norm_rel")]
            if extra:
                cells += extra(row)
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def repeat_table(entry):
    if entry["status"] != "ok":
        return f"{entry['status'].upper()}: {entry.get('error', '')}"
    data = entry["data"]
    lines = [f"{data['numel']:,} elements, {data['dtype']}; knee r = {data['knee']} "
             f"(runtime > 1.3x flat at r = {data['knee_runtime']}, FLOP/s at half the mul roof at r = "
             f"{data['knee_flops']})", "", "| r | runtime ms | TFLOP/s | GB/s |", "|---|---|---|---|"]
    for row in data["rows"]:
        if row["time_s"] is None:
            lines.append(f"| {row['repeat']} | FAILED: {row.get('error', '')[:150]} | | |")
        else:
            lines.append(f"| {row['repeat']} | {row['time_s'] * 1e3:.3f} | {row['flops_per_s'] / 1e12:.3f} | "
                         f"{row['bytes_per_s'] / 1e9:.0f} |")
    return "\n".join(lines)


def render(results):
    env = results["environment"]
    out = [f"# brrr benchmark suite — {env['device_name']}", "",
           f"date {env['date']} · commit {env.get('commit', '—')} · torch {env['versions']['torch']} · "
           f"triton {env['versions']['triton']} · "
           f"mode {env['mode']} · total {results.get('elapsed_s', 0):.0f} s", ""]
    ceilings = results["sections"].get("ceilings", {})
    if ceilings.get("status") == "ok":
        c = ceilings["data"]
        out += [f"ceilings: copy bandwidth {c['bandwidth'] / 1e9:.0f} GB/s, vector fp32 {c['vector_fp32'] / 1e12:.3g} "
                f"TFLOP/s, matmul TFLOP/s " + ", ".join(f"{k} {v / 1e12:.3g}" for k, v in c["matmul"].items())
                + f", launch latency {c['launch_latency'] * 1e6:.1f} µs", ""]
    elif ceilings:
        out += [f"ceilings: {ceilings['status']}: {ceilings.get('error', '')}", ""]
    sections = results["sections"]
    for name, title in (("repeat", "x*2 repeated r times"), ("cos", "x.cos().cos() vs eager x.cos()"),
                        ("mlp", "seed MLP"), ("micro", "micro-benchmarks (bf16, inputs rotated past L2)"),
                        ("models", "models")):
        if name not in sections:
            continue
        section = sections[name]
        out += [f"## {title}", ""]
        if section["status"] != "ok":
            out += [f"{section['status'].upper()}: {section.get('error', '')}", ""]
            continue
        data = section["data"]
        if name == "repeat":
            for backend, entry in data.items():
                out += [f"### {backend}", "", repeat_table(entry), ""]
        elif name == "cos":
            if data["status"] == "ok":
                d = data["data"]
                out += [f"eager x.cos(): {d['eager_single_cos_s'] * 1e3:.3f} ms; x.cos().cos() over that: "
                        + ", ".join(f"{k} {v:.2f}x" for k, v in d["ratio_to_single_cos"].items() if v), ""]
                out += [bench_table({"x.cos().cos()": {"status": "ok", "data": d["bench"]}}), ""]
            else:
                out += [f"{data['status'].upper()}: {data.get('error', '')}", ""]
        elif name == "micro":
            out += ["| op [shape] | ideal bytes (MiB) | FLOPs (M) | input sets rotated |", "|---|---|---|---|"]
            out += [f"| {k} | {e['data']['ideal_bytes'] / 2**20:.3g} | {e['data']['flops'] / 1e6:.3g} | "
                    f"{e['data']['input_sets']} |" for k, e in data.items() if e["status"] == "ok"]
            out += [""]
            out += [bench_table(data, extra=lambda r: [
                _num(r.get("achieved_bytes_per_s") and r["achieved_bytes_per_s"] / 1e9, ".0f"),
                _num(r.get("fraction_of_copy_bandwidth") and 100 * r["fraction_of_copy_bandwidth"], ".0f")]), ""]
        else:
            out += [bench_table(data), ""]
    return "\n".join(out)
