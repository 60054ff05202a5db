"""What report.py's figures share: matplotlib without a display, where a
figure is saved, and a colour per world size (the same in every figure)."""

import os

from atomic_file import save_figure

COLOURS = {2: "tab:blue", 4: "tab:orange"}  # by world size; others get matplotlib's next


def pyplot():
    """matplotlib.pyplot, drawing to files only (Agg: no display needed).
    Imported here, not at the top of a module: the summary runs without
    matplotlib (--no-plots)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def saver(out, saved):
    """save(fig, name), as every section's plot function takes it: writes
    the figure to out/name whole or not at all (atomic_file.save_figure),
    then calls saved(path)."""
    def save(fig, name):
        path = os.path.join(out, name)
        save_figure(fig, path)
        saved(path)
    return save
