"""The peers' cache: Inductor's rows of each configuration, kept from the run that measured them.

Eager and Inductor do not change when brrr does, so the sweep measures Inductor's two modes once per
(configuration, what it computes, GPU model, torch and triton versions) and keeps their rows with the eager
times of that same run. A later run re-times eager only and scales each cached Inductor time by eager's ratio,
then against now (`median_s` by the medians' ratio, `steady_s` by the back-to-back times'), so that a slower
or faster host moves both sides alike; memory and compile times are kept as measured. Where eager's ratio
strays beyond STALE_SCALE the peers are measured again in this run instead (`stale`). A change of GPU,
torch, triton or of the configuration's model or inputs is a miss: the peers are measured again.
`--remeasure-peers` measures them again regardless.
"""

import json
from pathlib import Path

SCALED = (("median_s", "median_s"), ("p20_s", "median_s"), ("p80_s", "median_s"), ("steady_s", "steady_s"))


def key(config_name, fingerprint, gpu, torch_version, triton_version):
    return f"{config_name}|{fingerprint}|{gpu}|torch {torch_version}|triton {triton_version}"


class PeerCache:
    """{key: {"eager": {median_s, steady_s}, "rows": {backend: row}, "commit", "date"}} in one JSON file."""

    def __init__(self, path):
        self.path = Path(path) if path else None
        self.entries = {}
        if self.path is not None and self.path.exists():
            try:
                self.entries = json.loads(self.path.read_text())
            except ValueError:   # a torn file: measure the peers again rather than trust it
                self.entries = {}

    def lookup(self, k, peers):
        """The cached entry when it holds every backend of `peers` measured ok, else None."""
        entry = self.entries.get(k)
        if entry is None or any(entry["rows"].get(p, {}).get("status") not in ("ok", "wrong") for p in peers):
            return None
        return entry

    def store(self, k, eager_row, peer_rows, commit, date):
        if eager_row.get("status") != "ok" or not eager_row.get("median_s"):
            return
        self.entries[k] = {"eager": {f: eager_row.get(f) for f in ("median_s", "steady_s")},
                           "rows": {b: dict(r) for b, r in peer_rows.items()}, "commit": commit, "date": date}

    def write(self, path=None):
        path = Path(path) if path else self.path
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
        tmp.replace(path)

    def merge(self, other):
        """Take `other`'s entries (a worker's cache, a later run's) over these."""
        self.entries.update(other.entries)


STALE_SCALE = (0.85, 1.15)   # eager's ratio outside this: the peers are measured again, not scaled


def stale(entry, eager_row):
    """Whether eager's time in this run strays from the cached run's by more than STALE_SCALE allows. Scaling
    assumes every backend moves with eager; a host-bound eager moves with the host while a replayed peer barely
    does: DenseNet121 bf16 inference's eager read 0.68x of its cached run's, its reduce-overhead row scaled to
    2.00 ms, and measured beside brrr in one process it took 2.84 (benchmarks/NOTES.md)."""
    then, now = entry["eager"].get("median_s"), eager_row.get("median_s")
    if not then or not now:
        return False
    return not STALE_SCALE[0] <= now / then <= STALE_SCALE[1]


def scaled_rows(entry, eager_row):
    """The cached peers' rows with their times scaled to the eager of this run (each row says by how much)."""
    out = {}
    for backend, row in entry["rows"].items():
        row = dict(row)
        factors = {}
        for field, base in SCALED:
            then, now = entry["eager"].get(base), eager_row.get(base)
            if row.get(field) is None or not then or not now:
                continue
            factors[base] = now / then
            row[field] = row[field] * now / then
        row["cached"] = {"commit": entry.get("commit"), "date": entry.get("date"), "eager_scale": factors}
        out[backend] = row
    return out
