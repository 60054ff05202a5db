"""Writing the benchmarks' output files whole or not at all.

replace_atomically(path, write) calls write(temporary) on a temporary file
in path's folder and renames it over path only once write returned: rename
within one folder is atomic, so a full disk or a killed run leaves the
previous file as it was (and no temporary behind), and a reader never sees
half a file. The same rule as tp::write_file in common/src/util/file.cc.
save_figure does it for a matplotlib figure; load_json reads such a file
back (None when there is none).
"""
import json
import os
import tempfile


def replace_atomically(path, write):
    folder = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    os.close(fd)
    try:
        write(temporary)
        os.chmod(temporary, 0o644)  # mkstemp makes 0600; results are for others to read
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def write_text(path, text):
    """replace_atomically for a text file."""
    def write(temporary):
        with open(temporary, "w") as f:
            f.write(text)
    replace_atomically(path, write)


def save_figure(fig, path):
    """replace_atomically for a matplotlib figure, as PNG (named: the
    temporary file has no .png ending); the figure is closed after."""
    import matplotlib.pyplot as plt
    fig.tight_layout()
    replace_atomically(path, lambda temporary: fig.savefig(temporary, dpi=110, format="png"))
    plt.close(fig)


def load_json(folder, name):
    """A results file a script wrote whole (hook_losses.json, link_fsdp.json),
    or None when it is absent."""
    path = os.path.join(folder, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)
