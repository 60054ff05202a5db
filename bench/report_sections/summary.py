"""summary.md as it is built: the sections' lines, then the kit's targets.

Each section adds its lines to a Report and marks the targets it measures
(Report.target); Report.text() appends the targets table, where a target no
section measured is "not measured".
"""

# The kit's targets (measured here, never by timed tests).
TARGET_BUCKETED_SPEEDUP = 5.0     # stage 02 sync vs stage 01 sync, depth 64, 2 ranks
TARGET_BUCKETED_VS_FLAT = 1.3     # stage 02 sync vs one flat all-reduce, depth 64, 2 ranks
TARGET_HIDDEN = 0.30              # share of stage 02's sync that stage 03 hides, 2 ranks
TARGET_VS_TORCH = 1.25            # stage 03 step vs PyTorch DDP step, 2 ranks
TARGET_KIT_OVERHEAD = 1.1         # kit all-reduce vs raw Gloo, median

# The targets as the report names them, in the order it lists them; one the
# results do not cover is listed as "not measured".
TARGETS = [
    ("stage 02 sync faster than stage 01, depth 64, 2 ranks", f">= {TARGET_BUCKETED_SPEEDUP:g}x"),
    ("stage 02 sync / one flat all-reduce, depth 64, 2 ranks", f"<= {TARGET_BUCKETED_VS_FLAT}x"),
    ("kit all-reduce / raw Gloo, 2 ranks (median over sizes)", f"<= {TARGET_KIT_OVERHEAD}x"),
    ("stage 03 hides stage 02's sync, 2 ranks, default caps, batch 64",
     f">= {TARGET_HIDDEN * 100:.0f}%"),
    ("kit stage 03 step / PyTorch DDP step, 2 ranks, default caps", f"<= {TARGET_VS_TORCH}x"),
]


class Report:
    def __init__(self):
        self.lines = []
        self.targets = {}  # what -> (measured, met)

    def add(self, *lines):
        self.lines.extend(lines)

    def table(self, header, rows):
        self.add("| " + " | ".join(header) + " |", "|" + "---|" * len(header))
        for row in rows:
            self.add("| " + " | ".join(str(c) for c in row) + " |")
        self.add("")

    def target(self, what, measured, met):
        assert what in dict(TARGETS), what
        self.targets[what] = (measured, "yes" if met else "**no**")

    def text(self):
        out = list(self.lines)
        out += ["## Targets", "", "| target | measured | goal | met |", "|---|---|---|---|"]
        for what, goal in TARGETS:
            measured, met = self.targets.get(what, ("not measured", "-"))
            out.append(f"| {what} | {measured} | {goal} | {met} |")
        return "\n".join(out) + "\n"


def context_line(results):
    """Where and when the results were measured (the first results file's context)."""
    for (program, w), result in sorted(results.items()):
        c = result["context"]
        cores = c.get("cores", c.get("num_cpus", "?"))
        return (f"Measured on {cores} core(s) ({c.get('host_name', 'this machine')}, "
                f"{c.get('date', '?')}); ranks share the cores.")
    return "No results found."
